"""The worker's capacity and who holds it: admission control as a plain object.

Why it exists: a task's sources (feed scans, shuffle reads, map input, and the
nested readers of limits, unions and top-k sorts) block a thread while they
wait for units, rows or producers. Acero runs them on the process's I/O pool,
so before admission control ~65 waiting sources on one worker froze every other
query on it while ``health`` still answered ok.

The rule that holds for any engine: a task is started only when the worker can
give it everything it may hold while waiting — one thread per blocking source
and a memory reservation — and the pool is sized to the capacity, so every
admitted task stays runnable whatever the others wait for. A task that does not
fit now waits in a bounded first-come-first-served queue (holding nothing but
its call) for at most ``Capacity.wait`` seconds; past that, or when the queue is
full, it is refused as *busy* (retryable, with the worker's load in the
message). A task that could never fit (more threads than the worker has) is
refused as too large. Coordinators open a query's tasks worker by worker in one
global order, so queued tasks can never wait for each other in a cycle
(``docs/architecture.md``, "Capacity").

No sockets: the Flight handler calls ``admit`` and ``release``; time only
bounds the wait.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from flight._proto import protocol_pb2

__all__ = ["INPUT_RESERVE_BYTES", "Admission", "Capacity", "Need", "Refusal"]

INPUT_RESERVE_BYTES = 8 << 20
"""Memory reserved per blocking source: what its queue of incoming batches may hold."""


@dataclass(frozen=True)
class Need:
    """What one task reserves while it runs."""

    threads: int
    """Blocking sources: threads it may hold while waiting."""
    memory: int
    """Bytes: its output buffer bound plus what its inputs may queue."""


@dataclass(frozen=True)
class Capacity:
    """A worker's limits (``flight-worker --max-tasks / --source-threads / --memory-budget-mb / --queue-*``)."""

    tasks: int
    threads: int
    memory: int
    queue: int = 0
    """Tasks that may wait for capacity at once (0: none wait, a task that does not fit is refused)."""
    wait: float = 0.0
    """Seconds a task may wait in the queue before it is refused as busy."""


@dataclass(frozen=True)
class Refusal:
    """Why a task was not admitted; ``fits_ever`` is False when it never could be."""

    reason: str
    fits_ever: bool


class Admission:
    """Reservations of the running tasks against the worker's capacity, and the queue of those waiting."""

    def __init__(self, capacity: Capacity) -> None:
        self.capacity = capacity
        self._held: dict[str, Need] = {}
        self._threads = 0
        self._memory = 0
        self._refused = 0
        self._queue: deque[object] = deque()
        self._lock = threading.Condition()

    def admit(
        self,
        key: str,
        need: Need,
        allocated: Callable[[], int] = lambda: 0,
        *,
        give_up: Callable[[], bool] = lambda: False,
        tick: Callable[[], None] = lambda: None,
        tick_every: float = 1.0,
    ) -> Refusal | None:
        """Reserve ``need`` for task ``key``, waiting in line if need be; None when admitted, else why not.

        ``allocated()`` is what the process's memory pool holds now: above the
        budget, only a worker with nothing running admits (so it never refuses
        forever). While queued, ``tick()`` runs every ``tick_every`` seconds
        outside the lock (the handler sends the coordinator a sign of life), and
        ``give_up()`` (the call was cancelled) ends the wait.
        """
        cap = self.capacity
        if need.threads > cap.threads:
            return Refusal(f"the task needs {need.threads} source threads; this worker has {cap.threads} in all", False)
        if need.memory > cap.memory:
            return Refusal(f"the task reserves {need.memory >> 20} MiB; this worker's budget is {cap.memory >> 20} MiB", False)
        deadline = time.monotonic() + cap.wait
        me = object()
        with self._lock:
            if key in self._held:
                return Refusal(f"task {key} is already admitted", False)
            if not self._queue and self._fits(need, allocated()):
                self._reserve(key, need)
                return None
            if cap.wait <= 0 or len(self._queue) >= cap.queue:
                self._refused += 1
                waiting = f"; {len(self._queue)} tasks wait already" if self._queue else ""
                return Refusal(f"at capacity ({self._describe(allocated())}{waiting}); the task needs {need.threads} threads", True)
            self._queue.append(me)
        try:
            next_tick = time.monotonic()
            while True:
                now = time.monotonic()
                if now >= next_tick:
                    tick()
                    next_tick = now + tick_every
                with self._lock:
                    if self._queue[0] is me and self._fits(need, allocated()):
                        self._reserve(key, need)
                        return None
                    if now >= deadline or give_up():
                        self._refused += 1
                        return Refusal(
                            f"at capacity for {cap.wait:g}s ({self._describe(allocated())}); the task needs {need.threads} threads",
                            True,
                        )
                    self._lock.wait(max(0.0, min(deadline - now, next_tick - now, 0.25)))
        finally:
            with self._lock:
                self._queue.remove(me)
                self._lock.notify_all()

    def _fits(self, need: Need, allocated: int) -> bool:
        cap = self.capacity
        return not (
            len(self._held) + 1 > cap.tasks
            or self._threads + need.threads > cap.threads
            or self._memory + need.memory > cap.memory
            or (self._held and allocated > cap.memory)
        )

    def _reserve(self, key: str, need: Need) -> None:
        self._held[key] = need
        self._threads += need.threads
        self._memory += need.memory

    def release(self, key: str) -> None:
        """Give back ``key``'s reservation (idempotent: the watchdog and the handler may both call it)."""
        with self._lock:
            need = self._held.pop(key, None)
            if need is not None:
                self._threads -= need.threads
                self._memory -= need.memory
                self._lock.notify_all()

    def _describe(self, allocated: int) -> str:
        cap = self.capacity
        return (
            f"{len(self._held)}/{cap.tasks} tasks, {self._threads}/{cap.threads} source threads, "
            f"{self._memory >> 20}/{cap.memory >> 20} MiB reserved, {allocated >> 20} MiB allocated"
        )

    def load(self, running: int, buffered: int) -> protocol_pb2.LoadInfo:
        with self._lock:
            return protocol_pb2.LoadInfo(
                running_tasks=running,
                buffered_bytes=buffered,
                source_threads=self._threads,
                source_threads_max=self.capacity.threads,
                reserved_bytes=self._memory,
                memory_budget=self.capacity.memory,
                queued_tasks=len(self._queue),
            )

    @property
    def refused(self) -> int:
        with self._lock:
            return self._refused

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)

    @property
    def waiting(self) -> int:
        with self._lock:
            return len(self._queue)
