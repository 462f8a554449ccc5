"""Medians, quantiles and ordered aggregates: those only the DuckDB engine computes (``flight.plan.agg.DUCKDB_ONLY``).

Answers are compared with DuckDB's own ``median`` / ``quantile_cont`` / ``quantile_disc`` / ``string_agg`` /
``array_agg`` over the same rows; a worker refuses a hostile fraction, separator, order or filter, or a partial
median, by field and lives.
"""

from __future__ import annotations

import math
from decimal import Decimal
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
    n = 500
    return pa.table({
        "k": pa.array([None if i % 17 == 0 else f"g{i % 7}" for i in range(n)], pa.string()),
        "x": pa.array([None if i % 11 == 0 else (i * 7919) % 1000 - 300 for i in range(n)], pa.int64()),
        "d": pa.array([Decimal(f"{(i * 31) % 997}.{i % 100:02d}") for i in range(n)], pa.decimal128(9, 2)),
        "f": pa.array([(i * 0.37) % 13.0 for i in range(n)], pa.float64()),
    })


def _duckdb(table: pa.Table, text: str) -> pa.Table:
    con = duckdb.connect()
    con.register("t", table)
    out = con.sql(text).arrow()
    return out.read_all() if hasattr(out, "read_all") else out


def _parts(t: pa.Table, where: Path) -> list[Path]:
    """``t`` as four Parquet files (four units: a plan forced into stages splits them between tasks)."""
    files = [where / f"part{i}.parquet" for i in range(4)]
    for i, path in enumerate(files):
        pq.write_table(t.slice(i * 125, 125), path)
    return files


def test_the_python_api_gives_duckdbs_medians_and_quantiles_one_task_and_split(tmp_path: Path) -> None:
    t = _table()
    files = _parts(t, tmp_path)
    q = flight.read_parquet(files).aggregate(
        ["k"], m=agg.median("x"), md=agg.median(col("d")), q=agg.quantile_cont("f", 0.9), qd=agg.quantile_disc("x", 0.25)
    )
    want = _duckdb(t, "select k, median(x) as m, median(d) as md, quantile_cont(f, 0.9) as q, quantile_disc(x, 0.25) as qd from t group by k")
    assert difference(flight.run_local(q).read_all(), want, False) is None
    with flight.LocalCluster(2, data_roots=[tmp_path]) as cluster:  # every plan split: rows moved by the key between tasks
        exec_ = flight.DistributedExec(q, cluster.urls, one_host_query_bytes=0, small_query_bytes=0)
        assert len(exec_.plan.stages) > 1
        got = exec_.execute().read_all()
    assert difference(got, want, False) is None


def test_a_quantile_needs_a_fraction_from_0_to_1_and_a_number() -> None:
    with pytest.raises(PlanError, match="between 0 and 1"):
        agg.quantile_cont("x", 1.5)
    with pytest.raises(PlanError, match="needs a fraction"):
        agg.Agg("quantile_disc", col("x"))
    with pytest.raises(PlanError, match="median needs a number"):
        flight.from_arrow(pa.table({"s": ["a"]})).aggregate(m=agg.median("s"))


def test_acero_refuses_a_median_by_name() -> None:
    q = flight.from_arrow(_table()).aggregate(m=agg.median("x"))
    with pytest.raises(ProtocolError, match="the aggregate median: computed by the DuckDB engine only"):
        flight.run_local(q, engine="acero").read_all()


def _median_plan(fraction: float, function: str = "quantile_cont", partial: bool = False) -> plan_pb2.StagePlan:
    sink = pa.BufferOutputStream()
    table = pa.table({"x": pa.array([1.0, 2.0, 4.0])})
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    values = plan_pb2.Operator(values=plan_pb2.Values(ipc_stream=sink.getvalue().to_pybytes()))
    call = plan_pb2.AggregateCall(function=function, column="x", name="q", fraction=fraction)
    return plan_pb2.StagePlan(root=plan_pb2.Operator(aggregate=plan_pb2.Aggregate(input=values, aggregates=[call], partial=partial)))


