"""Opening a query's tasks in turns: the I/O around ``waves.Waves`` (which decides), for one attempt.

Apart from ``opening.py``, which decides whether an attempt needs turns at all (``Opening._waves``); here the
driver opens the tasks ``Waves`` names, tells it which were admitted and which made their output, and opens a
task a worker refused as busy again after a backoff.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import TYPE_CHECKING

from flight.coordinator.channel import TaskChannel
from flight.coordinator.waves import TaskId, TaskNeed, Waves
from flight.errors import TaskFailedError, WorkerBusyError, WorkerUnavailableError

if TYPE_CHECKING:
    from flight.coordinator.run import Run

__all__ = ["BACKOFF_S", "MAX_BACKOFF_S", "Turns"]

log = logging.getLogger("flight.coordinator.exec")

BACKOFF_S = 0.05
MAX_BACKOFF_S = 1.0
"""Retrying tasks that busy workers refused: jittered exponential backoff between these."""
_POLL_S = 0.25
"""The longest the turns' driver sleeps without news: how soon it sees the query fail or a backoff end."""


class Turns:
    """The I/O around ``waves.Waves`` for one attempt: opens the tasks it names, tells it what the workers said.

    One driver thread (the launching one) makes every decision; the channels' reader threads only
    record that a task finished and wake it.
    """

    def __init__(self, run: Run, waves: Waves, counts: dict[int, int]) -> None:
        self.run = run
        self.waves = waves
        self.counts = counts
        self._cond = threading.Condition()
        self._news = 0  # wake-ups so far (ready, finished, an error): none is lost between two looks
        self._seen = 0
        self._computed: list[TaskId] = []
        self._pending: dict[TaskId, TaskChannel] = {}  # opened, not admitted yet
        self._running: dict[TaskId, TaskChannel] = {}  # admitted, no finished frame yet
        self._since: dict[TaskId, float] = {}  # when each task was first opened: the admission wait counts from it
        self._backoff: dict[TaskId, float] = {}
        self._again: dict[TaskId, float] = {}  # refused as busy: when to open it again

    def wake(self) -> None:
        with self._cond:
            self._news += 1
            self._cond.notify_all()

    def finished(self, channel: TaskChannel) -> None:
        """A task made all its output: its worker gave its source threads back."""
        key = channel.header.stage_key
        with self._cond:
            self._computed.append((key.stage_id, key.task_number))
            self._news += 1
            self._cond.notify_all()

    def open_all(self) -> None:
        """Open every task in turns; returns once each was admitted (raises if one cannot be)."""
        run = self.run
        run.dispatcher.start_sending()  # each task is sent its units once admitted (``TaskReady``)
        todo = self.waves.next()
        while True:
            for need in todo:
                self._open(need)
            if self.waves.done:
                break
            with self._cond:
                if self._news == self._seen:
                    self._cond.wait(self._sleep())
                self._seen = self._news
                computed, self._computed = self._computed, []
            if run.failed.is_set():
                raise run.error or TaskFailedError("the query failed while its tasks were opened in turns")
            todo = self._admitted()  # before the finishes: a task's ready frame comes before its finished frame
            for task in computed:
                self._running.pop(task, None)
                todo += self.waves.compute(task)
            self._ended()
            self._open_again()
            if not (todo or self._pending or self._running or self._again or self.waves.done):
                # Nothing of the query's will give room back: a gap between what ``Waves`` counted and the workers
                # (another query holding memory until it ends). Say so rather than poll for ever.
                raise TaskFailedError(f"the query's tasks could not all be opened in turns: {len(self.waves.waiting())} wait for "
                                      "room on their workers that no task of the query will give back (other queries hold it)")
        for channels in run.by_stage.values():
            channels.sort(key=lambda c: c.header.stage_key.task_number)

    def _sleep(self) -> float:
        now = time.monotonic()
        return max(0.0, min([_POLL_S, *(at - now for at in self._again.values())]))

    def _open(self, need: TaskNeed) -> None:
        run = self.run
        channel = run.add_task(run.plan.stage(need.stage), need.task, self.counts, late=True)
        self._since[need.id] = time.monotonic()
        self._backoff[need.id] = BACKOFF_S
        self._pending[need.id] = channel
        channel.open(run.clients.get(channel.url))

    def _admitted(self) -> list[TaskNeed]:
        """The pending tasks admitted since the last look, told to the feeds and the turns; the tasks that may open now.
        A busy refusal is opened again after a backoff; a worker that does not answer fails the attempt."""
        run, now, out = self.run, time.monotonic(), []
        for task, channel in list(self._pending.items()):
            if channel.ready.is_set():
                del self._pending[task]
                self._running[task] = channel
                run.dispatcher.task_ready(channel)
                out += self.waves.admit(task)
            elif task in self._again:
                continue
            elif isinstance(channel.error, WorkerBusyError):
                self._refused(task, channel, now)
            elif channel.error is not None or channel.done.is_set():
                raise channel.error or TaskFailedError(
                    "the worker closed the exchange without accepting the task", worker_url=channel.url, stage_key=channel.key
                )
            elif not channel.queued.is_set() and now - (channel.opened_at or now) > run.options.connect_timeout:
                raise WorkerUnavailableError(
                    f"worker {channel.url} did not accept task {channel.key} within {run.options.connect_timeout:g}s",
                    worker_url=channel.url,
                    stage_key=channel.key,
                )
            elif now - self._since[task] > run.options.admission_wait:
                raise WorkerBusyError(
                    f"worker {channel.url} kept task {channel.key} waiting for capacity for {now - self._since[task]:.1f}s "
                    f"(ExecOptions.admission_wait)",
                    worker_url=channel.url,
                    stage_key=channel.key,
                )
        return out

    def _ended(self) -> None:
        """An admitted task whose exchange ended or failed before its finished frame fails the attempt: its
        threads would never be given back here, and the tasks waiting for them would wait for nothing.
        (Its error fails the query on its own, ``Run.channel_error``; this does not rely on it.)"""
        for channel in self._running.values():
            if channel.metrics is None and (channel.error is not None or channel.done.is_set()):
                raise TaskFailedError(
                    "the task was admitted, then ended before it made all its output (no finished frame) while the "
                    f"query's tasks were opened in turns: {channel.error or 'its exchange ended'}",
                    worker_url=channel.url,
                    stage_key=channel.key,
                )

    def _refused(self, task: TaskId, channel: TaskChannel, now: float) -> None:
        waited, backoff = now - self._since[task], self._backoff[task]
        if waited + backoff > self.run.options.admission_wait:
            raise WorkerBusyError(
                f"worker {channel.url} kept task {channel.key} waiting for capacity for {waited:.1f}s: {channel.error}",
                worker_url=channel.url,
                stage_key=channel.key,
            )
        log.debug("query %s: task %s refused as busy; opened again in %.2fs", self.run.query_id, channel.key, backoff)
        self._again[task] = now + backoff * random.uniform(0.5, 1.0)
        self._backoff[task] = min(backoff * 2, MAX_BACKOFF_S)

    def _open_again(self) -> None:
        """Tasks refused as busy whose backoff ended: a new call with the same header (a refused key never ran)."""
        run, now = self.run, time.monotonic()
        for task, at in list(self._again.items()):
            if at > now:
                continue
            del self._again[task]
            old = self._pending[task]
            old.detach()
            old.finish()
            channel = run.make_channel(old.header)
            with run.lock:
                run.channels[run.channels.index(old)] = channel
                stage = run.by_stage[task[0]]
                stage[stage.index(old)] = channel
            run.dispatcher.reopen(channel)
            self._pending[task] = channel
            channel.open(run.clients.get(channel.url))
