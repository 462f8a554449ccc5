"""What one attempt (``run.Run``) reads of the execution it belongs to, and where it reports back.

Why a module of its own: ``exec.DistributedExec`` makes the attempts, and an attempt
that read and wrote its owner's attributes tied run.py and exec.py to each other.
An attempt gets this instead; ``exec._Attempts`` is its sink and copies what it
reports onto the ``DistributedExec`` (``query_id``, ``query_secret``, ``bound``, ``metrics``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from flight.config import ExecOptions
from flight.coordinator.metrics import QueryMetrics
from flight.coordinator.recovery import Attempt
from flight.coordinator.resolver import WorkerResolver
from flight.planner.stages import QueryPlan
from flight.sources.estimate import TaskEstimator

__all__ = ["RunContext", "RunSink"]


class RunSink(Protocol):
    """Where an attempt reports what describes the latest execution (``DistributedExec.query_id``, ``bound``, ``metrics``)."""

    def named(self, query_id: str, secret: bytes, bound: dict[int, list[str]]) -> None:
        """The attempt's query id (a new one for each admission retry), its secret, and its tasks' URLs (filled as bound)."""

    def finished(self, metrics: QueryMetrics) -> None:
        """The attempt ended (the query's end, a failure, or a retry's cause): what its tasks measured."""


@dataclass(frozen=True)
class RunContext:
    """What one attempt reads of the execution it belongs to, and where it reports back.

    Why not the ``DistributedExec`` itself: an attempt reading and writing its owner's
    attributes tied run.py and exec.py to each other; this is all an attempt needs.
    """

    plan: QueryPlan
    options: ExecOptions
    estimator: TaskEstimator
    resolver: WorkerResolver
    attempts: list[Attempt]  # the execution's lost workers so far: a replaced task adds its own (``replay.py``)
    sink: RunSink
    started: float = field(default_factory=time.monotonic)
    """When the execution began (monotonic): ``ExecOptions.deadline`` counts from here, across its attempts."""

    def deadline_left(self) -> float | None:
        """Seconds left of the execution's deadline (at least 0), or None without one: a later attempt gets what is left."""
        if self.options.deadline is None:
            return None
        return max(0.0, self.options.deadline - (time.monotonic() - self.started))
