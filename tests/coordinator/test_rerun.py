"""The re-run decision of a multi-stage query (``coordinator/rerun.py``), driven without sockets.

A simulated execution of a random stage graph on random workers takes random steps (a task
finishes, a consumer reads part of a producer's output, a head task's output is delivered, a
worker is lost) and then runs to its end. Whatever the order, every head task is delivered
exactly once (a retained head's output is whole on a live worker), no consumer mixes rows of two runs of one producer, nothing is bound to a lost
worker, and (a stage that gives other rows each run aside) no loss within the retries fails.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flight.coordinator.rerun import StageRecovery, Unrecoverable


@dataclass
class Sim:
    reads: dict[int, list[int]]
    counts: dict[int, int]
    head: int
    alive: set[str]
    planner: StageRecovery
    runs: dict[tuple[int, int], tuple[int, str]] = field(default_factory=dict)  # key -> (epoch, url)
    state: dict[tuple[int, int], str] = field(default_factory=dict)  # running, finished, delivered
    consumed: dict[tuple[int, int], dict[tuple[int, int], set[int]]] = field(default_factory=dict)
    delivered: dict[int, int] = field(default_factory=dict)
    retained: bool = False
    nondeterministic: frozenset[int] = frozenset()
    versions: dict[tuple[tuple[int, int], int], object] = field(default_factory=dict)  # (task, epoch) -> its output

    def start(self, key: tuple[int, int], epoch: int, url: str) -> None:
        self.runs[key] = (epoch, url)
        self.state[key] = "running"
        self.consumed[key] = {}

    def producers(self, key: tuple[int, int]) -> list[tuple[int, int]]:
        return [(p, t) for p in self.reads[key[0]] for t in range(self.counts[p])]

    def up(self, key: tuple[int, int]) -> bool:
        return self.runs[key][1] in self.alive

    def can_finish(self, key: tuple[int, int]) -> bool:
        return (
            self.state[key] == "running" and self.up(key)
            and all(self.state[p] in ("finished", "delivered") and self.up(p) for p in self.producers(key))
        )

    def finish(self, key: tuple[int, int]) -> None:
        for p in self.producers(key):
            self.consumed[key].setdefault(p, set()).add(self.runs[p][0])
            assert len(self.consumed[key][p]) == 1, f"{key} read two runs of {p}: {self.consumed[key][p]}"
        # What a run gives: a nondeterministic stage's differs every run; any other's follows from what it read.
        epoch = self.runs[key][0]
        inputs = tuple(self.versions[(p, min(self.consumed[key][p]))] for p in self.producers(key))
        self.versions[(key, epoch)] = (key, epoch) if key[0] in self.nondeterministic else (key, inputs)
        self.state[key] = "finished"
        self.planner.finished(*key, self.runs[key][0])

    def can_deliver(self, key: tuple[int, int]) -> bool:
        return not self.retained and key[0] == self.head and self.state[key] == "finished" and self.up(key)

    def deliver(self, key: tuple[int, int]) -> None:
        assert self.planner.delivered(*key, self.runs[key][0])
        assert not self.planner.delivered(*key, self.runs[key][0]), "a run is delivered once"
        self.state[key] = "delivered"
        self.delivered[key[1]] = self.delivered.get(key[1], 0) + 1

    def read(self, key: tuple[int, int], producer: tuple[int, int]) -> None:
        self.consumed[key].setdefault(producer, set()).add(self.runs[producer][0])

    def lose(self, url: str) -> None:
        self.alive.discard(url)
        old = dict(self.runs)
        reruns, dropped = self.planner.lose([url])
        for r in reruns:
            assert r.url in self.alive, f"task {(r.stage, r.task)} bound to lost {r.url}"
            assert r.epoch == old[(r.stage, r.task)][0] + 1
            assert self.state[(r.stage, r.task)] != "delivered"
            self.start((r.stage, r.task), r.epoch, r.url)
            assert not self.planner.delivered(r.stage, r.task, r.epoch - 1), "an old run is fenced"
        for key in dropped:
            assert old[key][1] == url


@st.composite
def graphs(draw: st.DrawFn) -> tuple[dict[int, list[int]], dict[int, int], list[str], dict[int, list[str]], set[int]]:
    n = draw(st.integers(2, 5))
    reads: dict[int, list[int]] = {0: []}
    for s in range(1, n):
        earlier = list(range(s))
        reads[s] = sorted(draw(st.sets(st.sampled_from(earlier), max_size=2))) if s < n - 1 else []
    consumed = {p for s in reads for p in reads[s]}
    reads[n - 1] = sorted(set(reads[n - 1]) | {s for s in range(n - 1) if s not in consumed} or {n - 2})
    counts = {s: draw(st.integers(1, 3)) for s in range(n)}
    urls = [f"grpc://w{i}:1" for i in range(draw(st.integers(2, 4)))]
    bound = {s: [draw(st.sampled_from(urls)) for _ in range(counts[s])] for s in range(n)}
    nondeterministic = draw(st.sets(st.sampled_from(range(n - 1)), max_size=1))
    return reads, counts, urls, bound, nondeterministic


def _step(sim: Sim, data: st.DataObject, losses_left: int) -> int:
    keys = sorted(sim.runs)
    moves: list[tuple[str, tuple[int, int], tuple[int, int] | str | None]] = []
    moves += [("finish", k, None) for k in keys if sim.can_finish(k)]
    moves += [("deliver", k, None) for k in keys if sim.can_deliver(k)]
    moves += [
        ("read", k, p) for k in keys if sim.state[k] == "running" and sim.up(k)
        for p in sim.producers(k) if sim.up(p)
    ]
    if losses_left and len(sim.alive) > 1:
        moves += [("lose", keys[0], u) for u in sorted(sim.alive)]
    if not moves:
        return -1
    kind, key, arg = data.draw(st.sampled_from(moves))
    if kind == "finish":
        sim.finish(key)
    elif kind == "deliver":
        sim.deliver(key)
    elif kind == "read":
        assert isinstance(arg, tuple)
        sim.read(key, arg)
    else:
        assert isinstance(arg, str)
        sim.lose(arg)
        return losses_left - 1
    return losses_left


def _run_to_end(sim: Sim) -> None:
    progressed = True
    while progressed:
        progressed = False
        for key in sorted(sim.runs):
            if sim.can_finish(key):
                sim.finish(key)
                progressed = True
            if sim.can_deliver(key):
                sim.deliver(key)
                progressed = True


@settings(max_examples=400, deadline=None)
@given(graphs(), st.data())
def test_every_head_task_is_delivered_exactly_once_whatever_is_lost_when(graph: tuple, data: st.DataObject) -> None:  # type: ignore[type-arg]
    reads, counts, urls, bound, nondeterministic = graph
    head = len(counts) - 1
    retained = data.draw(st.booleans())  # a detached query's head: read by others, any number of times
    planner = StageRecovery(reads, bound, head, nondeterministic=nondeterministic, workers=urls, retained_head=retained)
    sim = Sim(reads, counts, head, set(urls), planner, retained=retained, nondeterministic=frozenset(nondeterministic))
    for (s, t), run in planner.tasks.items():
        sim.start((s, t), run.epoch, run.url)
    losses = data.draw(st.integers(0, len(urls) - 1))
    try:
        for _ in range(data.draw(st.integers(0, 40))):
            losses = _step(sim, data, losses)
            if losses < 0:
                break
    except Unrecoverable:
        assert planner.nondeterministic, "only a stage that gives other rows each run may make a loss unrecoverable"
        return
    _run_to_end(sim)
    if retained:  # every head task's output whole on a live worker, for its readers
        assert all(sim.state[(head, t)] == "finished" and sim.up((head, t)) for t in range(counts[head])), sim.state
    else:
        assert sim.delivered == {t: 1 for t in range(counts[head])}, (sim.delivered, sim.state)
    for producer in sim.runs:  # every consumer of the result read the same rows of each producer task
        seen = {
            sim.versions[(producer, e)] for k in sim.runs if sim.state[k] != "running" for e in sim.consumed[k].get(producer, set())
        }
        assert len(seen) <= 1, f"the consumers of {producer} read different outputs of it: {seen}"


def test_a_finished_producer_on_a_survivor_is_read_again_not_run_again() -> None:
    # scan (2 tasks) -> aggregate (2 tasks, the head). The scan finished; w1 is lost while the head runs.
    planner = StageRecovery({0: [], 1: [0]}, {0: ["w0", "w1"], 1: ["w0", "w1"]}, 1)
    planner.finished(0, 0, 0)
    planner.finished(0, 1, 0)
    reruns, dropped = planner.lose(["w1"])
    assert [(r.stage, r.task, r.epoch, r.url, r.lost) for r in reruns] == [
        (0, 1, 1, "w0", True),  # its output went with w1, and the head still needs it
        (1, 0, 1, "w0", False),  # it may have read part of (0, 1)'s old output
        (1, 1, 1, "w0", True),
    ]
    assert dropped == []
    assert planner.epochs() == {(0, 1): 1, (1, 0): 1, (1, 1): 1}


def test_a_delivered_head_task_never_runs_again_and_an_unneeded_lost_task_is_dropped() -> None:
    planner = StageRecovery({0: [], 1: [0]}, {0: ["w0", "w1"], 1: ["w0", "w1"]}, 1)
    for key in ((0, 0), (0, 1), (1, 0), (1, 1)):
        planner.finished(*key, 0)
    assert planner.delivered(1, 1, 0)
    reruns, dropped = planner.lose(["w1"])
    assert reruns == [] and dropped == [(0, 1), (1, 1)]  # nobody needs the scan's output any more


def test_losing_every_worker_or_a_delivered_heads_input_that_changes_is_unrecoverable() -> None:
    planner = StageRecovery({0: [], 1: [0]}, {0: ["w0"], 1: ["w0"]}, 1)
    with pytest.raises(Unrecoverable, match="no worker is left: lost w0"):
        planner.lose(["w0"])
    # Stage 0 deals rows round-robin: its re-run would give the delivered head task other rows.
    planner = StageRecovery({0: [], 1: [0]}, {0: ["w0", "w1"], 1: ["w0", "w1"]}, 1, nondeterministic=[0])
    planner.finished(0, 1, 0)
    planner.finished(1, 0, 0)
    assert planner.delivered(1, 0, 0)
    with pytest.raises(Unrecoverable, match=r"\[\(1, 0\)\] already delivered"):
        planner.lose(["w1"])


def test_once_every_head_task_is_delivered_a_loss_runs_nothing_again() -> None:
    # The whole result reached the caller; a consumer whose finished frame is still on its way
    # (its worker cut off) must not make its producers run again, nor fail the query.
    planner = StageRecovery({0: [], 1: [0], 2: [1]}, {0: ["w0", "w1"], 1: ["w1", "w0"], 2: ["w0"]}, 2)
    planner.finished(0, 0, 0)
    planner.finished(1, 1, 0)  # (1, 0) on w1 never said it finished
    planner.finished(2, 0, 0)
    assert planner.delivered(2, 0, 0)
    reruns, dropped = planner.lose(["w1"])
    assert reruns == [] and dropped == [(0, 1), (1, 0)]
