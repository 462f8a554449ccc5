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
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from support import running_tasks, tpch_test_files, wait_until

import flight
from benchmarks.tpch_queries import ORDERED, compare, duckdb_answer, duckdb_connection, query
from flight.coordinator.recovery import may_retry, named_unreachable
from flight.dev.testing import SLEEP_SCHEMA, sleep_unit

SF = 0.05
SLOW_MS = "150"  # per work unit, on the victim only


@pytest.fixture(scope="module")
def files() -> dict[str, list[Path]]:
    return tpch_test_files(SF)


def cluster_with_slow_victim(data_roots: list[Path], victim: int, n: int = 3) -> flight.LocalCluster:
    args = [["--unit-delay-ms", SLOW_MS] if i == victim else [] for i in range(n)]
    return flight.LocalCluster(n, data_roots=data_roots, per_worker_args=args, extensions=["flight.dev.testing"])


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
        ex = flight.DistributedExec(query(n, files), cluster.urls, small_query_bytes=0)
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
        # Lost before every task was admitted, the query runs again (one attempt); after, the tasks
        # the worker took, and those reading them, run again within the attempt (one record each).
        assert {a.lost for a in ex.attempts} == {(url,)}
        shown = ex.explain(analyze=True)
        assert ("Retried after losing workers" in shown or "Recovered from losing workers" in shown) and url in shown
        assert url not in {u for urls in ex.bound.values() for u in urls}, "the query still used the lost worker"


@pytest.mark.slow
def test_a_frozen_worker_is_left_behind_within_the_heartbeat_bound(files: dict[str, list[Path]], data_roots: list[Path]) -> None:
    con = duckdb_connection(files)
    try:
        expected = duckdb_answer(3, files, con)
    finally:
        con.close()
    with cluster_with_slow_victim(data_roots, 1) as cluster:
        victim, url = cluster.processes[1], cluster.urls[1]
        ex = flight.DistributedExec(query(3, files), cluster.urls, heartbeat=0.25, peer_timeout=1.5, small_query_bytes=0)
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
        # One record per task that ran again (the frozen worker may have had one or two, as the kill test says).
        assert {a.lost for a in ex.attempts} == {(url,)}, ex.attempts


# ---------------------------------------------------------------- streaming scans: unit-level replay

STREAM_ROWS = 2_000_000
STREAM_FILES = 40


