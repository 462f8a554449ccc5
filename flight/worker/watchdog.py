"""The worker's watchdog: frees the tasks of silent coordinators, and gives memory back when idle.

Apart from the Flight handlers because it is no call's: one thread for the worker's
whole life, drained or not (a drain that is undone must still free the tasks of
coordinators that went silent), that the handlers only signal through two events.
"""

from __future__ import annotations

import logging
import threading
import time

from flight.worker.admission import Admission
from flight.worker.memory import release_idle_memory, resident_bytes, trim_busy_memory
from flight.worker.tasks import TaskRegistry

__all__ = ["watch"]

log = logging.getLogger("flight.worker.server")

RELEASE_AGAIN_S = (1.0, 3.0)
TRIM_EVERY_S = 2.0
"""Seconds between two trims of a busy worker past its memory ceiling (``trim_busy_memory``)."""
"""Seconds after an idle worker gave memory back when it does so again, if still idle: what the calls
that just ended held may be freed after the first pass (a stream's last buffers, gRPC's own), and an
idle worker allocates nothing that would trim it later. The 10,000-case fuzz run's idle samples were
at times 240-380 MiB above the baseline with one pass, and back down at the next sample."""


def watch(
    registry: TaskRegistry, admission: Admission, timeout: float, stopped: threading.Event, idle: threading.Event, ceiling: int = 0
) -> None:
    """Free tasks whose coordinator went silent (frozen, partitioned) for ``timeout`` seconds: nothing else would.

    A handler blocked reading a silent peer cannot be woken (pyarrow's server has no way
    to cancel a call), so the task's state is released here; the handler thread ends
    whenever the connection does. Runs until ``stopped``; ``idle`` says calls ended (tasks
    or refused calls) since memory was last handed back. Memory is handed back
    (``release_idle_memory``) at the first round (they are a second apart) after a whole
    round in which no call ended and that finds no task: a worker between two queries of
    a busy client is not idle. Given back at the first round that found no task, queries
    run back to back paid for it: the garbage collection holds the interpreter, and the
    trimmed heaps are faulted in again (a fifth of two workers' busy samples over TPC-H Q2,
    Q11, Q16 and Q22 run in a loop). Given back sooner (0.2 s after the last task left), an
    idle worker kept 250-360 MiB more at some samples of the 2,000-case fuzz run: the calls
    that just ended free what they held after their task left the registry.

    ``ceiling``: resident bytes past which a busy worker trims its heaps (``trim_busy_memory``), at
    most every ``TRIM_EVERY_S``; 0: never while busy.
    """
    again: list[float] = []  # when to give memory back once more, while the worker stays idle
    trimmed = 0.0
    quiet = False  # the last round found no task, and no call ended since
    while not stopped.wait(min(1.0, timeout / 4)):
        now = time.monotonic()
        _free_silent(registry, admission, now, timeout)
        if len(registry):
            idle.set()  # tasks it frees itself (silent clients) leave memory behind too
            again.clear()
            quiet = False
            if ceiling and now - trimmed > TRIM_EVERY_S and resident_bytes() > ceiling:
                trimmed = now
                trim_busy_memory()
        elif idle.is_set():
            idle.clear()
            quiet = True  # calls ended: one quiet round more before memory is handed back
        elif quiet:
            quiet = False
            release_idle_memory(busy=lambda: len(registry) > 0)
            again[:] = [now + s for s in RELEASE_AGAIN_S]
        elif again and now >= again[0]:
            again.pop(0)
            release_idle_memory(busy=lambda: len(registry) > 0)


def _free_silent(registry: TaskRegistry, admission: Admission, now: float, timeout: float) -> None:
    """One round of the watchdog (a frame of its own: the loop's last task is not kept while the worker idles)."""
    for task in registry.tasks():
        if task.half_closed:
            continue  # the client finished sending (a map stage's input): it cannot beat any more
        silent = now - task.last_heard
        if silent > timeout:
            log.warning("task %s: the coordinator sent nothing for %.1fs; freeing the task", task.key, silent)
            if task.unavailable is None:
                # Its readers (other workers' tasks) are told UNAVAILABLE naming this worker: cut off from the
                # coordinator, it is lost to the query, though a probe may find it answering once the cut heals.
                why = f"worker {task.worker_url} heard nothing from the coordinator of task {task.key} for {silent:.0f}s"
                task.unavailable = task.worker_url, why
            task.cancel(f"the coordinator sent nothing for {silent:.0f}s (heartbeats included)")
            registry.remove(task)
            admission.release(task.key)
