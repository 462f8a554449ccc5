"""``Query.unnest`` (SQL's UNNEST, Spark's explode), a row per element, and RANGE window frames: both computed by DuckDB.

DuckDB's own ``unnest`` over the same rows is the oracle; a worker refuses a hostile ``Unnest`` by field.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support import difference, error_of, header, healthy, raw_exchange

import flight
from flight import agg, col
from flight.errors import PlanError, ProtocolError
from flight.wire._proto import plan_pb2, protocol_pb2


def _table() -> pa.Table:
    n = 300
    return pa.table({
        "id": pa.array(range(n), pa.int64()),
        "k": pa.array([f"g{i % 5}" for i in range(n)]),
        "l": pa.array([None if i % 13 == 0 else [(i * j) % 17 for j in range(i % 4)] for i in range(n)], pa.list_(pa.int64())),
    })


def test_unnest_gives_duckdbs_rows_one_task_and_split(tmp_path: Path) -> None:
    t = _table()
    files = []
    for i in range(3):
        files.append(tmp_path / f"part{i}.parquet")
        pq.write_table(t.slice(i * 100, 100), files[-1])
    q = flight.read_parquet(files).unnest("l", "v").filter(col("v") > 3).aggregate(["k"], n=agg.count_all(), s=agg.sum("v"))
    con = duckdb.connect()
    con.register("t", t)
    want = con.sql("select k, count(*) as n, sum(v) as s from (select k, unnest(l) as v from t) where v > 3 group by k").arrow()
    want = want.read_all() if hasattr(want, "read_all") else want
    assert difference(flight.run_local(q).read_all(), want, False) is None
    with flight.LocalCluster(2, data_roots=[tmp_path]) as cluster:
        got = flight.DistributedExec(q, cluster.urls, one_host_query_bytes=0, small_query_bytes=0).execute().read_all()
    assert difference(got, want, False) is None


def test_unnest_is_refused_by_name_where_it_cannot_be() -> None:
    t = _table()
    with pytest.raises(PlanError, match="'k' is a string, not a list"):
        flight.from_arrow(t).unnest("k")
    with pytest.raises(PlanError, match="already a column"):
        flight.from_arrow(t).unnest("l", "id")
    with pytest.raises(ProtocolError, match="UNNEST: computed by the DuckDB engine only"):
        flight.run_local(flight.from_arrow(t).unnest("l"), engine="acero").read_all()


def _plan(column: str, name: str) -> plan_pb2.StagePlan:
    sink = pa.BufferOutputStream()
    table = pa.table({"x": [1, 2], "l": pa.array([[1], [2, 3]], pa.list_(pa.int64()))})
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    values = plan_pb2.Operator(values=plan_pb2.Values(ipc_stream=sink.getvalue().to_pybytes()))
    return plan_pb2.StagePlan(root=plan_pb2.Operator(unnest=plan_pb2.Unnest(input=values, column=column, name=name)))


@pytest.mark.parametrize(("column", "name", "field"), [("x", "v", "column"), ("nope", "v", "column"), ("l", "x", "name"), ("l", "", "name")])
def test_a_worker_refuses_a_hostile_unnest_by_field_and_lives(column: str, name: str, field: str) -> None:
    with flight.LocalCluster(1) as cluster:
        frames, _ = raw_exchange(cluster.urls[0], header(_plan(column, name)).SerializeToString())
        info = error_of(frames)
        assert info.code == protocol_pb2.ERROR_CODE_INVALID_ARGUMENT, info
        assert info.field.endswith(f"unnest.{field}"), info
        assert healthy(cluster.urls[0])


def _window_plan(order: list[str], start: int) -> plan_pb2.StagePlan:
    sink = pa.BufferOutputStream()
    table = pa.table({"x": [1, 2, 5], "s": ["a", "b", "c"]})
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    values = plan_pb2.Operator(values=plan_pb2.Values(ipc_stream=sink.getvalue().to_pybytes()))
    call = plan_pb2.WindowCall(function="count_all", name="n", frame=plan_pb2.WindowFrame(start=start, end=0, range=True))
    window = plan_pb2.Window(input=values, order_by=[plan_pb2.SortKey(column=c) for c in order], calls=[call])
    return plan_pb2.StagePlan(root=plan_pb2.Operator(window=window))


def test_a_range_frame_counts_values_not_rows_and_a_bad_one_is_refused_by_field() -> None:
    """RANGE BETWEEN 2 PRECEDING over x = 1, 2, 5 counts 1, 2, 1 rows (ROWS would count 1, 2, 3); over a text key or
    two keys a worker refuses it by field."""
    t = pa.table({"x": [1, 2, 5]})
    got = flight.run_local(flight.sql("select x, count(*) over (order by x range between 2 preceding and current row) as n from t",
                                      {"t": t})).read_all()
    assert sorted(zip(got["x"].to_pylist(), got["n"].to_pylist())) == [(1, 1), (2, 2), (5, 1)]
    with flight.LocalCluster(1) as cluster:
        for order in (["s"], ["x", "s"]):
            frames, _ = raw_exchange(cluster.urls[0], header(_window_plan(order, -2)).SerializeToString())
            info = error_of(frames)
            assert info.code == protocol_pb2.ERROR_CODE_INVALID_ARGUMENT and info.field.endswith("calls[0].frame"), info
        assert healthy(cluster.urls[0])
