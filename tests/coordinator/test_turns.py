"""Queries whose tasks together need more source threads than their workers have, on real workers: opened in turns.

Workers started with a few source threads (``--source-threads 3``) run TPC-H plans forced into many stages
(scans split by file, joins shuffled): every task fits its worker, but the tasks bound to one worker need
11 to 15 threads together. Before, they could never all be admitted, and the query waited out the
admission wait (``BUSY``); now ``coordinator/opening.py`` opens them in turns and every answer matches
DuckDB's. A task that could never fit is refused before anything runs, naming it. TPC-DS q14 on one
default worker (69 threads of 64) runs in tests/sql/test_tpcds.py.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as fl
import pytest
from support import running_tasks, tpch_test_files, wait_until

import flight
from benchmarks.tpch_queries import ORDERED, compare, duckdb_answer, duckdb_connection, query
from flight.dev.testing import waiting_query
from flight.errors import InvalidTaskError
from flight.wire.clients import read_stream

STAGED = {"broadcast_bytes": 0, "rows_per_task": 1, "one_host_query_bytes": 0, "small_query_bytes": 0}
"""Every plan in stages: scans split by file, joins shuffled, aggregates merged across tasks."""
TURNS = "opened in turns"


@pytest.fixture(scope="module")
def files() -> dict[str, list[Path]]:
    return tpch_test_files(0.05)


@pytest.fixture(scope="module")
def answers(files: dict[str, list[Path]]) -> dict[int, pa.Table]:
    con = duckdb_connection(files)
    try:
        return {n: duckdb_answer(n, files, con) for n in (3, 5)}
    finally:
        con.close()


@pytest.fixture(scope="module")
def small(files: dict[str, list[Path]]) -> Iterator[flight.LocalCluster]:
    """Two workers of three source threads each."""
    with flight.LocalCluster(2, data_roots=[files["lineitem"][0].parent.parent], worker_args=["--source-threads", "3"]) as c:
        yield c


@pytest.mark.slow
@pytest.mark.parametrize("n", [3, 5])
@pytest.mark.parametrize("stage_recovery", [True, False], ids=["recovery", "no-recovery"])
def test_a_plan_beyond_its_workers_source_threads_runs_exact_in_turns(
    n: int, stage_recovery: bool, small: flight.LocalCluster, files: dict[str, list[Path]], answers: dict[int, pa.Table],
    caplog: pytest.LogCaptureFixture,
) -> None:
    ex = flight.DistributedExec(query(n, files), small.urls, stage_recovery=stage_recovery, **STAGED)
    with caplog.at_level(logging.INFO, logger="flight.coordinator.exec"):
        got = ex.to_table()
    assert compare(got, answers[n], ORDERED.get(n)) is None
    assert any(TURNS in r.getMessage() for r in caplog.records), "the plan fit its workers: nothing was opened in turns"
    wait_until(lambda: running_tasks(small.urls) == 0, 15.0, "the query's tasks to be freed")


@pytest.mark.slow
def test_two_queries_in_turns_at_once_on_the_same_workers_are_both_exact(
    small: flight.LocalCluster, files: dict[str, list[Path]], answers: dict[int, pa.Table]
) -> None:
    results: dict[int, object] = {}

    def run(n: int) -> None:
        results[n] = _table_or_error(query(n, files), small.urls)

    threads = [threading.Thread(target=run, args=(n,)) for n in (3, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(100)
    for n in (3, 5):
        got = results.get(n)
        assert isinstance(got, pa.Table), f"TPC-H Q{n} failed: {got!r}"
        assert compare(got, answers[n], ORDERED.get(n)) is None


@pytest.mark.slow
def test_a_detached_query_in_turns_hands_out_its_head_partitions(
    small: flight.LocalCluster, files: dict[str, list[Path]], answers: dict[int, pa.Table], caplog: pytest.LogCaptureFixture
) -> None:
    # Opened in turns, the head tasks are the last; start_detached returns once they are admitted, with their tickets.
    with caplog.at_level(logging.INFO, logger="flight.coordinator.exec"):
        detached = flight.DistributedExec(query(3, files), small.urls, **STAGED).start_detached()
    assert any(TURNS in r.getMessage() for r in caplog.records)
    with detached:
        batches = []
        for p in detached.partitions:
            with fl.connect(p.url) as client:
                batches += list(read_stream(client, p.ticket))
        got = pa.Table.from_batches(batches, schema=detached.schema)
        assert detached.wait(30.0), "the detached query did not end once its head partitions were read"
    assert compare(got, answers[3], ORDERED.get(3)) is None


@pytest.mark.slow
def test_a_task_refused_as_busy_while_in_turns_is_opened_again_until_there_is_room(
    files: dict[str, list[Path]], answers: dict[int, pa.Table], caplog: pytest.LogCaptureFixture
) -> None:
    # Another query holds a thread of each worker; a task of 3 threads waits in the worker's queue
    # (--queue-wait 0.3 s), is refused as busy, and is opened again, alone, while the tasks admitted
    # meanwhile go on. The other query ends once a refusal was seen; then the task is admitted.
    args = ["--source-threads", "3", "--queue-wait", "0.3"]
    with flight.LocalCluster(2, data_roots=[files["lineitem"][0].parent.parent], extensions=["flight.dev.testing"], worker_args=args) as c:
        holders = [flight.DistributedExec(waiting_query(), [url]).execute() for url in c.urls]
        wait_until(lambda: running_tasks(c.urls) == 2, 20.0, "the other query's tasks")
        result: list[object] = []
        runner = threading.Thread(target=lambda: result.append(_table_or_error(query(3, files), c.urls)))
        with caplog.at_level(logging.DEBUG, logger="flight.coordinator.exec"):
            runner.start()
            try:
                wait_until(lambda: any("refused as busy" in r.getMessage() for r in caplog.records), 60.0, "a busy refusal in turns")
            finally:
                holders.clear()
                gc.collect()
            runner.join(100)
        assert result and isinstance(result[0], pa.Table), f"the query failed: {result!r}"
        assert compare(result[0], answers[3], ORDERED.get(3)) is None


def _table_or_error(q: flight.Query, urls: list[str]) -> pa.Table | BaseException:
    try:
        return flight.DistributedExec(q, urls, **STAGED).to_table()
    except BaseException as exc:  # noqa: BLE001 - handed to the test
        return exc


def test_a_task_that_can_never_fit_its_worker_is_named_before_anything_runs(files: dict[str, list[Path]]) -> None:
    # TPC-H Q3 on one worker is one task reading three tables and joining them: 5 source threads, of 4.
    with flight.LocalCluster(1, data_roots=[files["lineitem"][0].parent.parent], worker_args=["--source-threads", "4"]) as one:
        ex = flight.DistributedExec(query(3, files), one.urls)
        with pytest.raises(InvalidTaskError) as raised:
            ex.to_table()
        message = str(raised.value)
        assert "5 source threads" in message and one.urls[0] in message and f"{ex.query_id}/0/0" in message, message
        assert ex.metrics is not None and all(f.units == 0 for f in ex.metrics.feeds), "units were sent"
        wait_until(lambda: running_tasks(one.urls) == 0, 15.0, "the refused query's tasks to be freed")
