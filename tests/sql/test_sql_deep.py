"""Plans of any depth SQL makes run on real workers (issue 40, item 5).

A query with many scalar subqueries (TPC-DS Q9 has fifteen) is a plan of nested joins: sent as nested
protobuf messages, two levels per operator, it passed protobuf's 100 levels and workers failed with
``Exceeded upb_DecodeOptions_MaxDepth``. A stage's operators now travel as a flat list
(``flight.wire.plan_codec``); these queries run on the session's two workers, their stage plans
spied on as they are sent, and their answers are DuckDB's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support import running_tasks

import flight
from benchmarks.tpch_queries import duckdb_table
from flight.coordinator import binding
from flight.errors import PlanError
from flight.wire import plan_codec
from flight.wire._proto import plan_pb2

BUCKETS = 6  # three scalar subqueries each, as in TPC-DS Q9: 18


def q09_like(buckets: int = BUCKETS) -> str:
    """TPC-DS Q9's shape: per bucket, a count decides which of two other aggregates of the same rows to show."""
    cases = []
    for b in range(buckets):
        lo, hi = 10 * b, 10 * b + 30
        rows = f"from t where x between {lo} and {hi}"
        cases.append(f"case when (select count(*) {rows}) > {25 + 3 * b} then (select sum(y) {rows}) else (select max(y) {rows}) end as bucket{b}")
    return f"select {', '.join(cases)} from reason where r_reason_sk = 1"


def counts(count: int = 16) -> str:
    """Only scalar subqueries, no FROM: ``select (select count(*) from t where x > 0), ...``."""
    return "select " + ", ".join(f"(select count(*) from t where x > {i}) as c{i}" for i in range(count))


def filtered_by_subqueries(count: int = 16) -> str:
    """A WHERE clause of ``count`` conjuncts, each comparing with a scalar subquery."""
    conds = " and ".join(f"x + {i} > (select min(x) from t where y = {i % 7})" for i in range(count))
    return f"select count(*) as n, sum(x) as s, min(y) as lo from t where {conds}"


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("deep")
    out = {"t": root / "t.parquet", "reason": root / "reason.parquet"}
    pq.write_table(pa.table({"x": pa.array(range(100), pa.int64()), "y": pa.array([i * 7 % 13 for i in range(100)], pa.int64())}), out["t"])
    pq.write_table(pa.table({"r_reason_sk": pa.array([1, 2, 3], pa.int64())}), out["reason"])
    return out


@pytest.fixture(scope="module")
def con(tables: dict[str, Path]) -> Iterator[duckdb.DuckDBPyConnection]:
    c = duckdb.connect()
    for name, path in tables.items():
        c.execute(f"create view {name} as select * from read_parquet('{path}')")
    yield c
    c.close()


def depth(root: plan_pb2.Operator) -> int:
    """Operators on the longest path from ``root`` down."""
    deepest, stack = 0, [(root, 1)]
    while stack:
        op, level = stack.pop()
        deepest = max(deepest, level)
        kind = op.WhichOneof("kind")
        if kind is not None:
            body = getattr(op, kind)
            for name in plan_codec.CHILDREN[kind]:
                children = list(body.inputs) if kind == "union" else [getattr(body, name)] if body.HasField(name) else []
                stack.extend((child, level + 1) for child in children)
    return deepest


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The depth, in operators, of every stage plan the coordinator sends a worker."""
    depths: list[int] = []

    def spy(plan: plan_pb2.StagePlan) -> bytes:
        depths.append(depth(plan.root))
        return plan_codec.encode_plan(plan)

    monkeypatch.setattr(binding, "encode_plan", spy)
    return depths


def rows(table: pa.Table) -> list[tuple[object, ...]]:
    return [tuple(r.values()) for r in table.to_pylist()]


@pytest.mark.parametrize("text", [q09_like(), counts(), filtered_by_subqueries()], ids=["q09-like", "counts", "where-subqueries"])
@pytest.mark.parametrize("small", [True, False], ids=["one-task", "stages"])
def test_a_plan_deeper_than_protobuf_nests_runs_on_workers_and_matches_duckdb(
    text: str, small: bool, tables: dict[str, Path], con: duckdb.DuckDBPyConnection, cluster: flight.LocalCluster, sent: list[int]
) -> None:
    catalog = flight.Catalog({name: str(path) for name, path in tables.items()})
    options = {} if small else {"small_query_bytes": 0, "broadcast_bytes": 0}
    ex = flight.DistributedExec(flight.sql(text, catalog), cluster.urls, **options)
    got = ex.to_table()
    want = duckdb_table(con, text)
    assert rows(got) == rows(want), ex.explain()
    if small:  # one stage of the whole query: nested, 1 + 2 * depth levels of protobuf messages
        assert max(sent) > 50, sent


def test_a_plan_over_the_operator_limit_is_refused_by_the_coordinator_before_it_is_sent(
    tables: dict[str, Path], cluster: flight.LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(plan_codec, "MAX_PLAN_OPERATORS", 40)  # the workers keep theirs: nothing may reach them
    catalog = flight.Catalog({name: str(path) for name, path in tables.items()})
    ex = flight.DistributedExec(flight.sql(q09_like(), catalog), cluster.urls)
    with pytest.raises(PlanError, match=r"a stage's plan has \d+ operators; a worker accepts at most 40"):
        ex.to_table()
    assert running_tasks(cluster.urls) == 0
