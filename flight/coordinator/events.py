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
    "ResultComplete",
    "SendFeedEnd",
    "SendUnits",
    "SenderIdle",
    "StartSending",
    "TaskFinished",
    "TaskReady",
    "Tick",
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
    | TaskFinished | ResultComplete | WorkerLost | Abort | Tick
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
class FailQuery:
    reason: str
    url: str | None = None
    """The lost worker, when a worker loss is the cause."""


Instruction = SendUnits | SendFeedEnd | HalfClose | CancelTask | FailQuery
