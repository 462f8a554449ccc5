"""Grouping sets across tasks (``flight.planner.gsets``): one aggregate over every set's rows, the input computed once.

Plans are read from ``plan_query`` (how many stages scan the fact table); answers run on two real workers with
every plan forced into stages, against DuckDB over the same files: rollups, cubes and grouping sets with
``GROUPING()``, null keys in the data beside rolled-up ones, a grand total over no rows, and calls that keep the
sets apart.
"""

from __future__ import annotations

import math
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from support import write_parts

import flight
from flight.plan.nodes import FeedScanNode
from flight.planner.cut import plan_query
from flight.planner.gsets import merge_grouping_sets
from flight.planner.optimize import push_filters
from flight.planner.stages import QueryPlan

STAGED = {"one_host_query_bytes": 0, "small_query_bytes": 0}


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    root = tmp_path_factory.mktemp("gsets")
    n = 24_000
    regions = ["north", "south", "east", "west", None]
    sales = pa.table({
        "item": pa.array([None if i % 53 == 0 else i % 17 for i in range(n)], pa.int64()),
        "region": pa.array([regions[i % 5] for i in range(n)], pa.string()),
        "day": pa.array([i % 30 for i in range(n)], pa.int64()),
        "qty": pa.array([i % 9 for i in range(n)], pa.int64()),
        "amount": pa.array([None if i % 41 == 0 else float(i % 1000) / 4 for i in range(n)]),
    })
    days = pa.table({"d": pa.array(range(30), pa.int64()), "month": pa.array([d // 10 for d in range(30)], pa.int64())})
    return {"sales": write_parts(sales, root, "sales", 4), "days": write_parts(days, root, "days", 1)}


@pytest.fixture(scope="module")
def catalog(paths: dict[str, list[Path]]) -> flight.Catalog:
    return flight.Catalog({t: flight.read_parquet(p) for t, p in paths.items()})


def _key(value: object) -> tuple:
    return (value is None, round(value, 6) if isinstance(value, float) else value)


def _rows(rows: list[tuple]) -> list[tuple]:
    """Rows in one order whatever their nulls, floats rounded (sums added in another order)."""
    rounded = [tuple(round(v, 6) if isinstance(v, float) and math.isfinite(v) else v for v in r) for r in rows]
    return sorted(rounded, key=lambda r: tuple(_key(v) for v in r))


def _duckdb(text: str, paths: dict[str, list[Path]]) -> list[tuple]:
    con = duckdb.connect()
    for t, p in paths.items():
        con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet({[str(x) for x in p]})")
    return _rows(con.execute(text).fetchall())


def _run(text: str, catalog: flight.Catalog, cluster: flight.LocalCluster) -> tuple[list[tuple], flight.DistributedExec]:
    ex = flight.DistributedExec(flight.sql(text, catalog), cluster.urls, **STAGED)
    return _rows([tuple(r.values()) for r in ex.to_table().to_pylist()]), ex


def _scans_of(plan: QueryPlan, column: str) -> int:
    """How many scans in the plan's stages read a table with ``column``."""
    return sum(1 for s in plan.stages for n in s.root.walk() if isinstance(n, FeedScanNode) and column in n.schema.names)


ROLLUP = """
SELECT region, item, grouping(region) AS g_region, grouping(item) AS g_item, sum(amount) AS total, avg(qty) AS q,
       count(*) AS n, count(amount) AS n_amount, min(amount) AS lo, max(qty) AS hi
FROM sales JOIN days ON sales.day = days.d WHERE days.month < {month}
GROUP BY ROLLUP (region, item)
"""


def test_a_rollup_reads_its_input_once_and_gives_duckdbs_answer(catalog: flight.Catalog, paths: dict[str, list[Path]],
                                                              cluster: flight.LocalCluster) -> None:
    text = ROLLUP.format(month=2)
    plan = plan_query(flight.sql(text, catalog).node, 2)
    assert any("grouping sets" in r for r in plan.rewrites)
    assert _scans_of(plan, "qty") == 1  # three sets, the grand total among them: one scan of sales, not three
    got, ex = _run(text, catalog, cluster)
    assert got == _duckdb(text, paths)
    assert any("grouping sets" in r for r in ex.plan.rewrites)


def test_a_grand_total_over_no_rows_is_one_row_as_in_duckdb(catalog: flight.Catalog, paths: dict[str, list[Path]],
                                                           cluster: flight.LocalCluster) -> None:
    text = ROLLUP.format(month=-1)  # no day passes: no group of a keyed set, one row for the grand total
    got, ex = _run(text, catalog, cluster)
    want = _duckdb(text, paths)
    assert len(want) == 1 and want[0][6] == 0  # count(*) of nothing: 0, its sums null
    assert got == want
    assert any("grouping sets" in r for r in ex.plan.rewrites)


CUBE = """
SELECT region, month, grouping(region, month) AS g, count(DISTINCT item) AS items, count(*) AS n, median(qty) AS mid
FROM sales JOIN days ON sales.day = days.d GROUP BY CUBE (region, month)
"""

SETS = """
SELECT item, region, day, sum(qty) AS qty, max(amount) AS top
FROM sales GROUP BY GROUPING SETS ((item, region), (region), (item, day), ())
"""


@pytest.mark.parametrize("text", [CUBE, SETS], ids=["cube-distinct-median", "grouping-sets"])
def test_cubes_and_grouping_sets_give_duckdbs_answer(text: str, catalog: flight.Catalog, paths: dict[str, list[Path]],
                                                     cluster: flight.LocalCluster) -> None:
    plan = plan_query(flight.sql(text, catalog).node, 2)
    assert _scans_of(plan, "qty") == 1
    got, _ = _run(text, catalog, cluster)
    assert got == _duckdb(text, paths)


ORDERED = """
SELECT region, day, string_agg(CAST(item AS VARCHAR), ',' ORDER BY item) AS items, count(*) AS n
FROM sales WHERE item < 3 AND day < 2 GROUP BY ROLLUP (region, day)
"""


def test_sets_with_an_ordered_call_stay_apart_and_answer_the_same(catalog: flight.Catalog, paths: dict[str, list[Path]],
                                                                 cluster: flight.LocalCluster) -> None:
    root = push_filters(flight.sql(ORDERED, catalog).node)
    same, notes = merge_grouping_sets(root)
    assert same is root and notes == []  # an ordered aggregate is not merged: each set as it was
    got, _ = _run(ORDERED, catalog, cluster)
    assert got == _duckdb(ORDERED, paths)


def test_aggregates_over_different_inputs_are_not_merged(catalog: flight.Catalog) -> None:
    text = "SELECT region, sum(qty) AS s FROM sales GROUP BY region UNION ALL SELECT CAST(month AS VARCHAR), sum(d) FROM days GROUP BY month"
    root = push_filters(flight.sql(text, catalog).node)
    assert merge_grouping_sets(root) == (root, [])


def test_one_task_plans_keep_the_sets_as_they_are(catalog: flight.Catalog) -> None:
    plan = plan_query(flight.sql(ROLLUP.format(month=2), catalog).node, 1)  # one task's query computes the copies once
    assert not any("grouping sets" in r for r in plan.rewrites)


def test_sets_over_an_input_one_task_reads_keep_their_form(paths: dict[str, list[Path]]) -> None:
    # One file each: one task reads the input, and its query computes the copies once (a stage per set never comes).
    one_file = flight.Catalog({"sales": flight.read_parquet(paths["sales"][:1]), "days": flight.read_parquet(paths["days"])})
    plan = plan_query(flight.sql(ROLLUP.format(month=2), one_file).node, 2)
    assert not any("grouping sets" in r for r in plan.rewrites)


def test_more_sets_than_merged_are_left_as_they_are(catalog: flight.Catalog) -> None:
    # A CUBE of 6 keys is 64 sets: each set's value of a column would be a CASE of 64 branches.
    text = "SELECT item, region, day, qty, sum(amount) AS s FROM sales GROUP BY CUBE (item, region, day, qty, item + 1, day + 1)"
    root = push_filters(flight.sql(text, catalog).node)
    assert merge_grouping_sets(root) == (root, [])


BRACKETS = """
SELECT region, sum(CASE WHEN region LIKE '[%' THEN 1 ELSE 0 END) AS open, sum(CASE WHEN region LIKE '%]' THEN 1 ELSE 0 END) AS close,
       count(*) AS n
FROM sales GROUP BY ROLLUP (region)
"""


def test_a_bracket_in_a_literal_of_a_grouping_call_is_read_right(catalog: flight.Catalog, paths: dict[str, list[Path]],
                                                                  cluster: flight.LocalCluster) -> None:
    # DataFusion names the calls after their text: a bracket in a literal there once hid the plan's schema.
    got, _ = _run(BRACKETS, catalog, cluster)
    assert got == _duckdb(BRACKETS, paths)
