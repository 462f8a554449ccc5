"""Bad input and faults: each is a clear error, never a hang, a dead worker or lost rows."""

from __future__ import annotations

import gc
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as fl
import pytest
from support import error_of, header, healthy, raw_exchange, running_tasks, units_plan, wait_until, worker_info

import flight
from flight import col
from flight.dev.testing import SLEEP_SCHEMA, sleep_unit
from flight.wire._proto import protocol_pb2
from flight.wire.protocol import error_info_of


class _Nothing(flight.WorkUnitFeedProvider):
    def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[bytes]:
        return iter(())


# ------------------------------------------------------------ malformed input


def test_malformed_descriptor_is_invalid_argument_naming_the_field(cluster: flight.LocalCluster) -> None:
    url = cluster.urls[0]
    frames, exc = raw_exchange(url, b"\xff\xfe not a protobuf")
    assert isinstance(exc, fl.FlightServerError)  # a FlightError: no traceback; the kind is in its ErrorInfo
    assert "descriptor.cmd" in str(exc) and "Traceback" not in str(exc)
    status = error_info_of(exc)
    assert status is not None and status.code == protocol_pb2.ERROR_CODE_INVALID_ARGUMENT and status.field == "descriptor.cmd"
    info = error_of(frames)
    assert info.code == protocol_pb2.ERROR_CODE_INVALID_ARGUMENT and info.field == "descriptor.cmd"
    assert healthy(url)


def test_wrong_protocol_version_is_named(cluster: flight.LocalCluster) -> None:
    frames, exc = raw_exchange(cluster.urls[0], header(units_plan(), protocol_version=99).SerializeToString())
    assert isinstance(exc, fl.FlightServerError) and "protocol_version 99" in str(exc)
    assert error_of(frames).code == protocol_pb2.ERROR_CODE_VERSION_MISMATCH


def test_malformed_plan_bytes_name_the_field(cluster: flight.LocalCluster) -> None:
    h = header(units_plan())
    h.plan = b"\x0a\xff\xff\xff garbage"
    frames, exc = raw_exchange(cluster.urls[0], h.SerializeToString())
    assert isinstance(exc, fl.FlightServerError) and "header.plan" in str(exc)
    assert error_of(frames).field == "header.plan"
    assert healthy(cluster.urls[0])


def test_malformed_frame_names_the_field(cluster: flight.LocalCluster) -> None:
    h = header(units_plan(), feeds={"f": [0]})
    frames, exc = raw_exchange(cluster.urls[0], h.SerializeToString(), [b"\xff\xff\xff"])
    assert isinstance(exc, fl.FlightServerError)
    assert error_of(frames).field.startswith("app_metadata")
    assert healthy(cluster.urls[0])


def test_more_units_than_credits_is_a_protocol_error(cluster: flight.LocalCluster) -> None:
    h = header(units_plan(), feeds={"f": [0]})
    too_many = protocol_pb2.CoordinatorFrame(
        units=protocol_pb2.WorkUnitBatch(feed_id="f", partition=0, units=[protocol_pb2.WorkUnit(body=b"x")] * 1_000)
    )
    frames, exc = raw_exchange(cluster.urls[0], h.SerializeToString(), [too_many.SerializeToString()])
    info = error_of(frames)
    assert info.code == protocol_pb2.ERROR_CODE_INVALID_ARGUMENT
    assert "credits" in info.message and info.field == "app_metadata.units"
    assert isinstance(exc, fl.FlightServerError)


def test_unknown_reader_is_named(cluster: flight.LocalCluster) -> None:
    q = flight.from_feed(_Nothing(), "no-such-reader", pa.schema([("a", pa.int64())]))
    with pytest.raises(flight.InvalidTaskError, match="no-such-reader") as info:
        flight.DistributedExec(q, cluster.resolver()).to_table()
    assert info.value.field.endswith(".reader")
    assert info.value.worker_url in cluster.urls


def test_forged_function_name_is_rejected_by_the_worker(cluster: flight.LocalCluster) -> None:
    stage = flight.map_input(pa.schema([("a", pa.int64())])).filter(col("a") > 1).stage_plan()
    stage.root.filter.predicate.nodes[-1].call.function = "os.system"
    with pytest.raises(flight.InvalidTaskError, match="os.system") as info:
        list(flight.map_batches(stage, [pa.record_batch([pa.array([1, 2])], names=["a"])], cluster.urls[0]))
    assert "predicate" in info.value.field
    assert healthy(cluster.urls[0])


