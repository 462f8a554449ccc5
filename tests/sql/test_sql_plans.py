"""The stages TPC-H's subquery queries plan to, asserted as shapes.

Every correlated subquery is a join (semi, anti, or inner with the condition beside its keys)
against an aggregate grouped by the correlation keys, computed once: never a per-row loop.
Planned for two workers that need not exist (planning talks to no worker).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support import tpch_test_files

import flight
from benchmarks.tpch_queries import TABLES
from benchmarks.tpch_sql import SQL
from flight.plan.relnodes import AggregateNode
from flight.planner.cut import plan_query
from flight.planner.stages import PlannerOptions

URLS = ["grpc://127.0.0.1:1", "grpc://127.0.0.1:2"]


@pytest.fixture(scope="module")
def catalog() -> flight.Catalog:
    files: dict[str, list[Path]] = tpch_test_files(0.1)
    return flight.Catalog({t: flight.read_parquet([str(p.resolve()) for p in files[t]]) for t in TABLES})


def plan(n: int, catalog: flight.Catalog) -> str:
    return flight.DistributedExec(flight.sql(SQL[n], catalog), URLS, small_query_bytes=0).explain()


SHAPES = {
    # Q2: the minimum supply cost per part, joined back on the part and the cost.
    # (Q2, Q17, Q20: the aggregate reads only the parts the outer query keeps, flight.planner.keysets.)
    2: [r"(Final)?Aggregate\[keys=\['ps_partkey'\]; .*min", r"HashJoin\[(left semi|inner), p_partkey=ps_partkey",
        r"Aggregate\[keys=\['ps_partkey'\]\] below .*reads only the 'p_partkey' values"],
    # Q17: the average quantity per part; a line is kept by a semi join whose condition compares with it.
    17: [r"FinalAggregate\[keys=\['l_partkey'\]", r"HashJoin\[left semi, p_partkey=l_partkey, filter=\(.*l_quantity",
         r"Aggregate\[keys=\['l_partkey'\]\] below .*reads only the 'p_partkey' values"],
    # Q20: half the shipped quantity per (part, supplier), then parts named 'forest%', as semi joins.
    20: [r"Aggregate\[keys=\['l_partkey', 'l_suppkey'\]", r"HashJoin\[left semi, ps_partkey=l_partkey, ps_suppkey=l_suppkey, filter=",
         r"HashJoin\[left semi, (s_suppkey|ps_suppkey)", r"Aggregate\[keys=\['l_partkey', 'l_suppkey'\]\] below .*reads only the 'p_partkey'"],
    # Q21: EXISTS and NOT EXISTS on the same order with another supplier: a semi and an anti join with conditions.
    21: [r"HashJoin\[left semi, l_orderkey=l_orderkey___?\d+, filter=", r"HashJoin\[left anti, l_orderkey=l_orderkey___?\d+, filter="],
    # Q22: the average balance once (a global aggregate, broadcast), customers without orders by an anti join, the
    # comparison with the average moved onto the scan of customers below it (flight.planner.scalar).
    22: [r"FinalAggregate\[keys=\[\]", r"HashJoin\[left anti, c_custkey=o_custkey",
         r"HashJoin\[inner, __scalar\d+_one=__scalar\d+___key\d+, filter=\(.*c_acctbal"],
}


def test_joins_and_aggregates_by_the_order_key_stay_in_one_co_located_stage(catalog: flight.Catalog) -> None:
    """Q21's EXISTS and NOT EXISTS on lineitem run in the tasks that already split orders and lineitem
    by order key (flight/planner/place.py): one leaf stage reading no other stage, then the head. Q18's
    lines grouped by order key, used by the semi joins on both orders and lineitem, are grouped once, in
    key ranges too, and broadcast into the co-located join of orders and lineitem (cut.py, ``shared``)."""
    ex = flight.DistributedExec(flight.sql(SQL[21], catalog), URLS, small_query_bytes=0)
    leaves = [s for s in ex.plan.stages if s.feeds]
    assert len(leaves) == 1 and leaves[0].task_roots is not None and not leaves[0].reads, ex.explain()
    assert len(ex.plan.stages) == 2, ex.explain()
    ex = flight.DistributedExec(flight.sql(SQL[18], catalog), URLS, small_query_bytes=0)
    once, joined = [s for s in ex.plan.stages if s.feeds]
    assert once.task_roots is not None and not once.reads and once.output_mode == "broadcast", ex.explain()
    assert joined.task_roots is not None and {r.stage_id for r in joined.reads} == {once.stage_id}, ex.explain()
    grouped = [a for s in ex.plan.stages for a in s.root.walk() if isinstance(a, AggregateNode) and a.keys == ["l_orderkey"]]
    assert len(grouped) == 1, ex.explain()
    assert len(ex.plan.stages) == 3, ex.explain()


def test_an_aggregate_over_rows_already_hashed_on_its_keys_is_not_shuffled_again(catalog: flight.Catalog) -> None:
    """Q13 groups by the key its left join was shuffled on; Q16's COUNT(DISTINCT) is a distinct
    by four keys under a count by three of them, so the distinct is shuffled on the three (on the
    two of them that are strings: its filter keeps 8 sizes, flight/planner/colocate.py's spread_keys):
    in both, the upper aggregate runs where its rows are (no partial aggregate, no second shuffle)."""
    shuffled = PlannerOptions(broadcast_bytes=0, rows_per_task=1)  # Q13's join shuffled into two tasks at this size too
    for n, keys, hashed, options in ((13, ["c_custkey"], ["c_custkey"], shuffled),
                                     (16, ["p_brand", "p_type", "p_size"], ["p_brand", "p_type"], PlannerOptions(rows_per_task=1))):
        plan = plan_query(flight.sql(SQL[n], catalog).node, 2, options)
        assert any(f"hash-partitioned on {hashed}" in r for r in plan.rewrites), plan.rewrites
        finals = [a.keys for s in plan.stages for a in s.root.walk() if isinstance(a, AggregateNode) and a.label_text.startswith("Final")]
        assert keys not in finals, finals  # no partial and final split of it, so no shuffle between


@pytest.mark.parametrize("n", sorted(SHAPES), ids=lambda n: f"q{n}")
def test_subqueries_plan_as_joins(n: int, catalog: flight.Catalog) -> None:
    text = plan(n, catalog)
    for shape in SHAPES[n]:
        assert re.search(shape, text), f"Q{n}: no {shape!r} in\n{text}"
    stages = len(re.findall(r"^Stage \d+", text, flags=re.M))
    assert stages <= 12, f"Q{n}: {stages} stages\n{text}"


def test_explain_shows_the_optimized_logical_plan(catalog: flight.Catalog) -> None:
    """Where each filter went, the join order, the decorrelated subqueries: DataFusion's plan first."""
    text = flight.sql(SQL[17], catalog).explain()
    assert text.startswith("SQL logical plan (DataFusion, optimized):")
    assert "LeftSemi Join: part.p_partkey = __scalar_sq_1.l_partkey Filter:" in text
    assert "Filter: part.p_brand = " in text  # pushed to the scan of part
    assert "\nPlan:\n" in text


def test_distributed_explain_starts_with_the_logical_plan(catalog: flight.Catalog) -> None:
    text = plan(21, catalog)
    assert text.startswith("SQL logical plan (DataFusion, optimized):")
    assert text.index("LeftAnti Join") < text.index("Stage ")
