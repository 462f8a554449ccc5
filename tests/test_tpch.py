"""Ten TPC-H queries on a real 3-worker cluster, checked against DuckDB.

Each query runs with 1, 2 and 3 workers (the first k URLs of one cluster as the
resolver), planned twice: as the planner likes (at this size: small join sides
broadcast, one task after the leaves) and with every join shuffled and every
upper stage given a task per worker (``broadcast_bytes=0, rows_per_task=1``), so
hash shuffles into several consumer tasks are exercised too. The data is TPC-H at a small scale factor, generated
with ``tpchgen-cli`` into the benchmarks' cache (``.bench-cache/tpch``, ignored
by git): it is made once per checkout (about 6 s) and then reused, like the
benchmarks' own data. The queries, their SQL and the comparison live in
``benchmarks/tpch_queries.py``, shared with the benchmark harness.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from support import tpch_test_files

import flight
from benchmarks.tpch_queries import (
    ORDERED,
    QUERY_NUMBERS,
    compare,
    duckdb_answer,
    duckdb_connection,
    query,
)

pytestmark = pytest.mark.slow

SF = 0.05  # lineitem: 300K rows in 4 files per table
WORKERS = (1, 2, 3)
PLANS = {
    "auto": {},
    "shuffle": {"broadcast_bytes": 0, "rows_per_task": 1},  # hash joins and multi-task upper stages
}


@pytest.fixture(scope="module")
def files() -> dict[str, list[Path]]:
    return tpch_test_files(SF)


@pytest.fixture(scope="module")
def expected(files: dict[str, list[Path]]) -> Iterator[dict[int, pa.Table]]:
    """DuckDB's answer to each query, computed once."""
    con = duckdb_connection(files)
    try:
        yield {n: duckdb_answer(n, files, con) for n in QUERY_NUMBERS}
    finally:
        con.close()


@pytest.fixture(scope="module")
def tpch_cluster(data_roots: list[Path]) -> Iterator[flight.LocalCluster]:
    with flight.LocalCluster(3, data_roots=data_roots) as c:
        yield c


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("workers", WORKERS, ids=lambda k: f"w{k}")
@pytest.mark.parametrize("n", QUERY_NUMBERS, ids=lambda n: f"q{n}")
def test_tpch_query(
    n: int,
    workers: int,
    plan: str,
    files: dict[str, list[Path]],
    expected: dict[int, pa.Table],
    tpch_cluster: flight.LocalCluster,
) -> None:
    ex = flight.DistributedExec(query(n, files), tpch_cluster.urls[:workers], **PLANS[plan])
    difference = compare(ex.to_table(), expected[n], ORDERED.get(n))
    assert difference is None, (
        f"TPC-H Q{n} on {workers} worker(s), {plan} plan, differs from DuckDB: {difference}\n{ex.explain()}"
    )
