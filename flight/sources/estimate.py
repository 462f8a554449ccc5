"""How many tasks a shared-queue leaf gets, decided from what discovery has shown.

In distributed execution tasks are not free (a DoExchange, a pipeline, an
output stream each), so the estimator starts no more tasks than the work
justifies. It looks at a *sample*: the units discovered within
``sample_units`` units or ``sample_ms`` milliseconds (or all of them, if
discovery ended sooner), with their optional size hints. Users replace it by
passing their own ``TaskEstimator`` to ``DistributedExec``.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass, field

__all__ = ["DefaultTaskEstimator", "DiscoverySample", "TaskEstimate", "TaskEstimator"]


@dataclass(frozen=True)
class DiscoverySample:
    """The first units discovered: their size hints (None when unknown) and whether that was all."""

    rows: list[int | None]
    bytes: list[int | None]
    finished: bool
    elapsed_ms: float

    @property
    def units(self) -> int:
        return len(self.bytes)

    @property
    def known_bytes(self) -> int | None:
        """Total bytes, if every sampled unit had a hint."""
        return sum(b for b in self.bytes if b is not None) if self.bytes and all(b is not None for b in self.bytes) else None

    @property
    def known_rows(self) -> int | None:
        return sum(r for r in self.rows if r is not None) if self.rows and all(r is not None for r in self.rows) else None


@dataclass(frozen=True)
class TaskEstimate:
    tasks: int
    reasons: list[str] = field(default_factory=list)

    def describe(self) -> str:
        return f"{self.tasks} task(s): " + "; ".join(self.reasons)


class TaskEstimator(abc.ABC):
    """Decides a shared-queue leaf's task count; never more than ``workers``."""

    sample_units: int = 64
    """Stop sampling after this many units..."""
    sample_ms: float = 50.0
    """...or after this long, whichever comes first (discovery keeps going after)."""

    @abc.abstractmethod
    def estimate(self, sample: DiscoverySample, workers: int) -> TaskEstimate: ...


class DefaultTaskEstimator(TaskEstimator):
    """Size-aware when hints exist and discovery ended; every worker while it still runs.

    * discovery ended within the sample: the whole work is known. With byte
      hints, one task per ``target_bytes_per_task`` (or per ``target_rows_per_task``
      with row hints); without, one task per unit. Capped by the workers.
    * discovery still running: the total is unknown and more is coming, and the
      count cannot grow later, so every worker gets a task (a shared queue
      keeps idle ones cheap: they only hold credit).
    """

    def __init__(
        self,
        *,
        target_bytes_per_task: int = 128 << 20,
        target_rows_per_task: int = 1_000_000,
        sample_units: int = 64,
        sample_ms: float = 50.0,
    ) -> None:
        self.target_bytes_per_task = target_bytes_per_task
        self.target_rows_per_task = target_rows_per_task
        self.sample_units = sample_units
        self.sample_ms = sample_ms

    def estimate(self, sample: DiscoverySample, workers: int) -> TaskEstimate:
        workers = max(1, workers)
        reasons = [f"{sample.units} unit(s) discovered in {sample.elapsed_ms:.0f} ms"]
        if sample.finished:
            reasons.append("discovery finished within the sample")
            if sample.units == 0:
                return TaskEstimate(1, [*reasons, "no work: one task yields the empty result"])
            if sample.known_bytes is not None:
                want = math.ceil(sample.known_bytes / self.target_bytes_per_task)
                reasons.append(f"{sample.known_bytes} bytes at {self.target_bytes_per_task} per task -> {want}")
            elif sample.known_rows is not None:
                want = math.ceil(sample.known_rows / self.target_rows_per_task)
                reasons.append(f"{sample.known_rows} rows at {self.target_rows_per_task} per task -> {want}")
            else:
                want = sample.units
                reasons.append("no size hints: at most one task per unit")
        else:
            reasons.append("discovery still running: the total is unknown, so every worker")
            want = workers
        tasks = max(1, min(want, workers))
        if tasks == workers and want > workers:
            reasons.append(f"capped by {workers} worker(s)")
        return TaskEstimate(tasks, reasons)
