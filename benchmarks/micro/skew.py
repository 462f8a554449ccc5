"""Skew: a shared-queue feed against static round-robin partitions, with uneven work and a slow worker.

Why: the point of the shared queue (DESIGN.md, "Work-unit feeds") is that
each unit goes to whichever task has credit, so a slow worker and a few huge
units do not decide the query's end. Static partitions (as in Distributed
DataFusion) fix each unit's task up front, so the slowest partition does.

Setup: ``--units`` ``testing.sleep`` units whose cost (ms) is Pareto
distributed (seeded; mean ~15 ms, a handful of units of 100+ ms), on a
``LocalCluster`` of 3 workers, one of which adds ``--slow-ms`` to every unit.
The same units run twice per repetition, alternating which mode goes first:

* **shared**: ``shared = True``, forced to 3 tasks by an estimator that always
  picks every worker (the default one could pick fewer from a short sample);
* **partitioned**: ``partitions() == 3``, partition p yields the units i with
  i % 3 == p (round-robin, the usual static split).

A run counts only if every unit id came back exactly once. Prints both
medians, units per worker of each mode (from the tasks' feed metrics), and
last ``skew_speedup: X`` = partitioned median / shared median.

    python benchmarks/micro/skew.py [--units 200] [--runs 3] [--slow-ms 30] [--seed 7]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterator

import flight
from flight.dev.testing import SLEEP_SCHEMA, sleep_unit

WORKERS = 3


def unit_costs(n: int, seed: int, *, alpha: float = 1.5, floor_ms: float = 5.0, cap_ms: float = 600.0) -> list[float]:
    """Heavy-tailed costs: Pareto(alpha) scaled by ``floor_ms`` (mean alpha/(alpha-1) * floor = 15 ms), capped."""
    rng = random.Random(seed)
    return [round(min(cap_ms, floor_ms * rng.paretovariate(alpha)), 1) for _ in range(n)]


class SharedProvider(flight.WorkUnitFeedProvider):
    """One discovery stream for the whole leaf; each unit goes to whichever task has credit."""

    shared = True

    def __init__(self, costs: list[float]) -> None:
        self.costs = costs

    def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[bytes]:
        for i, ms in enumerate(self.costs):
            yield sleep_unit(i, ms=ms)


class RoundRobinProvider(flight.WorkUnitFeedProvider):
    """Three fixed partitions: partition p owns the units i with i % 3 == p."""

    def __init__(self, costs: list[float]) -> None:
        self.costs = costs

    def partitions(self) -> int:
        return WORKERS

    def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[bytes]:
        for i in range(partition, len(self.costs), WORKERS):
            yield sleep_unit(i, ms=self.costs[i])


class AllWorkers(flight.TaskEstimator):
    """One task per worker, without waiting for a discovery sample."""

    sample_units = 0
    sample_ms = 0.0

    def estimate(self, sample: flight.DiscoverySample, workers: int) -> flight.TaskEstimate:
        return flight.TaskEstimate(workers, ["forced: one task per worker"])


def run_once(urls: list[str], provider: flight.WorkUnitFeedProvider, n: int) -> tuple[float, Counter[str]]:
    """Seconds from ``execute()`` to the last row, and units per worker; raises unless ids 0..n-1 came back once each."""
    ex = flight.DistributedExec(flight.from_feed(provider, "testing.sleep", SLEEP_SCHEMA), urls, estimator=AllWorkers())
    started = time.perf_counter()
    table = ex.execute().read_all()
    elapsed = time.perf_counter() - started
    ids = sorted(table.column("id").to_pylist())
    if ids != list(range(n)):
        raise RuntimeError(f"{type(provider).__name__}: expected ids 0..{n - 1} once each; got {len(ids)} rows, {len(set(ids))} distinct")
    assert ex.metrics is not None
    if len(ex.metrics.tasks) != WORKERS:
        raise RuntimeError(f"{type(provider).__name__}: expected {WORKERS} tasks, got {len(ex.metrics.tasks)}")
    per_worker: Counter[str] = Counter()
    for t in ex.metrics.tasks:
        per_worker[t.worker_url] += sum(f.units for f in t.feeds)
    return elapsed, per_worker


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--units", type=int, default=200)
    p.add_argument("--runs", type=int, default=3, help="repetitions of each mode (median reported)")
    p.add_argument("--slow-ms", type=float, default=30.0, help="--unit-delay-ms of the slow worker")
    p.add_argument("--seed", type=int, default=4)
    args = p.parse_args(argv)

    costs = unit_costs(args.units, args.seed)
    top = sorted(costs, reverse=True)[:5]
    print(f"skew: {args.units} units, cost mean {statistics.mean(costs):.1f} ms, median {statistics.median(costs):.1f} ms, "
          f"total {sum(costs) / 1000:.2f} s, largest {top} ms; {WORKERS} workers, the first +{args.slow_ms:g} ms/unit")
    per_worker_args = [["--unit-delay-ms", str(args.slow_ms)]] + [[] for _ in range(WORKERS - 1)]
    modes: dict[str, flight.WorkUnitFeedProvider] = {"shared": SharedProvider(costs), "partitioned": RoundRobinProvider(costs)}
    times: dict[str, list[float]] = {m: [] for m in modes}
    units: dict[str, Counter[str]] = {}
    with flight.LocalCluster(WORKERS, extensions=["flight.dev.testing"], per_worker_args=per_worker_args) as cluster:
        slow = cluster.urls[0]
        run_once(cluster.urls, SharedProvider([0.0] * 6), 6)  # warm-up: connections, imports
        for r in range(args.runs):
            order = list(modes) if r % 2 == 0 else list(reversed(modes))
            for mode in order:
                elapsed, per_worker = run_once(cluster.urls, modes[mode], args.units)
                times[mode].append(elapsed)
                units[mode] = per_worker
                print(f"[skew] run {r + 1} {mode}: {elapsed:.3f}s", file=sys.stderr, flush=True)
        for mode in modes:
            shown = ", ".join(f"{'slow ' if u == slow else ''}{u.rsplit(':', 1)[-1]}={units[mode][u]}" for u in cluster.urls)
            print(f"  {mode:<12} median {statistics.median(times[mode]):.3f}s "
                  f"(runs {', '.join(f'{t:.3f}' for t in times[mode])}); units per worker (last run): {shown}")
    speedup = statistics.median(times["partitioned"]) / statistics.median(times["shared"])
    print(f"skew_speedup: {speedup:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
