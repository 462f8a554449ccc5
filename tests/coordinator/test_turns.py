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
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.flight as fl
import pytest
from support import read_in_thread, running_tasks, tpch_test_files, wait_until

import flight
from benchmarks.tpch_queries import ORDERED, compare, duckdb_answer, duckdb_connection, query
from flight import col, lit
from flight.coordinator.opening import Opening, worker_loads
from flight.coordinator.turns import Turns
from flight.dev.testing import SLEEP_SCHEMA, sleep_unit, waiting_query
from flight.errors import InvalidTaskError, TaskFailedError
from flight.wire._proto import protocol_pb2
from flight.wire.clients import ClientPool, read_stream

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


def test_more_tasks_on_a_worker_than_it_runs_at_once_run_exact_in_turns(
    files: dict[str, list[Path]], answers: dict[int, pa.Table], caplog: pytest.LogCaptureFixture
) -> None:
    # --max-tasks 1: threads and memory to spare, but Q3 in stages puts a producer and the head on one worker. Opened
    # at once, the head waited in that worker's queue for the producer's slot, and the query for the admission wait:
    # before LoadInfo said a worker's task slots, the query failed after it, "at capacity", however long it waited.
    with flight.LocalCluster(2, data_roots=[files["lineitem"][0].parent.parent], worker_args=["--max-tasks", "1"]) as c:
        ex = flight.DistributedExec(query(3, files), c.urls, admission_wait=20.0, **STAGED)  # a regression fails in 20 s
        assert sum(s.task_count for s in ex.plan.stages) > len(c.urls)  # so one worker is bound two tasks or more
        with caplog.at_level(logging.DEBUG, logger="flight.coordinator.exec"):
            got = ex.to_table()
        assert compare(got, answers[3], ORDERED.get(3)) is None
        said = [r.getMessage() for r in caplog.records if TURNS in r.getMessage()]
        assert said and "of 1 it runs at once" in said[0], said
        # The first try's queued tasks were let go (the workers count those as refused); in turns none was refused.
        again = [r.getMessage() for r in caplog.records if "refused as busy; opened again" in r.getMessage()]
        assert again == [], again
        wait_until(lambda: running_tasks(c.urls) == 0, 15.0, "the query's tasks to be freed")


class Units(flight.WorkUnitFeedProvider):
    def __init__(self, count: int, ms: float) -> None:
        self.count, self.ms = count, ms

    def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[bytes]:
        for i in range(self.count):
            yield sleep_unit(partition * 1000 + i, ms=self.ms)


@pytest.mark.slow
def test_a_worker_lost_after_its_tasks_were_opened_in_turns_runs_the_query_again_from_the_start(
    data_roots: list[Path], caplog: pytest.LogCaptureFixture
) -> None:
    # Stage 0 counts a quick feed (3 tasks); the head (stage 1, 3 tasks) scans a slow feed joined with
    # the total of the counts broadcast to it. Two source threads per worker: a worker's stage-0 task
    # and head task (1 + 2) never fit together, so the head tasks open once stage 0 made its output.
    # Once execute() returned (every task admitted), a worker running a head task is killed. Run
    # again in place (stage recovery), its tasks would be opened at once beside the survivors' own
    # (here they fit in the end; q14's shape on two workers would not); instead the attempt fails as
    # a lost worker's and the query runs again from the start on the two survivors, in turns again,
    # and its answer is exact. (Before, ``attempts`` said the lost tasks were replayed in place.)
    args = ["--source-threads", "2"]
    with flight.LocalCluster(3, data_roots=data_roots, extensions=["flight.dev.testing"], worker_args=args) as cluster:
        small = flight.from_feed(Units(20, 1), "testing.sleep", SLEEP_SCHEMA).aggregate([], n=flight.agg.count_all())
        big = flight.from_feed(Units(100, 30), "testing.sleep", SLEEP_SCHEMA).select("id", k=col("row"))
        ex = flight.DistributedExec(big.join(small.select(k=lit(0), n=col("n")), on="k"), cluster.urls)
        with caplog.at_level(logging.INFO, logger="flight.coordinator.exec"):
            reader = ex.execute()
            assert _turns_opened(caplog) == 1, "the plan fit: nothing opened in turns"
            victim = ex.bound[ex.plan.head.stage_id][0]
            cluster.processes[cluster.urls.index(victim)].send_signal(signal.SIGKILL)
            thread, out = read_in_thread(reader)
            thread.join(120)
            assert not thread.is_alive(), "the query hangs"
            turned = _turns_opened(caplog)
    assert "error" not in out, out.get("error")
    table = out["table"]
    assert isinstance(table, pa.Table)
    assert table.num_rows == 3 * 100 and set(table["n"].to_pylist()) == {3 * 20}
    assert [(a.lost, a.replayed) for a in ex.attempts] == [((victim,), None)], "not run again from the start: " + "; ".join(
        a.describe() for a in ex.attempts
    )
    assert turned == 2, "the second attempt was not opened in turns"


