"""The optimizer's rewrites (flight.planner.optimize, flight.planner.cut): plan shapes, and exact results.

Shapes: filters end directly above the scans, through projects (renamed), joins
(onto the sides the join type allows, suffixed names mapped back), sorts,
unions and grouped aggregates; a disjunction of conjunctions above a join gives
each side its implied filter, and nothing to a side some disjunct says nothing
about; a semi / anti join's build side is a partial distinct of its keys; an
inner or outer join builds on the smaller estimated side; ``explain()`` says
what moved where.

Results: every rewrite is checked on a real two-worker cluster (one task, and
two tasks with shuffle and broadcast joins) against DuckDB running the
equivalent SQL, with null keys, null values, duplicate keys, left outer joins
(a filter on the right side must stay above), semi and anti joins. Seeded
random predicates (``OR`` of ``AND`` of comparisons, null tests, ``isin``,
cross-side comparisons) over every join type check the same against DuckDB:
many in one process (``run_local`` plans with the same optimizer), fewer on
the cluster, and the derivation itself is checked to be implied by the
original predicate on random rows.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support import Data
from support import run_setup as run
from support import table_rows as rows
from support import write_parts as _write

import flight
from flight import agg, col, lit
from flight.compute.expressions import to_pyarrow
from flight.plan.agg import Agg
from flight.plan.nodes import FeedScanNode, FilterNode, Node, ProjectNode
from flight.plan.relnodes import AggregateNode, JoinNode, ShuffleReadNode
from flight.planner.cut import plan_query
from flight.planner.optimize import conjuncts, derive_side_filter, disjuncts, push_filters
from flight.planner.stages import PlannerOptions, QueryPlan
from flight.sources.providers import FileListProvider

# (id, workers, DistributedExec options)
ONE = ("1w", 1, {})
SHUFFLE = ("2w-shuffle", 2, {"rows_per_task": 1, "broadcast_bytes": 0, "small_query_bytes": 0})
BROADCAST = ("2w-broadcast", 2, {"rows_per_task": 1, "broadcast_bytes": 1 << 30, "small_query_bytes": 0})  # the data is small
SETUPS = [pytest.param(s, id=s[0]) for s in (ONE, SHUFFLE, BROADCAST)]

L_COLUMNS = ["id", "k", "s", "x", "v"]
R_COLUMNS = ["rid", "rk", "s", "x", "n"]


# --------------------------------------------------------------------------- data


def _left(n: int = 500) -> pa.Table:
    """Keys with nulls and duplicates; ``s`` and ``x`` exist on both sides (the right's get ``_right``)."""
    return pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "k": pa.array([None if i % 11 == 0 else (i * 7) % 120 for i in range(n)], pa.int64()),
            "s": pa.array([None if i % 9 == 0 else f"s{i % 5}" for i in range(n)], pa.string()),
            "x": pa.array([f"l{i % 40}" for i in range(n)], pa.string()),
            "v": pa.array([None if i % 10 == 3 else (i * 13) % 100 for i in range(n)], pa.int64()),
        }
    )


def _right(n: int = 300) -> pa.Table:
    """Keys 60..179 (half overlap the left's 0..119), some null; ``n`` with nulls."""
    return pa.table(
        {
            "rid": pa.array(range(n), pa.int64()),
            "rk": pa.array([None if i % 13 == 0 else 60 + (i * 11) % 120 for i in range(n)], pa.int64()),
            "s": pa.array([None if i % 7 == 0 else f"s{i % 4}" for i in range(n)], pa.string()),
            "x": pa.array([f"r{i % 30}" for i in range(n)], pa.string()),
            "n": pa.array([None if i % 6 == 0 else (i * 17) % 100 for i in range(n)], pa.int64()),
        }
    )


def _big(n: int = 20_000) -> pa.Table:
    """A build side 40 times the left's rows: keys 0..299 (a third of them the left's), duplicated, some null."""
    return pa.table(
        {
            "bk": pa.array([None if i % 17 == 0 else (i * 31) % 300 for i in range(n)], pa.int64()),
            "w": pa.array([(i * 7) % 100 for i in range(n)], pa.int64()),
        }
    )


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Data]:
    root = tmp_path_factory.mktemp("optimize")
    paths = {"L": _write(_left(), root, "L", 4), "R": _write(_right(), root, "R", 3), "B": _write(_big(), root, "B", 4)}
    con = duckdb.connect()
    for name, files in paths.items():
        con.register(name, pa.concat_tables(pq.read_table(p) for p in files))
    yield Data(paths, con)
    con.close()


# ------------------------------------------------------------------------ helpers


def plan(q: flight.Query, tasks: int = 2, **options: int) -> QueryPlan:
    return plan_query(q.node, tasks, PlannerOptions(**options))


def nodes(p: QueryPlan | Node, kind: type) -> list:
    roots = [s.root for s in p.stages] if isinstance(p, QueryPlan) else [p]
    return [n for r in roots for n in r.walk() if isinstance(n, kind)]


def scan_filter(p: QueryPlan | Node, column: str) -> FilterNode:
    """The filter directly above the scan that reads ``column``."""
    found = [f for f in nodes(p, FilterNode) if isinstance(f.input, FeedScanNode) and column in f.input.schema.names]
    assert len(found) == 1, f"no single filter directly above the scan of {column!r}:\n{_text(p)}"
    return found[0]


def _text(p: QueryPlan | Node) -> str:
    roots = [s.root for s in p.stages] if isinstance(p, QueryPlan) else [p]
    return "\n".join(line for r in roots for line in r.explain_lines())


def has_term(f: FilterNode, expr: flight.Expr) -> bool:
    return any(t.equals(expr) for t in conjuncts(f.predicate))


