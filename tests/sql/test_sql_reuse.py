"""A CTE (or view) used twice is computed once: one stage, read by each use (``flight.planner.reuse``).

The plans are asserted by their stages (how many scans, which stage is read by which); the answers
on two real workers against DuckDB's, over the corpus tables.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
from corpus import tables
from support import tpch_test_files
from test_sql_corpus import same

import flight
from benchmarks.tpch_queries import TABLES, duckdb_table
from benchmarks.tpch_sql import SQL
from flight.planner.cut import plan_query
from flight.planner.stages import PlannerOptions, QueryPlan

URLS = ["grpc://127.0.0.1:1", "grpc://127.0.0.1:2"]


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each table as three files, so that scans have two tasks and rows move."""
    root = tmp_path_factory.mktemp("sql-reuse")
    out = {}
    for name, table in tables().items():
        out[name] = root / name
        out[name].mkdir()
        step = max(1, -(-table.num_rows // 3))
        for part in range(3):
            pq.write_table(table.slice(part * step, step), out[name] / f"part-{part}.parquet", row_group_size=16)
    return out


class Once(flight.ListingProvider):
    """A listing that does not promise the same units when read again (like a feed of units discovered
    at run time): a subplan over it that a query uses twice must be computed once."""

    repeatable = False


@pytest.fixture(scope="module")
def catalog(paths: dict[str, Path]) -> flight.Catalog:
    return flight.Catalog({
        name: flight.read_parquet(Once(str(path), "*.parquet"), schema=pq.read_schema(next(path.glob("*.parquet"))))
        for name, path in paths.items()
    })


@pytest.fixture(scope="module")
def con(paths: dict[str, Path]) -> Iterator[duckdb.DuckDBPyConnection]:
    c = duckdb.connect()
    for name, path in paths.items():
        c.execute(f"create view {name} as select * from read_parquet('{path}/*.parquet')")
    yield c
    c.close()


def planned(text: str, catalog: flight.Catalog, **options: int) -> QueryPlan:
    return plan_query(flight.sql(text, catalog).node, len(URLS), PlannerOptions(**options))


def scans(plan: QueryPlan) -> int:
    return sum(1 for s in plan.stages for n in s.root.walk() if type(n).__name__ == "FeedScanNode")


def test_tpch_q15_scans_lineitem_once() -> None:
    """Q15's view ``revenue0`` is named twice (the join and the max): lineitem is read by one stage."""
    files = tpch_test_files(0.1)
    catalog = flight.Catalog({t: flight.read_parquet([str(p.resolve()) for p in files[t]]) for t in TABLES})
    plan = planned(SQL[15], catalog)
    assert scans(plan) == 2, "lineitem and supplier, once each"
    shared = [s for s in plan.stages if s.shared]
    assert len(shared) == 1 and len(shared[0].consumers) == 2
    text = flight.DistributedExec(flight.sql(SQL[15], catalog), URLS, small_query_bytes=0).explain()
    assert re.search(r"Stage \d+ \[leaf, -> stages \d+, \d+ \(hash, retained: read 2 times\)\]", text), text
    assert "is computed once and read again" in text


def test_a_self_join_of_a_cte_scans_once(catalog: flight.Catalog) -> None:
    """Both sides' partial aggregates are one stage; each side merges it (the second under its own
    column names, so the merges differ) and the join reads both."""
    text = "with s as (select g, sum(d) as total from t group by g) select a.g, a.total, b.total as t2 from s a join s b on a.g = b.g"
    plan = planned(text, catalog, broadcast_bytes=0, rows_per_task=1)
    shared = [s for s in plan.stages if s.shared]
    assert len(shared) == 1 and len(shared[0].consumers) == 2
    assert scans(plan) == 1


def test_aggregates_straight_over_a_cte_scan_once(catalog: flight.Catalog) -> None:
    """Each use's partial aggregate would run in the scan's tasks: over a source that is not
    repeatable, the CTE becomes a stage of its own, its rows spread round-robin to each use."""
    text = "with s as (select id, x from t where x > 0) select count(x) as c from s union all select sum(x) from s"
    plan = planned(text, catalog)
    assert scans(plan) == 1
    shared = [s for s in plan.stages if s.shared]
    assert len(shared) == 1 and shared[0].output_mode == "round_robin"


def test_a_cte_of_listed_files_is_read_again_by_each_use(paths: dict[str, Path]) -> None:
    """Files read again cost less than every row moved through a stage more (TPC-H Q18, docs/sql.md).
    A directory is listed while the query runs, and may change between two listings: it is not
    repeatable, so it is computed once like any such source."""
    text = "with s as (select id, x from t where x > 0) select count(x) as c from s union all select sum(x) from s"
    files = flight.Catalog({"t": flight.read_parquet(sorted(str(f) for f in paths["t"].glob("*.parquet")))})
    assert scans(planned(text, files)) == 2
    assert scans(planned(text, flight.Catalog({"t": str(paths["t"])}))) == 1


def test_uses_reading_other_columns_are_one_subplan(catalog: flight.Catalog) -> None:  # over the source that is not repeatable
    """Column pruning gives equal subplans the columns all their uses read: uses that read different
    columns of a CTE stay equal, one subplan scanning once (docs/sql.md, ``flight.planner.prune``)."""
    text = "with s as (select id, x from t where x > 0) select count(x) as c from s union all select max(id) from s"
    assert scans(planned(text, catalog)) == 1


def test_consumers_of_a_shared_hash_output_have_one_task_count(catalog: flight.Catalog) -> None:
    """The CTE joins t (60 rows: two tasks at 30 rows a task) and u (25 rows: one task): both joins
    read one partition each of its hash output, so both get two tasks."""
    text = (
        "with s as (select g, count(*) as n from t group by g) "
        "select s.g, s.n, t.id from s join t on s.g = t.g union all select s.g, s.n, u.id from s join u on s.g = u.g"
    )
    plan = planned(text, catalog, broadcast_bytes=0, rows_per_task=30)
    shared = [s for s in plan.stages if s.shared and s.output_mode == "hash"]
    assert shared, "the CTE's stage is shuffled to both joins"
    for stage in shared:
        counts = {plan.stage(c).task_count for c in stage.consumers}
        assert len(counts) == 1, f"stage {stage.stage_id}'s consumers have task counts {counts}"


RUN = [
    "with s as (select g, sum(d) as total from t group by g) select g from s where total = (select max(total) from s)",
    "with s as (select g, sum(d) as total from t group by g) select a.g, a.total, b.total as t2 from s a join s b on a.g = b.g",
    "with s as (select g, count(*) as n from t group by g) "
    "select s.g, s.n, t.id from s join t on s.g = t.g union all select s.g, s.n, u.id from s join u on s.g = u.g",
    "with s as (select id, x from t where x > 0) select count(x) as c from s union all select sum(x) from s union all select max(x) from s",
    "create view v as select g, min(x) as lo from t group by g; select a.g, b.lo from v a left join v b on a.g = b.g and a.lo = b.lo; drop view v",
]


@pytest.mark.parametrize("text", RUN, ids=[f"s{i}" for i in range(len(RUN))])
@pytest.mark.parametrize("per_task", [1, 30])
def test_a_shared_stage_on_workers_matches_duckdb(
    text: str, per_task: int, catalog: flight.Catalog, con: duckdb.DuckDBPyConnection, cluster: flight.LocalCluster
) -> None:
    """Every join shuffled, tasks per stage from one to two: each use reads the shared stage's output whole."""
    query = flight.sql(text, catalog)
    plan = plan_query(query.node, 2, PlannerOptions(broadcast_bytes=0, rows_per_task=per_task))
    assert any(s.shared for s in plan.stages), "the statement shares a stage"
    ex = flight.DistributedExec(query, cluster.urls, broadcast_bytes=0, rows_per_task=per_task, small_query_bytes=0)
    difference = same(ex.to_table(), duckdb_table(con, text), ordered=False)
    assert difference is None, f"{text}\n{difference}\n{ex.explain()}"
