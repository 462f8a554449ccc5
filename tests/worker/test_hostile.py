"""Hostile and heavy peers: no input crashes a worker, no load wedges it, no silent peer holds it.

Each test names one promise of issue 9 and checks it on real worker processes; the
oracle for results is pyarrow (or plain Python), never the code under test.
"""

from __future__ import annotations

import functools
import gc
import operator
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as fl
import pyarrow.parquet as pq
import pytest
from support import error_of, header, healthy, raw_exchange, running_tasks, wait_until

import flight
from flight import col
from flight.dev.testing import waiting_query
from flight.engine import select
from flight.engine.acero import pipeline
from flight.engine.confine import DataRoots
from flight.errors import InvalidTaskError, QueryTimeoutError, WorkerBusyError, WorkerUnavailableError
from flight.wire._proto import plan_pb2, protocol_pb2
from flight.wire.protocol import encode_schema, error_info_of


def _ipc(table: pa.Table, compression: str | None = None) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def _values_plan(ipc_stream: bytes) -> plan_pb2.StagePlan:
    return plan_pb2.StagePlan(root=plan_pb2.Operator(values=plan_pb2.Values(ipc_stream=ipc_stream)))


# ------------------------------------------------------------ wire data


def test_values_with_out_of_range_string_offsets_are_refused_and_the_worker_lives(cluster: flight.LocalCluster) -> None:
    good = _ipc(pa.table({"s": ["aaaa", "bbbb"]}))
    offsets = b"\x00\x00\x00\x00\x04\x00\x00\x00\x08\x00\x00\x00"
    assert good.count(offsets) == 1
    bad = good.replace(offsets, b"\x00\x00\x00\x00\x04\x00\x00\x00\xff\xff\xff\x7f")
    frames, exc = raw_exchange(cluster.urls[0], header(_values_plan(bad)).SerializeToString())
    info = error_of(frames)
    assert info.code == protocol_pb2.ERROR_CODE_INVALID_ARGUMENT and info.field == "plan.root.values.ipc_stream"
    status = error_info_of(exc) if exc is not None else None
    assert status is not None and status.field == info.field and "Traceback" not in str(exc)
    assert healthy(cluster.urls[0])


def test_a_small_zstd_payload_that_inflates_past_the_limit_is_refused(cluster: flight.LocalCluster) -> None:
    bomb = _ipc(pa.table({"a": pa.repeat(pa.scalar(0, pa.int64()), 40_000_000)}), "zstd")  # 10 KB -> 320 MB
    assert len(bomb) < 100_000
    frames, _ = raw_exchange(cluster.urls[0], header(_values_plan(bomb)).SerializeToString())
    info = error_of(frames)
    assert info.field == "plan.root.values.ipc_stream" and "decompresses to more than" in info.message
    assert healthy(cluster.urls[0])


def test_a_corrupt_map_input_batch_is_refused_naming_it(cluster: flight.LocalCluster) -> None:
    data = pa.py_buffer(b"abcdefgh")
    offsets = pa.py_buffer(pa.array([0, 8, 4], pa.int32()).buffers()[1])  # not monotonic: only full validation sees it
    bad = pa.Array.from_buffers(pa.string(), 2, [None, offsets, data])
    stage = flight.map_input(pa.schema([("s", pa.string())])).filter(col("s") != "x")
    with pytest.raises(InvalidTaskError) as raised:
        list(flight.map_batches(stage, [pa.record_batch([bad], names=["s"])], cluster.urls[0]))
    assert "map input batch 0" in str(raised.value)
    assert healthy(cluster.urls[0])


def test_sizes_a_peer_chooses_are_refused_or_clamped(cluster: flight.LocalCluster) -> None:
    plan = _values_plan(_ipc(pa.table({"a": [1]})))
    plan.output.partitions = 1_000_000
    frames, _ = raw_exchange(cluster.urls[0], header(plan).SerializeToString())
    assert error_of(frames).field == "header.plan.output.partitions"
    long_id = header(_values_plan(_ipc(pa.table({"a": [1]}))))
    long_id.stage_key.query_id = "q" * 20_000
    frames, exc = raw_exchange(cluster.urls[0], long_id.SerializeToString())
    assert error_of(frames).field == "header.stage_key.query_id"
    assert exc is not None and len(str(exc)) < 2_500  # no 20 KB echo
    assert healthy(cluster.urls[0])


def test_a_scan_schema_with_duplicate_names_is_a_clear_error(cluster: flight.LocalCluster) -> None:
    schema = pa.schema([("a", pa.int64()), ("a", pa.int64())])
    plan = plan_pb2.StagePlan(
        root=plan_pb2.Operator(
            feed_scan=plan_pb2.FeedScan(feed=plan_pb2.WorkUnitFeed(feed_id="f"), reader="parquet", schema=encode_schema(schema))
        )
    )
    frames, _ = raw_exchange(cluster.urls[0], header(plan, feeds={"f": [0]}).SerializeToString())
    info = error_of(frames)
    assert info.field == "plan.root.feed_scan.schema" and "twice" in info.message


