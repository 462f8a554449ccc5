"""A union's inputs stay in their own tasks (``flight.planner.frag.union_in_place``): none of its rows moved.

Plans are read from ``plan_query`` (which stages shuffle what); answers run on two real workers with every plan
forced into stages, against DuckDB over the same files.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from support import write_parts

import flight
from flight.planner.cut import plan_query
from flight.planner.stages import QueryPlan

STAGED = {"one_host_query_bytes": 0, "small_query_bytes": 0}


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    root = tmp_path_factory.mktemp("unions")
    n = 30_000
    store = pa.table({"item": pa.array([i % 97 for i in range(n)], pa.int64()), "day": pa.array([i % 30 for i in range(n)], pa.int64()),
                      "amount": pa.array([float(i % 1000) for i in range(n)])})
    web = pa.table({"item": pa.array([i % 89 for i in range(n // 3)], pa.int64()), "day": pa.array([i % 30 for i in range(n // 3)], pa.int64()),
                    "amount": pa.array([float(i % 700) for i in range(n // 3)])})
    days = pa.table({"d": pa.array(range(30), pa.int64()), "month": pa.array([d // 10 for d in range(30)], pa.int64())})
    return {"store": write_parts(store, root, "store", 4), "web": write_parts(web, root, "web", 2), "days": write_parts(days, root, "days", 1)}


@pytest.fixture(scope="module")
def catalog(paths: dict[str, list[Path]]) -> flight.Catalog:
    return flight.Catalog({t: flight.read_parquet(p) for t, p in paths.items()})


def _duckdb(text: str, paths: dict[str, list[Path]]) -> list[tuple]:
    con = duckdb.connect()
    for t, p in paths.items():
        con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet({[str(x) for x in p]})")
    return sorted(con.execute(text).fetchall())


def _modes(plan: QueryPlan) -> list[str]:
    return [s.output_mode for s in plan.stages]


CHANNELS = """
SELECT month, sum(amount) AS total, count(*) AS n FROM (
    SELECT day, amount FROM store WHERE item < 50 UNION ALL SELECT day, amount FROM web
) sales JOIN days ON sales.day = days.d GROUP BY month
"""


def test_a_union_of_scans_is_read_in_place_and_joined_there(catalog: flight.Catalog, paths: dict[str, list[Path]],
                                                           cluster: flight.LocalCluster) -> None:
    plan = plan_query(flight.sql(CHANNELS, catalog).node, 2)
    assert "round_robin" not in _modes(plan)  # no stage shuffles the union's rows into its tasks
    leaf = next(s for s in plan.stages if len(s.feeds) >= 2)  # both tables' scans in one stage, days broadcast into it
    assert leaf.task_count == 2 and leaf.output_mode == "hash"
    ex = flight.DistributedExec(flight.sql(CHANNELS, catalog), cluster.urls, **STAGED)
    got = sorted(tuple(r.values()) for r in ex.to_table().to_pylist())
    assert got == _duckdb(CHANNELS, paths)


TOTALS = """
SELECT 'all' AS what, sum(amount) AS total FROM store
UNION ALL SELECT 'web', sum(amount) FROM web
UNION ALL SELECT 'store ' || CAST(item AS VARCHAR), amount FROM store WHERE item = 3 AND day = 4
"""


def test_a_global_aggregate_beside_a_scan_is_not_spread_over_tasks(catalog: flight.Catalog, paths: dict[str, list[Path]],
                                                                  cluster: flight.LocalCluster) -> None:
    # A total in one task, beside a filtered scan in two: a task given no rows of the total would add a null row.
    plan = plan_query(flight.sql(TOTALS, catalog).node, 2)
    assert "round_robin" in _modes(plan)
    ex = flight.DistributedExec(flight.sql(TOTALS, catalog), cluster.urls, **STAGED)
    got = sorted(tuple(r.values()) for r in ex.to_table().to_pylist())
    assert got == _duckdb(TOTALS, paths)


GROUPED = """
SELECT item, sum(total) AS total FROM (
    SELECT item, sum(amount) AS total FROM store GROUP BY item
    UNION ALL SELECT item, sum(amount) AS total FROM web GROUP BY item
) t GROUP BY item
"""


def test_a_union_of_aggregates_in_as_many_tasks_stays_in_them(catalog: flight.Catalog, paths: dict[str, list[Path]],
                                                             cluster: flight.LocalCluster) -> None:
    # Each input's final aggregate runs in two tasks, task t on hash partition t: the union is theirs, in place.
    plan = plan_query(flight.sql(GROUPED, catalog).node, 2)
    assert "round_robin" not in _modes(plan)
    ex = flight.DistributedExec(flight.sql(GROUPED, catalog), cluster.urls, **STAGED)
    got = sorted(tuple(r.values()) for r in ex.to_table().to_pylist())
    assert got == _duckdb(GROUPED, paths)
