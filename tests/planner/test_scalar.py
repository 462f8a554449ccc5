"""A comparison with a scalar subquery filters the table its column comes from (``flight.planner.scalar``).

Shapes (planned without workers): the comparison's join with the one-row subquery lands beneath the joins
above it, on the scan whose column it compares, and explain() says so; it stays where a comparison reads
both sides of a join, and where nothing lies between it and its subplan. A comparison lands below an anti join on its kept side
(TPC-H Q22), and the subquery it compares with, read twice there, is one stage. Answers: each statement on two
real workers against DuckDB over the same files, every join shuffled or broadcast.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from support import difference, write_halves

import flight
from benchmarks.tpch_queries import duckdb_table
from flight.plan.nodes import FeedScanNode, Node
from flight.plan.relnodes import AggregateNode, JoinNode, ShuffleReadNode
from flight.planner.cut import plan_query
from flight.planner.stages import PlannerOptions


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``facts``: 20,000 rows (``v`` 0 to 999, some null) over 200 keys; ``dim``: 200 keys, a month each."""
    root = tmp_path_factory.mktemp("scalar")
    n = 20_000
    facts = pa.table({
        "k": pa.array([i % 200 for i in range(n)], pa.int64()),
        "v": pa.array([None if i % 53 == 0 else (i * 7) % 1000 for i in range(n)], pa.int64()),
    })
    dim = pa.table({"dk": pa.array(range(200), pa.int64()), "month": pa.array([i % 24 for i in range(200)], pa.int64())})
    cust = pa.table({"ck": pa.array(range(2000), pa.int64()), "bal": pa.array([(i * 37) % 1000 - 100 for i in range(2000)], pa.int64())})
    bought = [k for k in ((i * 13) % 5000 for i in range(20_000)) if k % 4]  # no customer whose key is a multiple of 4
    buys = pa.table({"bk": pa.array(bought, pa.int64())})
    return write_halves(root, {"facts": facts, "dim": dim, "cust": cust, "buys": buys})


BETWEEN = (
    "select count(*) as n, sum(v) as s from facts join dim on k = dk"
    " where month between (select min(month) + 3 from dim) and (select min(month) + 5 from dim)"
)
MOVED = {
    "between two scalar subqueries": BETWEEN,
    "a comparison with an aggregate of the other table": (
        "select month, count(*) as n from facts join dim on k = dk where v > (select avg(v) from facts) group by month"
    ),
}
ANTI = (  # TPC-H Q22's shape: customers above an average balance who never bought, their buys reduced to them first
    "select count(*) as n, sum(bal) as s from cust"
    " where bal > (select avg(bal) from cust where bal > 0) and not exists (select 1 from buys where bk = ck)"
)
MOVED["below an anti join, onto its kept side"] = ANTI
KEPT = {
    "it reads both sides of the join": (
        "select count(*) as n from facts join dim on k = dk where v + month > (select max(v) from facts)"
    ),
    "nothing between it and its subplan": "select count(*) as n from dim where month > (select avg(month) from dim)",
}


def moved(text: str, catalog: flight.Catalog) -> list[str]:
    plan = plan_query(flight.sql(text, catalog).node, 2)
    return [r for r in plan.rewrites if "comparison with a one-row subquery" in r]


def scalar_joins_over_scans(node: Node) -> int:
    """Joins with a one-row side (their keys the rewrite's) whose other side is a scan (under projections,
    filters and other such joins), no join of the query between."""

    def scalar(n: Node) -> bool:
        return isinstance(n, JoinNode) and bool(n.left_keys) and n.left_keys[0].startswith("__scalar")

    count = 0
    for n in node.walk():
        if scalar(n):
            assert isinstance(n, JoinNode)
            below = list(n.left.walk())
            count += any(isinstance(b, FeedScanNode) for b in below) and not any(isinstance(b, JoinNode) and not scalar(b) for b in below)
    return count


@pytest.mark.parametrize("name", sorted(MOVED))
def test_the_comparison_lands_on_the_scan_it_compares(name: str, catalog: flight.Catalog) -> None:
    notes = moved(MOVED[name], catalog)
    assert notes and all("moved below the joins above it" in n for n in notes), notes
    plan = plan_query(flight.sql(MOVED[name], catalog).node, 2)
    assert sum(scalar_joins_over_scans(s.root) for s in plan.stages) >= len(notes)  # a probe side read twice holds it twice


@pytest.mark.parametrize("name", sorted(KEPT))
def test_the_comparison_stays(name: str, catalog: flight.Catalog) -> None:
    assert moved(KEPT[name], catalog) == []


def test_a_subquery_read_twice_is_one_stage(catalog: flight.Catalog) -> None:
    """Q22's probe side (customers kept by the comparison) is read a second time to reduce the anti join's build side
    (``semibuild``): the average it compares with is one stage, whose partial rows both reads finish."""
    plan = plan_query(flight.sql(ANTI, catalog).node, 2, PlannerOptions(small_query_bytes=0))
    assert any("first reduced to the keys the probe side has" in r for r in plan.rewrites), plan.rewrites
    assert any("computed once and read again (the same scalar subquery twice)" in r for r in plan.rewrites), plan.rewrites
    averages = [s for s in plan.stages if isinstance(s.root, AggregateNode) and not s.root.keys and s.output_mode == "broadcast"]
    assert len(averages) == 1 and averages[0].root.partial
    readers = [s for s in plan.stages if any(isinstance(n, ShuffleReadNode) and n.stage_id == averages[0].stage_id for n in s.root.walk())]
    assert len(readers) == 2  # the reducer's read of the customers and the anti join's


SHARED = (  # the average's partial stage: finished in each reader by branch a, read gathered by branch b, then c's again
    "select 'a' as w, count(*) as n from facts where v > (select avg(v) from facts)"
    " union all select 'b', avg(v) from facts"
    " union all select 'c', avg(k) from facts where v < (select avg(v) from facts)"
)


def test_a_stage_another_use_reads_is_not_dropped_for_an_equal_broadcast_one(
    catalog: flight.Catalog, con: duckdb.DuckDBPyConnection, cluster: flight.LocalCluster
) -> None:
    """Branch c's partial average equals branch a's (broadcast), but the stage it was handed is branch b's, read
    gathered: dropped, b read c's stage (an answer of c's for b's row)."""
    got = flight.DistributedExec(flight.sql(SHARED, catalog), cluster.urls, small_query_bytes=0).to_table()
    why = difference(got, duckdb_table(con, SHARED), ordered=False)
    assert why is None, why


@pytest.mark.parametrize("name", sorted(MOVED) + sorted(KEPT))
@pytest.mark.parametrize("spread", ["shuffled", "broadcast"])
def test_answers_on_workers_match_duckdb(
    name: str, spread: str, catalog: flight.Catalog, con: duckdb.DuckDBPyConnection, cluster: flight.LocalCluster
) -> None:
    text = {**MOVED, **KEPT}[name]
    options = {"broadcast_bytes": 0, "rows_per_task": 1, "small_query_bytes": 0} if spread == "shuffled" else {}
    got = flight.DistributedExec(flight.sql(text, catalog), cluster.urls, **options).to_table()
    why = difference(got, duckdb_table(con, text), ordered=False)
    assert why is None, f"{text}\n{why}"
