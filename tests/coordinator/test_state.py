"""The coordinator's state machine alone: no threads, no sockets, no clocks.

``FeedState`` decides which unit goes to which task, when feeds end, when tasks
are half-closed or cancelled. These tests drive it with events — hand-written
ones for each rule, and hypothesis-generated interleavings for the invariants
that must hold under any order: credit is never exceeded, every unit is sent
exactly once, a feed end follows a partition's last unit, nothing is sent after
a half-close or a cancel.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flight.coordinator.state import (
    Abort,
    CancelTask,
    CreditGranted,
    DiscoveryEnded,
    FailQuery,
    FeedState,
    HalfClose,
    Instruction,
    Item,
    ResultComplete,
    SendFeedEnd,
    SendUnits,
    SenderIdle,
    StartSending,
    TaskFinished,
    Tick,
    UnitsFound,
    WorkerLost,
)

A, B, C = "grpc://a:1", "grpc://b:1", "grpc://c:1"
WAIT = 0.05


def shared_two_tasks(**kw: object) -> FeedState:
    """One shared feed read by task t0 (on A) and t1 (on B), each as its partition 0 / 1."""
    state = FeedState(max_frame=kw.pop("max_frame", 4), buffer=kw.pop("buffer", 100), affinity_wait=WAIT, **kw)  # type: ignore[arg-type]
    src = state.add_source("f", shared=True)
    for i, url in enumerate((A, B)):
        state.add_task(f"t{i}", url)
        state.add_slot(f"t{i}", src, i)
    return state


def units(n: int, start: int = 0, preferred: str | None = None) -> tuple[Item, ...]:
    return tuple(Item(f"u{i}".encode(), preferred=preferred) for i in range(start, start + n))


def sent(instructions: list[Instruction], task: str | None = None) -> list[bytes]:
    return [i.body for ins in instructions if isinstance(ins, SendUnits) and task in (None, ins.task) for i in ins.items]


# ------------------------------------------------------------------- rules


def test_no_unit_leaves_before_every_task_was_admitted() -> None:
    state = shared_two_tasks()
    assert state.handle(UnitsFound(0, units(3), 0.0)) == []
    assert state.handle(CreditGranted("t0", "f", 0, 5, 0.0)) == []
    out = state.handle(StartSending(0.0))
    assert sent(out, "t0") == [b"u0", b"u1", b"u2"]


def test_a_task_gets_at_most_its_credit_and_frames_are_capped() -> None:
    state = shared_two_tasks(max_frame=2)
    state.handle(StartSending(0.0))
    state.handle(UnitsFound(0, units(10), 0.0))
    got = sent(state.handle(CreditGranted("t0", "f", 0, 5, 0.0)))
    for _ in range(5):  # one frame per idle sender
        out = state.handle(SenderIdle("t0", 0.0))
        assert all(len(ins.items) <= 2 for ins in out if isinstance(ins, SendUnits))
        got += sent(out)
    assert got == [f"u{i}".encode() for i in range(5)]  # the credit, no more
    assert sent(state.handle(CreditGranted("t0", "f", 0, 1, 0.0))) == [b"u5"]
    assert [(s.units, s.frames) for s in state.stats() if s.task == "t0"] == [(6, 4)]


def test_units_found_while_a_sender_writes_wait_and_go_out_together() -> None:
    state = shared_two_tasks(max_frame=100)
    state.handle(StartSending(0.0))
    state.handle(CreditGranted("t0", "f", 0, 50, 0.0))
    assert sent(state.handle(UnitsFound(0, units(1), 0.0))) == [b"u0"]  # t0's sender is now busy
    for i in range(1, 6):
        assert state.handle(UnitsFound(0, units(1, i), 0.0)) == []  # queued meanwhile
    out = state.handle(SenderIdle("t0", 0.0))
    assert [len(ins.items) for ins in out if isinstance(ins, SendUnits)] == [5]  # one frame


def test_a_shared_queue_unit_goes_to_whichever_sender_is_idle() -> None:
    state = shared_two_tasks()
    state.handle(StartSending(0.0))
    state.handle(CreditGranted("t0", "f", 0, 5, 0.0))
    state.handle(CreditGranted("t1", "f", 1, 5, 0.0))
    assert sent(state.handle(UnitsFound(0, units(1), 0.0)), "t0") == [b"u0"]
    assert sent(state.handle(UnitsFound(0, units(1, 1), 0.0)), "t1") == [b"u1"]  # t0 still writes


def test_units_wait_for_credit_and_go_in_discovery_order() -> None:
    state = shared_two_tasks()
    state.handle(StartSending(0.0))
    assert state.handle(UnitsFound(0, units(2), 0.0)) == []
    assert sent(state.handle(CreditGranted("t1", "f", 1, 1, 0.0))) == [b"u0"]
    assert sent(state.handle(CreditGranted("t0", "f", 0, 3, 0.0))) == [b"u1"]
    state.handle(SenderIdle("t0", 0.0))
    assert sent(state.handle(UnitsFound(0, units(1, 2), 0.0)), "t0") == [b"u2"]


def test_feed_end_reaches_every_slot_of_a_shared_feed_after_its_last_unit() -> None:
    state = shared_two_tasks()
    state.handle(StartSending(0.0))
    state.handle(UnitsFound(0, units(2), 0.0))
    state.handle(DiscoveryEnded(0, 0.0))
    out = state.handle(CreditGranted("t1", "f", 1, 5, 0.0))
    assert out[0] == SendUnits("t1", "f", 1, out[0].items) and len(out[0].items) == 2
    assert set(out[1:]) == {SendFeedEnd("t1", "f", 1), SendFeedEnd("t0", "f", 0)}
    assert state.handle(CreditGranted("t0", "f", 0, 5, 0.0)) == []  # ended: nothing more, no second end


def test_no_feed_end_while_units_are_queued() -> None:
    state = shared_two_tasks()
    state.handle(StartSending(0.0))
    state.handle(UnitsFound(0, units(1), 0.0))
    assert state.handle(DiscoveryEnded(0, 0.0)) == []  # a unit still waits for credit
    out = state.handle(CreditGranted("t0", "f", 0, 1, 0.0))
    assert [type(i) for i in out] == [SendUnits, SendFeedEnd, SendFeedEnd]


def test_a_partitioned_feed_ends_per_partition() -> None:
    state = FeedState(max_frame=8, buffer=8, affinity_wait=WAIT)
    p0, p1 = state.add_source("f", shared=False), state.add_source("f", shared=False)
    state.add_task("t0", A)
    state.add_slot("t0", p0, 0)
    state.add_task("t1", B)
    state.add_slot("t1", p1, 1)
    state.handle(StartSending(0.0))
    assert state.handle(DiscoveryEnded(p0, 0.0)) == [SendFeedEnd("t0", "f", 0)]
    state.handle(UnitsFound(p1, units(1), 0.0))
    assert sent(state.handle(CreditGranted("t1", "f", 1, 4, 0.0))) == [b"u0"]
    assert state.handle(DiscoveryEnded(p1, 0.0)) == [SendFeedEnd("t1", "f", 1)]


def test_discovery_is_held_back_when_the_queue_is_full() -> None:
    state = shared_two_tasks(buffer=3)
    state.handle(StartSending(0.0))
    state.handle(UnitsFound(0, units(3), 0.0))
    assert state.room(0) == 0
    state.handle(CreditGranted("t0", "f", 0, 2, 0.0))
    assert state.room(0) == 2


def test_a_unit_waits_for_its_preferred_worker_then_goes_to_anyone() -> None:
    state = shared_two_tasks()
    state.handle(StartSending(0.0))
    state.handle(UnitsFound(0, units(1, preferred=B), 10.0))
    assert state.handle(CreditGranted("t0", "f", 0, 1, 10.0)) == []  # t0 is on A: the unit waits
    assert state.wake_at() == pytest.approx(10.0 + WAIT)
    assert state.handle(Tick(10.0 + WAIT / 2)) == []
    assert sent(state.handle(Tick(10.0 + WAIT)), "t0") == [b"u0"]
    assert state.stats()[0].affinity_hits == 0


def test_a_unit_goes_to_its_preferred_worker_when_it_has_credit() -> None:
    state = shared_two_tasks()
    state.handle(StartSending(0.0))
    state.handle(CreditGranted("t0", "f", 0, 5, 0.0))
    state.handle(UnitsFound(0, units(2, preferred=B), 0.0))
    assert sent(state.handle(CreditGranted("t1", "f", 1, 5, 0.01)), "t1") == [b"u0", b"u1"]
    assert {s.task: s.affinity_hits for s in state.stats()} == {"t0": 0, "t1": 2}


def test_a_preferred_worker_that_runs_no_task_is_no_reason_to_wait() -> None:
    state = shared_two_tasks()
    state.handle(StartSending(0.0))
    state.handle(CreditGranted("t0", "f", 0, 5, 0.0))
    assert sent(state.handle(UnitsFound(0, units(1, preferred="grpc://elsewhere:1"), 0.0))) == [b"u0"]


def test_a_unit_does_not_wait_for_a_worker_that_does_not_read_its_partition() -> None:
    state = FeedState(max_frame=8, buffer=8, affinity_wait=WAIT)
    p0, p1 = state.add_source("f", shared=False), state.add_source("f", shared=False)
    state.add_task("t0", A)
    state.add_slot("t0", p0, 0)
    state.add_task("t1", B)
    state.add_slot("t1", p1, 1)
    state.handle(StartSending(0.0))
    state.handle(CreditGranted("t0", "f", 0, 1, 0.0))
    assert sent(state.handle(UnitsFound(p0, units(1, preferred=B), 0.0))) == [b"u0"]  # B reads partition 1 only


def test_half_close_only_after_the_task_finished_and_the_result_is_complete() -> None:
    state = shared_two_tasks()
    state.handle(StartSending(0.0))
    assert state.handle(TaskFinished("t0", 0.0)) == []  # the result is not complete yet
    assert state.handle(ResultComplete(1.0)) == [HalfClose("t0")]
    assert state.handle(TaskFinished("t1", 1.1)) == [HalfClose("t1")]
    assert state.wake_at() is None


def test_a_task_the_result_did_not_need_is_half_closed_after_the_grace() -> None:
    state = shared_two_tasks(close_grace=0.5)
    state.handle(StartSending(0.0))
    assert state.handle(ResultComplete(1.0)) == []
    assert state.wake_at() == pytest.approx(1.5)
    assert state.handle(Tick(1.2)) == []
    assert state.handle(Tick(1.5)) == [HalfClose("t0"), HalfClose("t1")]
    assert state.handle(TaskFinished("t0", 1.6)) == []  # closed once only


@pytest.mark.parametrize("stage", ["wired", "admitted", "sending", "ended", "finished", "complete"])
def test_abort_at_every_stage_cancels_each_open_task_once_and_then_nothing_moves(stage: str) -> None:
    state = shared_two_tasks()
    steps = ["wired", "admitted", "sending", "ended", "finished", "complete"]
    script = {
        "admitted": [StartSending(0.0)],
        "sending": [UnitsFound(0, units(2), 0.0), CreditGranted("t0", "f", 0, 1, 0.0)],
        "ended": [DiscoveryEnded(0, 0.0), CreditGranted("t1", "f", 1, 4, 0.0)],
        "finished": [TaskFinished("t0", 0.0)],
        "complete": [ResultComplete(0.0)],
    }
    for step in steps[1 : steps.index(stage) + 1]:
        for event in script[step]:
            state.handle(event)
    closed = {"t0"} if stage == "complete" else set()
    out = state.handle(Abort("caller stopped", 2.0))
    assert out == [CancelTask(t, "caller stopped") for t in ("t0", "t1") if t not in closed] + [FailQuery("caller stopped")]
    for event in (UnitsFound(0, units(1, 9), 3.0) if stage in ("wired", "admitted", "sending") else Tick(3.0),
                  CreditGranted("t1", "f", 1, 9, 3.0), Tick(9.0), Abort("again", 9.0)):
        assert state.handle(event) == []


def test_a_lost_worker_fails_the_query_naming_it() -> None:
    state = shared_two_tasks()
    state.handle(StartSending(0.0))
    out = state.handle(WorkerLost(B, "connection refused", 1.0))
    assert out[-1] == FailQuery(f"worker {B} was lost: connection refused", B)
    assert {i.task for i in out if isinstance(i, CancelTask)} == {"t0", "t1"}


def test_tasks_can_be_forgotten_only_before_sending() -> None:
    state = shared_two_tasks()
    state.handle(UnitsFound(0, units(2), 0.0))
    state.clear_tasks()
    state.add_task("t9", A)
    state.add_slot("t9", 0, 0)
    state.handle(StartSending(0.0))
    assert sent(state.handle(CreditGranted("t9", "f", 0, 5, 0.0))) == [b"u0", b"u1"]  # nothing lost with the old tasks
    with pytest.raises(RuntimeError):
        state.clear_tasks()


def test_credit_for_a_partition_the_task_was_not_given_is_ignored() -> None:
    state = shared_two_tasks()
    state.handle(StartSending(0.0))
    state.handle(UnitsFound(0, units(1), 0.0))
    assert state.handle(CreditGranted("t0", "f", 7, 5, 0.0)) == []
    assert state.handle(CreditGranted("nobody", "f", 0, 5, 0.0)) == []
    assert state.handle(CreditGranted("t0", "f", 0, -3, 0.0)) == []


# -------------------------------------------------------- any interleaving


@dataclass
class World:
    """A FeedState and everything it said, checked as the events go.

    A slot is one feed partition of one task: ``slots`` maps (task, partition) to its source.
    A partitioned feed may give a task several partitions (more files than tasks).
    """

    state: FeedState
    urls: dict[str, str]
    slots: dict[tuple[str, int], int]
    granted: dict[tuple[str, int], int] = field(default_factory=dict)
    got: dict[tuple[str, int], list[bytes]] = field(default_factory=dict)
    ended: set[tuple[str, int]] = field(default_factory=set)
    closed: set[str] = field(default_factory=set)
    cancelled: set[str] = field(default_factory=set)
    finished: set[str] = field(default_factory=set)
    discovered: list[bytes] = field(default_factory=list)
    discovery_over: set[int] = field(default_factory=set)
    complete_at: float | None = None
    failed: bool = False
    writing: set[tuple[str, int]] = field(default_factory=set)  # slots with a frame their task's sender still writes

    def apply(self, event: object) -> None:
        out = self.state.handle(event)  # type: ignore[arg-type]
        if isinstance(event, UnitsFound):
            self.discovered += [i.body for i in event.items]
        elif isinstance(event, DiscoveryEnded):
            self.discovery_over.add(event.source)
        elif isinstance(event, CreditGranted) and event.credits > 0 and event.feed_id == "f":
            if (event.task, event.partition) in self.slots:
                key = (event.task, event.partition)
                self.granted[key] = self.granted.get(key, 0) + event.credits
        elif isinstance(event, TaskFinished):
            self.finished.add(event.task)
        elif isinstance(event, ResultComplete):
            self.complete_at = event.now
        elif isinstance(event, SenderIdle):
            self.writing = {slot for slot in self.writing if slot[0] != event.task}
        for ins in out:
            task = getattr(ins, "task", None)
            assert task not in self.closed and task not in self.cancelled, f"{ins} after the task was let go"
            if isinstance(ins, SendUnits):
                key = (ins.task, ins.partition)
                assert key in self.slots, f"units for a partition {ins.task} does not read"
                assert key not in self.ended, "units after the feed end"
                assert key not in self.writing, "a second frame for a partition before its sender was idle"
                assert not self.failed
                self.writing.add(key)
                self.got.setdefault(key, []).extend(i.body for i in ins.items)
                assert len(ins.items) <= self.state.max_frame
                assert len(self.got[key]) <= self.granted.get(key, 0), "credit exceeded"
                source = self.slots[key]
                readers = {self.urls[t] for (t, _), src in self.slots.items() if src == source}
                for item in ins.items:
                    p = item.preferred
                    if p is not None and p != self.urls[ins.task] and p in readers:
                        assert now_of(event) >= item.queued_at + self.state.affinity_wait, "affinity wait cut short"
            elif isinstance(ins, SendFeedEnd):
                key = (ins.task, ins.partition)
                assert key not in self.ended, "a second feed end"
                assert self.slots[key] in self.discovery_over, "a feed end before discovery ended"
                self.ended.add(key)
            elif isinstance(ins, HalfClose):
                assert self.complete_at is not None
                assert ins.task in self.finished or now_of(event) >= self.complete_at + self.state.close_grace
                self.closed.add(ins.task)
            elif isinstance(ins, CancelTask):
                self.cancelled.add(ins.task)
            elif isinstance(ins, FailQuery):
                self.failed = True
        if self.failed:
            assert self.cancelled | self.closed == set(self.urls), "a task left running after the query failed"


def now_of(event: object) -> float:
    return float(getattr(event, "now"))


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[World, list[object]]:
    shared = draw(st.booleans())
    n_tasks = draw(st.integers(1, 3))
    workers = (A, B, C)
    distinct = draw(st.booleans())  # one task per worker (affinity matters), or tasks sharing workers
    urls = {f"t{i}": workers[i] if distinct else workers[draw(st.integers(0, 2))] for i in range(n_tasks)}
    state = FeedState(
        max_frame=draw(st.integers(1, 4)), buffer=10_000, affinity_wait=WAIT, close_grace=draw(st.sampled_from([0.0, 0.2]))
    )
    for task, url in urls.items():
        state.add_task(task, url)
    slots: dict[tuple[str, int], int] = {}
    if shared:  # one discovery stream; each task reads it as its own partition
        source = state.add_source("f", shared=True)
        for i, task in enumerate(urls):
            slots[(task, i)] = source
    else:  # one stream per partition; partition p is read by task p % tasks (several per task)
        for p in range(draw(st.integers(1, 5))):
            slots[(f"t{p % n_tasks}", p)] = state.add_source("f", shared=False)
    for (task, partition), source in slots.items():
        state.add_slot(task, source, partition)
    world = World(state, urls, slots)
    sources = sorted(set(slots.values()))
    now = 0.0
    events: list[object] = []
    counter = 0
    ended: set[int] = set()
    admitted = False
    for _ in range(draw(st.integers(0, 40))):
        now += draw(st.sampled_from([0.0, 0.01, 0.03, 0.06]))
        kind = draw(st.sampled_from(["units", "units", "credit", "credit", "idle", "idle", "end", "start", "tick", "finish", "complete", "abort"]))
        if kind == "units":
            src = draw(st.sampled_from(sources))
            if src in ended:
                continue
            k = draw(st.integers(1, 3))
            pref = draw(st.sampled_from([None, A, B, C, "grpc://elsewhere:1"]))
            events.append(UnitsFound(src, units(k, counter, pref), now))
            counter += k
        elif kind == "credit":
            task, partition = draw(st.sampled_from(sorted(slots)))
            events.append(CreditGranted(task, "f", partition, draw(st.integers(1, 3)), now))
        elif kind == "idle":
            events.append(SenderIdle(draw(st.sampled_from(sorted(urls))), now))
        elif kind == "end":
            src = draw(st.sampled_from(sources))
            if src not in ended:
                ended.add(src)
                events.append(DiscoveryEnded(src, now))
        elif kind == "start" and not admitted:
            admitted = True
            events.append(StartSending(now))
        elif kind == "tick":
            events.append(Tick(now))
        elif kind == "finish":
            events.append(TaskFinished(draw(st.sampled_from(sorted(urls))), now))
        elif kind == "complete":
            events.append(ResultComplete(now))
        elif kind == "abort" and draw(st.integers(0, 4)) == 0:
            events.append(Abort("stop", now))
    return world, events


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_any_interleaving_keeps_credit_order_and_closing_rules(scenario: tuple[World, list[object]]) -> None:
    world, events = scenario
    for event in events:
        world.apply(event)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_every_unit_is_sent_exactly_once_once_everything_is_granted(scenario: tuple[World, list[object]]) -> None:
    """Whatever came first, ending discovery, admitting and granting enough credit sends each unit once."""
    world, events = scenario
    for event in events:
        if not isinstance(event, (Abort, ResultComplete, TaskFinished)):
            world.apply(event)
    now = max((now_of(e) for e in events), default=0.0)
    world.apply(StartSending(now))
    for source in set(world.slots.values()):
        if source not in world.discovery_over:
            world.apply(DiscoveryEnded(source, now))
    for task, partition in world.slots:
        world.apply(CreditGranted(task, "f", partition, len(world.discovered) + 1, now))
    world.apply(Tick(now + 2 * WAIT))
    for _ in range(len(world.discovered) + 1):  # every sender finishes its writes, again and again
        for task in world.urls:
            world.apply(SenderIdle(task, now + 2 * WAIT))
    everything = [b for got in world.got.values() for b in got]
    assert sorted(everything) == sorted(world.discovered), "a unit lost or sent twice"
    assert world.ended == set(world.slots), "a feed partition never ended"
