"""Driving work-unit feeds from the coordinator to tasks, under credit.

A **source** is one discovery stream: a thread runs the provider (generator or
async generator) and queues what it yields, a bounded step ahead of the tasks.
A **slot** is one feed partition of one task, with the credit that task granted.
A partitioned feed has one source per partition and one slot per source; a
shared-queue feed has one source and a slot in every task, and each unit goes
to whichever slot has credit (honouring a unit's preferred worker for a short
while). One sender thread per task turns queued units into ``WorkUnitBatch``
frames, never more than the slot's credit, and sends ``FeedEnd`` once its
source is exhausted. So a slow provider never blocks a task that already has
work, and a slow task never receives more than it asked for.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

from flight._proto import protocol_pb2
from flight.coordinator.channel import TaskChannel
from flight.estimate import DiscoverySample
from flight.feed import FeedContext, LatencyStats, Unit, WorkUnit, WorkUnitFeed, now_ns, unit_bytes
from flight.resolver import normalize_url

__all__ = ["FeedDispatcher", "PartitionStats", "Source"]

log = logging.getLogger(__name__)


class _Stopped(Exception):
    """Raised inside a discovery thread when the query ended first."""


@dataclass
class PartitionStats:
    """What the coordinator sent to one task for one feed partition."""

    feed_id: str
    partition: int
    task: str
    units: int = 0
    bytes: int = 0
    frames: int = 0
    affinity_hits: int = 0


@dataclass
class _Item:
    body: bytes
    created_ns: int
    queued_at: float
    preferred: str | None
    rows: int | None
    size: int | None


@dataclass(eq=False)
class Source:
    """One discovery stream and the units it found that no task has taken yet."""

    feed: WorkUnitFeed
    partition: int
    partitions: int
    shared: bool
    queue: deque[_Item] = field(default_factory=deque)
    discovered: int = 0
    discovered_all: bool = False
    preferred_waiting: int = 0  # queued units that name a worker
    discovery: LatencyStats = field(default_factory=LatencyStats)
    started: float = 0.0
    sample_rows: list[int | None] = field(default_factory=list)
    sample_bytes: list[int | None] = field(default_factory=list)


@dataclass(eq=False)
class _Slot:
    source: Source
    partition: int  # on the wire: the task's partition number for this feed
    channel: TaskChannel
    stats: PartitionStats
    credit: int = 0
    end_sent: bool = False


class FeedDispatcher:
    """All feed sources of one query, the tasks' slots, and the threads that move units."""

    def __init__(
        self,
        query_id: str,
        *,
        discovery_buffer: int,
        max_units_per_frame: int,
        affinity_wait_s: float = 0.05,
        on_error: Callable[[BaseException], None],
    ) -> None:
        self.query_id = query_id
        self._buffer = max(1, discovery_buffer)
        self._max_frame = max(1, max_units_per_frame)
        self._affinity_wait = affinity_wait_s
        self._on_error = on_error
        self.sources: list[Source] = []
        self._slots: dict[tuple[str, str, int], _Slot] = {}
        self._by_channel: dict[TaskChannel, list[_Slot]] = {}
        self._urls: set[str] = set()
        self._cond = threading.Condition()
        self.cancelled = threading.Event()

    # ------------------------------------------------------------ wiring up

    def add_source(self, feed: WorkUnitFeed, partition: int, partitions: int, *, shared: bool) -> Source:
        source = Source(feed, partition, partitions, shared)
        self.sources.append(source)
        return source

    def add_slot(self, source: Source, partition: int, channel: TaskChannel) -> None:
        slot = _Slot(source, partition, channel, PartitionStats(source.feed.feed_id, partition, channel.key))
        self._slots[(channel.key, source.feed.feed_id, partition)] = slot
        self._by_channel.setdefault(channel, []).append(slot)
        self._urls.add(channel.url)

    def clear_slots(self) -> None:
        """Forget every task (before any unit was sent): the query retries with new tasks."""
        with self._cond:
            self._slots.clear()
            self._by_channel.clear()
            self._urls.clear()

    @property
    def stats(self) -> list[PartitionStats]:
        return [s.stats for s in self._slots.values()]

    def on_credit(self, channel: TaskChannel, feed_id: str, partition: int, credits: int) -> None:
        slot = self._slots.get((channel.key, feed_id, partition))
        if slot is None:
            log.warning("task %s asked for units of feed %r partition %d it was not given", channel.key, feed_id, partition)
            return
        with self._cond:
            slot.credit += credits
            self._cond.notify_all()

    def start_discovery(self, sources: list[Source] | None = None) -> None:
        for source in sources if sources is not None else self.sources:
            if not source.started:
                source.started = time.monotonic()
                name = f"discover-{source.feed.feed_id}-{source.partition}"
                threading.Thread(target=self._discover, args=(source,), name=name, daemon=True).start()

    def start_sending(self) -> None:
        for channel, slots in self._by_channel.items():
            threading.Thread(target=self._send, args=(channel, slots), name=f"send-{channel.key}", daemon=True).start()

    def stop(self) -> None:
        """End discovery and sending (the query finished or failed)."""
        self.cancelled.set()
        with self._cond:
            self._cond.notify_all()

    def sample(self, source: Source, units: int, seconds: float) -> DiscoverySample:
        """Wait until ``source`` found ``units`` units, finished, or ``seconds`` passed; describe it."""
        deadline = source.started + seconds
        with self._cond:
            while source.discovered < units and not source.discovered_all and not self.cancelled.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return DiscoverySample(
                rows=list(source.sample_rows),
                bytes=list(source.sample_bytes),
                finished=source.discovered_all,
                elapsed_ms=(time.monotonic() - source.started) * 1000,
            )

    # -------------------------------------------------------------- discovery

    def _put(self, source: Source, unit: WorkUnit, created: int) -> None:
        body = unit_bytes(unit)
        preferred = rows = size = None
        if isinstance(unit, Unit):
            preferred = normalize_url(unit.preferred_worker) if unit.preferred_worker else None
            rows, size = unit.rows, unit.bytes
        item = _Item(body, created, time.monotonic(), preferred, rows, size)
        with self._cond:
            while len(source.queue) >= self._buffer and not self.cancelled.is_set():
                self._cond.wait()
            if self.cancelled.is_set():
                raise _Stopped
            item.queued_at = time.monotonic()  # the affinity wait starts once the unit is in the queue
            source.queue.append(item)
            source.discovered += 1
            if len(source.sample_bytes) < 100_000:
                source.sample_rows.append(rows)
                source.sample_bytes.append(size)
            if preferred is not None:
                source.preferred_waiting += 1
            self._cond.notify_all()

    def _discover(self, source: Source) -> None:
        ctx = FeedContext(self.query_id, source.feed.feed_id, source.partition, source.partitions, self.cancelled)
        try:
            stream = source.feed.feed(source.partition, ctx)
            if inspect.isasyncgen(stream) or hasattr(stream, "__anext__"):
                asyncio.run(self._discover_async(source, stream))  # type: ignore[arg-type]
            else:
                self._discover_sync(source, stream)  # type: ignore[arg-type]
        except _Stopped:
            pass
        except BaseException as exc:  # noqa: BLE001 - user code: the query fails with its own exception
            what = "the shared discovery" if source.shared else f"partition {source.partition}"
            exc.add_note(f"raised by the provider of feed {source.feed.feed_id!r}, {what}")
            self._on_error(exc)
            return  # never mark a failed discovery as complete: no FeedEnd may follow it
        with self._cond:
            source.discovered_all = True
            self._cond.notify_all()

    def _discover_sync(self, source: Source, stream: Iterator[WorkUnit]) -> None:
        try:
            last = now_ns()
            for unit in stream:
                created = now_ns()
                source.discovery.add(created - last)
                self._put(source, unit, created)
                last = now_ns()
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()

    async def _discover_async(self, source: Source, stream: AsyncIterator[WorkUnit]) -> None:
        # A loop of this thread's own: blocking in _put only holds up this provider.
        last = now_ns()
        async for unit in stream:
            created = now_ns()
            source.discovery.add(created - last)
            self._put(source, unit, created)
            last = now_ns()

    # ---------------------------------------------------------------- sending

    def _take(self, slot: _Slot, n: int) -> list[_Item]:
        """Up to ``n`` units for ``slot``: in order, skipping (for a while) units meant for other workers."""
        queue = slot.source.queue
        if not slot.source.preferred_waiting:
            return [queue.popleft() for _ in range(min(n, len(queue)))]
        now = time.monotonic()
        url = slot.channel.url
        taken: list[_Item] = []
        keep: list[_Item] = []
        while queue and len(taken) < n:
            item = queue.popleft()
            p = item.preferred
            if p is None or p == url or p not in self._urls or now - item.queued_at >= self._affinity_wait:
                if p is not None:
                    slot.source.preferred_waiting -= 1
                    slot.stats.affinity_hits += p == url
                taken.append(item)
            else:
                keep.append(item)
        queue.extendleft(reversed(keep))
        return taken

    def _ready_frames(self, slots: list[_Slot]) -> list[protocol_pb2.CoordinatorFrame]:
        frames = []
        for slot in slots:
            source = slot.source
            items = self._take(slot, min(slot.credit, self._max_frame)) if slot.credit and source.queue else []
            if items:
                sent = now_ns()
                units = [protocol_pb2.WorkUnit(body=i.body, created_unix_nanos=i.created_ns, sent_unix_nanos=sent) for i in items]
                slot.credit -= len(items)
                slot.stats.units += len(items)
                slot.stats.bytes += sum(len(i.body) for i in items)
                slot.stats.frames += 1
                frames.append(
                    protocol_pb2.CoordinatorFrame(
                        units=protocol_pb2.WorkUnitBatch(feed_id=source.feed.feed_id, partition=slot.partition, units=units)
                    )
                )
            if source.discovered_all and not source.queue and not slot.end_sent:
                slot.end_sent = True
                frames.append(
                    protocol_pb2.CoordinatorFrame(
                        feed_end=protocol_pb2.FeedEnd(feed_id=source.feed.feed_id, partition=slot.partition)
                    )
                )
        return frames

    def _send(self, channel: TaskChannel, slots: list[_Slot]) -> None:
        while True:
            with self._cond:
                while True:
                    if self.cancelled.is_set():
                        return
                    frames = self._ready_frames(slots)
                    if frames:
                        self._cond.notify_all()  # discovery may wait for queue room
                        break
                    if all(s.end_sent for s in slots):
                        return
                    # Units held back for another worker become anyone's after the affinity wait.
                    waiting = any(s.credit and s.source.queue for s in slots)
                    self._cond.wait(self._affinity_wait if waiting else None)
            for frame in frames:
                channel.send(frame)
