"""Short-lived threads without the cost of starting one: ``spawn`` hands a function to an idle thread.

Why: a query starts a dozen threads on the coordinator (a reader and a heartbeat per task, a
sender per task, discovery, the result's reader) and each task two or more on its worker (its
runner, its heartbeats, its shuffle readers). ``Thread.start`` waits until the new thread runs,
and while other threads compute, that thread waits for the GIL: up to the interpreter's switch
interval (5 ms) for each start, on the path from a query's start to its tasks' first rows
(profiled: a tenth of the coordinator's main thread on TPC-H Q6 went to starting threads).

``spawn`` never waits: an idle thread takes the function, or a new thread is started for it
by a thread of the pool's own (so the caller does not wait for that start either). A thread
that finds nothing to do for ``IDLE_S`` seconds ends, so a process between queries keeps no
threads beyond the last burst's, and there is no upper bound: whatever would have had a
thread of its own still does (a bounded pool could leave a reader waiting on a writer that
has no thread yet). Each function runs under the name it was given (``faulthandler`` dumps
and logs say what the thread does), and an exception escaping it is reported as one escaping
a ``threading.Thread`` is (``threading.excepthook``).
"""

from __future__ import annotations

import heapq
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["IDLE_S", "Job", "every", "retire_idle", "spawn"]

IDLE_S = 30.0
"""How long an idle pool thread waits for a function before it ends."""


class Job:
    """A function handed to ``spawn``: what ``threading.Thread`` offers its starter, ``join`` and ``is_alive``."""

    __slots__ = ("_args", "_done", "_target", "name")

    def __init__(self, target: Callable[..., Any], args: tuple[Any, ...], name: str) -> None:
        self._target = target
        self._args = args
        self.name = name
        self._done = threading.Event()

    def join(self, timeout: float | None = None) -> None:
        """Wait until the function returned (or raised), at most ``timeout`` seconds."""
        self._done.wait(timeout)

    def is_alive(self) -> bool:
        """Whether the function has not returned yet (it may still wait for a thread)."""
        return not self._done.is_set()

    def _run(self) -> None:
        thread = threading.current_thread()
        previous, thread.name = thread.name, self.name
        try:
            self._target(*self._args)
        except BaseException as exc:  # noqa: BLE001 - reported as an escaping exception is, then the thread goes on
            threading.excepthook(threading.ExceptHookArgs((type(exc), exc, exc.__traceback__, thread)))
        finally:
            self._target = self._args = None  # type: ignore[assignment]  # nothing kept alive by an idle thread
            thread.name = previous
            self._done.set()


_IDLE_NAME = "flight-idle"


class _Pool:
    """Idle threads waiting on one queue; ``_idle`` counts those that will take a queued job for sure."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._jobs: deque[Job] = deque()
        self._idle = 0
        self._retire = 0  # idle threads asked to end now (retire_idle)
        self._starting: deque[Job] = deque()
        self._starter: threading.Thread | None = None
        self._wake_starter = threading.Condition(self._lock)

    def submit(self, job: Job) -> None:
        with self._lock:
            if self._idle > len(self._jobs):
                self._jobs.append(job)
                self._ready.notify()
                return
            # No thread is free: the starter makes one, so this caller does not wait for the start.
            self._starting.append(job)
            if self._starter is not None:
                self._wake_starter.notify()
                return
            starter = self._starter = threading.Thread(target=self._start_threads, name="flight-thread-starter", daemon=True)
        try:
            starter.start()
        except BaseException:  # no thread could be started: the caller learns it, as from Thread.start
            with self._lock:
                self._starter = None
                if job in self._starting:
                    self._starting.remove(job)
            raise

    def _start_threads(self) -> None:
        while True:
            with self._lock:
                while not self._starting:
                    if not self._wake_starter.wait(IDLE_S) and not self._starting:
                        self._starter = None
                        return
                job = self._starting.popleft()
            try:
                threading.Thread(target=self._serve, args=(job,), name=job.name, daemon=True).start()
            except RuntimeError:  # the process has no thread to spare: run it here rather than lose it
                job._run()

    def _serve(self, job: Job) -> None:
        while True:
            job._run()
            threading.current_thread().name = _IDLE_NAME
            with self._lock:
                self._idle += 1
                while not self._jobs:
                    if self._retire > 0:
                        self._retire -= 1
                        self._idle -= 1
                        return
                    if not self._ready.wait(IDLE_S) and not self._jobs:
                        self._idle -= 1
                        return
                job = self._jobs.popleft()
                self._idle -= 1

    def retire_idle(self) -> None:
        with self._lock:
            self._retire = self._idle
            self._ready.notify_all()


_POOL = _Pool()
# A forked child (a Spark Python worker) has none of the parent's threads: it starts from an empty
# pool, or it would queue functions for idle threads that are not there.
os.register_at_fork(after_in_child=lambda: _Pool.__init__(_POOL))


def spawn(target: Callable[..., Any], *args: Any, name: str) -> Job:
    """Run ``target(*args)`` on a thread of its own, named ``name``, without waiting for it to start."""
    job = Job(target, args, name)
    _POOL.submit(job)
    return job


def retire_idle() -> None:
    """End the threads that wait for a function now, not ``IDLE_S`` later (an idle worker gives their memory back)."""
    _POOL.retire_idle()


class _Ticker:
    """One thread that calls many short functions, each every so many seconds.

    Why: a heartbeat per task channel on a thread of its own made a thread per task, and
    under a burst of queries (200 at once on two cores) those threads waited behind
    thousands of thread starts: a channel's first heartbeat came after the worker's
    10 s silence bound and the worker freed a live task. One thread beats for all.

    A function returns False to stop being called; it must never block (a heartbeat
    that finds its channel's writer busy skips the beat: the write is a sign of life).
    """

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._due: list[tuple[float, int, float, Callable[[], bool]]] = []
        self._count = 0
        self._thread: threading.Thread | None = None

    def every(self, interval: float, fn: Callable[[], bool]) -> None:
        with self._lock:
            self._count += 1
            heapq.heappush(self._due, (time.monotonic() + interval, self._count, interval, fn))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="flight-ticker", daemon=True)
                self._thread.start()
            self._lock.notify()

    def _run(self) -> None:
        while True:
            with self._lock:
                while True:
                    now = time.monotonic()
                    if self._due and self._due[0][0] <= now:
                        due, n, interval, fn = heapq.heappop(self._due)
                        break
                    if not self._due and not self._lock.wait(IDLE_S) and not self._due:
                        self._thread = None
                        return
                    if self._due:
                        self._lock.wait(self._due[0][0] - now)
            try:
                again = fn()
            except BaseException as exc:  # noqa: BLE001 - reported, and that function is not called again
                threading.excepthook(threading.ExceptHookArgs((type(exc), exc, exc.__traceback__, threading.current_thread())))
                again = False
            if again:
                with self._lock:
                    heapq.heappush(self._due, (max(due + interval, time.monotonic()), n, interval, fn))


_TICKER = _Ticker()
os.register_at_fork(after_in_child=lambda: _Ticker.__init__(_TICKER))


def every(interval: float, fn: Callable[[], bool]) -> None:
    """Call ``fn()`` every ``interval`` seconds on the process's one ticker thread, until it returns False."""
    _TICKER.every(interval, fn)