@pytest.fixture(scope="module")
def stream_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """2M rows in 40 Parquet files: a unique ``id``, a value, a string."""
    root = tmp_path_factory.mktemp("stream")
    per = STREAM_ROWS // STREAM_FILES
    rng = random.Random(5)
    paths = []
    for i in range(STREAM_FILES):
        ids = pa.array(range(i * per, (i + 1) * per), pa.int64())
        values = pa.array([rng.random() for _ in range(per)], pa.float64())
        path = root / f"part-{i:02d}.parquet"
        pq.write_table(pa.table({"id": ids, "v": values, "s": pc.cast(pc.multiply(ids, 7), pa.string())}), path, row_group_size=per // 2)
        paths.append(path)
    return paths


class SharedFiles(flight.WorkUnitFeedProvider):
    """The files as one shared queue: each goes to whichever task has credit."""

    shared = True

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths

    def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[flight.WorkUnit]:
        for path in self.paths:
            yield flight.file_unit(str(path))


def streaming_query(paths: list[Path], shared: bool) -> flight.Query:
    schema = pq.read_schema(paths[0])
    scan = flight.read_parquet(SharedFiles(paths), schema=schema) if shared else flight.read_parquet(paths)
    return scan.filter(flight.col("v") >= 0.25).select("id", "s", w=flight.col("v") * 2)


def streaming_answer(paths: list[Path]) -> pa.Table:
    """DuckDB's answer to ``streaming_query``: the oracle."""
    con = duckdb.connect()
    try:
        files = ", ".join(f"'{p}'" for p in paths)
        return con.sql(f"SELECT id, s, v * 2 AS w FROM read_parquet([{files}]) WHERE v >= 0.25").to_arrow_table()
    finally:
        con.close()


def assert_exactly(got: pa.Table, expected: pa.Table) -> None:
    """The same multiset of rows: no row lost, none twice (``id`` is unique in the source)."""
    assert got.num_rows == expected.num_rows, f"{got.num_rows} rows, expected {expected.num_rows}"
    assert pc.count_distinct(got["id"]).as_py() == got.num_rows, "a row reached the caller twice"
    checksums = [(pc.sum(t["id"]).as_py(), round(pc.sum(t["w"]).as_py(), 3)) for t in (got, expected)]
    assert checksums[0] == checksums[1]
    assert got.select(expected.column_names).sort_by("id").equals(expected.sort_by("id"))


def read_with_a_kill(reader: pa.RecordBatchReader, kill: Callable[[], None], after_rows: int) -> pa.Table:
    """Read ``reader`` to its end, calling ``kill`` once ``after_rows`` rows reached this caller."""
    batches, rows, killed = [], 0, False
    for batch in reader:
        batches.append(batch)
        rows += batch.num_rows
        if not killed and rows >= after_rows:
            kill()
            killed = True
    assert killed, "the query ended before the worker was hit"
    return pa.Table.from_batches(batches, reader.schema)


@pytest.mark.slow
@pytest.mark.parametrize("shared", [False, True], ids=["partitioned", "shared-queue"])
def test_a_streaming_scan_survives_a_worker_killed_after_rows_reached_the_caller(
    shared: bool, stream_files: list[Path], data_roots: list[Path]
) -> None:
    rng = random.Random(11 + shared)
    expected = streaming_answer(stream_files)
    with cluster_with_slow_victim(data_roots, 1) as cluster:
        url = cluster.urls[1]
        ex = flight.DistributedExec(streaming_query(stream_files, shared), cluster.urls, small_query_bytes=0)
        reader = ex.execute()
        got = read_with_a_kill(reader, lambda: cluster.processes[1].send_signal(signal.SIGKILL), rng.randrange(1, 400_000))
    assert_exactly(got, expected)
    assert [a.lost for a in ex.attempts] == [(url,)] and ex.attempts[0].replayed is not None, ex.explain()
    shown = ex.explain(analyze=True)
    assert "Recovered from losing workers" in shown and url in shown
    assert url not in ex.bound[ex.stage.stage_id], "a lost task was not replaced"


@pytest.mark.slow
def test_a_streaming_scan_survives_a_frozen_worker_within_the_heartbeat_bound(stream_files: list[Path], data_roots: list[Path]) -> None:
    files = stream_files[:12]
    expected = streaming_answer(files)
    with cluster_with_slow_victim(data_roots, 1) as cluster:
        victim, url = cluster.processes[1], cluster.urls[1]
        ex = flight.DistributedExec(streaming_query(files, shared=False), cluster.urls, heartbeat=0.25, peer_timeout=1.5, small_query_bytes=0)
        try:
            got = read_with_a_kill(ex.execute(), lambda: victim.send_signal(signal.SIGSTOP), 1)
        finally:
            victim.send_signal(signal.SIGCONT)
    assert_exactly(got, expected)
    assert [a.lost for a in ex.attempts] == [(url,)] and ex.attempts[0].replayed is not None


@pytest.mark.slow
def test_a_streaming_scan_that_loses_more_workers_than_its_retries_fails_naming_them(
    stream_files: list[Path], data_roots: list[Path]
) -> None:
    with flight.LocalCluster(3, data_roots=data_roots, per_worker_args=[["--unit-delay-ms", SLOW_MS]] * 3) as cluster:
        ex = flight.DistributedExec(streaming_query(stream_files[:12], shared=False), cluster.urls, retries=1, small_query_bytes=0)
        reader = ex.execute()

        def kill_two() -> None:
            cluster.processes[0].send_signal(signal.SIGKILL)
            cluster.processes[1].send_signal(signal.SIGKILL)

        with pytest.raises(flight.WorkerUnavailableError) as info:
            read_with_a_kill(reader, kill_two, 1)
    assert info.value.worker_url in cluster.urls[:2]
    assert len(ex.attempts) <= 1


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
        with pytest.raises(flight.RetryableError, match=r"after .* rows had reached the caller") as info:
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


def test_an_unavailable_error_names_the_lost_worker_only_when_it_is_one_of_the_attempts() -> None:
    urls = ["grpc://127.0.0.1:1", "grpc://127.0.0.1:2"]
    cut = flight.WorkerUnavailableError("heard nothing from the coordinator", worker_url=urls[1])
    assert named_unreachable(cut, urls) == [urls[1]]
    assert named_unreachable(flight.WorkerUnavailableError("gone", worker_url="grpc://127.0.0.1:3"), urls) == []
    assert named_unreachable(flight.WorkerUnavailableError("no url"), urls) == []
    assert named_unreachable(flight.TaskFailedError("bad unit", worker_url=urls[0]), urls) == []
