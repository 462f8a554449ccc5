"""One ``DistributedExec``, several executions at once: each owns its bound plan.

A run binds every shuffle read to its own producers' URLs and task keys; when
runs bound them in the shared plan nodes, two runs of one instance could read
each other's producers. Checked against DuckDB on a plan with hash shuffles and
multi-task upper stages.
"""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest
from support import tpch_test_files

import flight
from benchmarks.tpch_queries import ORDERED, compare, duckdb_answer, duckdb_connection, query


@pytest.mark.slow
def test_two_executions_of_one_instance_at_once_are_both_exact(cluster: flight.LocalCluster) -> None:
    files = tpch_test_files(0.05)
    con = duckdb_connection(files)
    try:
        expected = duckdb_answer(3, files, con)
    finally:
        con.close()
    ex = flight.DistributedExec(query(3, files), cluster.urls, broadcast_bytes=0, rows_per_task=1)
    results: list[object] = [None] * 3

    def run(i: int) -> None:
        try:
            results[i] = ex.to_table()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i, got in enumerate(results):
        assert isinstance(got, pa.Table), f"execution {i} failed: {got!r}"
        assert compare(got, expected, ORDERED.get(3)) is None, f"execution {i} differs from DuckDB"
