"""Queries that survive losing a worker: killed (SIGKILL) or frozen (SIGSTOP) while they run.

Each test starts its own cluster of real worker processes (the victim does not come
back) and compares the result with DuckDB's answer over the same files. The victim
is made slow (``--unit-delay-ms``), so that it is surely mid-query when it is hit;
where it is hit within that window is drawn from a seeded random generator.
"""

from __future__ import annotations

import os
import random
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from support import running_tasks, tpch_test_files, wait_until

import flight
from benchmarks.tpch_queries import ORDERED, compare, duckdb_answer, duckdb_connection, query
from flight.coordinator.recovery import may_retry
from flight.testing import SLEEP_SCHEMA, sleep_unit

SF = 0.05
SLOW_MS = "150"  # per work unit, on the victim only


@pytest.fixture(scope="module")
def files() -> dict[str, list[Path]]:
    return tpch_test_files(SF)


def cluster_with_slow_victim(data_roots: list[Path], victim: int, n: int = 3) -> flight.LocalCluster:
    args = [["--unit-delay-ms", SLOW_MS] if i == victim else [] for i in range(n)]
    return flight.LocalCluster(n, data_roots=data_roots, per_worker_args=args, extensions=["flight.testing"])


def run_in_thread(ex: flight.DistributedExec) -> tuple[threading.Thread, dict[str, object]]:
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["table"] = ex.to_table()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


@pytest.mark.slow
@pytest.mark.parametrize("n", [3, 5, 10, 13], ids=lambda n: f"q{n}")
def test_a_worker_killed_mid_query_costs_an_attempt_not_the_result(n: int, files: dict[str, list[Path]], data_roots: list[Path]) -> None:
    rng = random.Random(n)
    victim = rng.randrange(3)
    con = duckdb_connection(files)
    try:
        expected = duckdb_answer(n, files, con)
    finally:
        con.close()
    with cluster_with_slow_victim(data_roots, victim) as cluster:
        url = cluster.urls[victim]
        ex = flight.DistributedExec(query(n, files), cluster.urls)
        thread, outcome = run_in_thread(ex)
        wait_until(lambda: running_tasks([url]) > 0, timeout=30.0, what="the victim to run tasks")
        threading.Event().wait(rng.uniform(0.0, 0.4))
        cluster.processes[victim].send_signal(signal.SIGKILL)
        thread.join(120)
        assert not thread.is_alive(), "the query did not end"
        assert "error" not in outcome, f"the query failed: {outcome.get('error')!r}"
        got = outcome["table"]
        assert isinstance(got, pa.Table)
        difference = compare(got, expected, ORDERED.get(n))
        assert difference is None, f"TPC-H Q{n} after losing {url} differs from DuckDB: {difference}\n{ex.explain()}"
        assert [a.lost for a in ex.attempts] == [(url,)]
        shown = ex.explain(analyze=True)
        assert "Retried after losing workers" in shown and url in shown
        assert url not in {u for urls in ex.bound.values() for u in urls}, "the last attempt still used the lost worker"


@pytest.mark.slow
def test_a_frozen_worker_is_left_behind_within_the_heartbeat_bound(files: dict[str, list[Path]], data_roots: list[Path]) -> None:
    con = duckdb_connection(files)
    try:
        expected = duckdb_answer(3, files, con)
    finally:
        con.close()
    with cluster_with_slow_victim(data_roots, 1) as cluster:
        victim, url = cluster.processes[1], cluster.urls[1]
        ex = flight.DistributedExec(query(3, files), cluster.urls, heartbeat=0.25, peer_timeout=1.5)
        thread, outcome = run_in_thread(ex)
        try:
            wait_until(lambda: running_tasks([url]) > 0, timeout=30.0, what="the victim to run tasks")
            victim.send_signal(signal.SIGSTOP)
            thread.join(60)
        finally:
            victim.send_signal(signal.SIGCONT)
        assert not thread.is_alive(), "the query did not end"
        assert "error" not in outcome, f"the query failed: {outcome.get('error')!r}"
        assert compare(outcome["table"], expected, ORDERED.get(3)) is None  # type: ignore[arg-type]
        assert [a.lost for a in ex.attempts] == [(url,)]


class Slow(flight.WorkUnitFeedProvider):
    def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[bytes]:
        for i in range(400):
            yield sleep_unit(partition * 1000 + i, ms=10)


@pytest.mark.slow
def test_a_worker_lost_after_rows_reached_the_caller_is_named_and_the_error_says_why(data_roots: list[Path]) -> None:
    # Without unit-level recovery (a multi-stage query has none either), rows already delivered
    # cannot be taken back: the error says so and names the worker.
    with cluster_with_slow_victim(data_roots, 1, n=2) as cluster:
        ex = flight.DistributedExec(flight.from_feed(Slow(), "testing.sleep", SLEEP_SCHEMA), cluster.urls, unit_recovery=False)
        reader = ex.execute()
        assert reader.read_next_batch().num_rows > 0
        cluster.processes[1].send_signal(signal.SIGKILL)
        with pytest.raises(flight.RetryableError, match="after .* rows had reached the caller") as info:
            reader.read_all()
        assert info.value.worker_url == cluster.urls[1]
        assert ex.attempts == []


@pytest.mark.slow
def test_with_no_retries_a_lost_worker_fails_the_query_naming_it(data_roots: list[Path]) -> None:
    with cluster_with_slow_victim(data_roots, 1, n=2) as cluster:
        q = flight.from_feed(Slow(), "testing.sleep", SLEEP_SCHEMA).aggregate(["id"], n=flight.agg.count_all())
        ex = flight.DistributedExec(q, cluster.urls, retries=0)
        thread, outcome = run_in_thread(ex)
        wait_until(lambda: running_tasks([cluster.urls[1]]) > 0, what="the victim to run tasks")
        cluster.processes[1].send_signal(signal.SIGKILL)
        thread.join(30)
        error = outcome.get("error")
        assert isinstance(error, flight.RetryableError) and cluster.urls[1] in str(error)
        assert ex.attempts == []


def test_only_worker_failures_before_the_first_row_may_be_retried() -> None:
    lost = flight.WorkerUnavailableError("gone", worker_url="grpc://127.0.0.1:1")
    assert may_retry(lost, rows_delivered=False, attempts=0, retries=2)
    assert may_retry(flight.TaskFailedError("shuffle read failed"), rows_delivered=False, attempts=1, retries=2)
    assert not may_retry(lost, rows_delivered=True, attempts=0, retries=2)
    assert not may_retry(lost, rows_delivered=False, attempts=2, retries=2)
    for own_fault in (
        flight.PlanError("bad"),
        flight.ProtocolError("bad frame"),
        flight.QueryTimeoutError("late"),
        flight.WorkerBusyError("full"),
        ValueError("a provider's own exception"),
    ):
        assert not may_retry(own_fault, rows_delivered=False, attempts=0, retries=2), own_fault


def test_negative_retries_are_refused() -> None:
    with pytest.raises(ValueError, match="retries"):
        flight.DistributedExec(flight.from_feed(Slow(), "testing.sleep", SLEEP_SCHEMA), ["grpc://127.0.0.1:1"], retries=-1)


if os.name != "posix":  # pragma: no cover - signals
    pytest.skip("needs POSIX signals", allow_module_level=True)