def test_plan_errors_are_found_before_any_worker(parquet_files: list[Path]) -> None:
    q = flight.read_parquet(parquet_files)
    with pytest.raises(flight.PlanError, match="nope"):
        q.filter(col("nope") > 1)
    with pytest.raises(flight.PlanError):
        q.filter(col("name") > 1)
    with pytest.raises(flight.PlanError, match="no worker"):
        flight.DistributedExec(q, [])


# --------------------------------------------------------------------- faults


def test_missing_file_names_stage_worker_and_file(cluster: flight.LocalCluster, parquet_files: list[Path], tmp_path: Path) -> None:
    missing = tmp_path / "gone.parquet"
    q = flight.read_parquet([*parquet_files[:2], missing], schema=flight.read_parquet(parquet_files).schema)
    with pytest.raises(flight.TaskFailedError) as info:
        flight.DistributedExec(q, cluster.resolver()).to_table()
    err = info.value
    assert str(missing) in str(err)
    assert err.worker_url in cluster.urls and err.worker_url in str(err)
    assert err.stage_key and err.stage_key in str(err)
    wait_until(lambda: running_tasks(cluster.urls) == 0, timeout=2.0, what="tasks to be freed")


class Exploding(flight.WorkUnitFeedProvider):
    def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[bytes]:
        for i in range(5):
            yield sleep_unit(i, ms=1)
        if partition == 1:
            raise KeyError("catalog page 3 is gone")
        while not ctx.is_cancelled():  # partition 0 keeps discovering until the query stops it
            yield sleep_unit(99, ms=5)


def test_provider_exception_fails_the_query_and_frees_every_task(cluster: flight.LocalCluster) -> None:
    q = flight.from_feed(Exploding(), "testing.sleep", SLEEP_SCHEMA)
    with pytest.raises(KeyError, match="catalog page 3") as info:
        flight.DistributedExec(q, cluster.resolver()).to_table()
    assert any("partition 1" in note for note in getattr(info.value, "__notes__", []))
    wait_until(lambda: running_tasks(cluster.urls) == 0, timeout=2.0, what="tasks to be freed")


