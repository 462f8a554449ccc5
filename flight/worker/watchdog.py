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
from flight.worker.memory import release_idle_memory
from flight.worker.tasks import TaskRegistry

__all__ = ["IDLE_DEBOUNCE_S", "watch"]

log = logging.getLogger("flight.worker.server")

IDLE_DEBOUNCE_S = 0.2
"""How long after its last task ended a worker waits before it gives memory back: a query's next
stage, or the next query of a script, usually comes sooner, and its threads are still there."""


def watch(registry: TaskRegistry, admission: Admission, timeout: float, stopped: threading.Event, idle: threading.Event) -> None:
    """Free tasks whose coordinator went silent (frozen, partitioned) for ``timeout`` seconds: nothing else would.

    A handler blocked reading a silent peer cannot be woken (pyarrow's server has no way
    to cancel a call), so the task's state is released here; the handler thread ends
    whenever the connection does. Runs until ``stopped``. A handler sets ``idle`` when it
    freed the worker's last task: memory is handed back ``IDLE_DEBOUNCE_S`` later if no task
    came meanwhile (``release_idle_memory``), and after the tasks this watchdog frees too.
    """
    every = min(1.0, timeout / 4)
    ran = False  # tasks ran since memory was last handed back
    next_round = time.monotonic()
    while not stopped.is_set():
        if idle.wait(max(0.0, next_round - time.monotonic())):
            idle.clear()
            ran = True
            if stopped.wait(IDLE_DEBOUNCE_S):
                return
        if time.monotonic() >= next_round:
            _free_silent(registry, admission, time.monotonic(), timeout)
            next_round = time.monotonic() + every
        if len(registry):
            ran = True
        elif ran:
            ran = False
            release_idle_memory(busy=lambda: len(registry) > 0)


def _free_silent(registry: TaskRegistry, admission: Admission, now: float, timeout: float) -> None:
    """One round of the watchdog (a frame of its own: the loop's last task is not kept while the worker idles)."""
    for task in registry.tasks():
        if task.half_closed:
            continue  # the client finished sending (a map stage's input): it cannot beat any more
        silent = now - task.last_heard
        if silent > timeout:
            log.warning("task %s: the coordinator sent nothing for %.1fs; freeing the task", task.key, silent)
            task.cancel(f"the coordinator sent nothing for {silent:.0f}s (heartbeats included)")
            registry.remove(task)
            admission.release(task.key)
