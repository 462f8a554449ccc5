"""The coordinator's decisions for one execution, as a state machine apart from I/O.

Why: credits, the shared queue, affinity, feed ends, half-close and cancellation
are the riskiest logic of the coordinator, and they are decisions, not I/O. Here
they are one pure object (after dask's worker state machine): ``handle(event)``
takes one event — units discovered, discovery ended, a task ready, credit
granted, a task finished or drained, the result complete, a worker lost, a
tick of the clock, an abort — and returns the instructions that follow from it:
send these units, send a feed end, half-close, cancel, fail. No threads, no
sockets, no clocks: time comes in with the events (``now``, seconds on any
monotonic clock), and ``wake_at()`` says when the driver should tick.

The driver (``dispatch.FeedDispatcher``) owns the threads: discovery threads
turn a provider's units into ``UnitsFound`` events, the channels' readers turn
frames into ``CreditGranted`` / ``TaskFinished`` events, and one sender per task
carries out that task's instructions in the order they were given.

Guarantees, tested without processes in ``tests/coordinator/test_state.py``:

* a task never holds more units than the credit it granted (per feed partition);
* every discovered unit is sent exactly once (to one task), under any order of
  events, unless the query failed; a unit kept back for a preferred worker waits
  at most ``affinity_wait`` seconds;
* a feed partition's ``SendFeedEnd`` comes after its last unit and only once the
  discovery ended and its queue is empty;
* ``HalfClose`` reaches a task only once it finished (or, ``close_grace`` after
  the result was complete, a task the result did not need);
* after ``Abort`` (or ``WorkerLost``) nothing is sent; every open task is cancelled once;
* a recoverable task's lost units (``TaskLost``: sent, and not ``UnitsDone``) go back to
  the front of their queues, in order, and to no task that was already sent its feed end;
  a replacement takes over the lost task's feed partitions: so a unit whose rows reached
  the caller is never sent again, and every other unit is, until a task completes it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

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
    WorkerLost,
)
from flight.coordinator.slots import FeedProgress, SlotState, SlotStats, SourceState, TaskState

__all__ = ["FeedState"]


class FeedState:
    """Sources (discovery streams), tasks and their feed slots, for one execution.

    ``max_frame`` caps the units of one ``SendUnits``; ``buffer`` the units a source may
    queue ahead of the tasks (``room()``: the driver's discovery waits for it);
    ``affinity_wait`` how long a unit waits for its preferred worker; ``close_grace``
    how long after the result is complete an unfinished task is waited for.
    """

    def __init__(self, *, max_frame: int, buffer: int, affinity_wait: float, close_grace: float = 0.5) -> None:
        self.max_frame = max(1, max_frame)
        self.buffer = max(1, buffer)
        self.affinity_wait = affinity_wait
        self.close_grace = close_grace
        self.sources: list[SourceState] = []
        self.tasks: dict[str, TaskState] = {}
        self._slots: dict[tuple[str, str, int], SlotState] = {}
        self.failed: str | None = None
        self.sending = False
        self._preferred_waiting = 0  # over every source: whether an affinity wait may need a tick
        self._handlers: dict[type, Callable[[Any, list[Instruction]], None]] = {
            UnitsFound: self._units_found,
            DiscoveryEnded: self._discovery_ended,
            StartSending: self._start_sending,
            TaskReady: self._task_ready,
            CreditGranted: self._credit_granted,
            SenderIdle: self._sender_idle,
            TaskFinished: self._task_finished,
            ResultComplete: self._result_complete,
            UnitsDone: self._units_done,
            OutputRead: self._output_read,
            TaskLost: self._task_lost,
            TaskReplaced: self._task_replaced,
            WorkerLost: self._worker_lost,
            Abort: self._abort,
            Tick: self._tick,
        }
        self.complete_at: float | None = None  # when the result was complete
        self._next_id = 0  # the next unit's id

    # ---------------------------------------------------------------- wiring

    def add_source(self, feed_id: str, *, shared: bool) -> int:
        self.sources.append(SourceState(feed_id, shared))
        return len(self.sources) - 1

    def add_task(self, key: str, url: str, *, recoverable: bool = False, exclusive: bool = False, ready: bool = True) -> None:
        """``recoverable``: a lost task's undelivered units are replayed (``UnitsDone``, ``TaskLost``).

        ``exclusive``: they are replayed by its replacement alone, every unit it was sent (no
        ``UnitsDone`` comes): its output is retained and read as one partition, which the
        replacement must make again whole. ``ready`` False: nothing goes to it, not even a feed
        end, before ``TaskReady`` (a task opened after the units began to flow: ``opening.py``).
        """
        self.tasks[key] = TaskState(key, url, ready=ready, recoverable=recoverable or exclusive, exclusive=exclusive)

    def add_slot(self, key: str, source_id: int, partition: int) -> None:
        """Task ``key`` reads ``source_id`` as its feed partition ``partition`` (its number on the wire)."""
        source, task = self.sources[source_id], self.tasks[key]
        slot = SlotState(source, task, key, partition, stats=SlotStats(source.feed_id, partition, key))
        source.slots.append(slot)
        source.urls.add(task.url)
        task.slots.append(slot)
        self._slots[(key, source.feed_id, partition)] = slot

    def clear_tasks(self) -> None:
        """Forget every task (an attempt was let go before any unit was sent)."""
        if self.sending:
            raise RuntimeError("units may have been sent already: the tasks cannot be forgotten")
        for source in self.sources:
            source.slots.clear()
            source.urls.clear()
        self.tasks.clear()
        self._slots.clear()

    # ------------------------------------------------------------- queries

    def room(self, source: int) -> int:
        """How many more units ``source`` may queue now."""
        return max(0, self.buffer - len(self.sources[source].queue))

    def discovered(self, source: int) -> int:
        return self.sources[source].discovered

    def discovery_ended(self, source: int) -> bool:
        return self.sources[source].ended

    def stats(self) -> list[SlotStats]:
        return [s.stats for s in self._slots.values()]

    def feeds(self, now: float) -> list[FeedProgress]:
        """Each feed's discovery, sending and taking so far, summed over its sources, and its lag."""
        out: dict[str, FeedProgress] = {}
        for source in self.sources:
            f = out.setdefault(source.feed_id, FeedProgress(source.feed_id))
            f.discovered += source.discovered
            f.ended = f.ended and source.ended if f.sources else source.ended
            f.sources += 1
            for slot in source.slots:
                f.sent += slot.stats.units
                f.taken += slot.stats.units if slot.owner.finished else slot.stats.taken
            if source.queue:
                f.oldest_waiting = max(f.oldest_waiting, now - source.queue[0].queued_at)
        return list(out.values())

    def may_wake(self) -> bool:
        """Whether ``wake_at`` may name a time: a unit waits for its preferred worker, or the result is complete."""
        return self.complete_at is not None or self._preferred_waiting > 0

    def wake_at(self) -> float | None:
        """When the driver should send a ``Tick``: a unit's affinity wait, or the close grace, ends."""
        times: list[float] = []
        for source in self.sources:
            if source.preferred_waiting and any(s.credit for s in source.slots):
                times.extend(i.queued_at + self.affinity_wait for i in source.queue if i.preferred is not None)
        if self.complete_at is not None and any(not t.closed for t in self.tasks.values()):
            times.append(self.complete_at + self.close_grace)
        return min(times) if times else None

    # -------------------------------------------------------------- events

    def handle(self, event: Event) -> list[Instruction]:
        """The instructions that follow from ``event``, in the order they must be carried out."""
        out: list[Instruction] = []
        if self.failed is None:
            # A table of handlers rather than ``match``: a unit found is the hot path (one per unit).
            self._handlers[type(event)](event, out)
        return out

    def found(self, source_id: int, item: Item, now: float) -> list[Instruction]:
        """``handle(UnitsFound(source_id, (item,), now))`` without making the event: the per-unit path."""
        out: list[Instruction] = []
        if self.failed is None:
            self._add(source_id, (item,), now, out)
        return out

    def _units_found(self, event: UnitsFound, out: list[Instruction]) -> None:
        self._add(event.source, event.items, event.now, out)

    def _add(self, source_id: int, items: Iterable[Item], now: float, out: list[Instruction]) -> None:
        source = self.sources[source_id]
        if source.ended:
            raise ValueError(f"units found after discovery of source {source_id} ended")
        n = 0
        for item in items:
            n += 1
            item.id = self._next_id
            self._next_id += 1
            item.queued_at = now
            source.queue.append(item)
            if item.preferred is not None:
                source.preferred_waiting += 1
                self._preferred_waiting += 1
        source.discovered += n
        self._pump(source, source.slots, now, out)

    def _discovery_ended(self, event: DiscoveryEnded, out: list[Instruction]) -> None:
        source = self.sources[event.source]
        source.ended = True
        self._pump(source, source.slots, event.now, out)

    def _start_sending(self, event: StartSending, out: list[Instruction]) -> None:
        # The first time, nothing was sent to any task before: every sender is idle, so each task's partitions go out
        # together (one bundle, ``framing.py``), where the first partition's frame made the rest wait for its ``SenderIdle``.
        first, self.sending = not self.sending, True
        for source in self.sources:
            self._pump(source, source.slots, event.now, out, ready=first)

    def _task_ready(self, event: TaskReady, out: list[Instruction]) -> None:
        task = self.tasks.get(event.task)
        if task is not None and not task.ready:
            task.ready = True
            for slot in task.slots:  # nothing was sent to it yet: its sender is idle
                self._pump(slot.source, (slot,), event.now, out, ready=True)

    def _credit_granted(self, event: CreditGranted, out: list[Instruction]) -> None:
        slot = self._slots.get((event.task, event.feed_id, event.partition))
        if slot is None or event.credits <= 0:
            return  # a feed partition it was not given: ignored (the driver logs it)
        if not slot.stats.credited:
            slot.stats.window = event.credits
        slot.stats.credited += event.credits
        slot.credit += event.credits
        self._pump(slot.source, (slot,), event.now, out)

    def _sender_idle(self, event: SenderIdle, out: list[Instruction]) -> None:
        task = self.tasks.get(event.task)
        if task is None or not task.busy:
            return
        task.busy = False
        for slot in task.slots:  # a frame for each of its partitions that has units and credit
            self._pump(slot.source, (slot,), event.now, out, ready=True)

    def _task_finished(self, event: TaskFinished, out: list[Instruction]) -> None:
        task = self.tasks.get(event.task)
        if task is not None:
            task.finished = True
            if self.complete_at is not None and not task.closed:
                task.closed = True
                out.append(HalfClose(task.key))

    def _result_complete(self, event: ResultComplete, out: list[Instruction]) -> None:
        self.complete_at = event.now
        for task in self.tasks.values():
            if task.finished and not task.closed:
                task.closed = True
                out.append(HalfClose(task.key))

    def _units_done(self, event: UnitsDone, out: list[Instruction]) -> None:
        task = self.tasks.get(event.task)
        if task is None or not task.recoverable:
            return
        for unit in event.ids:
            if task.outstanding.pop(unit, None) is None:
                # Rows of a unit it was not sent, or delivered already: the worker broke its promise.
                self._fail(f"task {task.key} on {task.url} sent rows of work unit {unit}, which it was not sent or had completed", None, out)
                return

    def _output_read(self, event: OutputRead, out: list[Instruction]) -> None:
        task = self.tasks.get(event.task)
        if task is not None:
            task.read = True
            task.outstanding.clear()

    def _task_lost(self, event: TaskLost, out: list[Instruction]) -> None:
        task = self.tasks.get(event.task)
        if task is None or task.read or task.lost:
            return  # everything it had to give was delivered, or its loss was handled
        if not task.recoverable or task.closed:
            self._fail(f"task {task.key} on {task.url} was lost: {event.reason}", task.url, out)
            return
        task.closed = task.lost = True
        out.append(CancelTask(task.key, event.reason))
        back: dict[int, list[Item]] = {}  # by source: the lost units, in the order they were sent
        for slot, item in task.outstanding.values():
            back.setdefault(id(slot.source), []).append(item)
        sources = {id(slot.source): slot.source for slot in task.slots}
        for key, items in back.items():
            source = sources[key]
            for item in items:
                if item.preferred is not None:  # its wait for that worker is over
                    item.preferred = None
            if not task.exclusive:
                source.queue.extendleft(reversed(items))
        units = len(task.outstanding)
        if task.exclusive:  # what it was sent, then what it had still to replay (a lost replacement's)
            for slot in task.slots:
                units += len(slot.replay)
                slot.replay = deque([*(item for s, item in task.outstanding.values() if s is slot), *slot.replay])
        task.outstanding.clear()
        for source in sources.values():
            source.urls = {s.owner.url for s in source.slots if not s.owner.closed}
        out.append(ReplaceTask(task.key, event.reason, units))
        for source in sources.values():  # a shared queue's other tasks may take them now
            self._pump(source, source.slots, event.now, out)

    def _task_replaced(self, event: TaskReplaced, out: list[Instruction]) -> None:
        lost = self.tasks[event.lost]
        task = self.tasks[event.task] = TaskState(event.task, event.url, ready=False, recoverable=lost.recoverable, exclusive=lost.exclusive)
        for old in lost.slots:
            slot = SlotState(old.source, task, task.key, old.partition, stats=SlotStats(old.source.feed_id, old.partition, task.key))
            slot.replay, old.replay = old.replay, deque()
            old.source.slots.append(slot)
            old.source.urls.add(task.url)
            task.slots.append(slot)
            self._slots[(task.key, old.source.feed_id, old.partition)] = slot

    def _worker_lost(self, event: WorkerLost, out: list[Instruction]) -> None:
        self._fail(f"worker {event.url} was lost: {event.reason}", event.url, out)

    def _abort(self, event: Abort, out: list[Instruction]) -> None:
        self._fail(event.reason, None, out)

    def _tick(self, event: Tick, out: list[Instruction]) -> None:
        now = event.now
        if self.complete_at is not None and now >= self.complete_at + self.close_grace:
            for task in self.tasks.values():  # not needed for the result (below a limit, say)
                if not task.closed:
                    task.closed = True
                    out.append(HalfClose(task.key))
        for source in [s for s in self.sources if s.preferred_waiting]:
            self._pump(source, source.slots, now, out)

    def _fail(self, reason: str, url: str | None, out: list[Instruction]) -> None:
        self.failed = reason
        for task in self.tasks.values():
            if not task.closed:
                task.closed = True
                out.append(CancelTask(task.key, reason))
        out.append(FailQuery(reason, url))

    # ------------------------------------------------------------- sending

    def _pump(self, source: SourceState, slots: Iterable[SlotState], now: float, out: list[Instruction], ready: bool = False) -> None:
        """Units of ``source`` to each of ``slots`` with credit whose sender is idle (``ready``: treat
        it so), one frame each, in order; feed ends once the source is done."""
        if not self.sending:
            return
        queue = source.queue
        for slot in slots:
            owner = slot.owner
            if not (slot.credit and (queue or slot.replay)) or owner.closed or slot.end_sent or not owner.ready or (owner.busy and not ready):
                continue
            n = min(slot.credit, self.max_frame)
            if slot.replay:
                items = [slot.replay.popleft() for _ in range(min(n, len(slot.replay)))]
            else:
                items = self._take(slot, n, owner.url, now)
            if not items:
                continue
            if owner.recoverable:
                for item in items:
                    owner.outstanding[item.id] = (slot, item)
            slot.credit -= len(items)
            stats = slot.stats
            stats.units += len(items)
            stats.bytes += sum(len(i.body) for i in items) if len(items) > 1 else len(items[0].body)
            stats.frames += 1
            owner.busy = True  # one frame at a time: the rest waits for SenderIdle, and goes out together
            out.append(SendUnits(slot.task, source.feed_id, slot.partition, tuple(items)))
        # A source done: every slot of it learns so (for a shared queue, the slots that took
        # nothing from the last pump too), each after the last units it was sent.
        if source.ended and not queue:
            for slot in source.slots:
                if not slot.end_sent and not slot.owner.closed and slot.owner.ready and not slot.replay:
                    slot.end_sent = True
                    out.append(SendFeedEnd(slot.task, source.feed_id, slot.partition))

    def _take(self, slot: SlotState, n: int, url: str, now: float) -> list[Item]:
        """Up to ``n`` units for ``slot``: in order, skipping (for a while) units meant for other workers."""
        queue = slot.source.queue
        if not slot.source.preferred_waiting:
            return [queue.popleft() for _ in range(min(n, len(queue)))]
        taken: list[Item] = []
        keep: list[Item] = []
        while queue and len(taken) < n:
            item = queue.popleft()
            p = item.preferred
            # A unit waits for its preferred worker only if a task there reads this source, and only
            # until ``queued_at + affinity_wait`` (the same sum ``wake_at`` asks to be woken at).
            if p is None or p == url or p not in slot.source.urls or now >= item.queued_at + self.affinity_wait:
                if p is not None:
                    slot.source.preferred_waiting -= 1
                    self._preferred_waiting -= 1
                    slot.stats.affinity_hits += p == url
                taken.append(item)
            else:
                keep.append(item)
        queue.extendleft(reversed(keep))
        return taken
