"""Queries whose tasks do not fit a worker's memory budget together, alone or side by side, run to their answers.

The chaos run's hangs (issue 41): TPC-H Q5 with every join shuffled puts ~12 tasks of ~40 MiB on each worker;
with workers of 256 MiB budgets (``--memory-limit 256MB``) it could never be admitted whole and waited for its
deadline at the first worker, and three such queries opened at once each held part of a worker while waiting
in its queue for what the others held. Here the workers' queue wait is long (600 s), so that a wait for memory
shows as the deadline (60 s) running out, not as a busy refusal that breaks it: every query must answer, and
exactly as DuckDB does.

A query whose tasks on a worker would reserve more than its budget even with the smallest output buffers (TPC-DS
q14 across two hosts with its files cut: 131 tasks a worker, 3.6 GB of 2 GB) failed at once with a ``PlanError``;
now it is opened in turns (``coordinator/waves.py``), here on workers of a 40 MiB budget.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from support import tpch_test_files

import flight
from benchmarks.tpch_queries import TABLES, compare, decimals_as_numbers, duckdb_connection, duckdb_table
from benchmarks.tpch_sql import ORDERED, SQL

SHUFFLED = {"small_query_bytes": 0, "one_host_query_bytes": 0, "broadcast_bytes": 0, "rows_per_task": 1, "deadline": 60.0}
QUERIES = (5, 5, 9)


@pytest.fixture(scope="module")
def files() -> dict[str, list[Path]]:
    return tpch_test_files(0.01)


@pytest.fixture(scope="module")
def small(data_roots: list[Path]) -> Iterator[flight.LocalCluster]:
    args = ["--memory-limit", "256MB", "--queue-wait", "600"]
    with flight.LocalCluster(2, data_roots=data_roots, worker_args=args) as c:
        yield c


@pytest.mark.slow
def test_queries_larger_than_a_workers_budget_answer_side_by_side(files: dict[str, list[Path]], small: flight.LocalCluster) -> None:
    catalog = flight.Catalog({t: flight.read_parquet([str(p.resolve()) for p in files[t]]) for t in TABLES})
    con = duckdb_connection(files)
    try:
        want = {n: duckdb_table(con, SQL[n]) for n in set(QUERIES)}
    finally:
        con.close()
    outcomes: dict[int, object] = {}

    def run(i: int, n: int) -> None:
        try:
            outcomes[i] = flight.DistributedExec(flight.sql(SQL[n], catalog), small.urls, **SHUFFLED).to_table()
        except Exception as exc:  # noqa: BLE001 - handed to the test
            outcomes[i] = exc

    threads = [threading.Thread(target=run, args=(i, n), daemon=True) for i, n in enumerate(QUERIES)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a query did not end"
    for i, n in enumerate(QUERIES):
        got = outcomes[i]
        assert isinstance(got, pa.Table), f"TPC-H Q{n} (#{i}) failed: {got!r}"
        assert compare(got, decimals_as_numbers(want[n]), ORDERED.get(n)) is None, f"TPC-H Q{n} (#{i}) differs from DuckDB"


@pytest.fixture(scope="module")
def tight(data_roots: list[Path]) -> Iterator[flight.LocalCluster]:
    with flight.LocalCluster(2, data_roots=data_roots, worker_args=["--memory-budget-mb", "40"]) as c:
        yield c


@pytest.mark.slow
@pytest.mark.parametrize("n", [5, 9])
def test_a_query_past_a_workers_budget_even_with_the_smallest_buffers_is_opened_in_turns(
    n: int, files: dict[str, list[Path]], tight: flight.LocalCluster, caplog: pytest.LogCaptureFixture,
) -> None:
    catalog = flight.Catalog({t: flight.read_parquet([str(p.resolve()) for p in files[t]]) for t in TABLES})
    con = duckdb_connection(files)
    try:
        want = duckdb_table(con, SQL[n])
    finally:
        con.close()
    ex = flight.DistributedExec(flight.sql(SQL[n], catalog), tight.urls, **SHUFFLED)
    with caplog.at_level(logging.INFO, logger="flight.coordinator.exec"):
        got = ex.to_table()
    assert compare(got, decimals_as_numbers(want), ORDERED.get(n)) is None, f"TPC-H Q{n} differs from DuckDB"
    said = [r.getMessage() for r in caplog.records]
    assert any("opened in turns" in m and "of 40 MiB" in m for m in said), said
    shown = ex.explain(analyze=True).split("Opening:\n", 1)[-1]  # and explain() says how it was opened, and why
    assert shown.startswith("  - output buffers of 1 MiB: ") and "\n  - opened in turns" in shown and "of 40 MiB" in shown, shown[:2000]