def test_a_busy_refusal_is_retried_by_the_opening_only_for_a_task_not_admitted_yet() -> None:
    # At once or in order, nothing was sent before every task was admitted: any refusal is retried.
    # In turns an admitted task was sent its units: its refusal must fail the query (Run.channel_error).
    opening = Opening(SimpleNamespace())  # type: ignore[arg-type]
    waiting, admitted = SimpleNamespace(ready=threading.Event()), SimpleNamespace(ready=threading.Event())
    admitted.ready.set()
    assert opening.refused_while_opening(admitted)  # type: ignore[arg-type]
    opening.turned, opening.turns = True, object()  # type: ignore[assignment]
    assert opening.refused_while_opening(waiting)  # type: ignore[arg-type]
    assert not opening.refused_while_opening(admitted)  # type: ignore[arg-type]
    opening.turns = None  # every task opened: none is the opening's any more
    assert not opening.refused_while_opening(waiting)  # type: ignore[arg-type]


def test_an_admitted_task_that_ends_without_its_finished_frame_fails_the_turns_naming_it() -> None:
    # Its threads would never be given back: the tasks waiting for them must not wait for nothing.
    turns = Turns.__new__(Turns)
    done = threading.Event()
    running = SimpleNamespace(metrics=None, error=None, done=done, url="grpc://w1:1", key="q.1/0/1")
    turns._running = {(0, 1): running}  # type: ignore[dict-item]
    turns._ended()  # still running: nothing to say
    done.set()
    with pytest.raises(TaskFailedError) as raised:
        turns._ended()
    assert "q.1/0/1" in str(raised.value) and "grpc://w1:1" in str(raised.value), raised.value
    running.metrics = protocol_pb2.TaskMetrics()  # its finished frame came: it gave its threads back
    turns._ended()


class _Info(fl.FlightServerBase):
    """A worker's ``info`` action only: after ``delay`` seconds (or once let go), ``threads`` source threads."""

    def __init__(self, threads: int, delay: float, gone: threading.Event) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.threads, self.delay, self.gone = threads, delay, gone

    def do_action(self, context: fl.ServerCallContext, action: fl.Action) -> Iterator[fl.Result]:
        self.gone.wait(self.delay)
        info = protocol_pb2.WorkerInfo(load=protocol_pb2.LoadInfo(source_threads_max=self.threads))
        yield fl.Result(info.SerializeToString())


def test_worker_loads_asks_every_worker_at_once_within_one_bound() -> None:
    # Three silent workers and one that answers: one after another they would cost three timeouts.
    gone = threading.Event()
    servers = [_Info(5, 60.0, gone) for _ in range(3)] + [_Info(7, 0.0, gone)]
    try:
        urls = [f"grpc://127.0.0.1:{s.port}" for s in servers]
        started = time.monotonic()
        got = {url: load.source_threads_max for url, load in worker_loads(ClientPool(), urls, 1.0).items()}
        elapsed = time.monotonic() - started
        assert got == {urls[-1]: 7}
        assert elapsed < 2.9, f"asked one after another: {elapsed:.1f}s"
    finally:
        gone.set()
        for s in servers:
            s.shutdown()


def _turns_opened(caplog: pytest.LogCaptureFixture) -> int:
    """How many attempts were opened in turns (the opening's one line each)."""
    return sum("need more source threads" in r.getMessage() and TURNS in r.getMessage() for r in caplog.records)