def filters_reading(p: QueryPlan | Node, column: str) -> list[FilterNode]:
    return [f for f in nodes(p, FilterNode) if column in f.predicate.referenced_fields()]




def _key(row: tuple) -> tuple:
    return tuple((0, 0) if v is None else (1, round(v, 6) if isinstance(v, float) else v) for v in row)


def assert_rows(got: pa.Table, expected: list[tuple]) -> None:
    a, b = sorted(rows(got), key=_key), sorted(expected, key=_key)
    assert len(a) == len(b), f"{len(a)} rows, DuckDB has {len(b)}"
    for i, (r, e) in enumerate(zip(a, b)):
        same = all(
            (x is None and y is None) or (x is not None and y is not None and (math.isclose(x, y) if isinstance(x, float) else x == y))
            for x, y in zip(r, e)
        )
        assert same, f"row {i}: got {r}, DuckDB {e}"


JOINED = "l.id, l.k, l.s, l.x, l.v, r.rid, r.rk, r.s, r.x, r.n"
JOINED_NAMES = ["id", "k", "s", "x", "v", "rid", "rk", "s_right", "x_right", "n"]
_SQL_JOIN = {"inner": "JOIN", "left": "LEFT JOIN", "right": "RIGHT JOIN", "full": "FULL OUTER JOIN"}


def join_sql(how: str, where: str) -> str:
    if how in ("semi", "anti"):
        exists = "EXISTS" if how == "semi" else "NOT EXISTS"
        return f"SELECT l.id, l.k, l.s, l.x, l.v FROM L l WHERE {exists} (SELECT 1 FROM R r WHERE r.rk = l.k) AND ({where})"
    return f"SELECT {JOINED} FROM L l {_SQL_JOIN[how]} R r ON l.k = r.rk WHERE {where}"


# ---------------------------------------------------------------- plan shapes


def test_filter_above_a_select_lands_on_the_scan_renamed(data: Data) -> None:
    q = data.read("L").select("id", key="k", value="v").filter((col("key") > 5) & (col("value") < 50))
    p = plan(q, tasks=1)
    f = scan_filter(p, "k")
    assert f.predicate.referenced_fields() == {"k", "v"}  # read by the scan's own names
    assert isinstance(p.head.root, ProjectNode) and p.head.root.input is f
    assert not f.origins  # moving through a project is not worth a note


def test_filter_on_a_computed_column_stays_above_its_project(data: Data) -> None:
    q = data.read("L").select("id", double=col("v") * 2).filter((col("double") > 10) & (col("id") > 3))
    p = plan(q, tasks=1)
    assert has_term(scan_filter(p, "id"), col("id") > 3)
    (top,) = filters_reading(p, "double")
    assert isinstance(top.input, ProjectNode)


def test_conjunction_above_an_inner_join_is_split_per_side(data: Data) -> None:
    left_term, right_term = col("v") > 10, col("n") < 50
    mixed = col("v") < col("n")
    q = data.read("L").join(data.read("R"), left_on="k", right_on="rk").filter(left_term & right_term & mixed)
    p = plan(q)
    assert has_term(scan_filter(p, "v"), left_term)
    assert has_term(scan_filter(p, "n"), right_term)
    (above,) = [f for f in nodes(p, FilterNode) if f.predicate.equals(mixed)]
    assert isinstance(above.input, (JoinNode, ProjectNode))  # a project when the planner swapped the sides
    assert "pushed below HashJoin[inner, k=rk]" in scan_filter(p, "v").label()


def test_suffixed_right_columns_go_to_the_right_side_by_their_own_name(data: Data) -> None:
    q = data.read("L").join(data.read("R"), left_on="k", right_on="rk").filter((col("s_right") == "s1") & (col("s") == "s2"))
    p = plan(q)
    right = scan_filter(p, "rid")
    left = scan_filter(p, "id")
    assert right.predicate.equals(col("s") == "s1") and left.predicate.equals(col("s") == "s2")


def test_custom_suffix_maps_back_to_the_right_sides_names(data: Data) -> None:
    right = data.read("R").select("rid", "rk", "s", x_r="x")  # "s" gets the suffix "_r"; "x_r" is the right's own name
    q = data.read("L").join(right, left_on="k", right_on="rk", suffix="_r").filter((col("s_r") == "s1") & (col("x_r") == "r2"))
    p = plan(q, tasks=1)
    assert scan_filter(p, "rid").predicate.equals((col("s") == "s1") & (col("x") == "r2"))
    assert not [f for f in nodes(p, FilterNode) if isinstance(f.input, FeedScanNode) and "id" in f.input.schema.names]


def test_or_of_ands_gives_each_side_its_implied_filter(data: Data) -> None:
    """The Q19 pattern: each side gets OR_i (its own terms of disjunct i); the original stays above."""
    pred = (
        ((col("s") == "s1") & (col("v") < 30) & (col("n") > 10))
        | ((col("s") == "s2") & (col("x_right") == "r3"))
        | ((col("v") > 70) & (col("n").is_null()) & (col("k") == col("rk")))
    )
    q = data.read("L").join(data.read("R"), left_on="k", right_on="rk").filter(pred)
    p = plan(q)
    left = scan_filter(p, "id")
    right = scan_filter(p, "rid")
    expected_left = ((col("s") == "s1") & (col("v") < 30)) | (col("s") == "s2") | (col("v") > 70)
    expected_right = (col("n") > 10) | (col("x") == "r3") | col("n").is_null()
    assert left.predicate.equals(expected_left), repr(left.predicate)
    assert right.predicate.equals(expected_right), repr(right.predicate)
    assert left.origins == ("derived from the OR above HashJoin[inner, k=rk]",)
    (original,) = [f for f in nodes(p, FilterNode) if f.predicate.equals(pred)]
    assert not isinstance(original.input, FeedScanNode)


