"""Semi and anti joins moved below the joins they filter (flight.planner.semijoin): plan shapes, and exact results.

Shapes, without sockets: TPC-H Q18's ``IN`` subquery lands directly on the orders scan and, through the join
on ``o_orderkey = l_orderkey``, on the lineitem scan (it sat above ``customer ⋈ orders ⋈ lineitem``, whose
~60 million rows at SF 10 crossed the network before it); an
anti join moves onto an outer join's preserved side only; a semi join whose keys come from both sides of
the join below, or that sits above an aggregate, stays; explain()'s rewrites say what moved.

Results: IN, NOT IN (null keys on both sides: SQL's three-valued ``NOT IN``), EXISTS and NOT EXISTS over
joins, on the session's two real workers with the plan forced into shuffles, against DuckDB.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import flight
from benchmarks.tpch_sql import SQL
from flight.plan.nodes import FeedScanNode, Node
from flight.plan.relnodes import JoinNode
from flight.planner.cut import plan_query
from flight.planner.optimize import push_filters
from flight.planner.semijoin import push_semi_joins
from flight.planner.stages import PlannerOptions

DISTRIBUTED = {"small_query_bytes": 0, "one_host_query_bytes": 0, "broadcast_bytes": 0, "rows_per_task": 1}


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Customers, orders and items with null keys and orders nobody placed; each table one Parquet file."""
    root = tmp_path_factory.mktemp("semijoin")
    data = {
        "customer": pa.table({"c_custkey": [1, 2, 3, 4, None], "c_name": ["a", "b", "c", "d", "e"]}),
        "orders": pa.table({"o_orderkey": [10, 11, 12, 13, 14, 15, None], "o_custkey": [1, 1, 2, 3, None, 9, 4],
                            "o_total": [5.0, 7.5, 1.0, 2.0, 3.0, 4.0, 8.0]}),
        "lineitem": pa.table({"l_orderkey": [10, 10, 11, 12, 12, 12, 13, None, 15, 99],
                              "l_quantity": [30, 40, 5, 100, 150, 90, 1, 60, 400, 7]}),
    }
    paths = {}
    for name, table in data.items():
        paths[name] = root / f"{name}.parquet"
        pq.write_table(table, paths[name])
    return paths


def catalog(tables: dict[str, Path]) -> flight.Catalog:
    return flight.Catalog({name: flight.read_parquet([str(p)]) for name, p in tables.items()})


def semi_joins(root: Node) -> list[JoinNode]:
    return [n for n in root.walk() if isinstance(n, JoinNode) and n.join_type in ("left semi", "left anti")]


def test_q18s_in_subquery_lands_on_the_orders_scan(tables: dict[str, Path]) -> None:
    cat = flight.Catalog({"customer": flight.read_parquet([str(tables["customer"])]), "orders": _q18_orders(tables),
                          "lineitem": flight.read_parquet([str(tables["lineitem"])])})
    root, notes = push_semi_joins(push_filters(flight.sql(SQL[18], cat).node))
    semis = semi_joins(root)
    # On orders, and, through the inner join on o_orderkey = l_orderkey, on lineitem too (on l_orderkey): its
    # build side is one scan's aggregate, cheap to compute twice.
    assert sorted(s.left_keys[0] for s in semis) == ["l_orderkey", "o_orderkey"], [s.label() for s in semis]
    assert all(isinstance(s.left, FeedScanNode) for s in semis), [s.left.label() for s in semis]
    assert len(notes) == 1 and "moved below HashJoin[inner" in notes[0] and "other side" in notes[0], notes
    plan = plan_query(flight.sql(SQL[18], cat).node, 2, PlannerOptions(small_query_bytes=0))
    assert any("moved below" in r for r in plan.rewrites), plan.rewrites


def test_one_task_moves_q18s_in_subquery_but_reads_its_build_side_once(tables: dict[str, Path]) -> None:
    cat = flight.Catalog({"customer": flight.read_parquet([str(tables["customer"])]), "orders": _q18_orders(tables),
                          "lineitem": flight.read_parquet([str(tables["lineitem"])])})
    root, notes = push_semi_joins(push_filters(flight.sql(SQL[18], cat).node), copies=False)
    assert [s.left_keys[0] for s in semi_joins(root)] == ["o_orderkey"]
    assert len(notes) == 1 and "other side" not in notes[0], notes
    for tasks, copies in ((1, 1), (2, 2)):  # split, the copy saves moving lineitem's rows; in one task it only reads
        plan = plan_query(flight.sql(SQL[18], cat).node, tasks, PlannerOptions(small_query_bytes=0))
        semis = [n for st in plan.stages for n in semi_joins(st.root) if n.left_keys[0] in ("o_orderkey", "l_orderkey")]
        assert len(semis) == copies, (tasks, [s.label() for s in semis])


