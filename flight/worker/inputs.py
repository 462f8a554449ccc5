"""What flows into a task: work units under credit (``FeedInbox``) and map-stage input (``InputQueue``).

Plain objects, no I/O: the exchange's reader thread puts into them, the task's
pipeline takes from them, and both bound what they hold (credits; a few batches).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pyarrow as pa

from flight.errors import ProtocolError, light_copy
from flight.sources.feed import LatencyStats, now_ns
from flight.wire._proto import protocol_pb2
from flight.wire.limits import MAX_FEED_WINDOW, clamp

__all__ = ["FeedInbox", "InputQueue", "ReceivedUnit", "UnitBytes"]


class UnitBytes:
    """The bytes of work units a task holds unread, across its feed partitions, against a bound.

    Why: credits bound the *number* of units a client may send, not their size (a unit may
    be 16 MiB, a window 65,536 units): a client that sent a full window of large units made
    a worker hold +410 MB for one task. The bound is the task's input reservation, which
    admission counted against the worker's and the client's memory budget; a frame that
    would pass it is refused as a protocol error (the task fails, nothing grows), except
    when the task holds no unit at all, so any single unit a frame may carry gets through.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held = 0
        self._lock = threading.Lock()

    def hold(self, n: int, where: str) -> None:
        with self._lock:
            if self._held and self._held + n > self.limit:
                raise ProtocolError(
                    f"{where}: the task would hold {(self._held + n) >> 10} KiB of unread work units, more than its "
                    f"{self.limit >> 10} KiB input reservation: send fewer or smaller units at a time",
                    field="app_metadata.units",
                )
            self._held += n

    def free(self, n: int) -> None:
        with self._lock:
            self._held = max(0, self._held - n)

    @property
    def held(self) -> int:
        with self._lock:
            return self._held


@dataclass
class ReceivedUnit:
    """A unit on the worker, with the timestamps its latencies are made of."""

    body: bytes
    created_ns: int
    sent_ns: int
    received_ns: int
    inbox: FeedInbox = field(repr=False)
    id: int = 0
    """``WorkUnit.id``: what a task tags its rows with for unit-level recovery (``TaskOptions.tag_units``)."""

    def done(self) -> None:
        """The reader has turned this unit into rows."""
        self.inbox.record_processed(self)


class FeedInbox:
    """Units of one feed partition for one task, bounded by credits.

    The task's Ready frame grants the first ``window`` credits (``open``); each unit it
    takes may grant more, in chunks, so the coordinator never has more than ``window``
    units outstanding (queued here or in flight) for this partition.
    """

    def __init__(
        self, feed_id: str, partition: int, window: int, send_credit: Callable[[int], None], held: UnitBytes | None = None
    ) -> None:
        self.feed_id = feed_id
        self._held = held or UnitBytes(1 << 62)
        self.partition = partition
        self._window = clamp(window, 1, MAX_FEED_WINDOW)
        self._send_credit = send_credit
        self._units: deque[ReceivedUnit] = deque()
        self._granted = 0
        self._received = 0
        self._taken = 0
        self._ended = False
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self.units = 0
        self.bytes = 0
        self.created_to_sent = LatencyStats()
        self.sent_to_received = LatencyStats()
        self.received_to_processed = LatencyStats()

    def open(self) -> int:
        """The first window, granted: the credits the task's Ready frame carries for this partition (each unit taken
        grants more through ``send_credit``)."""
        with self._cond:
            self._granted = self._window
        return self._window

    def deliver(self, units: list[protocol_pb2.WorkUnit]) -> None:
        """Units from a WorkUnitBatch frame; more than the credit granted is a protocol error."""
        received_ns = now_ns()
        with self._cond:
            if self._ended:
                raise ProtocolError(
                    f"units for feed {self.feed_id!r} partition {self.partition} arrived after its FeedEnd",
                    field="app_metadata.units",
                )
            if self._received + len(units) > self._granted:
                raise ProtocolError(
                    f"feed {self.feed_id!r} partition {self.partition}: {self._received + len(units)} units sent "
                    f"but only {self._granted} credits granted",
                    field="app_metadata.units",
                )
            size = sum(len(u.body) for u in units)
            self._held.hold(size, f"feed {self.feed_id!r} partition {self.partition}")
            self._received += len(units)
            for u in units:
                self._units.append(ReceivedUnit(u.body, u.created_unix_nanos, u.sent_unix_nanos, received_ns, self, u.id))
                self.bytes += len(u.body)
                self.created_to_sent.add(u.sent_unix_nanos - u.created_unix_nanos)
                self.sent_to_received.add(received_ns - u.sent_unix_nanos)
            self.units += len(units)
            self._cond.notify_all()

    def end(self) -> None:
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        with self._cond:
            if self._error is None:
                self._error = error
            self._held.free(sum(len(u.body) for u in self._units))  # never read now: let them go
            self._units.clear()
            self._cond.notify_all()

    def take(self, most: int = 1) -> list[ReceivedUnit]:
        """Wait for at least one unit and return up to ``most``; ``[]`` once the feed has ended."""
        with self._cond:
            while not self._units and not self._ended and self._error is None:
                self._cond.wait()
            if self._error is not None:
                raise light_copy(self._error)
            taken = [self._units.popleft() for _ in range(min(most, len(self._units)))]
            self._held.free(sum(len(u.body) for u in taken))
            self._taken += len(taken)
            outstanding = self._granted - self._taken
            grant = 0
            if taken and not self._ended and outstanding <= self._window // 2:
                grant = self._window - outstanding
                self._granted += grant
        if grant:
            self._send_credit(grant)
        return taken

    def __iter__(self) -> Iterator[ReceivedUnit]:
        while batch := self.take(1):
            yield batch[0]

    def record_processed(self, unit: ReceivedUnit) -> None:
        self.received_to_processed.add(now_ns() - unit.received_ns)

    def metrics(self) -> protocol_pb2.FeedMetrics:
        return protocol_pb2.FeedMetrics(
            feed_id=self.feed_id,
            partition=self.partition,
            units=self.units,
            bytes=self.bytes,
            created_to_sent=self.created_to_sent.to_proto(),
            sent_to_received=self.sent_to_received.to_proto(),
            received_to_processed=self.received_to_processed.to_proto(),
        )