def test_a_disjunct_without_a_term_for_a_side_derives_nothing_for_it(data: Data) -> None:
    pred = ((col("v") < 30) & (col("n") > 10)) | (col("v") > 70)  # the second disjunct says nothing about R
    q = data.read("L").join(data.read("R"), left_on="k", right_on="rk").filter(pred)
    p = plan(q)
    assert scan_filter(p, "id").predicate.equals((col("v") < 30) | (col("v") > 70))
    assert not [f for f in nodes(p, FilterNode) if isinstance(f.input, FeedScanNode) and "rid" in f.input.schema.names]
    assert derive_side_filter(pred, {"n", "rid", "rk"}) is None


def test_left_outer_join_keeps_right_side_filters_above(data: Data) -> None:
    pred = (col("v") > 10) & (col("n") > 50) & (col("n").is_null() | (col("rid") < 5))
    q = data.read("L").join(data.read("R"), left_on="k", right_on="rk", how="left").filter(pred)
    p = plan(q)
    assert scan_filter(p, "id").predicate.equals(col("v") > 10)
    assert not [f for f in nodes(p, FilterNode) if isinstance(f.input, FeedScanNode) and "rid" in f.input.schema.names]
    (above,) = filters_reading(p, "n")
    assert has_term(above, col("n") > 50) and has_term(above, col("n").is_null() | (col("rid") < 5))
    assert isinstance(above.input, (JoinNode, ProjectNode))


def test_left_outer_join_derives_only_for_the_left_side(data: Data) -> None:
    pred = ((col("v") < 30) & (col("n") > 10)) | ((col("v") > 70) & (col("n") < 5))
    q = data.read("L").join(data.read("R"), left_on="k", right_on="rk", how="left").filter(pred)
    p = plan(q)
    assert scan_filter(p, "id").predicate.equals((col("v") < 30) | (col("v") > 70))
    assert not [f for f in nodes(p, FilterNode) if isinstance(f.input, FeedScanNode) and "rid" in f.input.schema.names]


def test_right_and_full_outer_joins(data: Data) -> None:
    base = data.read("L").join(data.read("R"), left_on="k", right_on="rk", how="right")
    p = plan(base.filter((col("v") > 10) & (col("n") > 10)))
    assert scan_filter(p, "rid").predicate.equals(col("n") > 10)
    assert not [f for f in nodes(p, FilterNode) if isinstance(f.input, FeedScanNode) and "id" in f.input.schema.names]
    full = data.read("L").join(data.read("R"), left_on="k", right_on="rk", how="full")
    p = plan(full.filter((col("v") > 10) & (col("n") > 10)))
    assert not [f for f in nodes(p, FilterNode) if isinstance(f.input, FeedScanNode)]


@pytest.mark.parametrize("how", ["semi", "anti"])
def test_semi_and_anti_joins_filter_their_left_side_and_send_distinct_keys(data: Data, how: str) -> None:
    q = data.read("L").join(data.read("R").filter(col("n") > 5), left_on="k", right_on="rk", how=how).filter(col("v") > 10)
    p = plan(q, broadcast_bytes=0)
    assert scan_filter(p, "id").predicate.equals(col("v") > 10)
    (join,) = nodes(p, JoinNode)
    assert join.strategy == "shuffle"
    build = p.stage(join.right.stage_id).root  # type: ignore[attr-defined]
    assert isinstance(build, AggregateNode) and build.partial and build.keys == ["rk"] and not build.calls
    assert any("reduced to its distinct keys ['rk']" in r for r in p.rewrites)
    # Broadcast: the same distinct before the broadcast.
    p = plan(q, broadcast_bytes=1 << 30)
    (join,) = nodes(p, JoinNode)
    assert join.strategy == "broadcast"
    build = p.stage(join.right.stage_id).root  # type: ignore[attr-defined]
    assert isinstance(build, AggregateNode) and build.partial
    # One task: no network, no distinct.
    assert not nodes(plan(q, tasks=1), AggregateNode)


def test_filter_on_group_keys_goes_below_the_aggregate_others_stay(data: Data) -> None:
    q = data.read("L").aggregate(["k", "s"], total=agg.sum("v")).filter((col("k") > 10) & (col("total") > 100))
    p = plan(q, tasks=1)
    assert scan_filter(p, "k").predicate.equals(col("k") > 10)
    (above,) = filters_reading(p, "total")
    assert above.predicate.equals(col("total") > 100)
    # A global aggregate keeps its filter above (an empty input still makes one row).
    q = data.read("L").aggregate(total=agg.sum("v")).filter(lit(True) & (col("total") > 100))
    assert not [f for f in nodes(plan(q, tasks=1), FilterNode) if isinstance(f.input, FeedScanNode)]


def test_filter_does_not_cross_a_limit_but_crosses_a_sort_and_a_union(data: Data) -> None:
    limited = data.read("L").limit(10).filter(col("v") > 10)
    p = plan(limited, tasks=1)
    assert not [f for f in nodes(p, FilterNode) if isinstance(f.input, FeedScanNode)]
    sorted_q = data.read("L").sort("v").filter(col("v") > 10)
    assert scan_filter(plan(sorted_q, tasks=1), "v").predicate.equals(col("v") > 10)
    unioned = data.read("L").union(data.read("L")).filter(col("v") > 10)
    scans = [f for f in nodes(plan(unioned, tasks=1), FilterNode) if isinstance(f.input, FeedScanNode)]
    assert len(scans) == 2


