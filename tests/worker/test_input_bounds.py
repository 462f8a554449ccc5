"""What a client sends a task is bounded in bytes, not only in count (no sockets: the plain objects).

Credits bound how many work units a client may send; ``UnitBytes`` bounds their bytes by the
task's input reservation, and ``InputQueue`` bounds a map stage's queued input the same way,
by making the exchange's reader wait (gRPC's flow control then holds the client back).
"""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest
from support import wait_until

from flight.errors import ProtocolError
from flight.wire._proto import protocol_pb2
from flight.worker.inputs import FeedInbox, InputQueue, UnitBytes


def _units(n: int, size: int) -> list[protocol_pb2.WorkUnit]:
    return [protocol_pb2.WorkUnit(body=b"u" * size) for _ in range(n)]


def test_units_past_the_reservation_are_refused_and_taking_them_frees_room() -> None:
    held = UnitBytes(1000)
    credits: list[int] = []
    a = FeedInbox("f", 0, 64, credits.append, held)
    b = FeedInbox("f", 1, 64, credits.append, held)
    a.open()
    b.open()
    a.deliver(_units(6, 100))
    b.deliver(_units(4, 100))
    assert held.held == 1000
    with pytest.raises(ProtocolError, match="input reservation") as refused:
        b.deliver(_units(1, 1))  # one byte too many, in any partition of the task
    assert refused.value.field == "app_metadata.units"
    assert [len(u.body) for u in a.take(2)] == [100, 100]
    assert held.held == 800
    b.deliver(_units(2, 100))  # room again
    assert held.held == 1000


def test_one_unit_larger_than_the_reservation_passes_when_nothing_is_held() -> None:
    held = UnitBytes(1000)
    inbox = FeedInbox("f", 0, 8, lambda n: None, held)
    inbox.open()
    inbox.deliver(_units(1, 5000))  # any single unit a frame may carry gets through
    with pytest.raises(ProtocolError):
        inbox.deliver(_units(1, 10))
    inbox.take(1)
    assert held.held == 0


def test_a_failed_inbox_lets_its_units_go() -> None:
    held = UnitBytes(1 << 20)
    inbox = FeedInbox("f", 0, 8, lambda n: None, held)
    inbox.open()
    inbox.deliver(_units(8, 1000))
    inbox.fail(RuntimeError("cancelled"))
    assert held.held == 0
    with pytest.raises(RuntimeError):
        inbox.take(1)


def _batch(nbytes: int) -> pa.RecordBatch:
    return pa.record_batch({"x": pa.array([b"x" * nbytes], pa.binary())})


def test_map_input_waits_past_its_bytes_and_resumes_when_read() -> None:
    queue = InputQueue(max_batches=100, max_bytes=3000)
    queue.put(_batch(1000))
    queue.put(_batch(1000))  # about 2 KB queued: a third would pass 3,000 bytes
    third = threading.Thread(target=queue.put, args=(_batch(1000),))
    third.start()
    third.join(0.2)
    assert third.is_alive(), "the third batch should wait for room"
    it = iter(queue)
    next(it)
    wait_until(lambda: not third.is_alive(), 5.0, "the waiting batch to be queued once one was read")
    assert queue.batches == 3


def test_one_map_input_batch_larger_than_the_bound_is_taken_when_the_queue_is_empty() -> None:
    queue = InputQueue(max_batches=8, max_bytes=100)
    queue.put(_batch(10_000))
    queue.end()
    assert [b.num_rows for b in queue] == [1]