def test_a_map_upload_cut_short_fails_instead_of_returning_fewer_rows(cluster: flight.LocalCluster) -> None:
    schema = pa.schema([("a", pa.int64())])
    stage = flight.map_input(schema).stage_plan()
    h = header(stage)
    client = fl.connect(cluster.urls[0])
    try:
        for end in (None, protocol_pb2.InputEnd(rows=20, batches=2)):  # no InputEnd; counts that do not match
            writer, reader = client.do_exchange(fl.FlightDescriptor.for_command(h.SerializeToString()))
            writer.begin(schema)
            writer.write_batch(pa.record_batch([pa.array(range(10))], schema=schema))
            if end is not None:
                writer.write_metadata(pa.py_buffer(protocol_pb2.CoordinatorFrame(input_end=end).SerializeToString()))
            writer.done_writing()
            errors = []
            with pytest.raises(fl.FlightServerError) as raised:
                while True:
                    chunk = reader.read_chunk()
                    if chunk.app_metadata is not None:
                        frame = protocol_pb2.WorkerFrame.FromString(chunk.app_metadata.to_pybytes())
                        if frame.WhichOneof("frame") == "error":
                            errors.append(frame.error)
            assert [e.field for e in errors] == ["app_metadata.input_end"], errors
            assert error_info_of(raised.value).field == "app_metadata.input_end"  # type: ignore[union-attr]
            h.stage_key.task_number = 0
            h.stage_key.query_id += "x"
    finally:
        client.close()


def test_deep_and_wide_expressions_run_on_workers(cluster: flight.LocalCluster, parquet_files: list[Path]) -> None:
    table = pa.concat_tables(pq.read_table(p) for p in parquet_files)
    ids = table.column("id").to_pylist()
    wanted = set(range(0, 5_000 * 3, 3))
    wide = functools.reduce(operator.or_, (col("id") == v for v in sorted(wanted)))
    deep = col("id")
    for _ in range(200):
        deep = deep + 1
    q = flight.read_parquet(parquet_files).filter(wide & (deep > 200)).select("id")
    got = sorted(flight.DistributedExec(q, cluster.resolver()).to_table().column("id").to_pylist())
    assert got == sorted(i for i in ids if i in wanted and i + 200 > 200)


# ------------------------------------------------------------------ load


def test_100_waiting_tasks_do_not_block_another_query(parquet_files: list[Path]) -> None:
    """Waiting tasks hold admitted threads of their own; a new query still runs beside them.

    Before admission control, ~65 waiting sources froze every other query on a worker.
    """
    waiting = waiting_query()
    roots = [parquet_files[0].parent]
    # The budget too: 100 tasks reserve 4 GB, past the default (half of --memory-limit); this test is about threads.
    args = ["--max-tasks", "128", "--source-threads", "128", "--memory-budget-mb", "8192"]
    with flight.LocalCluster(2, data_roots=roots, worker_args=args) as cluster:
        runs = [flight.DistributedExec(waiting, [cluster.urls[0]]) for _ in range(100)]
        readers = [r.execute() for r in runs]  # all started, none can finish
        try:
            wait_until(lambda: running_tasks([cluster.urls[0]]) >= 100, 20.0, "100 waiting tasks")
            q = flight.read_parquet(parquet_files).aggregate([], n=flight.agg.count_all())
            got = flight.DistributedExec(q, cluster.resolver()).to_table()
            expected = sum(pq.ParquetFile(p).metadata.num_rows for p in parquet_files)
            assert got.column("n").to_pylist() == [expected]
        finally:
            del readers
            gc.collect()
        wait_until(lambda: running_tasks(cluster.urls) == 0, 20.0, "the waiting tasks to be freed")


def test_beyond_capacity_a_query_waits_then_names_the_busy_worker() -> None:
    waiting = waiting_query()
    with flight.LocalCluster(1, worker_args=["--source-threads", "4"]) as small:
        holders = [flight.DistributedExec(waiting, small.urls) for _ in range(4)]
        readers = [h.execute() for h in holders]
        wait_until(lambda: running_tasks(small.urls) == 4, 20.0, "four admitted tasks")
        # The admission wait (1 s) bounds a queued task, though the deadline for the worker's first
        # answer (connect_timeout, 10 s) is longer: the refusal comes after about a second.
        more = flight.DistributedExec(waiting, small.urls, admission_wait=1.0)
        with pytest.raises(WorkerBusyError) as raised:
            more.to_table()
        assert small.urls[0] in str(raised.value) and "at capacity" in str(raised.value)
        del readers


def test_a_query_deadline_cancels_everything_with_a_clear_timeout(cluster: flight.LocalCluster) -> None:
    waiting = waiting_query()
    with pytest.raises(QueryTimeoutError, match="deadline of 1s"):
        flight.DistributedExec(waiting, cluster.resolver(), deadline=1.0).to_table()
    wait_until(lambda: running_tasks(cluster.urls) == 0, 10.0, "the tasks to be freed")


