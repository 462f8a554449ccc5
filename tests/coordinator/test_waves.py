"""Opening a query's tasks in turns (``coordinator/waves.py``), the decision alone: no workers, no sockets.

When the tasks bound to one worker need more source threads, memory or task slots together than it has, ``Waves`` says
which to open when. Hand-written cases (TPC-DS q14 on one worker, q14's memory across two hosts, tasks that can
never fit) and hypothesis's random stage graphs, workers, needs and event orders check the rules: a worker's
open tasks never hold more threads, memory or task slots than it has (its kept outputs counted), a task opens only once
every task of the stages it reads was admitted, and whatever the order of the workers' answers, every task is
opened and admitted in the end.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from flight.coordinator.waves import TaskId, TaskNeed, Waves
from flight.worker.admission import Admission
from flight.worker.capacity import Capacity, Need

W1, W2, W3 = "grpc://a:1", "grpc://b:1", "grpc://c:1"


def ids(needs: list[TaskNeed]) -> list[TaskId]:
    return [n.id for n in needs]


def test_q14_on_one_worker_opens_the_head_once_its_producer_gave_its_threads_back() -> None:
    # TPC-DS q14 on one worker of 64 source threads: a producer of 61 read five times by a head of 8.
    waves = Waves({0: [], 1: [0, 0, 0, 0, 0]}, [TaskNeed(0, 0, W1, 61), TaskNeed(1, 0, W1, 8)], {W1: 64})
    assert not waves.fits() and waves.totals() == {W1: 69} and waves.too_large() == []
    assert ids(waves.next()) == [(0, 0)]
    assert waves.next() == []  # opened already; the head waits for it
    assert waves.admit((0, 0)) == []  # admitted, but 61 + 8 > 64
    assert not waves.done
    assert ids(waves.compute((0, 0))) == [(1, 0)]
    assert waves.admit((1, 0)) == [] and waves.done


def test_a_plan_that_fits_needs_no_turns_and_opens_its_stages_in_order() -> None:
    waves = Waves({0: [], 1: [], 2: [0, 1]}, [TaskNeed(0, 0, W1, 2), TaskNeed(1, 0, W1, 2), TaskNeed(2, 0, W1, 2)], {W1: 64})
    assert waves.fits()
    assert ids(waves.next()) == [(0, 0), (1, 0)]  # the reader waits for both producers to be admitted
    assert waves.admit((0, 0)) == []
    assert ids(waves.admit((1, 0))) == [(2, 0)]


def test_a_task_that_can_never_fit_is_named_and_unknown_workers_are_taken_to_have_room() -> None:
    waves = Waves({0: [], 1: [0]}, [TaskNeed(0, 0, W1, 3), TaskNeed(0, 1, W2, 70), TaskNeed(1, 0, W3, 900)], {W1: 64, W2: 64})
    assert waves.too_large() == [TaskNeed(0, 1, W2, 70)]  # W3 did not say what it has: not judged
    assert not waves.fits()
    assert waves.fits(1)  # the head stage alone: W3's room is unknown


def test_each_worker_is_counted_on_its_own() -> None:
    # Two producers on two workers, each full; the reader on W2 waits for W2's producer only to give its threads back.
    needs = [TaskNeed(0, 0, W1, 4), TaskNeed(0, 1, W2, 4), TaskNeed(1, 0, W2, 1)]
    waves = Waves({0: [], 1: [0]}, needs, {W1: 4, W2: 4})
    assert ids(waves.next()) == [(0, 0), (0, 1)]
    waves.admit((0, 0))
    assert waves.admit((0, 1)) == []
    assert waves.compute((0, 0)) == []  # W1's threads are back, but the reader is bound to W2
    assert ids(waves.compute((0, 1))) == [(1, 0)]


MIB = 1 << 20


def test_tasks_over_a_workers_memory_budget_open_in_turns_and_keep_their_output_buffer() -> None:
    # Threads are plenty; memory is not: three producers of 40 MiB on a 100 MiB budget, each keeping 1 MiB once made.
    needs = [TaskNeed(0, t, W1, 1, 40 * MIB, MIB) for t in range(3)] + [TaskNeed(1, 0, W1, 3, 30 * MIB, MIB)]
    waves = Waves({0: [], 1: [0]}, needs, {W1: 64}, {W1: 100 * MIB})
    assert not waves.fits() and waves.totals() == {W1: 6} and waves.memory_totals() == {W1: 150 * MIB}
    assert waves.starved() == {}
    assert ids(waves.next()) == [(0, 0), (0, 1)]  # 80 MiB; a third would be 120
    waves.admit((0, 0))
    assert waves.admit((0, 1)) == []
    assert ids(waves.compute((0, 0))) == [(0, 2)]  # its 40 MiB back but the 1 its output keeps: 1 + 40 + 40
    assert waves.admit((0, 2)) == []  # every producer admitted, but 81 + 30 > 100
    assert ids(waves.compute((0, 1))) == [(1, 0)]  # 1 + 1 + 40 + 30
    assert waves.reserved == {W1: 72 * MIB}
    assert waves.admit((1, 0)) == [] and waves.done


def test_a_task_alone_over_the_budget_counts_as_the_whole_budget_and_kept_outputs_can_starve_it() -> None:
    # The worker clamps a task's reservation to its budget and runs it alone: it opens once nothing else is held.
    waves = Waves({0: [], 1: [0]}, [TaskNeed(0, 0, W1, 1, 10 * MIB, 0), TaskNeed(1, 0, W1, 1, 500 * MIB, 0)], {W1: 64}, {W1: 100 * MIB})
    assert waves.starved() == {} and not waves.fits()
    assert ids(waves.next()) == [(0, 0)]
    assert waves.admit((0, 0)) == []
    assert ids(waves.compute((0, 0))) == [(1, 0)]
    # Kept outputs that stay in memory until the query ends leave it no room: refused before anything opens.
    kept = Waves({0: [], 1: [0]}, [TaskNeed(0, 0, W1, 1, 10 * MIB, MIB), TaskNeed(1, 0, W1, 1, 500 * MIB, 0)], {W1: 64}, {W1: 100 * MIB})
    assert kept.starved() == {W1: 101 * MIB}


def test_one_task_on_a_worker_fits_its_memory_whatever_it_reserves() -> None:
    waves = Waves({0: []}, [TaskNeed(0, 0, W1, 1, 500 * MIB, MIB), TaskNeed(0, 1, W2, 1, 10 * MIB, MIB)], {}, {W1: 100 * MIB, W2: 100 * MIB})
    assert waves.fits() and waves.starved() == {}


def test_a_task_is_starved_only_by_what_the_others_keep_not_by_its_own_buffer() -> None:
    # Two tasks of 20 MiB on 40 MiB: they fit at once. Opened in turns, the second needs 20 beside the first's 12 kept.
    two = Waves({0: [], 1: [0]}, [TaskNeed(0, 0, W1, 1, 20 * MIB, 12 * MIB), TaskNeed(1, 0, W1, 1, 20 * MIB, 12 * MIB)], {}, {W1: 40 * MIB})
    assert two.fits() and two.starved() == {}
    three = Waves({0: [], 1: [0]}, [TaskNeed(0, t, W1, 1, 30 * MIB, 12 * MIB) for t in range(2)] + [TaskNeed(1, 0, W1, 1, 20 * MIB, 0)],
                  {}, {W1: 40 * MIB})
    assert not three.fits() and three.starved() == {W1: 44 * MIB}  # the head's 20 beside two kept 12s (the largest need)


def test_a_detached_head_must_fit_beside_the_buffers_the_stages_below_keep() -> None:
    # 80 producers keep 1 MiB each; three head tasks of 9 MiB: 27 + 80 > 100, although the head alone fits.
    needs = [TaskNeed(0, t, W1, 0, 2 * MIB, MIB) for t in range(80)] + [TaskNeed(1, t, W1, 1, 9 * MIB, MIB) for t in range(3)]
    waves = Waves({0: [], 1: [0]}, needs, {W1: 64}, {W1: 100 * MIB})
    assert waves.fits(1) and not waves.head_fits(1)
    assert Waves({0: [], 1: [0]}, needs[:60] + needs[80:], {W1: 64}, {W1: 100 * MIB}).head_fits(1)


def test_events_of_tasks_not_opened_or_said_twice_change_nothing() -> None:
    waves = Waves({0: [], 1: [0]}, [TaskNeed(0, 0, W1, 3), TaskNeed(1, 0, W1, 3)], {W1: 4})
    assert ids(waves.next()) == [(0, 0)]
    assert waves.admit((1, 0)) == [] and waves.compute((1, 0)) == []  # never opened
    assert waves.held == {W1: 3}
    waves.admit((0, 0))
    waves.admit((0, 0))
    assert waves.held == {W1: 3}
    assert ids(waves.compute((0, 0))) == [(1, 0)]
    assert waves.compute((0, 0)) == [] and waves.held == {W1: 3}


def test_a_worker_running_one_task_at_a_time_opens_a_reader_once_its_producer_made_its_output() -> None:
    # --max-tasks 1: threads and memory to spare, but a second task there would wait in the worker's queue.
    needs = [TaskNeed(0, 0, W1, 1), TaskNeed(0, 1, W2, 1), TaskNeed(1, 0, W1, 1)]
    waves = Waves({0: [], 1: [0]}, needs, {W1: 64, W2: 64}, None, {W1: 1, W2: 1})
    assert not waves.fits() and waves.task_counts() == {W1: 2, W2: 1}
    assert waves.fits(0) and waves.fits(1) and waves.head_fits(1)
    assert ids(waves.next()) == [(0, 0), (0, 1)]
    waves.admit((0, 0))
    assert waves.admit((0, 1)) == []  # every producer admitted, but W1 runs its one task
    assert waves.compute((0, 1)) == []  # W2's slot is back; the reader is bound to W1
    assert ids(waves.compute((0, 0))) == [(1, 0)]
    assert waves.admit((1, 0)) == [] and waves.done
    assert Waves({0: [], 1: [0]}, needs, {W1: 64, W2: 64}, None, {W1: 2, W2: 1}).fits()
    assert Waves({0: [], 1: [0]}, needs, {W1: 64, W2: 64}, None, {W1: 0}).fits()  # 0: not said (an older worker)


def test_a_worker_says_the_tasks_it_runs_at_once_for_one_caller() -> None:
    # LoadInfo.max_tasks: --max-tasks, or --max-tasks-per-client where that is fewer (what Admission holds a caller to).
    assert Admission(Capacity(tasks=8, threads=64, memory=1 << 30)).load(0, 0).max_tasks == 8
    assert Admission(Capacity(tasks=8, threads=64, memory=1 << 30, per_client=3)).load(0, 0).max_tasks == 3
    assert Admission(Capacity(tasks=2, threads=64, memory=1 << 30, per_client=5)).load(0, 0).max_tasks == 2


# ------------------------------------------------------------------ any plan, any order


@dataclass
class Plan:
    reads: dict[int, list[int]]
    needs: list[TaskNeed]
    capacity: dict[str, int]
    budget: dict[str, int]
    slots: dict[str, int]


@st.composite
def plans(draw: st.DrawFn) -> Plan:
    """A random stage graph (a stage reads some earlier ones), its tasks on random workers, each needing at most what
    its worker has (a task that could never fit is refused before anything opens)."""
    workers = [W1, W2, W3][: draw(st.integers(1, 3))]
    capacity = {w: draw(st.integers(1, 12)) for w in workers}
    budget = {w: draw(st.integers(20, 200)) for w in workers}  # memory, in units of a kept output buffer (1)
    stages = draw(st.integers(1, 6))
    reads = {s: sorted(set(draw(st.lists(st.integers(0, s - 1), max_size=3)))) if s else [] for s in range(stages)}
    needs = [
        TaskNeed(s, t, url := draw(st.sampled_from(workers)), draw(st.integers(0, capacity[url])), draw(st.integers(1, 100)), 1)
        for s in range(stages)
        for t in range(draw(st.integers(1, 3)))
    ]
    slots = {w: draw(st.integers(1, 4)) for w in workers}  # the tasks it runs at once (--max-tasks)
    return Plan(reads, needs, capacity, budget, slots)


@settings(max_examples=300, deadline=None)
@given(plan=plans(), data=st.data())
def test_any_order_of_answers_opens_every_task_within_each_workers_threads_and_memory(plan: Plan, data: st.DataObject) -> None:
    waves = Waves(plan.reads, plan.needs, plan.capacity, plan.budget, plan.slots)
    if waves.starved():  # refused before anything opens (opening.py): kept outputs would leave a task no room
        assert not waves.fits(), "a plan that fits at once was taken for starved"
        return
    by_id = {n.id: n for n in plan.needs}
    opened: list[TaskId] = []
    admitted: set[TaskId] = set()
    computed: set[TaskId] = set()

    def opens(news: list[TaskNeed]) -> None:
        for n in news:
            assert n.id not in opened, f"{n.id} opened twice"
            for child in plan.reads[n.stage]:  # every task of the stages it reads was admitted
                assert all(m.id in admitted for m in plan.needs if m.stage == child), f"{n.id} opened before stage {child}"
            opened.append(n.id)
        for url, cap in plan.capacity.items():  # a worker's open tasks hold at most its threads
            held = sum(by_id[t].threads for t in opened if t not in computed and by_id[t].url == url)
            assert held <= cap, f"{url}: {held} of {cap}"
            running = sum(1 for t in opened if t not in computed and by_id[t].url == url)
            assert running <= plan.slots[url], f"{url}: {running} tasks of {plan.slots[url]}"
        for url, budget in plan.budget.items():  # and at most its memory, a task counted as at most the whole budget
            here = [by_id[t] for t in opened if by_id[t].url == url]
            reserved = sum(n.keeps if n.id in computed else min(n.memory, budget) for n in here)
            assert reserved <= budget, f"{url}: {reserved} of {budget} reserved"

    opens(waves.next())
    while True:
        can_admit = [t for t in opened if t not in admitted]
        can_compute = [t for t in admitted if t not in computed]  # an admitted task finishes: its producers were all admitted
        if not can_admit and not can_compute:
            break
        event, task = data.draw(st.sampled_from([("admit", t) for t in can_admit] + [("compute", t) for t in can_compute]))
        if event == "admit":
            admitted.add(task)
            opens(waves.admit(task))
        else:
            computed.add(task)
            opens(waves.compute(task))
    assert sorted(opened) == sorted(by_id), f"never opened: {sorted(set(by_id) - set(opened))}"
    assert waves.done and waves.waiting() == []


@settings(max_examples=300, deadline=None)
@given(plan=plans(), data=st.data())
def test_every_task_opened_in_turns_is_admitted_at_once_by_a_real_admission(plan: Plan, data: st.DataObject) -> None:
    # The worker's own accounting (flight.worker.admission), fed the decisions: none waits, every task runs.
    waves = Waves(plan.reads, plan.needs, plan.capacity, plan.budget, plan.slots)
    if waves.starved():
        return
    by_id = {n.id: n for n in plan.needs}
    workers = {url: Admission(Capacity(tasks=plan.slots[url], threads=plan.capacity[url], memory=plan.budget[url])) for url in plan.capacity}
    running: list[TaskId] = []

    def opens(news: list[TaskNeed]) -> None:  # each opened task is admitted there and then (queue 0: never waits)
        queue = list(news)
        while queue:
            n = queue.pop(0)
            refusal = workers[n.url].admit(f"{n.id}", Need(n.threads, n.memory))
            assert refusal is None, f"{n.id} on {n.url}: {refusal.reason}"
            running.append(n.id)
            queue += waves.admit(n.id)

    opens(waves.next())
    while running:
        task = running.pop(data.draw(st.integers(0, len(running) - 1)))
        n = by_id[task]
        workers[n.url].computed(f"{task}", n.keeps, kept=True)  # its output kept for its readers: its buffer stays
        opens(waves.compute(task))
    assert waves.done
