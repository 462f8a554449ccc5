"""Work-unit feeds: work discovered at run time on the coordinator, streamed to tasks.

A ``WorkUnitFeedProvider`` is user code that yields work units (opaque bytes:
a file and its row groups, an API page token, ...) for one partition of a leaf.
It only ever runs on the coordinator. A ``WorkUnitFeed`` wraps it:

* **local** (on the coordinator): holds the provider; ``inner()`` returns it;
* **remote** (on a worker, rebuilt by ``from_proto``): carries only the feed id;
  ``feed(partition, ctx)`` yields the units the coordinator streams in, and
  ``inner()`` raises, because the provider never leaves the coordinator.

This mirrors Distributed DataFusion's ``WorkUnitFeed`` (shared/reference/002).
"""

from __future__ import annotations

import abc
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from google.protobuf.message import Message

from flight._proto import plan_pb2, protocol_pb2
from flight.errors import FeedError

__all__ = [
    "FeedContext",
    "LatencyStats",
    "RemoteUnitSource",
    "Unit",
    "WorkUnit",
    "WorkUnitFeed",
    "WorkUnitFeedProvider",
    "file_unit",
    "unit_bytes",
]

@dataclass(frozen=True)
class Unit:
    """A work unit with what the coordinator may know about it.

    ``preferred_worker`` (a worker URL: data locality, a warm cache) sends the
    unit to that worker's task when it has credit within a short bound.
    ``rows`` / ``bytes`` are size hints the ``TaskEstimator`` uses to decide
    how many tasks the work justifies. None of these cross the wire.
    """

    body: bytes | Message
    preferred_worker: str | None = None
    rows: int | None = None
    bytes: int | None = None


WorkUnit = bytes | bytearray | memoryview | Message | Unit
"""What a provider may yield: raw bytes, any protobuf message (serialized on the way), or a ``Unit``."""


def unit_bytes(unit: WorkUnit) -> bytes:
    """The wire body of a unit; a clear error for anything that is not bytes or protobuf."""
    if isinstance(unit, Unit):
        unit = unit.body
    if isinstance(unit, bytes):
        return unit
    if isinstance(unit, (bytearray, memoryview)):
        return bytes(unit)
    if isinstance(unit, Message):
        return unit.SerializeToString()
    raise TypeError(
        f"a work unit must be bytes or a protobuf message, not {type(unit).__name__}; "
        "serialize it (e.g. file_unit(path) for the built-in file readers)"
    )


def file_unit(path: str, row_groups: Iterable[int] = ()) -> plan_pb2.FileUnit:
    """A unit for the built-in ``parquet`` / ``ipc`` / ``csv`` readers."""
    return plan_pb2.FileUnit(path=str(path), row_groups=list(row_groups))


@dataclass(frozen=True)
class FeedContext:
    """What a provider knows about the partition it feeds.

    ``cancelled`` is set when the query ends early (failure, the caller stopped
    reading); a long-running provider should check it between slow steps.
    """

    query_id: str
    feed_id: str
    partition: int
    partitions: int
    cancelled: threading.Event = field(default_factory=threading.Event, compare=False)

    def is_cancelled(self) -> bool:
        return self.cancelled.is_set()


class WorkUnitFeedProvider(abc.ABC):
    """User code that discovers work units; runs only on the coordinator.

    ``feed`` may be a generator or an async generator. Two ways to hand units out:

    * **partitioned** (default): ``partitions()`` says how many independent
      streams the feed has (``None``: one per task); ``feed(p, ctx)`` yields
      partition ``p``'s units, and they all go to the task that owns ``p``.
    * **shared queue** (``shared = True``): ``feed(0, ctx)`` is the one
      discovery stream of the whole leaf; each unit goes to whichever task has
      credit, so a slow task gets fewer units and discovery overlaps execution.
      The number of tasks is then decided from the first discovered units by a
      ``TaskEstimator``.
    """

    shared: bool = False

    def estimated_rows(self) -> float | None:
        """Rows the feed will produce, if known cheaply at planning (sizes upper stages and broadcasts)."""
        return None

    @abc.abstractmethod
    def feed(self, partition: int, ctx: FeedContext) -> Iterator[WorkUnit] | AsyncIterator[WorkUnit]:
        """Yield the work units of ``partition``."""

    def partitions(self) -> int | None:
        return None