def test_run_local_runs_a_plan_of_twelve_scans(parquet_files: list[Path]) -> None:
    expected = pa.concat_tables(pq.read_table(p) for p in parquet_files)
    ids = expected.column("id").to_pylist()
    bounds = [min(ids) + (max(ids) + 1 - min(ids)) * i // 12 for i in range(13)]
    scans = [flight.read_parquet(parquet_files).filter((col("id") >= lo) & (col("id") < hi)) for lo, hi in zip(bounds, bounds[1:])]
    got = flight.run_local(scans[0].union(*scans[1:])).read_all()
    assert sorted(got.column("id").to_pylist()) == sorted(ids)


def test_source_threads_counts_exactly_the_blocking_sources(parquet_files: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    a = flight.read_parquet(parquet_files)
    q = a.filter(col("id") > 3).union(a.limit(5)).sort("id").limit(3)
    plan = q.stage_plan()
    made: list[object] = []
    real = pipeline._source
    monkeypatch.setattr(pipeline, "_source", lambda reader, env: made.append(reader) or real(reader, env))
    feeds = flight.planner.cut.plan_query(q.node, max_tasks=1).head.feeds
    inputs = flight.dev.local._LocalInputs({f.feed.feed_id: (f.feed, f.partitions) for f in feeds})
    reader = select.compile_task(plan, inputs, 1024, roots=DataRoots.of([parquet_files[0].parent]))
    reader.read_all()
    assert pipeline.source_threads(plan) == len(made) > 0


# ------------------------------------------------------------- silence


# A coordinator in a process of its own (``python -m flight.dev.testing``'s, with heartbeats every
# 0.25 s instead of 2 s): the worker's silence bound can then be short without freeing a live task.
_COORDINATOR = """
import sys
import flight
from flight.dev.testing import waiting_query
reader = flight.DistributedExec(waiting_query(), [sys.argv[1]], heartbeat=0.25).execute()
print("started", flush=True)
reader.read_all()
"""


@pytest.mark.slow
def test_a_frozen_coordinator_has_its_tasks_freed() -> None:
    with flight.LocalCluster(1, worker_args=["--peer-timeout", "1.5"]) as one:
        proc = subprocess.Popen([sys.executable, "-c", _COORDINATOR, one.urls[0]], stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
            wait_until(lambda: running_tasks(one.urls) == 1, 10.0, "the task to start")
            os.kill(proc.pid, signal.SIGSTOP)
            stopped = time.monotonic()
            wait_until(lambda: running_tasks(one.urls) == 0, 15.0, "the frozen coordinator's task to be freed")
            assert time.monotonic() - stopped >= 1.0  # freed by the silence rule, not by anything else
            assert healthy(one.urls[0])
        finally:
            proc.kill()
            os.kill(proc.pid, signal.SIGCONT)
            proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()


@pytest.mark.slow
def test_a_silent_worker_fails_the_query_naming_it() -> None:
    waiting = waiting_query()
    with flight.LocalCluster(1) as one:
        pid = one.processes[0].pid
        reader = flight.DistributedExec(waiting, one.urls, peer_timeout=1.5, heartbeat=0.25).execute()
        wait_until(lambda: running_tasks(one.urls) == 1, 10.0, "the task to start")
        os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(WorkerUnavailableError, match="sent nothing") as raised:
                reader.read_all()
            assert time.monotonic() - started < 10.0
            assert one.urls[0] in str(raised.value)
        finally:
            os.kill(pid, signal.SIGCONT)


@pytest.mark.slow
def test_sigterm_ends_a_worker_whose_client_stays_silent() -> None:
    one = flight.LocalCluster(1, grace=1.0).start()
    try:
        proc = one.processes[0]
        stage = flight.map_input(pa.schema([("a", pa.int64())])).stage_plan()
        client = fl.connect(one.urls[0])
        writer, _reader = client.do_exchange(fl.FlightDescriptor.for_command(header(stage).SerializeToString()))
        wait_until(lambda: running_tasks(one.urls) == 1, 10.0, "the map task to start")
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=1.0 + 10.0) == 0  # --grace plus a few seconds, whatever the client does
        assert time.monotonic() - started < 1.0 + 6.0
    finally:
        one.stop()


def test_pools_of_clients_aborting_mid_read_never_abort_the_coordinator(cluster: flight.LocalCluster) -> None:
    """Abandoning results while their reader threads are inside read_chunk (TaskChannel.abort) is safe."""
    waiting = waiting_query()
    for _ in range(20):
        reader = flight.DistributedExec(waiting, cluster.resolver()).execute()
        del reader  # dropped: every channel is aborted while its reader thread is inside read_chunk
        gc.collect()
    wait_until(lambda: running_tasks(cluster.urls) == 0, 20.0, "every abandoned task to be freed")
    assert healthy(cluster.urls[0])


def test_info_reports_the_load(cluster: flight.LocalCluster) -> None:
    client = fl.connect(cluster.urls[0])
    info = protocol_pb2.WorkerInfo.FromString(next(iter(client.do_action("info"))).body.to_pybytes())
    assert info.load.source_threads_max == flight.WorkerOptions().source_threads
    assert info.load.max_tasks == flight.WorkerOptions().max_tasks  # no auth: every caller is one identity, with every slot
