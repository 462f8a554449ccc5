"""A subplan used more than once whose scans are behind cuts is built once, every use reading the same stages
(``flight.planner.cut._Planner.shared``), even when a small broadcast below it is a stage per use (each read in
place: ``flight.planner.replicate``), which made the cut's fingerprints differ (TPC-DS q57's CTE was computed three
times across two hosts). Answers on two real workers, every plan forced into stages, against DuckDB.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from support import write_parts

import flight
from flight.plan.nodes import FeedScanNode
from flight.planner.cut import plan_query
from flight.planner.stages import QueryPlan

STAGED = {"one_host_query_bytes": 0, "small_query_bytes": 0}


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    root = tmp_path_factory.mktemp("repeats")
    n = 20_000
    sales = pa.table({"item": pa.array([i % 50 for i in range(n)], pa.int64()), "month": pa.array([i % 12 for i in range(n)], pa.int64()),
                      "amount": pa.array([float(i % 700) for i in range(n)])})
    items = pa.table({"i": pa.array(range(50), pa.int64()), "brand": pa.array([f"b{i % 7}" for i in range(50)])})
    return {"sales": write_parts(sales, root, "sales", 4), "items": write_parts(items, root, "items", 1)}


@pytest.fixture(scope="module")
def catalog(paths: dict[str, list[Path]]) -> flight.Catalog:
    return flight.Catalog({t: flight.read_parquet(p) for t, p in paths.items()})


MONTHLY = """
WITH monthly AS (
    SELECT brand, month, sum(amount) AS total, rank() OVER (PARTITION BY brand ORDER BY month) AS rn
    FROM sales JOIN items ON sales.item = items.i GROUP BY brand, month
)
SELECT a.brand, a.month, a.total, a.rn, b.total AS best
FROM monthly a JOIN (SELECT brand, max(total) AS total FROM monthly GROUP BY brand) b ON a.brand = b.brand AND a.total = b.total
"""


LAGGED = """
WITH monthly AS (
    SELECT brand, month, sum(amount) AS total, rank() OVER (PARTITION BY brand ORDER BY month) AS rn
    FROM sales JOIN items ON sales.item = items.i GROUP BY brand, month
)
SELECT cur.brand, cur.month, cur.total, prev.total AS previous, nxt.total AS following
FROM monthly cur JOIN monthly prev ON cur.brand = prev.brand AND cur.rn = prev.rn + 1
JOIN monthly nxt ON cur.brand = nxt.brand AND cur.rn = nxt.rn - 1
WHERE cur.month > 2
"""


def _check(plan: QueryPlan, text: str, catalog: flight.Catalog, paths: dict[str, list[Path]], cluster: flight.LocalCluster) -> None:
    """The plan's stages numbered 0, 1, ... and every stage read there; the answer on the workers, every plan forced
    into stages, DuckDB's."""
    ids = {s.stage_id for s in plan.stages}
    assert ids == set(range(len(plan.stages))) and all(r.stage_id in ids for s in plan.stages for r in s.reads)
    ex = flight.DistributedExec(flight.sql(text, catalog), cluster.urls, **STAGED)
    got = sorted(tuple(r.values()) for r in ex.to_table().to_pylist())
    con = duckdb.connect()
    for t, p in paths.items():
        con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet({[str(x) for x in p]})")
    assert got == sorted(con.execute(text).fetchall())


TWICE_OVER_A_BROADCAST = """
WITH v AS (
    SELECT s.item, s.total, i.brand FROM (SELECT item, sum(amount) AS total FROM sales GROUP BY item) s
    JOIN items i ON s.item = i.i WHERE i.brand = 'b1'
)
SELECT f.month, sum(y.total) AS a, sum(z.total) AS b, count(*) AS n
FROM sales f JOIN v y ON f.item = y.item JOIN v z ON f.item = z.item GROUP BY f.month
"""

SCALARS = """
SELECT month, count(*) AS n FROM sales
WHERE amount > (SELECT avg(amount) FROM sales) AND item > (SELECT 2 * avg(item) FROM sales) / 10
  AND month > (SELECT 2 * avg(item) FROM sales) / 10
GROUP BY month
"""


@pytest.mark.parametrize("text", [TWICE_OVER_A_BROADCAST, SCALARS], ids=["cte-over-a-broadcast", "scalars-read-twice"])
def test_uses_of_equal_stages_plan_and_answer(text: str, catalog: flight.Catalog, paths: dict[str, list[Path]],
                                             cluster: flight.LocalCluster) -> None:
    # A copy of a small broadcast one use found made may still be read by another use's stage; a scalar subquery's
    # partial stage read by two uses must stay while either reads it.
    plan = plan_query(flight.sql(text, catalog).node, 2)
    _check(plan, text, catalog, paths, cluster)


@pytest.mark.parametrize("text", [MONTHLY, LAGGED], ids=["equal-uses", "uses-that-differ-above"])
def test_a_repeated_subplan_over_a_small_broadcast_is_computed_once(text: str, catalog: flight.Catalog, paths: dict[str, list[Path]],
                                                                     cluster: flight.LocalCluster) -> None:
    # LAGGED's uses differ above the CTE's aggregate (a filter pushed into the first, a key computed in the others):
    # each cuts its own stages, whose fingerprints see its copy of the small broadcast of items as the first one.
    plan = plan_query(flight.sql(text, catalog).node, 2)
    fact_scans = [s for s in plan.stages if any(isinstance(n, FeedScanNode) and "amount" in n.schema.names for n in s.root.walk())]
    assert len(fact_scans) == 1  # every use reads one stage scanning sales
    _check(plan, text, catalog, paths, cluster)
