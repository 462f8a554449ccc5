"""What one client can make a real worker hold, with the largest values it may choose.

Before issue 24: a full credit window (65,536) of 1 MiB work units grew a worker by 410 MB,
and one DoGet left unread with ``output_buffer_bytes`` at its clamp (1 GiB then) by 595 MB.
Now a task's unread units stay within its input reservation (a frame past it is refused as
a protocol error) and an output buffer within 192 MiB, and admission counts both against
the client's and the worker's budget. These tests drive a ``flight-worker`` process with
those values, read its RSS from /proc, and check it grew by at most 300 MB, and that the
``info`` action shows what the client holds.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as fl
import pyarrow.parquet
import pytest
from support import wait_until

import flight
from flight import threads
from flight.coordinator.headers import task_header
from flight.wire._proto import protocol_pb2
from flight.wire.plan_codec import encode_plan
from flight.wire.protocol import new_secret
from flight.worker.memory import release_idle_memory

MB = 1 << 20
GROWTH_MB = 300  # the bound for each case
UNIT = b"u" * MB


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def info(client: fl.FlightClient) -> protocol_pb2.WorkerInfo:
    (result,) = list(client.do_action(fl.Action("info", b""), options=fl.FlightCallOptions(timeout=10)))
    return protocol_pb2.WorkerInfo.FromString(result.body.to_pybytes())


@pytest.fixture
def worker() -> Iterator[tuple[str, int]]:
    with flight.LocalCluster(1) as cluster:
        yield cluster.urls[0], cluster.processes[0].pid


class _Nothing(flight.WorkUnitFeedProvider):
    """Only its plan is used: this test is the coordinator and sends the units itself."""

    def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[bytes]:
        return iter(())


def units_header(url: str, **options: int) -> protocol_pb2.TaskHeader:
    plan = flight.units(_Nothing()).stage_plan()  # the units themselves as rows: output as large as the input
    feed_id = plan.root.feed_scan.feed.feed_id
    return task_header(
        query_id=os.urandom(8).hex(), stage_id=0, task=0, task_count=1, plan=encode_plan(plan), url=url,
        secret=new_secret(), feeds={feed_id: [0]}, options=protocol_pb2.TaskOptions(**options),
    )


class Exchange:
    def __init__(self, client: fl.FlightClient, header: protocol_pb2.TaskHeader) -> None:
        self.header = header
        self.writer, self.reader = client.do_exchange(fl.FlightDescriptor.for_command(header.SerializeToString()))

    def frame(self) -> protocol_pb2.WorkerFrame:
        while True:
            chunk = self.reader.read_chunk()
            if chunk.app_metadata is not None and chunk.app_metadata.size:
                frame = protocol_pb2.WorkerFrame.FromString(chunk.app_metadata.to_pybytes())
                if frame.WhichOneof("frame") != "heartbeat":
                    return frame

    def send(self, frame: protocol_pb2.CoordinatorFrame) -> None:
        self.writer.write_metadata(pa.py_buffer(frame.SerializeToString()))

    def units(self, n: int) -> None:
        feed_id = self.header.feeds[0].feed_id
        batch = protocol_pb2.WorkUnitBatch(feed_id=feed_id, partition=0, units=[protocol_pb2.WorkUnit(body=UNIT)] * n)
        self.send(protocol_pb2.CoordinatorFrame(units=batch))

    def close(self) -> None:
        self.reader.cancel()
        try:
            self.writer.close()
        except (pa.ArrowException, OSError):
            pass  # the call was cancelled: its status is re-raised here


@pytest.mark.slow
def test_a_flood_of_large_units_is_refused_not_buffered(worker: tuple[str, int]) -> None:
    url, pid = worker
    client = fl.connect(url)
    before = rss(pid)
    ex = Exchange(client, units_header(url, feed_window=1 << 20))  # asks for more than the clamp (65,536)
    try:
        ready = ex.frame()
        assert ready.WhichOneof("frame") == "ready" and [c.credits for c in ready.ready.credits] == [65_536], ready  # the first window
        refusal = ""
        for _ in range(64):  # up to 1 GiB of units in 16 MiB frames: each within the credit granted
            try:
                ex.units(16)
            except (pa.ArrowException, OSError):
                break  # the worker ended the call (pyarrow then reads the rest of the stream itself)
        try:
            while not refusal:
                frame = ex.frame()
                if frame.WhichOneof("frame") == "error":
                    refusal = f"{frame.error.message} [field: {frame.error.field}]"
        except (pa.ArrowException, OSError) as exc:
            refusal = str(exc)  # the call's status carries the same ErrorInfo
    finally:
        peak = rss(pid)
        ex.close()
    assert "input reservation" in refusal and "app_metadata.units" in refusal, refusal
    print(f"unit flood: the worker grew by {(peak - before) >> 20} MB")
    assert peak - before <= GROWTH_MB * MB, f"the worker grew by {(peak - before) >> 20} MB"
    wait_until(lambda: info(client).running_tasks == 0, 15.0, "the refused task to be freed")


@pytest.mark.slow
def test_an_unread_output_at_the_largest_buffer_stays_within_it(worker: tuple[str, int]) -> None:
    url, pid = worker
    client = fl.connect(url)
    before = rss(pid)
    header = units_header(url, feed_window=4, output_buffer_bytes=1 << 40)  # clamped to 192 MiB
    ex = Exchange(client, header)
    reader = None
    try:
        ready = ex.frame()
        assert ready.WhichOneof("frame") == "ready", ready
        ticket = protocol_pb2.Ticket(stage_key=header.stage_key, partition_start=0, partition_end=1, query_secret=header.query_secret)
        reader = client.do_get(fl.Ticket(ticket.SerializeToString()))  # opened, never read
        sent = 0
        granted = sum(c.credits for c in ready.ready.credits)  # the first window (protocol version 12)
        full = None  # the worker's load once its output buffer held its bound
        # Units under credit until the task stops granting: its output buffer is full and nobody reads it.
        while sent < 600:
            if sent >= granted:
                frame = ex.frame()
                assert frame.WhichOneof("frame") == "credit", frame
                granted += frame.credit.credits
            while sent < granted and sent < 600:
                ex.units(1)
                sent += 1
            clients = info(client).clients
            if clients and clients[0].buffered_bytes >= 188 * MB:
                full = clients[0]
                break
        assert full is not None, f"the output buffer never reached 188 MiB after {sent} units"
        # Read again later, it may be a batch less: the unread DoGet's stream takes the next batch out of the
        # buffer into gRPC's (a CI run saw 187.0 MiB here); never more than the bounds.
        load = info(client).clients[0]
        assert load.identity == "anonymous" and load.running_tasks == 1
        assert load.buffered_bytes <= (192 + 8 + 2) * MB and full.buffered_bytes <= (192 + 8 + 2) * MB, load  # output and unread units
        grown = rss(pid) - before
        print(f"unread output at the largest buffer: the worker grew by {grown >> 20} MB, holding {load.buffered_bytes >> 20} MiB")
        assert grown <= GROWTH_MB * MB, f"the worker grew by {grown >> 20} MB"
    finally:
        if reader is not None:
            reader.cancel()
        ex.close()
    wait_until(lambda: info(client).running_tasks == 0, 15.0, "the abandoned task to be freed")


def test_giving_idle_memory_back_ends_idle_threads_and_keeps_the_io_pool_size() -> None:
    """``release_idle_memory`` shrinks Arrow's I/O pool so its idle threads end (their allocator pages go
    back), then gives the pool its size again: the next task has every source thread admission counted on."""
    size = pa.io_thread_count()
    for job in [threads.spawn(lambda: None, name=f"idle-{i}") for i in range(3)]:
        job.join(10)
    release_idle_memory()
    assert pa.io_thread_count() == size
    wait_until(lambda: not [t for t in threading.enumerate() if t.name == "flight-idle"], timeout=5,
               what="the idle pool threads to end")


def test_giving_idle_memory_back_never_resizes_arrows_compute_pool() -> None:
    """Acero sizes a plan's per-thread state by the compute pool's size when the plan starts: a
    plan started while the release had shrunk that pool lost rows of a hash join (TPC-H Q12 on
    ``--engine acero`` workers, a few rows short about once in 150 runs). Only the I/O pool shrinks."""
    seen: list[tuple[int, int]] = []

    def busy() -> bool:  # asked while the pools are at their idle size
        seen.append((pa.cpu_count(), pa.io_thread_count()))
        return len(seen) >= 3

    cpu = pa.cpu_count()
    release_idle_memory(busy)
    assert seen and all(c == cpu for c, _ in seen) and any(io == 1 for _, io in seen), seen
    assert pa.cpu_count() == cpu


_RELEASE_BESIDE_ACERO = """
import sys, threading
from pathlib import Path
import pyarrow as pa
import flight
from flight.worker.memory import release_idle_memory