class InputQueue:
    """A map stage's input batches, from the exchange's reader thread to the pipeline.

    Bounded in batches and in bytes (the task's input reservation; one batch of any size
    when the queue is empty): past either, ``put`` waits, the exchange is not read, and
    gRPC's flow control holds the client back. It never grows with what a client sends.
    """

    def __init__(self, max_batches: int = 8, max_bytes: int = 8 << 20) -> None:
        self._items: deque[pa.RecordBatch] = deque()
        self._max = max_batches
        self._max_bytes = max_bytes
        self._bytes = 0
        self._ended = False
        self._discarding = False
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self.rows = 0
        self.batches = 0
        self.end_seen = False  # the client's InputEnd frame arrived

    def discard(self) -> None:
        """The pipeline needs no more input (e.g. a limit was reached): drop what still arrives.

        The exchange keeps being read, so the client's half-close is still seen.
        """
        with self._cond:
            self._discarding = True
            self._items.clear()
            self._bytes = 0
            self._cond.notify_all()

    def put(self, batch: pa.RecordBatch) -> None:
        with self._cond:
            while (
                self._items
                and (len(self._items) >= self._max or self._bytes + batch.nbytes > self._max_bytes)
                and self._error is None
                and not self._discarding
            ):
                self._cond.wait()
            if self._error is not None:
                raise light_copy(self._error)
            if self.end_seen:
                raise ProtocolError("a map input batch arrived after the InputEnd frame", field="data")
            self.rows += batch.num_rows
            self.batches += 1
            if self._discarding:
                return
            self._items.append(batch)
            self._bytes += batch.nbytes
            self._cond.notify_all()

    @property
    def queued_bytes(self) -> int:
        with self._cond:
            return self._bytes

    def end_with(self, rows: int, batches: int) -> None:
        """The client's InputEnd: what it sent must be what arrived, or the input was cut short."""
        with self._cond:
            if self._error is not None:  # the task stopped: the input did not reach it, whatever the counts say
                raise light_copy(self._error)
            if self.end_seen:
                raise ProtocolError("a second InputEnd frame arrived", field="app_metadata.input_end")
            self.end_seen = True
            if (rows, batches) != (self.rows, self.batches):
                raise ProtocolError(
                    f"the client sent {rows} rows in {batches} batches but {self.rows} rows in "
                    f"{self.batches} batches arrived: the input was cut short or altered",
                    field="app_metadata.input_end",
                )
            self._ended = True
            self._cond.notify_all()

    def end(self) -> None:
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        with self._cond:
            if self._error is None:
                self._error = error
            self._items.clear()  # never read now: let them go
            self._bytes = 0
            self._cond.notify_all()

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        while True:
            with self._cond:
                while not self._items and not self._ended and self._error is None:
                    self._cond.wait()
                if self._error is not None:
                    raise light_copy(self._error)
                if not self._items:
                    return
                batch = self._items.popleft()
                self._bytes -= batch.nbytes
                self._cond.notify_all()
            yield batch