def test_pushing_twice_changes_nothing(data: Data) -> None:
    pred = ((col("s") == "s1") & (col("n") > 10)) | ((col("v") > 70) & (col("n") < 5))
    q = data.read("L").join(data.read("R"), left_on="k", right_on="rk").filter(pred & (col("v") < 90))
    once = push_filters(q.node)
    twice = push_filters(once)
    assert _text(once) == _text(twice)


def test_inner_join_builds_on_the_smaller_side_in_the_query_column_order(data: Data) -> None:
    small = data.read("L").filter(col("id") < 5).select("id", "k")
    big = data.read("R").select("rid", "rk", "n")
    q = small.join(big, left_on="k", right_on="rk")
    p = plan(q, broadcast_bytes=0)
    (join,) = nodes(p, JoinNode)
    assert join.strategy == "shuffle, sides swapped" and join.left_keys == ["rk"]
    assert p.head.root.schema.names == ["id", "k", "rid", "rk", "n"]
    assert any("sides swapped" in r for r in p.rewrites)
    (join,) = nodes(plan(q, tasks=1), JoinNode)
    assert join.strategy == "local, sides swapped"
    # A left outer join swaps into a right outer one; names clashing across the sides keep it as written.
    p = plan(small.join(big, left_on="k", right_on="rk", how="left"), broadcast_bytes=0)
    (join,) = nodes(p, JoinNode)
    assert join.join_type == "right outer" and "sides swapped" in join.strategy
    p = plan(data.read("L").filter(col("id") < 5).join(data.read("R"), left_on="k", right_on="rk"), broadcast_bytes=0)
    (join,) = nodes(p, JoinNode)
    assert join.strategy == "shuffle"


def test_tpch_q19_and_q4_plans() -> None:
    from support import tpch_test_files

    from benchmarks.tpch_queries import query

    files = tpch_test_files(0.05)
    p = plan(query(19, files))
    lineitem = scan_filter(p, "l_quantity")
    part = scan_filter(p, "p_brand")
    assert "derived from the OR above HashJoin[inner, l_partkey=p_partkey]" in lineitem.label()
    assert len(disjuncts(conjuncts(lineitem.predicate)[-1])) == 3  # the quantity ranges
    assert len(disjuncts(part.predicate)) == 3 and part.predicate.referenced_fields() == {"p_brand", "p_container", "p_size"}
    (join,) = nodes(p, JoinNode)
    assert join.join_type == "inner"
    # Footers that bound both order keys: one co-located semi join, each task one key range of both sides.
    (join,) = nodes(plan(query(4, files), broadcast_bytes=0), JoinNode)
    assert join.join_type == "left semi" and join.strategy == "co-located"
    # Otherwise the build side's distinct keys are shuffled.
    p = plan_query(query(4, files).node, 2, PlannerOptions(broadcast_bytes=0), colocate=False)
    (join,) = nodes(p, JoinNode)
    assert join.join_type == "left semi" and isinstance(join.right, ShuffleReadNode)
    build = p.stage(join.right.stage_id).root
    assert isinstance(build, AggregateNode) and build.partial and build.keys == ["l_orderkey"]
    assert isinstance(scan_filter(p, "l_commitdate").input, FeedScanNode)


def test_explain_shows_what_moved_where(cluster: flight.LocalCluster, data: Data) -> None:
    pred = ((col("v") < 30) & (col("n") > 10)) | ((col("v") > 70) & (col("n") < 5))
    q = data.read("L").join(data.read("R"), left_on="k", right_on="rk").filter(pred & (col("s") == "s1"))
    ex = flight.DistributedExec(q, cluster.resolver(), broadcast_bytes=0, small_query_bytes=0)
    text = ex.explain()
    assert text.startswith("Plan rewrites:\n")
    assert "  - stage 0: filter on ['v'] derived from the OR above HashJoin[inner, k=rk]; now directly above the scan of" in text
    assert "  - stage 0: filter on ['s'] pushed below HashJoin[inner, k=rk]; now directly above the scan of" in text
    assert "  - stage 1: filter on ['n'] derived from the OR above HashJoin[inner, k=rk]; now directly above the scan of" in text
    assert "  <- conjunct 1 derived from the OR above HashJoin[inner, k=rk]; conjunct 2 pushed below HashJoin[inner, k=rk]" in text
    assert "Filter[((col(\"n\") > 10) | (col(\"n\") < 5))]  <- derived from the OR above HashJoin[inner, k=rk]" in text
    got = ex.to_table()
    where = "((l.v < 30 AND r.n > 10) OR (l.v > 70 AND r.n < 5)) AND l.s = 's1'"
    assert_rows(got, data.sql(join_sql("inner", where)))


def test_explain_without_rewrites_has_no_rewrite_block(cluster: flight.LocalCluster, data: Data) -> None:
    ex = flight.DistributedExec(data.read("L").filter(col("v") > 3), cluster.resolver(), small_query_bytes=0)
    assert "Plan rewrites" not in ex.explain() and "<-" not in ex.explain()


# ---------------------------------------------------- exact results on workers


