"""What the feed state machine (``state.FeedState``) keeps: sources, tasks, and a slot per task and feed partition.

Why apart: these are plain records, read and changed only by ``FeedState``'s handlers;
kept here, state.py holds the decisions alone. ``SlotStats`` is what a slot received,
reported in ``QueryMetrics.feeds`` (``dispatch.PartitionStats``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from flight.coordinator.events import Item

__all__ = ["FeedProgress", "SlotState", "SlotStats", "SourceState", "TaskState"]


@dataclass
class SlotStats:
    """What one task received for one feed partition."""

    feed_id: str
    partition: int
    task: str
    units: int = 0
    bytes: int = 0
    frames: int = 0
    """Its ``WorkUnitBatch``es: a frame each, or an entry of a ``FeedFrames`` beside other partitions' (protocol 13)."""
    affinity_hits: int = 0
    window: int = 0
    """The credit it granted first: its feed window."""
    credited: int = 0
    """Every credit it granted: past its window, one per unit it took (``taken``)."""

    @property
    def taken(self) -> int:
        """Units the task took from its inbox so far (a lower bound: it may return credits in batches)."""
        return min(self.units, max(0, self.credited - self.window))


@dataclass
class FeedProgress:
    """One feed as the coordinator sees it while the query runs: units found, sent, taken, and its lag."""

    feed_id: str
    discovered: int = 0
    sent: int = 0
    taken: int = 0
    ended: bool = False
    """Discovery ended on every source of it."""
    sources: int = 0
    oldest_waiting: float = 0.0
    """Seconds the oldest unit not yet sent has waited (0 when none waits): how far sending lags finding."""


@dataclass(eq=False)
class SourceState:
    """One discovery stream: its queue of units not yet sent, and the slots that read it."""

    feed_id: str
    shared: bool
    queue: deque[Item] = field(default_factory=deque)
    ended: bool = False
    discovered: int = 0
    preferred_waiting: int = 0
    slots: list[SlotState] = field(default_factory=list)
    urls: set[str] = field(default_factory=set)
    """The workers of the tasks that read it."""


@dataclass(eq=False)
class SlotState:
    """One task's feed partition of one source: the credit it granted, and whether its feed end went out."""

    source: SourceState
    owner: TaskState
    task: str
    partition: int
    credit: int = 0
    end_sent: bool = False
    stats: SlotStats = field(default_factory=lambda: SlotStats("", 0, ""))
    replay: deque[Item] = field(default_factory=deque)
    """A lost exclusive task's units, for its replacement alone: sent before the source's queue."""


@dataclass(eq=False)
class TaskState:
    """One task: its slots, whether anything may go to it, and (recoverable) its units not yet delivered."""

    key: str
    url: str
    slots: list[SlotState] = field(default_factory=list)
    ready: bool = True  # a replacement's is False until TaskReady: nothing goes to it before
    recoverable: bool = False  # its units are tracked until delivered, and replayed if it is lost
    exclusive: bool = False  # its replacement alone replays them (a retained output, read by partition)
    outstanding: dict[int, tuple[SlotState, Item]] = field(default_factory=dict)
    """A recoverable task's units sent and not yet delivered, by id, in the order sent."""
    read: bool = False  # a recoverable task's output was read to its end
    lost: bool = False
    busy: bool = False  # its sender has units to write: more wait in the queue until SenderIdle
    finished: bool = False
    closed: bool = False  # half-closed or cancelled: nothing more goes to it
