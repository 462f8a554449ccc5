"""Driving work-unit feeds from the coordinator to tasks, under credit.

Each feed partition has a discovery thread that runs the provider (a
generator or an async generator) and queues what it yields, a bounded step
ahead of the task. One sender thread per task turns queued units into
``WorkUnitBatch`` frames, never more than the credit the task granted, and
sends ``FeedEnd`` once a partition's discovery is over and its queue is empty.
So a slow provider never blocks a task that already has work, and a slow task
never receives more than it asked for.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

from flight._proto import protocol_pb2
from flight.coordinator.channel import TaskChannel
from flight.feed import FeedContext, LatencyStats, WorkUnit, WorkUnitFeed, now_ns, unit_bytes

__all__ = ["FeedDispatcher", "PartitionStats"]

log = logging.getLogger(__name__)


class _Stopped(Exception):
    """Raised inside a discovery thread when the query ended first."""


@dataclass
class PartitionStats:
    """What the coordinator sent for one feed partition."""

    feed_id: str
    partition: int
    task: str
    units: int = 0
    bytes: int = 0
    frames: int = 0
    discovery: LatencyStats = field(default_factory=LatencyStats)


@dataclass(eq=False)
class _Partition:
    feed: WorkUnitFeed
    partition: int
    partitions: int
    channel: TaskChannel
    stats: PartitionStats
    queue: deque[tuple[bytes, int]] = field(default_factory=deque)
    credit: int = 0
    discovered_all: bool = False
    end_sent: bool = False


class FeedDispatcher:
    """All feed partitions of one query, and the threads that move their units."""

    def __init__(
        self,
        query_id: str,
        *,
        discovery_buffer: int,
        max_units_per_frame: int,
        on_error: Callable[[BaseException], None],
    ) -> None:
        self.query_id = query_id
        self._buffer = max(1, discovery_buffer)
        self._max_frame = max(1, max_units_per_frame)
        self._on_error = on_error
        self._parts: dict[tuple[str, str, int], _Partition] = {}
        self._by_channel: dict[TaskChannel, list[_Partition]] = {}
        self._cond = threading.Condition()
        self.cancelled = threading.Event()
        self._threads: list[threading.Thread] = []

    def add(self, feed: WorkUnitFeed, partition: int, partitions: int, channel: TaskChannel) -> None:
        stats = PartitionStats(feed.feed_id, partition, channel.key)
        part = _Partition(feed, partition, partitions, channel, stats)
        self._parts[(channel.key, feed.feed_id, partition)] = part
        self._by_channel.setdefault(channel, []).append(part)

    @property
    def stats(self) -> list[PartitionStats]:
        return [p.stats for p in self._parts.values()]

    def on_credit(self, channel: TaskChannel, feed_id: str, partition: int, credits: int) -> None:
        part = self._parts.get((channel.key, feed_id, partition))
        if part is None:
            log.warning("task %s asked for units of feed %r partition %d it was not given", channel.key, feed_id, partition)
            return
        with self._cond:
            part.credit += credits
            self._cond.notify_all()

    def start(self) -> None:
        for part in self._parts.values():
            self._spawn(self._discover, part, name=f"discover-{part.feed.feed_id}-{part.partition}")
        for channel, parts in self._by_channel.items():
            self._spawn(self._send, channel, parts, name=f"send-{channel.key}")

    def _spawn(self, target: Callable[..., None], *args: object, name: str = "") -> None:
        thread = threading.Thread(target=target, args=args, name=name or None, daemon=True)
        self._threads.append(thread)
        thread.start()

    def stop(self) -> None:
        """End discovery and sending (the query finished or failed)."""
        self.cancelled.set()
        with self._cond:
            self._cond.notify_all()

    # -------------------------------------------------------------- discovery

    def _put(self, part: _Partition, unit: WorkUnit, created: int) -> None:
        body = unit_bytes(unit)
        with self._cond:
            while len(part.queue) >= self._buffer and not self.cancelled.is_set():
                self._cond.wait()
            if self.cancelled.is_set():
                raise _Stopped
            part.queue.append((body, created))
            self._cond.notify_all()

    def _discover(self, part: _Partition) -> None:
        ctx = FeedContext(self.query_id, part.feed.feed_id, part.partition, part.partitions, self.cancelled)
        try:
            stream = part.feed.feed(part.partition, ctx)
            if inspect.isasyncgen(stream) or hasattr(stream, "__anext__"):
                asyncio.run(self._discover_async(part, stream))  # type: ignore[arg-type]
            else:
                self._discover_sync(part, stream)  # type: ignore[arg-type]
        except _Stopped:
            pass
        except BaseException as exc:  # noqa: BLE001 - user code: the query fails with its own exception
            exc.add_note(f"raised by the provider of feed {part.feed.feed_id!r}, partition {part.partition}")
            self._on_error(exc)
        finally:
            with self._cond:
                part.discovered_all = True
                self._cond.notify_all()

    def _discover_sync(self, part: _Partition, stream: Iterator[WorkUnit]) -> None:
        try:
            last = now_ns()
            for unit in stream:
                created = now_ns()
                part.stats.discovery.add(created - last)
                self._put(part, unit, created)
                last = now_ns()
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()

    async def _discover_async(self, part: _Partition, stream: AsyncIterator[WorkUnit]) -> None:
        # A loop of this thread's own: blocking in _put only holds up this provider.
        last = now_ns()
        async for unit in stream:
            created = now_ns()
            part.stats.discovery.add(created - last)
            self._put(part, unit, created)
            last = now_ns()

    # ---------------------------------------------------------------- sending

    def _ready_frames(self, parts: list[_Partition]) -> list[protocol_pb2.CoordinatorFrame]:
        frames = []
        for part in parts:
            n = min(part.credit, len(part.queue), self._max_frame)
            if n:
                sent = now_ns()
                units = []
                for _ in range(n):
                    body, created = part.queue.popleft()
                    units.append(protocol_pb2.WorkUnit(body=body, created_unix_nanos=created, sent_unix_nanos=sent))
                    part.stats.bytes += len(body)
                part.credit -= n
                part.stats.units += n
                part.stats.frames += 1
                frames.append(
                    protocol_pb2.CoordinatorFrame(
                        units=protocol_pb2.WorkUnitBatch(feed_id=part.feed.feed_id, partition=part.partition, units=units)
                    )
                )
            if part.discovered_all and not part.queue and not part.end_sent:
                part.end_sent = True
                frames.append(
                    protocol_pb2.CoordinatorFrame(
                        feed_end=protocol_pb2.FeedEnd(feed_id=part.feed.feed_id, partition=part.partition)
                    )
                )
        return frames

    def _send(self, channel: TaskChannel, parts: list[_Partition]) -> None:
        while True:
            with self._cond:
                while True:
                    if self.cancelled.is_set():
                        return
                    frames = self._ready_frames(parts)
                    if frames:
                        self._cond.notify_all()  # discovery may wait for queue room
                        break
                    if all(p.end_sent for p in parts):
                        return
                    self._cond.wait()
            for frame in frames:
                channel.send(frame)
