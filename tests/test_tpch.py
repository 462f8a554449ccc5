"""Ten TPC-H queries on a real 3-worker cluster, checked against DuckDB and DataFusion.

The workers' engine is DuckDB (docs/engine.md), so DuckDB alone would not be an independent
oracle: every answer is also checked against Apache DataFusion running the same SQL text, and
the two oracles are checked against each other. The queries also run on workers started with
``--engine acero``.

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

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support import tpch_test_files

import flight
from benchmarks.tpch import sf_dir, table_files
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
def datafusion_expected(files: dict[str, list[Path]]) -> dict[int, pa.Table]:
    """DataFusion's answer to each query (the second oracle), computed once."""
    pytest.importorskip("datafusion")
    from benchmarks.engines import DataFusionEngine

    engine = DataFusionEngine(files)
    try:
        return {n: engine.run(n) for n in QUERY_NUMBERS}
    finally:
        engine.close()


@pytest.mark.parametrize("n", QUERY_NUMBERS, ids=lambda n: f"q{n}")
def test_the_two_oracles_agree(n: int, expected: dict[int, pa.Table], datafusion_expected: dict[int, pa.Table]) -> None:
    assert compare(datafusion_expected[n], expected[n], ORDERED.get(n)) is None


@pytest.fixture(scope="module")
def acero_cluster(data_roots: list[Path]) -> Iterator[flight.LocalCluster]:
    with flight.LocalCluster(2, data_roots=data_roots, worker_args=["--engine", "acero"]) as c:
        yield c


@pytest.mark.parametrize("n", QUERY_NUMBERS, ids=lambda n: f"q{n}")
def test_tpch_query_on_acero_workers(
    n: int, files: dict[str, list[Path]], datafusion_expected: dict[int, pa.Table], acero_cluster: flight.LocalCluster
) -> None:
    ex = flight.DistributedExec(query(n, files), acero_cluster.urls)
    difference = compare(ex.to_table(), datafusion_expected[n], ORDERED.get(n))
    assert difference is None, f"TPC-H Q{n} on Acero workers differs from DataFusion: {difference}\n{ex.explain()}"


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
    datafusion_expected: dict[int, pa.Table],
    tpch_cluster: flight.LocalCluster,
) -> None:
    ex = flight.DistributedExec(query(n, files), tpch_cluster.urls[:workers], **PLANS[plan])
    got = ex.to_table()
    for oracle, answer in (("DuckDB", expected[n]), ("DataFusion", datafusion_expected[n])):
        difference = compare(got, answer, ORDERED.get(n))
        assert difference is None, (
            f"TPC-H Q{n} on {workers} worker(s), {plan} plan, differs from {oracle}: {difference}\n{ex.explain()}"
        )


def test_two_processes_asking_for_the_same_table_at_once_generate_it_once(tmp_path: Path) -> None:
    # The suite runs in two processes (`pytest -n 2`): both may ask at once for tables the cache lacks.
    code = ("import sys; from benchmarks.tpch import ensure_tpch, table_files; "
            "root = ensure_tpch(0.01, ('nation', 'region'), sys.argv[1]); "
            "print(len(table_files(root, 'nation')), len(table_files(root, 'region')))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=Path(__file__).parents[1]) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    assert [out.split() for out, _ in outs] == [["1", "1"], ["1", "1"]]  # tpchgen writes a table this small as one file
    assert sum(err.count("[tpch] generating") for _, err in outs) == 2, outs  # each table once, by the lock's holder
    assert pq.read_table(table_files(sf_dir(0.01, tmp_path), "nation")).num_rows == 25