def test_reader_failure_on_one_task_cancels_the_others(cluster: flight.LocalCluster) -> None:
    class Mixed(flight.WorkUnitFeedProvider):
        def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[bytes]:
            yield b"bad unit"

    q = flight.from_feed(Mixed(), "testing.fail", SLEEP_SCHEMA)
    with pytest.raises(flight.TaskFailedError, match="always fails"):
        flight.DistributedExec(q, cluster.resolver()).to_table()
    wait_until(lambda: running_tasks(cluster.urls) == 0, timeout=2.0, what="tasks to be freed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dead_worker_url_is_named_within_the_deadline(parquet_files: list[Path]) -> None:
    dead = f"grpc://127.0.0.1:{_free_port()}"
    started = time.monotonic()
    with pytest.raises(flight.WorkerUnavailableError) as info:
        flight.DistributedExec(flight.read_parquet(parquet_files), [dead], connect_timeout=3.0).to_table()
    assert dead in str(info.value) and info.value.worker_url == dead
    assert isinstance(info.value, flight.RetryableError)
    assert time.monotonic() - started < 10


def test_coordinator_death_frees_the_task_within_two_seconds(cluster: flight.LocalCluster) -> None:
    """A coordinator process killed mid-query: the workers cancel and free its tasks."""
    script = textwrap.dedent(
        f"""
        import sys, flight
        from flight.dev.testing import SLEEP_SCHEMA, sleep_unit
        class Endless(flight.WorkUnitFeedProvider):
            def feed(self, partition, ctx):
                i = 0
                while True:
                    i += 1
                    yield sleep_unit(i, ms=10)
        q = flight.from_feed(Endless(), "testing.sleep", SLEEP_SCHEMA)
        reader = flight.DistributedExec(q, {cluster.urls!r}).execute()
        reader.read_next_batch()
        print("streaming", flush=True)
        for batch in reader:
            pass
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "streaming"
        assert running_tasks(cluster.urls) == 2
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        wait_until(lambda: running_tasks(cluster.urls) == 0, timeout=2.0, what="tasks of the dead coordinator to be freed")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_cancel_action_cancels_a_running_query(cluster: flight.LocalCluster) -> None:
    class Slow(flight.WorkUnitFeedProvider):
        def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[bytes]:
            i = 0
            while not ctx.is_cancelled():
                i += 1
                yield sleep_unit(i, ms=20)

    ex = flight.DistributedExec(flight.from_feed(Slow(), "testing.sleep", SLEEP_SCHEMA), cluster.resolver())
    reader = ex.execute()
    reader.read_next_batch()
    assert ex.query_id is not None
    body = protocol_pb2.CancelRequest(query_id=ex.query_id, query_secret=ex.query_secret).SerializeToString()
    cancelled = 0
    for url in cluster.urls:
        with fl.connect(url) as client:
            (res,) = list(client.do_action(fl.Action("cancel", body)))
        result = protocol_pb2.CancelResult()
        result.ParseFromString(res.body.to_pybytes())
        cancelled += result.cancelled_tasks
    # Every task of the query (the estimator sizes the shared feed's stage from its first units:
    # on a loaded machine it may start one task instead of two).
    assert cancelled == sum(len(urls) for urls in ex.bound.values()) >= 1
    with pytest.raises(flight.TaskCancelledError, match="cancelled by request"):
        for _ in reader:
            pass
    wait_until(lambda: running_tasks(cluster.urls) == 0, timeout=2.0, what="cancelled tasks to be freed")


def test_a_worker_dying_mid_query_fails_it_naming_the_worker() -> None:
    """A worker killed while a multi-stage query runs: a retryable error naming it, in bounded time."""

    class Slow(flight.WorkUnitFeedProvider):
        def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[bytes]:
            for i in range(200):
                yield sleep_unit(partition * 1000 + i, ms=20)

    with flight.LocalCluster(2, extensions=["flight.dev.testing"]) as own:
        q = flight.from_feed(Slow(), "testing.sleep", SLEEP_SCHEMA).aggregate(["id"], n=flight.agg.count_all())
        ex = flight.DistributedExec(q, own.urls, rows_per_task=1, retries=0)  # with retries it recovers (tests/coordinator)
        reader = ex.execute()
        victim, url = own.processes[1], own.urls[1]
        wait_until(lambda: running_tasks([url]) > 0, what="the victim to run tasks")
        started = time.monotonic()
        victim.send_signal(signal.SIGKILL)
        with pytest.raises(flight.RetryableError) as info:
            reader.read_all()
        assert url in str(info.value)
        assert time.monotonic() - started < 10
        wait_until(lambda: running_tasks([own.urls[0]]) == 0, timeout=2.0, what="the survivor to free its tasks")


def test_a_limit_query_releases_tasks_whose_output_was_not_all_read(cluster: flight.LocalCluster, parquet_files: list) -> None:
    """Producers below a satisfied limit still hold output; the coordinator's release frees them."""
    q = flight.read_parquet(parquet_files * 4).limit(5000)
    got = flight.DistributedExec(q, cluster.urls, output_buffer_bytes=1 << 16).to_table()
    assert got.num_rows == 5000
    wait_until(lambda: running_tasks(cluster.urls) == 0, timeout=2.0, what="every task to be freed")
    assert all(worker_info(u).buffered_bytes == 0 for u in cluster.urls)


def test_a_reader_raising_its_own_exception_type_fails_the_query(cluster: flight.LocalCluster) -> None:
    class Odd(flight.WorkUnitFeedProvider):
        def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[bytes]:
            yield b"not json"  # testing.sleep raises UnitReadError; testing.raise raises ValueError

    q = flight.from_feed(Odd(), "testing.raise", SLEEP_SCHEMA)
    with pytest.raises(flight.TaskFailedError, match="ValueError|odd unit"):
        flight.DistributedExec(q, cluster.urls, connect_timeout=5).to_table()
    wait_until(lambda: running_tasks(cluster.urls) == 0, timeout=2.0, what="tasks to be freed")


def test_a_result_reader_dropped_unread_frees_the_tasks(cluster: flight.LocalCluster) -> None:
    class Endless(flight.WorkUnitFeedProvider):
        def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[bytes]:
            i = 0
            while not ctx.is_cancelled():
                i += 1
                yield sleep_unit(i, ms=10)

    reader = flight.DistributedExec(flight.from_feed(Endless(), "testing.sleep", SLEEP_SCHEMA), cluster.urls).execute()
    wait_until(lambda: running_tasks(cluster.urls) == 2, what="the tasks to start")
    del reader
    gc.collect()
    wait_until(lambda: running_tasks(cluster.urls) == 0, timeout=2.0, what="the tasks of a dropped reader to be freed")