CASES = {
    # name: (how, builder predicate, SQL predicate)
    "inner-split": ("inner", (col("v") > 20) & (col("n") < 60) & (col("s") != col("s_right")), "l.v > 20 AND r.n < 60 AND l.s <> r.s"),
    "inner-or-of-ands": (
        "inner",
        ((col("s") == "s1") & (col("v") < 40) & (col("n") > 10))
        | ((col("s") == "s3") & (col("x_right").isin(["r1", "r2", "r3", "r4"])))
        | ((col("v") > 80) & col("n").is_null()),
        (
            "(l.s = 's1' AND l.v < 40 AND r.n > 10) OR (l.s = 's3' AND coalesce(r.x IN ('r1', 'r2', 'r3', 'r4'), false)) "
            "OR (l.v > 80 AND r.n IS NULL)"
        ),
    ),
    "inner-or-missing-side": (
        "inner",
        ((col("v") < 30) & (col("n") > 10)) | (col("v") > 70),
        "(l.v < 30 AND r.n > 10) OR l.v > 70",
    ),
    "left-right-side-filter": ("left", (col("n") > 50) & (col("v") > 10), "r.n > 50 AND l.v > 10"),
    "left-right-is-null": ("left", col("rid").is_null() & (col("v") < 80), "r.rid IS NULL AND l.v < 80"),
    "left-or-of-ands": (
        "left",
        ((col("v") < 30) & col("n").is_null()) | ((col("v") > 70) & (col("n") < 50)),
        "(l.v < 30 AND r.n IS NULL) OR (l.v > 70 AND r.n < 50)",
    ),
    "right-both-sides": ("right", (col("v") > 10) & (col("n") > 10), "l.v > 10 AND r.n > 10"),
    "full-both-sides": ("full", (col("v") > 10) | (col("n") > 90), "l.v > 10 OR r.n > 90"),
    "semi": ("semi", (col("v") > 10) & col("s").is_not_null(), "l.v > 10 AND l.s IS NOT NULL"),
    "anti": ("anti", (col("v") > 10) | col("k").is_null(), "l.v > 10 OR l.k IS NULL"),
}


@pytest.mark.parametrize("setup", SETUPS)
@pytest.mark.parametrize("case", CASES)
def test_filtered_joins_match_duckdb(cluster: flight.LocalCluster, data: Data, case: str, setup: tuple) -> None:
    how, pred, where = CASES[case]
    q = data.read("L").join(data.read("R"), left_on="k", right_on="rk", how=how).filter(pred)
    got, ex = run(cluster, setup, q)
    expected = data.sql(join_sql(how, where))
    assert expected, "the case should keep some rows"
    assert_rows(got, expected)
    if how == "left":  # the right side of a left outer join is never filtered below it
        assert not [f for f in nodes(ex.plan, FilterNode) if isinstance(f.input, FeedScanNode) and "rid" in f.input.schema.names]


@pytest.mark.parametrize("setup", SETUPS)
@pytest.mark.parametrize("how", ["semi", "anti"])
def test_semi_anti_join_with_duplicate_and_null_build_keys(cluster: flight.LocalCluster, data: Data, how: str, setup: tuple) -> None:
    right = data.read("R").filter(col("n") > 20).union(data.read("R").filter(col("n") > 40))  # every key several times
    q = data.read("L").join(right, left_on="k", right_on="rk", how=how).filter(col("v") < 90)
    got, ex = run(cluster, setup, q)
    exists = "EXISTS" if how == "semi" else "NOT EXISTS"
    sql = f"SELECT l.* FROM L l WHERE l.v < 90 AND {exists} (SELECT 1 FROM R r WHERE r.n > 20 AND r.rk = l.k)"
    assert_rows(got, data.sql(sql))
    if setup[1] > 1:
        assert any(isinstance(s.root, AggregateNode) and s.root.partial and not s.root.calls for s in ex.stages)


REDUCED = "the build side is first reduced to the keys the probe side has"


class OnceOnly(FileListProvider):
    """Files whose second read might differ (as a paginated API's would): not repeatable."""

    repeatable = False


def _unbounded_build(data: Data) -> flight.Query:
    """B's rows with their key computed: no footer bounds how many distinct keys it holds."""
    return data.read("B").filter(col("w") > 5).with_columns(bk=col("bk") + 0)


@pytest.mark.parametrize("how", ["semi", "anti"])
def test_a_much_larger_build_side_is_first_reduced_to_the_probe_sides_keys(data: Data, how: str) -> None:
    q = data.read("L").filter(col("v") < 90).join(_unbounded_build(data), left_on="k", right_on="bk", how=how)
    p = plan(q, broadcast_bytes=1 << 30)
    assert any(REDUCED in r for r in p.rewrites), p.rewrites
    outer = next(j for j in nodes(p, JoinNode) if j.join_type == f"left {how}" and "id" in j.schema.names)
    build = p.stage(outer.right.stage_id).root  # type: ignore[attr-defined]
    assert isinstance(build, AggregateNode) and build.partial and build.keys == ["bk"]
    (reducer,) = [j for j in nodes(p, JoinNode) if j is not outer]
    assert reducer.join_type == "left semi" and reducer.left_keys == ["bk"] and reducer.right_keys == ["k"]
    # Not when the probe side's feed may change between two reads, nor when the sides are alike.
    once = flight.read_parquet(OnceOnly(data.paths["L"]), schema=data.read("L").schema).filter(col("v") < 90)
    assert not any(REDUCED in r for r in plan(once.join(_unbounded_build(data), left_on="k", right_on="bk", how=how)).rewrites)
    alike = data.read("L").join(data.read("R"), left_on="k", right_on="rk", how=how)
    assert not any(REDUCED in r for r in plan(alike, broadcast_bytes=1 << 30).rewrites)


@pytest.mark.parametrize("how", ["semi", "anti"])
def test_a_build_side_whose_footers_bound_its_keys_to_few_is_not_reduced(data: Data, how: str) -> None:
    # B's 20,000 rows hold keys 0..299 by its footers: no more distinct keys than the probe side
    # has rows (TPC-H Q22's orders, at most 150,000 customer keys): a second read would not pay.
    q = data.read("L").filter(col("v") < 90).join(data.read("B").filter(col("w") > 5), left_on="k", right_on="bk", how=how)
    p = plan(q, broadcast_bytes=1 << 30)
    assert not any(REDUCED in r for r in p.rewrites), p.rewrites
    assert any("reduced to its distinct keys ['bk']" in r for r in p.rewrites), p.rewrites