def _q18_orders(tables: dict[str, Path]) -> flight.Query:
    """Q18's orders: the test's columns under TPC-H's names."""
    return flight.read_parquet([str(tables["orders"])]).select(
        o_orderkey=flight.col("o_orderkey"), o_custkey=flight.col("o_custkey"), o_totalprice=flight.col("o_total"),
        o_orderdate=flight.lit("2026-01-01"),
    )


@pytest.mark.parametrize(("text", "moves"), [
    ("select c_name, o_orderkey from customer join orders on c_custkey = o_custkey "
     "where o_orderkey in (select l_orderkey from lineitem)", True),
    ("select c_name, o_orderkey from customer left join orders on c_custkey = o_custkey "
     "where not exists (select 1 from lineitem where l_orderkey = c_custkey)", True),
    ("select c_name, o_orderkey from customer left join orders on c_custkey = o_custkey "
     "where o_orderkey in (select l_orderkey from lineitem)", False),  # onto the null-extended side: stays
    ("select o_custkey, count(*) as n from orders group by o_custkey "
     "having o_custkey in (select l_orderkey from lineitem)", False),  # above an aggregate: stays
], ids=["in-through-inner", "not-exists-onto-preserved", "not-onto-null-extended", "not-below-aggregate"])
def test_a_semi_join_moves_only_where_it_keeps_the_same_rows(tables: dict[str, Path], text: str, moves: bool) -> None:
    node = push_filters(flight.sql(text, catalog(tables)).node)
    _, notes = push_semi_joins(node)
    assert bool(notes) == moves, notes


@pytest.mark.parametrize(("build", "copied"), [
    ("select l_orderkey from lineitem where l_quantity > 50", True),
    ("select l_orderkey from lineitem group by l_orderkey having sum(l_quantity) > 50", True),
    ("select l_orderkey from lineitem", False),  # a bare scan's keys: nearly every key there is (TPC-DS q37, q82)
], ids=["filtered", "having", "bare-scan"])
def test_a_semi_join_is_copied_onto_the_joined_side_only_when_its_build_side_filters(
        tables: dict[str, Path], build: str, copied: bool) -> None:
    text = f"select c_name, o_orderkey from customer join orders on c_custkey = o_custkey where o_custkey in ({build})"
    root, notes = push_semi_joins(push_filters(flight.sql(text, catalog(tables)).node))
    assert len(notes) == 1 and ("other side, on c_custkey" in notes[0]) == copied, notes
    assert sorted(s.left_keys[0] for s in semi_joins(root)) == (["c_custkey", "o_custkey"] if copied else ["o_custkey"])


QUERIES = {
    "in": "select c_name, o_orderkey, o_total from customer join orders on c_custkey = o_custkey "
          "where o_orderkey in (select l_orderkey from lineitem group by l_orderkey having sum(l_quantity) > 50)",
    "in-copied": "select c_name, o_orderkey, o_total from customer join orders on c_custkey = o_custkey "
                 "where o_custkey in (select l_orderkey from lineitem where l_quantity > 50)",
    "not-in": "select c_name, o_orderkey from customer join orders on c_custkey = o_custkey "
              "where o_orderkey not in (select l_orderkey from lineitem where l_quantity < 100)",
    "not-in-no-null": "select c_name, o_orderkey from customer join orders on c_custkey = o_custkey "
                      "where o_orderkey not in (select l_orderkey from lineitem where l_orderkey is not null and l_quantity < 100)",
    "exists": "select c_name, o_orderkey from customer left join orders on c_custkey = o_custkey "
              "where exists (select 1 from lineitem where l_orderkey = o_orderkey and l_quantity > 50)",
    "not-exists": "select c_name, o_orderkey from customer left join orders on c_custkey = o_custkey "
                  "where not exists (select 1 from lineitem where l_orderkey = o_orderkey)",
    "not-exists-preserved": "select c_name, o_orderkey from customer left join orders on c_custkey = o_custkey "
                            "where not exists (select 1 from lineitem where l_orderkey - 9 = c_custkey)",
}


@pytest.mark.parametrize("split", [True, False], ids=["staged", "one-task"])
@pytest.mark.parametrize("name", list(QUERIES))
def test_moved_semi_and_anti_joins_answer_as_duckdb(name: str, split: bool, tables: dict[str, Path], cluster: flight.LocalCluster) -> None:
    text = QUERIES[name]
    got = flight.DistributedExec(flight.sql(text, catalog(tables)), cluster.urls, **(DISTRIBUTED if split else {})).to_table()
    con = duckdb.connect()
    try:
        for table, path in tables.items():
            con.execute(f"create view {table} as select * from read_parquet('{path}')")
        want = con.sql(text).to_arrow_table()
    finally:
        con.close()
    key = lambda r: tuple((v is None, v) for v in r.values())  # noqa: E731
    assert sorted(got.to_pylist(), key=key) == sorted(want.to_pylist(), key=key), name
