"""The default TaskEstimator's decisions, and a user's own estimator in a real query."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import flight
from flight.dev.testing import SLEEP_SCHEMA, sleep_unit
from flight.sources.estimate import DefaultTaskEstimator, DiscoverySample

MB = 1 << 20


def sample(n: int, size: int | None = None, rows: int | None = None, finished: bool = True) -> DiscoverySample:
    return DiscoverySample(rows=[rows] * n, bytes=[size] * n, finished=finished, elapsed_ms=5.0)


@pytest.mark.parametrize(
    ("s", "workers", "tasks"),
    [
        (sample(3, size=MB), 4, 1),  # small: 3 MB is far below one task's target
        (sample(40, size=16 * MB), 4, 4),  # large: 640 MB wants 5 tasks, capped by 4 workers
        (sample(10, size=32 * MB), 8, 3),  # 320 MB at 128 MB per task
        (sample(2), 4, 2),  # unknown size, finished: at most one task per unit
        (sample(64, finished=False), 3, 3),  # unknown size, still discovering: every worker
        (sample(1, finished=False), 3, 3),  # one unit seen so far, more coming: the count cannot grow later
        (sample(0), 3, 1),  # empty discovery: one task yields the empty result
        (sample(5, rows=600_000), 8, 3),  # row hints: 3M rows at 1M per task
    ],
)
def test_default_estimator(s: DiscoverySample, workers: int, tasks: int) -> None:
    est = DefaultTaskEstimator().estimate(s, workers)
    assert est.tasks == tasks
    assert est.reasons and all(isinstance(r, str) for r in est.reasons)


def test_mixed_hints_fall_back_to_counting_units() -> None:
    s = DiscoverySample(rows=[None, None], bytes=[MB, None], finished=True, elapsed_ms=1.0)
    assert s.known_bytes is None
    assert DefaultTaskEstimator().estimate(s, 4).tasks == 2


class Shared(flight.WorkUnitFeedProvider):
    shared = True

    def __init__(self, n: int, size: int | None) -> None:
        self.n, self.size = n, size

    def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[flight.Unit]:
        for i in range(self.n):
            yield flight.Unit(sleep_unit(i), bytes=self.size)


def test_small_discovery_runs_one_task_and_explain_says_why(cluster: flight.LocalCluster) -> None:
    ex = flight.DistributedExec(flight.from_feed(Shared(20, 1000), "testing.sleep", SLEEP_SCHEMA), cluster.resolver())
    assert "up to 2 task(s)" in ex.explain()
    got = ex.to_table()
    assert sorted(got["id"].to_pylist()) == list(range(20))
    assert ex.stage.task_count == 1 and ex.metrics is not None and len(ex.metrics.tasks) == 1
    text = ex.explain()
    assert "estimate: 1 task(s)" in text and "20000 bytes" in text


def test_large_discovery_uses_every_worker(cluster: flight.LocalCluster) -> None:
    ex = flight.DistributedExec(flight.from_feed(Shared(20, 64 * MB), "testing.sleep", SLEEP_SCHEMA), cluster.resolver())
    assert sorted(ex.to_table()["id"].to_pylist()) == list(range(20))
    assert ex.stage.task_count == 2 and "capped by 2 worker(s)" in ex.explain()


def test_a_users_estimator_replaces_the_default(cluster: flight.LocalCluster) -> None:
    class AlwaysTwo(flight.TaskEstimator):
        sample_units = 1

        def estimate(self, sample: DiscoverySample, workers: int) -> flight.TaskEstimate:
            return flight.TaskEstimate(min(2, workers), ["the user knows best"])

    ex = flight.DistributedExec(
        flight.from_feed(Shared(6, 1), "testing.sleep", SLEEP_SCHEMA), cluster.resolver(), estimator=AlwaysTwo()
    )
    assert sorted(ex.to_table()["id"].to_pylist()) == list(range(6))
    assert ex.stage.task_count == 2 and "the user knows best" in ex.explain()


def test_an_estimator_out_of_bounds_is_a_plan_error(cluster: flight.LocalCluster) -> None:
    class TooMany(flight.TaskEstimator):
        def estimate(self, sample: DiscoverySample, workers: int) -> flight.TaskEstimate:
            return flight.TaskEstimate(workers + 5, ["greedy"])

    ex = flight.DistributedExec(flight.from_feed(Shared(3, 1), "testing.sleep", SLEEP_SCHEMA), cluster.resolver(), estimator=TooMany())
    with pytest.raises(flight.PlanError, match="between 1 and 2"):
        ex.to_table()