@pytest.mark.parametrize("setup", [pytest.param(SHUFFLE, id=SHUFFLE[0]), pytest.param(BROADCAST, id=BROADCAST[0])])
@pytest.mark.parametrize("how", ["semi", "anti"])
def test_reduced_semi_and_anti_joins_match_duckdb(cluster: flight.LocalCluster, data: Data, how: str, setup: tuple) -> None:
    q = data.read("L").filter(col("v") < 90).join(_unbounded_build(data), left_on="k", right_on="bk", how=how)
    got, ex = run(cluster, setup, q)
    exists = "EXISTS" if how == "semi" else "NOT EXISTS"
    assert_rows(got, data.sql(f"SELECT l.* FROM L l WHERE l.v < 90 AND {exists} (SELECT 1 FROM B b WHERE b.w > 5 AND b.bk = l.k)"))
    # Reducing broadcasts the probe side's keys: not with broadcasts off (the shuffle setup).
    assert any(REDUCED in r for r in ex.plan.rewrites) == (setup is BROADCAST)


@pytest.mark.parametrize("setup", SETUPS)
def test_swapped_joins_keep_names_order_and_rows(cluster: flight.LocalCluster, data: Data, setup: tuple) -> None:
    small = data.read("L").filter(col("id") < 40).select("id", "k", "v")
    big = data.read("R").select("rid", "rk", "n")
    for how in ("inner", "left", "right", "full"):
        q = small.join(big, left_on="k", right_on="rk", how=how)
        got, _ = run(cluster, setup, q)
        assert got.column_names == ["id", "k", "v", "rid", "rk", "n"]
        sql = f"SELECT l.id, l.k, l.v, r.rid, r.rk, r.n FROM (SELECT * FROM L WHERE id < 40) l {_SQL_JOIN[how]} R r ON l.k = r.rk"
        assert_rows(got, data.sql(sql))


@pytest.mark.parametrize("setup", SETUPS)
def test_filters_through_renames_aggregates_and_on_joins(cluster: flight.LocalCluster, data: Data, setup: tuple) -> None:
    per_key = data.read("R").aggregate(["rk"], total=agg.sum("n"), rows=agg.count_all()).select(k="rk", total="total", rows="rows")
    q = (
        data.read("L").select("id", "k", "s", value="v")
        .join(per_key, on="k")
        .filter((col("k") > 70) & (col("value") < 60) & ((col("total") > 100) | (col("s") == "s2")))
    )
    got, ex = run(cluster, setup, q)
    sql = (
        "SELECT l.id, l.k, l.s, l.v, r.total, r.rows FROM L l JOIN "
        "(SELECT rk, sum(n) AS total, count(*) AS rows FROM R GROUP BY rk) r ON l.k = r.rk "
        "WHERE l.k > 70 AND l.v < 60 AND (r.total > 100 OR l.s = 's2')"
    )
    assert_rows(got, data.sql(sql))
    assert has_term(scan_filter(ex.plan, "v"), col("k") > 70)


# ------------------------------------------------------------ random predicates


@dataclass
class _Term:
    expr: flight.Expr
    sql: str


_L_INT = {"v": "l.v", "k": "l.k", "id": "l.id"}
_R_INT = {"n": "r.n", "rk": "r.rk", "rid": "r.rid"}
_L_STR = {"s": "l.s", "x": "l.x"}
_R_STR = {"s_right": "r.s", "x_right": "r.x"}


def _random_term(rng: random.Random, sides: str) -> _Term:
    """One comparison, null test or membership over the allowed sides ("L", "R" or "LR")."""
    ints = {**(_L_INT if "L" in sides else {}), **(_R_INT if "R" in sides else {})}
    strs = {**(_L_STR if "L" in sides else {}), **(_R_STR if "R" in sides else {})}
    kind = rng.random()
    if kind < 0.5:
        name = rng.choice(sorted(ints))
        op, sql = rng.choice([("<", "<"), ("<=", "<="), (">", ">"), (">=", ">="), ("==", "="), ("!=", "<>")])
        value = rng.randrange(0, 120)
        e = {"<": col(name) < value, "<=": col(name) <= value, ">": col(name) > value, ">=": col(name) >= value,
             "==": col(name) == value, "!=": col(name) != value}[op]
        return _Term(e, f"{ints[name]} {sql} {value}")
    if kind < 0.65:
        name = rng.choice(sorted({**ints, **strs}))
        sql = {**ints, **strs}[name]
        if rng.random() < 0.5:
            return _Term(col(name).is_null(), f"{sql} IS NULL")
        return _Term(col(name).is_not_null(), f"{sql} IS NOT NULL")
    if kind < 0.8:
        name = rng.choice(sorted(strs))
        prefix = "s" if name.startswith("s") else ("l" if name == "x" else "r")
        values = sorted({f"{prefix}{rng.randrange(0, 6 if prefix == 's' else 40)}" for _ in range(3)})
        listed = ", ".join(f"'{v}'" for v in values)
        return _Term(col(name).isin(values), f"coalesce({strs[name]} IN ({listed}), false)")
    if kind < 0.9 and sides == "LR":
        a, b = rng.choice(sorted(_L_INT)), rng.choice(sorted(_R_INT))
        return _Term(col(a) < col(b), f"{_L_INT[a]} < {_R_INT[b]}")
    name = rng.choice(sorted(ints))
    value = rng.randrange(0, 120)
    return _Term(~(col(name) > value), f"NOT ({ints[name]} > {value})")


