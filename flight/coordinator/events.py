"""The words of the coordinator's state machine: the events it takes and the instructions it gives.

Kept apart from ``state.FeedState`` (the decisions), so that the driver, the tests and
the state machine share one vocabulary. Events are named tuples (a ``UnitsFound`` is
made per unit: a tuple is cheap); instructions are frozen dataclasses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

__all__ = [
    "Abort",
    "CancelTask",
    "CreditGranted",
    "DiscoveryEnded",
    "Event",
    "FailQuery",
    "HalfClose",
    "Instruction",
    "Item",
    "OutputRead",
    "ReplaceTask",
    "ResultComplete",
    "SendFeedEnd",
    "SendUnits",
    "SenderIdle",
    "StartSending",
    "TaskFinished",
    "TaskLost",
    "TaskReady",
    "TaskReplaced",
    "Tick",
    "UnitsDone",
    "UnitsFound",
    "WorkerLost",
]


@dataclass(eq=False, slots=True)
class Item:
    """One discovered work unit: its encoded body and what decides where it goes."""

    body: bytes
    created_ns: int = 0
    preferred: str | None = None
    """The worker URL the unit would rather run on (normalized), or None."""
    rows: int | None = None
    size: int | None = None
    queued_at: float = 0.0
    """When it joined its source's queue (set by the state machine): the affinity wait starts then."""
    id: int = 0
    """Its number in the execution, in the order found (set by the state machine): ``WorkUnit.id``."""


# ------------------------------------------------------------------ events
# Named tuples: immutable like the instructions, and cheap to make (one ``UnitsFound`` per unit).


class UnitsFound(NamedTuple):
    source: int
    items: tuple[Item, ...]
    now: float


class DiscoveryEnded(NamedTuple):
    source: int
    now: float


class StartSending(NamedTuple):
    """Every task was admitted: units may go out (before, a refused attempt may still be let go)."""

    now: float


class TaskReady(NamedTuple):
    """The task accepted its header. Needed only by a replacement (``TaskReplaced``): nothing goes
    to it before; the first tasks are all ready before ``StartSending``."""

    task: str
    now: float


class CreditGranted(NamedTuple):
    task: str
    feed_id: str
    partition: int
    credits: int
    now: float


class SenderIdle(NamedTuple):
    """The driver carried out every instruction given for ``task`` (its frames are written).

    A task takes units only while its sender is idle: units found meanwhile wait in the
    source's queue and go out together, in one frame, once it is (and a shared queue's
    units go to whichever task is ready first).
    """

    task: str
    now: float


class TaskFinished(NamedTuple):
    """The task's final metrics arrived: it produced all its output."""

    task: str
    now: float


class ResultComplete(NamedTuple):
    """The caller read every head output: the tasks may be let go."""

    now: float


class UnitsDone(NamedTuple):
    """Every row of these units reached the caller (a recoverable task's, ``TaskOptions.tag_units``):
    they will never be replayed."""

    task: str
    ids: tuple[int, ...]
    now: float


class OutputRead(NamedTuple):
    """A recoverable task's output was read to its end: all its units are delivered."""

    task: str
    now: float


class TaskLost(NamedTuple):
    """A recoverable task's worker is lost (dead, or silent past the heartbeat): replay its units."""

    task: str
    reason: str
    now: float


class TaskReplaced(NamedTuple):
    """The driver made ``task`` on ``url`` to take over the feed partitions of ``lost``."""

    lost: str
    task: str
    url: str
    now: float


class WorkerLost(NamedTuple):
    url: str
    reason: str
    now: float


class Abort(NamedTuple):
    """The query failed or was cancelled (an error, a deadline, the caller stopped reading)."""

    reason: str
    now: float


class Tick(NamedTuple):
    now: float


Event = (
    UnitsFound | DiscoveryEnded | StartSending | TaskReady | CreditGranted | SenderIdle
    | TaskFinished | ResultComplete | UnitsDone | OutputRead | TaskLost | TaskReplaced
    | WorkerLost | Abort | Tick
)


# ------------------------------------------------------------ instructions


@dataclass(frozen=True)
class SendUnits:
    task: str
    feed_id: str
    partition: int
    items: tuple[Item, ...]


@dataclass(frozen=True)
class SendFeedEnd:
    task: str
    feed_id: str
    partition: int


@dataclass(frozen=True)
class HalfClose:
    task: str


@dataclass(frozen=True)
class CancelTask:
    task: str
    reason: str


@dataclass(frozen=True)
class ReplaceTask:
    """Open a task like ``task`` (lost) on another worker, then say ``TaskReplaced``; ``units`` of
    ``task``'s went back to their queues for it (or, from a shared queue, any task with credit)."""

    task: str
    reason: str
    units: int


@dataclass(frozen=True)
class FailQuery:
    reason: str
    url: str | None = None
    """The lost worker, when a worker loss is the cause."""


Instruction = SendUnits | SendFeedEnd | HalfClose | CancelTask | ReplaceTask | FailQuery