def test_the_python_api_gives_duckdbs_ordered_aggregates_one_task_and_split(tmp_path: Path) -> None:
    t = _table()
    files = _parts(t, tmp_path)
    q = flight.read_parquet(files).aggregate(
        ["k"],
        s=agg.string_agg(col("x").cast(pa.string()), "+", order_by=[("f", True, False), "x"]),
        a=agg.array_agg("d", order_by=[(col("x"), False, True), "f"], where=col("f") > 6.0),
    )
    want = _duckdb(t, "select k, string_agg(cast(x as varchar), '+' order by f desc, x) as s, "
                      "array_agg(d order by x asc nulls first, f) filter (where f > 6.0) as a from t group by k")
    assert difference(flight.run_local(q).read_all(), want, False) is None
    with flight.LocalCluster(2, data_roots=[tmp_path]) as cluster:
        got = flight.DistributedExec(q, cluster.urls, one_host_query_bytes=0, small_query_bytes=0).execute().read_all()
    assert difference(got, want, False) is None
    with pytest.raises(PlanError, match="string_agg joins text"):
        flight.from_arrow(t).aggregate(s=agg.string_agg("x"))


def _agg_plan(call: plan_pb2.AggregateCall, partial: bool = False) -> plan_pb2.StagePlan:
    sink = pa.BufferOutputStream()
    table = pa.table({"x": pa.array([1.0, 2.0, 4.0]), "s": ["a", "b", "c"]})
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    values = plan_pb2.Operator(values=plan_pb2.Values(ipc_stream=sink.getvalue().to_pybytes()))
    return plan_pb2.StagePlan(root=plan_pb2.Operator(aggregate=plan_pb2.Aggregate(input=values, aggregates=[call], partial=partial)))


@pytest.mark.parametrize(("call", "field"), [
    (plan_pb2.AggregateCall(function="string_agg", column="s", name="a", separator="," * 5000), "separator"),
    (plan_pb2.AggregateCall(function="string_agg", column="s", name="a", order=[plan_pb2.AggregateOrder(column="nope")]), "order"),
    (plan_pb2.AggregateCall(function="array_agg", column="s", name="a", filter="x"), "filter"),
    (plan_pb2.AggregateCall(function="sum", column="x", name="a", order=[plan_pb2.AggregateOrder(column="x")]), "function"),
])
def test_a_worker_refuses_a_hostile_ordered_aggregate_by_field_and_lives(call: plan_pb2.AggregateCall, field: str) -> None:
    with flight.LocalCluster(1) as cluster:
        frames, _ = raw_exchange(cluster.urls[0], header(_agg_plan(call)).SerializeToString())
        info = error_of(frames)
        assert info.code == protocol_pb2.ERROR_CODE_INVALID_ARGUMENT, info
        assert info.field.endswith(f"aggregates[0].{field}"), info
        assert healthy(cluster.urls[0])


@pytest.mark.parametrize(("fraction", "function", "partial", "field"), [
    (math.nan, "quantile_cont", False, "fraction"),
    (2.0, "quantile_disc", False, "fraction"),
    (-0.5, "quantile_cont", False, "fraction"),
    (0.5, "median", True, "function"),
])
def test_a_worker_refuses_a_hostile_quantile_by_field_and_lives(fraction: float, function: str, partial: bool, field: str) -> None:
    with flight.LocalCluster(1) as cluster:
        frames, _ = raw_exchange(cluster.urls[0], header(_median_plan(fraction, function, partial)).SerializeToString())
        info = error_of(frames)
        assert info.code == protocol_pb2.ERROR_CODE_INVALID_ARGUMENT, info
        assert info.field.endswith(f"aggregates[0].{field}"), info
        assert "Traceback" not in info.message
        assert healthy(cluster.urls[0])