def _random_predicate(rng: random.Random, sides: str) -> _Term:
    """AND of 1-2 ORs of 1-3 ANDs of 1-3 terms, each term over a random one of the allowed sides."""
    choices = ["L", "R", "LR"] if sides == "LR" else [sides]
    outer = []
    for _ in range(rng.randint(1, 2)):
        branches = []
        for _ in range(rng.randint(1, 3)):
            terms = [_random_term(rng, rng.choice(choices)) for _ in range(rng.randint(1, 3))]
            expr = terms[0].expr
            for t in terms[1:]:
                expr = expr & t.expr
            branches.append(_Term(expr, "(" + " AND ".join(t.sql for t in terms) + ")"))
        expr = branches[0].expr
        for b in branches[1:]:
            expr = expr | b.expr
        outer.append(_Term(expr, "(" + " OR ".join(b.sql for b in branches) + ")"))
    expr = outer[0].expr
    for o in outer[1:]:
        expr = expr & o.expr
    return _Term(expr, " AND ".join(o.sql for o in outer))


HOWS = ["inner", "left", "right", "full", "semi", "anti"]


def _random_case(seed: int) -> tuple[str, _Term]:
    rng = random.Random(seed)
    how = HOWS[seed % len(HOWS)]
    return how, _random_predicate(rng, "L" if how in ("semi", "anti") else "LR")


@pytest.mark.parametrize("seed", range(120))
def test_random_filtered_joins_in_one_process_match_duckdb(data: Data, seed: int) -> None:
    how, pred = _random_case(seed)
    q = data.read("L").join(data.read("R"), left_on="k", right_on="rk", how=how).filter(pred.expr)
    got = flight.run_local(q).read_all()
    assert_rows(got, data.sql(join_sql(how, pred.sql)))


@pytest.mark.parametrize("seed", range(0, 120, 5))
def test_random_filtered_joins_on_workers_match_duckdb(cluster: flight.LocalCluster, data: Data, seed: int) -> None:
    how, pred = _random_case(seed)
    q = data.read("L").join(data.read("R"), left_on="k", right_on="rk", how=how).filter(pred.expr)
    setup = SHUFFLE if seed % 2 else BROADCAST
    got, _ = run(cluster, setup, q)
    assert_rows(got, data.sql(join_sql(how, pred.sql)))


@pytest.mark.parametrize("seed", range(200))
def test_derived_filter_is_implied_by_the_original(seed: int) -> None:
    """On random rows: wherever the predicate is true, the derived filter of each side is true too."""
    rng = random.Random(10_000 + seed)
    pred = _random_predicate(rng, "LR").expr
    n = 400
    table = pa.table(
        {
            **{c: pa.array([None if rng.random() < 0.15 else rng.randrange(0, 120) for _ in range(n)], pa.int64())
               for c in [*_L_INT, *_R_INT]},
            **{c: pa.array([None if rng.random() < 0.15 else f"{c[0] if c[0] == 's' else ('l' if c == 'x' else 'r')}{rng.randrange(0, 6)}"
                            for _ in range(n)], pa.string()) for c in [*_L_STR, *_R_STR]},
        }
    )
    kept = table.filter(to_pyarrow(pred.to_proto()))
    for columns in (set(_L_INT) | set(_L_STR), set(_R_INT) | set(_R_STR)):
        derived = derive_side_filter(pred, columns)
        if derived is None:
            continue
        assert derived.referenced_fields() <= columns
        also = kept.filter(to_pyarrow(derived.to_proto()))
        assert also.num_rows == kept.num_rows, f"{derived!r} is not implied by {pred!r}"


# ---------------------------------------------------------------- eager aggregation

EAGER = "computed on the right side first"


def _eager_query(data: Data, how: str, calls: dict[str, Agg]) -> flight.Query:
    left = data.read("L").select("k", "v")
    right = data.read("R").select("rk", "n", "rid")
    return left.join(right, left_on="k", right_on="rk", how=how).aggregate(["k"], **calls)


@pytest.mark.parametrize("setup", [pytest.param(SHUFFLE, id=SHUFFLE[0]), pytest.param(BROADCAST, id=BROADCAST[0])])
@pytest.mark.parametrize("how", ["left", "inner"])
def test_an_aggregate_by_the_join_keys_is_computed_before_the_join(cluster: flight.LocalCluster, data: Data, how: str, setup: tuple) -> None:
    # Null and duplicate keys on both sides: each left row of a key meets that key's right rows.
    calls = {"c": agg.count("n"), "total": agg.sum("n"), "lo": agg.min("rid"), "hi": agg.max("n")}
    q = _eager_query(data, how, calls)
    got, ex = run(cluster, setup, q)
    assert any(EAGER in r for r in ex.plan.rewrites), ex.plan.rewrites
    join = _SQL_JOIN[how]
    sql = f"SELECT l.k, count(r.n), sum(r.n), min(r.rid), max(r.n) FROM L l {join} R r ON l.k = r.rk GROUP BY l.k"
    assert_rows(got, data.sql(sql))
    early = [a for a in nodes(ex.plan, AggregateNode) if a.keys == ["rk"]]
    assert early, "the right side is aggregated by its keys"