class RemoteUnitSource(Protocol):
    """Where a remote feed's units come from on a worker (the task's inboxes)."""

    def units(self, feed_id: str, partition: int) -> Iterator[bytes]: ...


class WorkUnitFeed:
    """A feed of one leaf node: local on the coordinator, remote on a worker."""

    def __init__(self, provider: WorkUnitFeedProvider, feed_id: str | None = None) -> None:
        if not isinstance(provider, WorkUnitFeedProvider):
            raise TypeError(f"WorkUnitFeed needs a WorkUnitFeedProvider, not {type(provider).__name__}")
        self._provider: WorkUnitFeedProvider | None = provider
        self.feed_id = feed_id or f"feed-{uuid.uuid4().hex[:12]}"

    @classmethod
    def from_proto(cls, msg: plan_pb2.WorkUnitFeed) -> WorkUnitFeed:
        """The remote variant: what a worker rebuilds from the plan."""
        if not msg.feed_id:
            raise FeedError("a WorkUnitFeed message has an empty feed_id")
        feed = cls.__new__(cls)
        feed._provider = None
        feed.feed_id = msg.feed_id
        return feed

    def to_proto(self) -> plan_pb2.WorkUnitFeed:
        """Only the id crosses the wire; the provider stays on the coordinator."""
        return plan_pb2.WorkUnitFeed(feed_id=self.feed_id)

    @property
    def is_local(self) -> bool:
        return self._provider is not None

    def inner(self) -> WorkUnitFeedProvider:
        """The local provider; a FeedError on a worker, where there is none."""
        if self._provider is None:
            raise FeedError(
                f"feed {self.feed_id!r} is remote: its provider runs only on the coordinator, "
                "and a worker only sees the units streamed to it"
            )
        return self._provider

    def try_inner(self) -> WorkUnitFeedProvider | None:
        return self._provider

    def feed(self, partition: int, ctx: FeedContext | RemoteUnitSource) -> Iterator[bytes] | AsyncIterator[WorkUnit]:
        """Local: the provider's stream for ``partition``. Remote: units streamed in for it."""
        if self._provider is not None:
            if not isinstance(ctx, FeedContext):
                raise TypeError("a local feed needs a FeedContext")
            return self._provider.feed(partition, ctx)
        if isinstance(ctx, FeedContext):
            raise FeedError(f"feed {self.feed_id!r} is remote and needs the task's unit source, not a FeedContext")
        return ctx.units(self.feed_id, partition)

    def __repr__(self) -> str:
        where = type(self._provider).__name__ if self._provider is not None else "remote"
        return f"WorkUnitFeed({self.feed_id!r}, {where})"


class LatencyStats:
    """Count, sum and max of one latency (e.g. unit created → sent); cheap to update."""

    __slots__ = ("count", "max_nanos", "sum_nanos")

    def __init__(self) -> None:
        self.count = 0
        self.sum_nanos = 0
        self.max_nanos = 0

    def add(self, nanos: int) -> None:
        nanos = max(nanos, 0)  # clocks of two hosts may disagree by a little
        self.count += 1
        self.sum_nanos += nanos
        if nanos > self.max_nanos:
            self.max_nanos = nanos

    def __repr__(self) -> str:
        return f"LatencyStats(count={self.count}, mean_ms={self.mean_ms:.3f}, max_ms={self.max_nanos / 1e6:.3f})"

    @property
    def mean_ms(self) -> float:
        return self.sum_nanos / self.count / 1e6 if self.count else 0.0

    def to_proto(self) -> protocol_pb2.LatencyStats:
        return protocol_pb2.LatencyStats(count=self.count, sum_nanos=self.sum_nanos, max_nanos=self.max_nanos)


def now_ns() -> int:
    """Wall-clock nanoseconds: feed latencies compare clocks of coordinator and worker."""
    return time.time_ns()
