"""Multi-stage queries that lose workers after they started (``rerun.py``, ``stagereplay.py``): the corners.

Found by a second reading of the recovery code, each once a defect: a reader waiting for more
head tasks than the query has, a retained head task's second loss, a task dropped at one loss and
needed at the next, a healthy worker taken for silent while a frozen one was probed, a
deterministic stage below a nondeterministic one taken for changed. Each integration test runs
real worker processes and kills (SIGKILL) or freezes (SIGSTOP) some; nothing of ours is mocked.
A query that should finish is read on a thread with a bound, so a hang fails the test instead of
hanging it.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
from support import read_in_thread, running_tasks, wait_until

import flight
from flight import col, lit
from flight.coordinator.rerun import StageRecovery
from flight.dev.testing import SLEEP_SCHEMA, sleep_unit


class Units(flight.WorkUnitFeedProvider):
    def __init__(self, count: int, ms: float) -> None:
        self.count, self.ms = count, ms

    def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[bytes]:
        for i in range(self.count):
            yield sleep_unit(partition * 1000 + i, ms=self.ms)


@pytest.mark.slow
def test_a_head_task_run_again_before_the_caller_reads_does_not_hang_the_reader(data_roots: list[Path]) -> None:
    # The lost head tasks were replaced before the caller's first read: the reader waits for one
    # end per head task of the query, not per channel opened.
    args = [[], ["--unit-delay-ms", "150"], []]
    with flight.LocalCluster(3, data_roots=data_roots, per_worker_args=args, extensions=["flight.dev.testing"]) as cluster:
        q = flight.from_feed(Units(60, 10), "testing.sleep", SLEEP_SCHEMA).aggregate(["id"], n=flight.agg.count_all())
        ex = flight.DistributedExec(q, cluster.urls)
        reader = ex.execute()
        cluster.processes[1].send_signal(signal.SIGKILL)
        wait_until(lambda: len(ex.attempts) > 0, timeout=30, what="the lost tasks to run again")
        thread, out = read_in_thread(reader)
        thread.join(45)
        assert not thread.is_alive(), "the reader hangs: it waits for more head tasks than the query has"
    assert "error" not in out, out
    assert out["table"].num_rows == 180  # type: ignore[attr-defined]


@pytest.mark.slow
def test_a_retained_head_task_run_again_on_another_worker_survives_a_second_loss(data_roots: list[Path]) -> None:
    # A retained head's replacement keeps its key (epoch 0 in its header: Spark finds it by ticket)
    # while its run is the decision's epoch 1: a second loss must still find and replace it.
    with flight.LocalCluster(4, data_roots=data_roots, per_worker_args=[["--unit-delay-ms", "40"]] * 4,
                             extensions=["flight.dev.testing"]) as cluster:
        q = flight.from_feed(Units(80, 10), "testing.sleep", SLEEP_SCHEMA).aggregate(["id"], n=flight.agg.count_all())
        ex = flight.DistributedExec(q, cluster.urls)
        with ex.start_detached(retain=120) as detached:
            first = detached.partitions[0].url
            wait_until(lambda: running_tasks([first]) > 0, timeout=30, what="the first head worker to run its task")
            cluster.processes[cluster.urls.index(first)].send_signal(signal.SIGKILL)
            wait_until(lambda: len(detached.attempts) > 0, timeout=30, what="the first loss's reruns")
            replay = detached._run.replay  # type: ignore[union-attr]
            wait_until(lambda: bool(h := replay.head()) and all(c.url != first and c.ready.is_set() for c in h), timeout=30,
                       what="the lost head's replacement to be admitted")
            heads = replay.head()
            second = next(c.url for c in heads if c.url != first)
            cluster.processes[cluster.urls.index(second)].send_signal(signal.SIGKILL)
            assert detached.computed(timeout=60), "the head tasks did not finish"
            # computed() counts a head channel that failed as finished (its events are all set when
            # the exchange ends): look at the query's error and the heads' final metrics too.
            assert detached._run.error is None, detached._run.error
            assert all(c.metrics is not None for c in detached._run.replay.head())  # type: ignore[union-attr]


@pytest.mark.slow
def test_a_producer_dropped_at_one_loss_runs_again_when_a_later_loss_needs_its_output(data_roots: list[Path]) -> None:
    # Stage 0 (4 tasks) -> stage 1 (one task, a global count) -> broadcast -> stage 2 (the head, a
    # slow scan joined with it). Loss 1 (a worker of stage 0 only) drops its stage-0 task: stage 1
    # had finished. Loss 2 takes stage 1's worker: stage 1 runs again and so must the dropped
    # stage-0 task, on a survivor, or stage 1's new run would read a producer that never runs.
    with flight.LocalCluster(4, data_roots=data_roots, extensions=["flight.dev.testing"]) as cluster:
        small = flight.from_feed(Units(20, 1), "testing.sleep", SLEEP_SCHEMA).aggregate([], n=flight.agg.count_all())
        big = flight.from_feed(Units(150, 30), "testing.sleep", SLEEP_SCHEMA).select("id", k=col("row"))
        ex = flight.DistributedExec(big.join(small.select(k=lit(0), n=col("n")), on="k"), cluster.urls)
        reader = ex.execute()
        thread, out = read_in_thread(reader)
        stage1 = ex.bound[1][0]
        only_stage0 = next(u for u in ex.bound[0] if u != stage1)
        # The small side finished (its output kept for the head's readers); the head still scans (4.5 s a task).
        wait_until(lambda: all(t.state == "finished" for t in ex.progress()[0].tasks), timeout=30, what="the small side to finish")
        cluster.processes[cluster.urls.index(only_stage0)].send_signal(signal.SIGKILL)
        wait_until(lambda: len(ex.attempts) > 0, timeout=30, what="the first loss's reruns")
        wait_until(lambda: _head_replaced(ex, only_stage0, 4), timeout=30, what="the lost head tasks' replacements to be admitted")
        cluster.processes[cluster.urls.index(stage1)].send_signal(signal.SIGKILL)
        thread.join(90)
        assert not thread.is_alive(), "the query hangs"
    assert "error" not in out, out.get("error")
    table = out["table"]
    assert table.num_rows == 4 * 150 and set(table["n"].to_pylist()) == {80}  # type: ignore[attr-defined]


def _head_replaced(ex: flight.DistributedExec, lost: str, tasks: int) -> bool:
    """The head's ``tasks`` tasks run again (the loss fails them all: the head reads every stage-0 task), each admitted,
    none on ``lost``."""
    stages = ex.progress()
    running = [t for t in stages[-1].tasks if t.state == "running"] if stages else []
    return len(running) == tasks and all(t.ready is not None and t.worker_url != lost for t in running)


def test_a_deterministic_stage_run_again_below_a_delivered_head_is_recoverable() -> None:
    # Stage 0 deals rows round-robin (nondeterministic); it finished on w0 and its output is kept
    # there. Stage 1 (deterministic) is lost with w1 and runs again: it reads stage 0's *kept*
    # output, so it makes the same rows again, and the delivered head task (2, 0) need not run again.
    planner = StageRecovery({0: [], 1: [0], 2: [1]}, {0: ["w0"], 1: ["w1"], 2: ["w0", "w2"]}, 2, nondeterministic=[0])
    planner.finished(0, 0, 0)
    planner.finished(1, 0, 0)
    planner.finished(2, 0, 0)
    assert planner.delivered(2, 0, 0)
    reruns, _ = planner.lose(["w1"])
    assert sorted((r.stage, r.task) for r in reruns) == [(1, 0), (2, 1)]


def test_a_task_dropped_at_one_loss_may_be_run_again_at_a_later_one() -> None:
    # ``lose`` may name in its reruns a task it returned as dropped before: the driver must still
    # have its channel to let go (tests below: the producer dropped at one loss).
    planner = StageRecovery({0: [], 1: [0], 2: [1]}, {0: ["w0", "w1"], 1: ["w2"], 2: ["w3"]}, 2)
    planner.finished(0, 0, 0)
    planner.finished(0, 1, 0)
    planner.finished(1, 0, 0)
    reruns, dropped = planner.lose(["w0"])
    assert reruns == [] and dropped == [(0, 0)]
    reruns, dropped = planner.lose(["w2"])
    assert (0, 0) in {(r.stage, r.task) for r in reruns}


class Staggered(flight.WorkUnitFeedProvider):
    """Three partitions of 10 ms units: partition 0 ends first, 1 (the victim's) later."""

    counts: ClassVar[dict[int, int]] = {0: 190, 1: 500, 2: 400}  # 1 needs only outlast the freeze at 0.6 s: it then runs again whole

    def partitions(self) -> int:
        return 3

    def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[bytes]:
        for i in range(self.counts[partition]):
            yield sleep_unit(partition * 10_000 + i, ms=10)


@pytest.mark.slow
def test_a_healthy_task_finishing_while_a_frozen_worker_is_probed_is_not_taken_for_silent(data_roots: list[Path]) -> None:
    # The workers are probed (2 s for a frozen one) while a healthy task's ``finished`` frame
    # arrives: its channel's reader must not wait for the decision, or its own worker would look
    # silent past peer_timeout and be taken for lost. (Partition 0's task ends ~2.3 s in, within
    # the probe that starts ~1.7 s in.)
    with flight.LocalCluster(3, data_roots=data_roots, extensions=["flight.dev.testing"]) as cluster:
        q = flight.from_feed(Staggered(), "testing.sleep", SLEEP_SCHEMA).aggregate(["id"], n=flight.agg.count_all())
        ex = flight.DistributedExec(q, cluster.urls, heartbeat=0.2, peer_timeout=1.0)
        reader = ex.execute()
        thread, out = read_in_thread(reader)
        time.sleep(0.6)
        victim = cluster.processes[cluster.urls.index(ex.bound[0][1])]
        victim.send_signal(signal.SIGSTOP)
        try:
            thread.join(60)
        finally:
            victim.send_signal(signal.SIGCONT)
        assert not thread.is_alive()
    assert "error" not in out, out.get("error")
    assert out["table"].num_rows == sum(Staggered.counts.values())  # type: ignore[attr-defined]
