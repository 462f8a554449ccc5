"""A worker's capacity and a task's needs: the numbers admission control works with.

Apart from ``admission.py``, which decides who holds the capacity and who waits:
these are plain values, read from the worker's options once at start (and by
``tasks.py`` for the reservation per source), with no lock and no queue.
"""

from __future__ import annotations

from dataclasses import dataclass

from flight.config import WorkerOptions
from flight.wire.limits import INPUT_RESERVE_BYTES

__all__ = [
    "CLIENT_MEMORY_SHARE",
    "CLIENT_SHARE",
    "INPUT_RESERVE_BYTES",
    "MAX_QUEUED_PER_CLIENT",
    "Capacity",
    "Need",
    "worker_capacity",
]

CLIENT_SHARE = 0.75
"""``--max-tasks-per-client``'s default on a worker that tells callers apart: this share of ``--max-tasks``."""
CLIENT_MEMORY_SHARE = 0.5
"""``--memory-budget-per-client-mb``'s default on a worker that tells callers apart: this share of ``--memory-budget-mb``."""
MAX_QUEUED_PER_CLIENT = 16
"""``--max-queued-per-client``'s default on a worker that tells callers apart."""


@dataclass(frozen=True)
class Need:
    """What one task reserves while it runs."""

    threads: int
    """Blocking sources: threads it may hold while waiting."""
    memory: int
    """Bytes: its output buffer bound plus what its inputs may queue."""


@dataclass(frozen=True)
class Capacity:
    """A worker's limits (``flight-worker --max-tasks / --source-threads / --memory-budget-mb / --queue-* / --max-*-per-client``)."""

    tasks: int
    threads: int
    memory: int
    queue: int = 0
    """Tasks that may wait for capacity at once (0: none wait, a task that does not fit is refused)."""
    wait: float = 0.0
    """Seconds a task may wait in the queue before it is refused as busy."""
    per_client: int = 0
    """Slots one identity may hold at once (0: ``tasks``, no cap of its own)."""
    client_queue: int = 0
    """Tasks one identity may have waiting at once (0: only ``queue`` bounds them)."""
    client_memory: int = 0
    """Bytes one identity's admitted tasks may reserve at once (0: ``memory``, no budget of its own)."""

    @property
    def client_cap(self) -> int:
        return min(self.per_client or self.tasks, self.tasks)

    @property
    def client_budget(self) -> int:
        return min(self.client_memory or self.memory, self.memory)


def worker_capacity(options: WorkerOptions, identifies_callers: bool) -> Capacity:
    """A worker's ``Capacity`` from its options: the per-client values given, else the defaults.

    A worker that tells callers apart (tokens, client certificates) caps each at
    ``CLIENT_SHARE`` of its tasks, ``MAX_QUEUED_PER_CLIENT`` waiting tasks and
    ``CLIENT_MEMORY_SHARE`` of its memory budget. One that does not has a single
    identity, ``anonymous``, for all: a cap of its own would only make the worker
    smaller, so the defaults are the whole worker.
    """
    o = options
    if identifies_callers:
        tasks, queued, memory = max(1, int(o.max_tasks * CLIENT_SHARE)), MAX_QUEUED_PER_CLIENT, int(o.memory_budget * CLIENT_MEMORY_SHARE)
    else:
        tasks, queued, memory = o.max_tasks, o.queue_length, o.memory_budget
    return Capacity(
        o.max_tasks,
        o.source_threads,
        o.memory_budget,
        o.queue_length,
        o.queue_wait,
        per_client=tasks if o.max_tasks_per_client is None else o.max_tasks_per_client,
        client_queue=queued if o.max_queued_per_client is None else o.max_queued_per_client,
        client_memory=memory if o.memory_budget_per_client is None else o.memory_budget_per_client,
    )

