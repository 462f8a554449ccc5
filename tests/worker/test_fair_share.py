"""A fair share of a worker for every client (issue 24): a real ``flight-worker`` with two named tokens.

Client A ("alice") opens task exchanges that wait forever for units and keeps them
alive with heartbeats, doing nothing else: the hostile client of the issue. Client B
("bob") must still get its query answered, exactly (pyarrow is the oracle), and the
worker must keep its thread count bounded however many exchanges A opens.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as fl
import pytest
from support import header, units_plan, wait_until

import flight
from flight import agg, col
from flight.security import Security, connect
from flight.wire._proto import protocol_pb2

pytestmark = pytest.mark.slow  # a worker process of its own, dozens to a thousand exchanges

ALICE = Security(token="alice-token-0123456789abcdef")
BOB = Security(token="bob-token-fedcba9876543210")
HEARTBEAT = protocol_pb2.CoordinatorFrame(heartbeat=protocol_pb2.Heartbeat()).SerializeToString()
RELEASE = protocol_pb2.CoordinatorFrame(release=protocol_pb2.Release()).SerializeToString()
THREAD_LIMIT = 150


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[flight.LocalCluster]:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# two clients\nalice:{ALICE.token}\nbob:{BOB.token}\n")
    tokens.chmod(0o600)
    with flight.LocalCluster(1, worker_args=["--auth-token-file", str(tokens)]) as cluster:
        yield cluster


class Hostile(threading.Thread):
    """Opens ``n`` exchanges whose tasks wait for units that never come, and heartbeats them until stopped.

    Every call on the exchanges happens on this one thread (a Flight stream must not be
    written from two threads); ``stop()`` lets every task go and cancels every call.
    """

    def __init__(self, url: str, n: int, security: Security) -> None:
        super().__init__(name="hostile", daemon=True)
        self.url, self.n, self.security = url, n, security
        self.opened = threading.Event()
        self.stopped = threading.Event()
        self.error: BaseException | None = None
        self.open = 0  # exchanges opened (refused ones included)

    def run(self) -> None:
        streams: list[tuple[fl.FlightStreamWriter, fl.FlightStreamReader]] = []
        client = connect(self.url, self.security)
        try:
            for _ in range(self.n):
                h = header(units_plan(), feeds={"f": [0]})
                streams.append(client.do_exchange(fl.FlightDescriptor.for_command(h.SerializeToString())))
                self.open += 1
            self.opened.set()
            while not self.stopped.wait(1.0):  # well within the worker's --peer-timeout (10 s)
                for writer, _ in streams:
                    with contextlib.suppress(pa.ArrowException, OSError):  # a refused exchange has ended
                        writer.write_metadata(pa.py_buffer(HEARTBEAT))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            for writer, reader in streams:
                with contextlib.suppress(pa.ArrowException, OSError):
                    writer.write_metadata(pa.py_buffer(RELEASE))
                with contextlib.suppress(pa.ArrowException, OSError):
                    reader.cancel()
                with contextlib.suppress(pa.ArrowException, OSError):
                    writer.close()
            streams.clear()
            client.close()
            self.opened.set()

    def stop(self) -> None:
        self.stopped.set()
        self.join(60)
        assert not self.is_alive(), "the hostile client did not let go of its exchanges"


@contextlib.contextmanager
def hostile(url: str, n: int) -> Iterator[Hostile]:
    h = Hostile(url, n, ALICE)
    h.start()
    try:
        assert h.opened.wait(120), "the hostile client did not open its exchanges"
        assert h.error is None, h.error
        yield h
    finally:
        h.stop()


def info(url: str, security: Security) -> protocol_pb2.WorkerInfo:
    with connect(url, security) as client:
        (result,) = list(client.do_action(fl.Action("info", b"")))
    return protocol_pb2.WorkerInfo.FromString(result.body.to_pybytes())


def load_of(url: str, name: str) -> protocol_pb2.ClientLoad:
    for c in info(url, BOB).clients:
        if c.identity == name:
            return c
    return protocol_pb2.ClientLoad(identity=name)


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _table() -> pa.Table:
    return pa.table({"k": pa.array([i % 3 for i in range(5)], pa.int64()), "v": pa.array([10, 20, 30, 40, 50], pa.int64())})


def test_a_client_holding_the_worker_leaves_room_for_another(worker: flight.LocalCluster) -> None:
    url = worker.urls[0]
    with hostile(url, 70):
        # 3/4 of --max-tasks (64) run, the next 16 wait, the rest were refused at once.
        wait_until(lambda: load_of(url, "alice").running_tasks == 48 and load_of(url, "alice").queued_tasks == 16,
                   60.0, "alice's tasks to settle at her share")
        alice = load_of(url, "alice")
        assert alice.refused == 70 - 48 - 16 and alice.reserved_bytes > 0
        q = flight.from_arrow(_table()).aggregate(["k"], n=agg.count_all(), s=agg.sum("v")).filter(col("k") >= 0)
        got = flight.DistributedExec(q, [url], security=BOB).to_table().sort_by("k")
        expected = _table().group_by("k").aggregate([([], "count_all"), ("v", "sum")]).sort_by("k")
        assert got.column("k").to_pylist() == expected.column("k").to_pylist()
        assert got.column("n").to_pylist() == expected.column("count_all").to_pylist()
        assert got.column("s").to_pylist() == expected.column("v_sum").to_pylist()
        assert load_of(url, "alice").running_tasks == 48  # still held: bob got in beside her
        assert load_of(url, "bob").refused == 0
    wait_until(lambda: info(url, BOB).running_tasks == 0, 30.0, "alice's tasks to be freed")


def test_a_thousand_exchanges_of_one_client_keep_the_threads_bounded(worker: flight.LocalCluster) -> None:
    url, pid = worker.urls[0], worker.processes[0].pid
    base = threads_of(pid)
    with hostile(url, 1000) as h:
        assert h.open == 1000
        wait_until(lambda: load_of(url, "alice").refused >= 1000 - 48 - 16, 120.0, "the refusals beyond alice's share")
        wait_until(lambda: load_of(url, "alice").running_tasks == 48, 60.0, "alice's running tasks")
        counts = []
        for _ in range(5):  # a few samples while the exchanges heartbeat
            counts.append(threads_of(pid))
            with connect(url, BOB) as client:
                assert [r.body.to_pybytes() for r in client.do_action(fl.Action("health", b""))] == [b"ok"]
        print(f"worker threads: {base} idle, {max(counts)} with 1,000 exchanges of one client")
        assert max(counts) < THREAD_LIMIT, f"the worker runs {max(counts)} threads (idle: {base})"
    wait_until(lambda: info(url, BOB).running_tasks == 0, 30.0, "alice's tasks to be freed")
