"""Driving work-unit feeds from the coordinator to tasks: the I/O around ``state.FeedState``.

A **source** is one discovery stream: a thread runs the provider (generator or
async generator) and hands what it yields to the state machine, a bounded step
ahead of the tasks. A **slot** is one feed partition of one task, with the
credit that task granted. Which unit goes to which task, when a feed ends, when
a task is half-closed: ``FeedState`` decides (``coordinator/state.py``, tested
without sockets). This driver only carries its instructions out: one sender
thread per task sends that task's frames in the order they were decided
(coalescing units that queued up behind a slow write into one frame), and one
ticker thread wakes the state machine when an affinity wait or the close grace
ends. So a slow provider never blocks a task that already has work, and a slow
task never receives more than it asked for.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

from flight.coordinator.channel import TaskChannel
from flight.coordinator.events import (
    Abort,
    CancelTask,
    CreditGranted,
    DiscoveryEnded,
    Event,
    FailQuery,
    HalfClose,
    Instruction,
    Item,
    OutputRead,
    ReplaceTask,
    ResultComplete,
    SenderIdle,
    SendFeedEnd,
    SendUnits,
    StartSending,
    TaskFinished,
    TaskLost,
    TaskReady,
    TaskReplaced,
    Tick,
    UnitsDone,
    UnitsFound,
)
from flight.coordinator.framing import frames
from flight.coordinator.resolver import normalize_url
from flight.coordinator.slots import FeedProgress, SlotStats
from flight.coordinator.state import FeedState
from flight.sources.estimate import DiscoverySample
from flight.sources.feed import FeedContext, LatencyStats, Unit, WorkUnit, WorkUnitFeed, now_ns, unit_bytes
from flight.threads import spawn

__all__ = ["FeedDispatcher", "PartitionStats", "Source"]

log = logging.getLogger(__name__)

PartitionStats = SlotStats
"""What the coordinator sent to one task for one feed partition (``QueryMetrics.feeds``)."""


class _Stopped(Exception):
    """Raised inside a discovery thread when the query ended first."""


@dataclass(eq=False)
class Source:
    """One discovery stream: its provider, and what its discovery measured."""

    feed: WorkUnitFeed
    partition: int
    partitions: int
    shared: bool
    index: int
    """Its number in the state machine."""
    discovery: LatencyStats = field(default_factory=LatencyStats)
    started: float = 0.0
    sample_rows: list[int | None] = field(default_factory=list)
    sample_bytes: list[int | None] = field(default_factory=list)


@dataclass(eq=False)
class _Outbox:
    channel: TaskChannel
    wake: threading.Condition
    """On the dispatcher's lock: only this task's sender waits on it."""
    pending: deque[Instruction] = field(default_factory=deque)


class FeedDispatcher:
    """All feed sources of one execution, its tasks, and the threads that move units."""

    def __init__(
        self,
        query_id: str,
        *,
        discovery_buffer: int,
        max_units_per_frame: int,
        affinity_wait_s: float = 0.05,
        close_grace_s: float = 0.5,
        on_error: Callable[[BaseException], None],
        on_replace: Callable[[ReplaceTask], None] | None = None,
    ) -> None:
        self.query_id = query_id
        self._max_frame = max(1, max_units_per_frame)
        self._on_error = on_error
        self._on_replace = on_replace
        self.state = FeedState(
            max_frame=max_units_per_frame, buffer=discovery_buffer, affinity_wait=affinity_wait_s, close_grace=close_grace_s
        )
        self.sources: list[Source] = []
        self._boxes: dict[str, _Outbox] = {}
        # One lock for the state machine; each waiter has a condition of its own on it, so an event
        # wakes only who it concerns (a unit found wakes one sender, not every thread of the query).
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)  # discovery (queue room) and sample()
        self._ticker = threading.Condition(self._lock)
        self._waiting = 0  # threads waiting on _cond (notify_all is skipped when none: it is per unit)
        self._sending = False
        self.cancelled = threading.Event()

    # ------------------------------------------------------------ wiring up

    def add_source(self, feed: WorkUnitFeed, partition: int, partitions: int, *, shared: bool) -> Source:
        source = Source(feed, partition, partitions, shared, self.state.add_source(feed.feed_id, shared=shared))
        self.sources.append(source)
        return source

    def add_task(self, channel: TaskChannel, *, recoverable: bool = False, exclusive: bool = False, late: bool = False) -> None:
        """A task of the execution (with feeds or without): its channel carries the instructions.

        ``recoverable``: its lost units are replayed (``task_lost``); ``exclusive``: all it was
        sent, by its replacement alone (``FeedState.add_task``); ``late``: opened once units may
        flow already (tasks opened in turns), so nothing goes to it before ``task_ready``.
        """
        self._add_box(channel, lambda: self.state.add_task(channel.key, channel.url, recoverable=recoverable, exclusive=exclusive, ready=not late))

    def reopen(self, channel: TaskChannel) -> None:
        """``channel`` carries its key's instructions from now on (a task opened again after a busy refusal)."""
        with self._cond:
            self._boxes[channel.key].channel = channel

    def replace(self, lost: str, channel: TaskChannel) -> None:
        """``channel`` (not yet open) takes over the feed partitions of the lost task ``lost``.

        Its slots exist before it opens (its credits may come at once); nothing is sent to it
        before ``task_ready``.
        """
        self._add_box(channel, lambda: self._apply_locked(TaskReplaced(lost, channel.key, channel.url, time.monotonic())))

    def _add_box(self, channel: TaskChannel, make: Callable[[], object]) -> None:
        """``channel``'s outbox, once ``make`` (under the lock) made its task; its sender starts now if units flow already."""
        box = _Outbox(channel, threading.Condition(self._lock))
        with self._lock:
            self._boxes[channel.key] = box
            make()
            sending = self._sending and not self.cancelled.is_set()
        if sending:
            spawn(self._send, box, name=f"send-{channel.key}")

    def task_ready(self, channel: TaskChannel) -> None:
        """A replacement (or a task opened late) accepted its header: its units may go out."""
        self._apply(TaskReady(channel.key, time.monotonic()))

    def units_done(self, channel: TaskChannel, ids: list[int]) -> None:
        """Every row of these units of ``channel``'s reached the caller."""
        self._apply(UnitsDone(channel.key, tuple(ids), time.monotonic()))

    def output_read(self, channel: TaskChannel) -> None:
        self._apply(OutputRead(channel.key, time.monotonic()))

    def task_lost(self, channel: TaskChannel, reason: str) -> None:
        """``channel``'s worker is lost: its undelivered units go back to the queues, and a
        ``ReplaceTask`` reaches ``on_replace`` (or, for a task that cannot be recovered, the query fails)."""
        self._apply(TaskLost(channel.key, reason, time.monotonic()))

    def add_slot(self, source: Source, partition: int, channel: TaskChannel) -> None:
        with self._cond:
            if channel.key not in self._boxes:
                self.state.add_task(channel.key, channel.url)
                self._boxes[channel.key] = _Outbox(channel, threading.Condition(self._lock))
            self.state.add_slot(channel.key, source.index, partition)

    def clear_slots(self) -> None:
        """Forget every task (before any unit was sent): the query retries with new tasks."""
        with self._cond:
            self.state.clear_tasks()
            self._boxes.clear()

    @property
    def stats(self) -> list[PartitionStats]:
        with self._cond:
            return self.state.stats()

    def feeds(self) -> list[FeedProgress]:
        """Each feed's units found, sent and taken so far, and its lag (a live view)."""
        with self._cond:
            return self.state.feeds(time.monotonic())

    def on_credit(self, channel: TaskChannel, feed_id: str, partition: int, credits: int) -> None:
        if (channel.key, feed_id, partition) not in self.state._slots:
            log.warning("task %s asked for units of feed %r partition %d it was not given", channel.key, feed_id, partition)
            return
        self._apply(CreditGranted(channel.key, feed_id, partition, credits, time.monotonic()))

    def on_finished(self, channel: TaskChannel) -> None:
        self._apply(TaskFinished(channel.key, time.monotonic()))

    def result_complete(self) -> None:
        """The caller read every head output: finished tasks are half-closed, the rest after a grace."""
        self._apply(ResultComplete(time.monotonic()))

    def start_discovery(self, sources: list[Source] | None = None) -> None:
        """A discovery thread per source, started by a thread of its own: the caller goes on to open
        the tasks at once (a query has a source per feed partition, TPC-H Q5 20 of them, and each
        thread start waits for the new thread to run)."""
        todo = [s for s in (sources if sources is not None else self.sources) if not s.started]
        now = time.monotonic()
        for source in todo:
            source.started = now

        def start_all() -> None:
            for source in todo:
                spawn(self._discover, source, name=f"discover-{source.feed.feed_id}-{source.partition}")

        if len(todo) == 1:
            start_all()
        elif todo:
            spawn(start_all, name=f"discovery-{self.query_id}")

    def start_sending(self) -> None:
        with self._cond:
            self._sending = True
            boxes = list(self._boxes.values())
        for box in boxes:
            spawn(self._send, box, name=f"send-{box.channel.key}")
        spawn(self._tick, name=f"feeds-{self.query_id}")
        self._apply(StartSending(time.monotonic()))

    def stop(self, reason: str = "the query ended") -> None:
        """End discovery and sending (the query finished or failed); open tasks are cancelled."""
        self.cancelled.set()
        self._apply(Abort(reason, time.monotonic()))

    def sample(self, source: Source, units: int, seconds: float) -> DiscoverySample:
        """Wait until ``source`` found ``units`` units, finished, or ``seconds`` passed; describe it."""
        deadline = source.started + seconds
        with self._cond:
            while (
                self.state.discovered(source.index) < units
                and not self.state.discovery_ended(source.index)
                and not self.cancelled.is_set()
            ):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._waiting += 1
                try:
                    self._cond.wait(left)
                finally:
                    self._waiting -= 1
            return DiscoverySample(
                rows=list(source.sample_rows),
                bytes=list(source.sample_bytes),
                finished=self.state.discovery_ended(source.index),
                elapsed_ms=(time.monotonic() - source.started) * 1000,
            )

    def _apply(self, event: Event) -> None:
        """One event through the state machine; sends are queued per task, cancels done here."""
        with self._lock:
            now_here = self._apply_locked(event)
        # A cancel must not wait behind a send blocked on a frozen worker: the channel's abort
        # is safe from any thread, so it runs on the one that decided it.
        for ins in now_here:
            if isinstance(ins, CancelTask):
                box = self._boxes.get(ins.task)
                if box is not None:
                    box.channel.abort(ins.reason)
            elif isinstance(ins, ReplaceTask):
                if self._on_replace is None:
                    self._on_error(RuntimeError(f"task {ins.task} was lost and nothing can replace it: {ins.reason}"))
                else:
                    self._on_replace(ins)
            elif isinstance(ins, FailQuery) and not self.cancelled.is_set():
                self._on_error(RuntimeError(ins.reason))

    def _apply_locked(self, event: Event) -> list[Instruction]:
        """``_apply`` with the lock held: returns what must run outside it (cancels, failure)."""
        now_here = self._route(self.state.handle(event))
        if isinstance(event, (Abort, ResultComplete, StartSending)) or self.state.may_wake():
            self._ticker.notify()
        if isinstance(event, Abort):
            for box in self._boxes.values():
                box.wake.notify()
            if self._waiting:
                self._cond.notify_all()
        elif self._waiting and isinstance(event, (UnitsFound, DiscoveryEnded)):
            self._cond.notify_all()  # progress sample() waits for
        return now_here

    def _route(self, instructions: list[Instruction]) -> list[Instruction]:
        """Sends to their task's sender, in order; what must run outside the lock is returned."""
        now_here: list[Instruction] = []
        for ins in instructions:
            if isinstance(ins, (SendUnits, SendFeedEnd, HalfClose)):
                box = self._boxes[ins.task]
                box.pending.append(ins)
                box.wake.notify()
                if self._waiting and isinstance(ins, SendUnits):
                    self._cond.notify_all()  # queue room for discovery
            else:
                now_here.append(ins)
        return now_here

    # -------------------------------------------------------------- discovery

    def _put(self, source: Source, unit: WorkUnit, created: int) -> None:
        body = unit_bytes(unit)
        preferred = rows = size = None
        if isinstance(unit, Unit):
            preferred = normalize_url(unit.preferred_worker) if unit.preferred_worker else None
            rows, size = unit.rows, unit.bytes
        with self._lock:
            while not self.state.room(source.index) and not self.cancelled.is_set():
                self._waiting += 1
                try:
                    self._cond.wait()
                finally:
                    self._waiting -= 1
            if self.cancelled.is_set():
                raise _Stopped
            if len(source.sample_bytes) < 100_000:
                source.sample_rows.append(rows)
                source.sample_bytes.append(size)
            # A found unit only ever queues or sends: nothing runs outside the lock. The state
            # machine's per-unit entry (``found``) is ``handle(UnitsFound(...))`` without the event.
            self._route(self.state.found(source.index, Item(body, created, preferred, rows, size), time.monotonic()))
            if preferred is not None:
                self._ticker.notify()  # an affinity wait may end before anything else happens
            if self._waiting:
                self._cond.notify_all()  # progress sample() waits for

    def _discover(self, source: Source) -> None:
        ctx = FeedContext(self.query_id, source.feed.feed_id, source.partition, source.partitions, self.cancelled)
        try:
            stream = source.feed.feed(source.partition, ctx)
            if inspect.isasyncgen(stream) or hasattr(stream, "__anext__"):
                asyncio.run(self._discover_async(source, stream))  # type: ignore[arg-type]
            else:
                self._discover_sync(source, stream)
        except _Stopped:
            pass
        except BaseException as exc:  # noqa: BLE001 - user code: the query fails with its own exception
            what = "the shared discovery" if source.shared else f"partition {source.partition}"
            exc.add_note(f"raised by the provider of feed {source.feed.feed_id!r}, {what}")
            self._on_error(exc)
            return  # never mark a failed discovery as complete: no FeedEnd may follow it
        self._apply(DiscoveryEnded(source.index, time.monotonic()))

    def _discover_sync(self, source: Source, stream: Iterator[WorkUnit]) -> None:
        try:
            last = now_ns()
            for unit in stream:
                created = now_ns()
                source.discovery.add(created - last)
                self._put(source, unit, created)
                last = now_ns()
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()

    async def _discover_async(self, source: Source, stream: AsyncIterator[WorkUnit]) -> None:
        # A loop of this thread's own: blocking in _put only holds up this provider.
        last = now_ns()
        async for unit in stream:
            created = now_ns()
            source.discovery.add(created - last)
            self._put(source, unit, created)
            last = now_ns()

    # ---------------------------------------------------------------- sending

    def _send(self, box: _Outbox) -> None:
        """One task's instructions, in order: frames, then (once finished) the half-close."""
        while True:
            with self._lock:
                while not box.pending and not self.cancelled.is_set():
                    box.wake.wait()
                if self.cancelled.is_set():
                    return
                batch = list(box.pending)
                box.pending.clear()
            for frame in frames(batch, self._max_frame):  # framing.py: each partition's, bundled (protocol 13)
                if frame is None:
                    box.channel.close()
                    return
                box.channel.send(frame)
            self._apply(SenderIdle(box.channel.key, time.monotonic()))  # the units queued meanwhile go next

    def _tick(self) -> None:
        """Wakes the state machine when an affinity wait or the close grace ends."""
        while True:
            with self._lock:
                while not self.cancelled.is_set():
                    at = self.state.wake_at()
                    left = None if at is None else at - time.monotonic()
                    if left is not None and left <= 0:
                        break
                    self._ticker.wait(left)
                if self.cancelled.is_set():
                    return
            self._apply(Tick(time.monotonic()))