root = Path(sys.argv[1])
q = (flight.read_parquet(sorted((root / "l").glob("*.parquet")))
     .join(flight.read_parquet(sorted((root / "r").glob("*.parquet"))), left_on="k", right_on="k")
     .aggregate(["a"], n=flight.agg.count_all(), s=flight.agg.sum("b")))
stop = threading.Event()

def release_again_and_again():
    while not stop.is_set():
        release_idle_memory(lambda: stop.wait(0.003))

threading.Thread(target=release_again_and_again, daemon=True).start()
for i in range(int(sys.argv[2])):
    got = flight.run_local(q, engine="acero").read_all().sort_by("a")
    print(got.to_pylist(), flush=True)
stop.set()
"""


@pytest.mark.slow
def test_acero_joins_stay_exact_while_idle_memory_is_given_back(tmp_path: Path) -> None:
    """The same join on Acero 60 times, the release running beside it over and over: every answer
    equals DuckDB's (with the compute pool resized, runs came out short or the process crashed).

    The runs are in a process of their own, as a worker's are: the release collects garbage, and
    run back to back in the test process (the heap of every test before it, where one collection
    takes a second with the GIL held) the runs barely moved (CI's timeout).
    """
    import json
    import subprocess
    import sys

    import duckdb

    n = 60_000
    left = pa.table({"k": pa.array(range(n), pa.int64()), "a": pa.array([i % 7 for i in range(n)], pa.int64())})
    right = pa.table({"k": pa.array(range(0, 3 * n, 3), pa.int64()), "b": pa.array([i % 5 for i in range(n)], pa.int64())})
    for name, t in (("l", left), ("r", right)):
        (tmp_path / name).mkdir()
        for i in range(2):
            pa.parquet.write_table(t.slice(i * n // 2, n // 2), tmp_path / name / f"{i}.parquet", row_group_size=5_000)
    want = duckdb.sql(f"SELECT a, count(*) AS n, sum(b) AS s FROM read_parquet('{tmp_path}/l/*.parquet') "
                      f"JOIN read_parquet('{tmp_path}/r/*.parquet') USING (k) GROUP BY a ORDER BY a").arrow().read_all()
    runs = 60
    done = subprocess.run([sys.executable, "-c", _RELEASE_BESIDE_ACERO, str(tmp_path), str(runs)],
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-2000:]  # a crash is a failure too
    answers = [json.loads(line.replace("'", '"')) for line in done.stdout.splitlines()]
    assert len(answers) == runs
    for i, got in enumerate(answers):
        assert got == want.to_pylist(), f"run {i}"


def test_a_worker_started_without_the_arrow_pool_variable_runs_again_with_it(tmp_path: Path) -> None:
    # Arrow's C++ code (the Flight server's reads) allocates from the pool Arrow chose at import: the worker
    # must be the process that set ARROW_DEFAULT_MEMORY_POOL, so flight-worker runs itself again with it.
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    with subprocess.Popen([sys.executable, "-m", "flight.worker", "--host", "127.0.0.1", "--port", "0"],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=tmp_path) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().startswith("flight-worker listening on ")
            environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
            assert b"ARROW_DEFAULT_MEMORY_POOL=jemalloc" in environ  # the same pid, after the exec
        finally:
            proc.terminate()
            proc.wait(30)