@pytest.mark.parametrize("setup", [pytest.param(SHUFFLE, id=SHUFFLE[0]), pytest.param(BROADCAST, id=BROADCAST[0])])
def test_an_aggregate_over_a_sql_left_join_is_computed_before_it_through_the_projections(
    cluster: flight.LocalCluster, data: Data, setup: tuple
) -> None:
    """TPC-H Q13's form from SQL: the front end puts projections between the join and the aggregate, which only
    select columns; the rewrite sees through them. Each left row without a match still counts 0."""
    catalog = flight.Catalog({"lt": data.read("L"), "rt": data.read("R")})
    text = ("SELECT c, count(*) AS n FROM (SELECT l.k, count(r.n) AS c FROM {L} l LEFT OUTER JOIN {R} r "
            "ON l.k = r.rk AND r.rid % 3 <> 0 GROUP BY l.k) AS t GROUP BY c")
    got, ex = run(cluster, setup, flight.sql(text.format(L="lt", R="rt"), catalog))
    assert any(EAGER in r for r in ex.plan.rewrites), ex.plan.rewrites
    assert [a for a in nodes(ex.plan, AggregateNode) if a.keys == ["rk"]], "the right side is aggregated by its keys"
    assert_rows(got, data.sql(text.format(L="L", R="R")))


def test_eager_aggregation_only_where_it_is_exact(data: Data) -> None:
    assert any(EAGER in r for r in plan(_eager_query(data, "left", {"c": agg.count("n")})).rewrites)
    for calls in ({"n": agg.count_all()}, {"m": agg.mean("n")}, {"d": agg.count_distinct("n")}, {"lv": agg.sum("v")}):
        assert not any(EAGER in r for r in plan(_eager_query(data, "left", calls)).rewrites), calls
    # Other keys than the join's, another join type, shared column names, one task: left as written.
    left, right = data.read("L").select("k", "v"), data.read("R").select("rk", "n")
    by_v = left.join(right, left_on="k", right_on="rk", how="left").aggregate(["v"], c=agg.count("n"))
    full = left.join(right, left_on="k", right_on="rk", how="full").aggregate(["k"], c=agg.count("n"))
    shared = data.read("L").join(data.read("R"), left_on="k", right_on="rk", how="left").aggregate(["k"], c=agg.count("n"))
    for q in (by_v, full, shared):
        assert not any(EAGER in r for r in plan(q).rewrites)
    assert not any(EAGER in r for r in plan(_eager_query(data, "left", {"c": agg.count("n")}), tasks=1).rewrites)


SUNK = "pre-aggregated by"


def _sunk_query(data: Data, how: str = "inner", lookup: flight.Query | None = None) -> flight.Query:
    """Sums of the L-R join's columns grouped by a column of B, joined on R's key: B is the lookup."""
    pairs = data.read("L").select("id", "k", "v").join(data.read("R").select("rid", "rk", "n"), left_on="k", right_on="rk")
    b = lookup if lookup is not None else data.read("B")
    return pairs.join(b, left_on="rk", right_on="bk", how=how).aggregate(
        ["w", "k"], total=agg.sum("v"), c=agg.count("n"), lo=agg.min("id"), hi=agg.max("n")
    )


@pytest.mark.parametrize("setup", [pytest.param(SHUFFLE, id=SHUFFLE[0]), pytest.param(BROADCAST, id=BROADCAST[0])])
@pytest.mark.parametrize("how", ["left", "inner"])
def test_an_aggregate_over_a_join_and_a_lookup_is_pre_aggregated_below_the_lookup(
    cluster: flight.LocalCluster, data: Data, how: str, setup: tuple
) -> None:
    # B has ~66 rows per key and null keys, L and R duplicate and null keys: each pre-aggregated
    # row must count once per B row it meets, as each of its rows did.
    got, ex = run(cluster, setup, _sunk_query(data, how))
    assert any(SUNK in r for r in ex.plan.rewrites), ex.plan.rewrites
    sunk = [a for a in nodes(ex.plan, AggregateNode) if a.label_text == "EagerAggregate"]
    assert [(a.keys, a.partial) for a in sunk] == [(["k", "rk"], True)], "grouped by what the joins above read, per task"
    assert isinstance(sunk[0].input, JoinNode) and sunk[0].input.right_keys == ["rk"], "right above the L-R join"
    sql = (
        f"SELECT b.w, l.k, sum(l.v), count(r.n), min(l.id), max(r.n) FROM L l JOIN R r ON l.k = r.rk "
        f"{_SQL_JOIN[how]} B b ON r.rk = b.bk GROUP BY b.w, l.k"
    )
    assert_rows(got, data.sql(sql))


def test_pre_aggregates_only_below_a_join_beside_a_lookup(data: Data) -> None:
    assert any(SUNK in r for r in plan(_sunk_query(data)).rewrites)
    # A filtered lookup may drop most rows: aggregating first would be work for nothing.
    filtered = _sunk_query(data, lookup=data.read("B").filter(col("w") < 5))
    # An argument from the lookup side; a mean (no merge); the aggregated side a scan, not a join.
    other_side = data.read("L").select("id", "k", "v").join(data.read("R").select("rid", "rk", "n"), left_on="k", right_on="rk")
    other_side = other_side.join(data.read("B"), left_on="rk", right_on="bk").aggregate(["k"], t=agg.sum("w"))
    mean = data.read("L").select("k", "v").join(data.read("R").select("rk", "n"), left_on="k", right_on="rk")
    mean = mean.join(data.read("B"), left_on="rk", right_on="bk").aggregate(["w"], m=agg.mean("v"))
    scan = data.read("L").select("k", "v").join(data.read("B"), left_on="k", right_on="bk").aggregate(["w"], t=agg.sum("v"))
    for q in (filtered, mean, scan):
        assert not any(SUNK in r for r in plan(q).rewrites), q.explain()
    # other_side: the sum reads B's column, so the pre-aggregate may only go onto B's side, a scan.
    assert not any(SUNK in r for r in plan(other_side).rewrites)
    assert not any(SUNK in r for r in plan(_sunk_query(data), tasks=1).rewrites)
