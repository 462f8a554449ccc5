"""Slow discovery: does execution overlap a discovery that trickles units out?

Why: when listing the work is itself slow (an API paging through results, a
catalog scan), discover-everything-then-plan pays discovery + execution, while
a shared-queue feed (DESIGN.md, "Work-unit feeds"; shared/reference/003) starts
tasks on the first units and should finish about when discovery does.

Setup: a provider yields ``--units`` ``testing.sleep`` units, one every
``--every-ms`` (on a fixed schedule, waiting on the query's cancel event, so
discovery takes exactly units x every-ms); each unit takes ``--unit-ms`` on a
worker. ``LocalCluster(2)``: one worker already keeps up with discovery
(20 ms per unit each way), a second gives headroom for per-unit overhead
without oversubscribing the machine's 2 cores; and the default estimator, which
sees 2 units in its 50 ms sample, would start only 2 tasks anyway.

* **streaming**: the paced provider as a shared-queue feed, run directly;
  ``first_batch_ms`` is ``execute()`` to the first result batch;
* **discover-then-plan**: collect every unit first (same pacing), then run a
  shared provider over the list; its total is discovery + execution.

Ideal = max(discovery, units x unit-ms / workers). Streaming runs with the
default estimator (``sample_ms`` = 50), then with a smaller ``sample_ms`` and
with an estimator that takes every worker without sampling, to show what the
sample costs. A run counts only if every unit id came back exactly once. The
last two lines are ``first_batch_ms: X`` and ``slow_discovery_ratio: Y``
(default estimator, medians).

    python benchmarks/micro/slow_discovery.py [--units 100] [--every-ms 20] [--unit-ms 20] [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import flight
from flight.dev.testing import SLEEP_SCHEMA, sleep_unit

WORKERS = 2


class PacedProvider(flight.WorkUnitFeedProvider):
    """A slow discovery: unit i is ready at (i + 1) x ``every_s`` after the stream starts."""

    shared = True

    def __init__(self, units: int, every_s: float, unit_ms: float) -> None:
        self.units, self.every_s, self.unit_ms = units, every_s, unit_ms

    def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[bytes]:
        start = time.monotonic()
        for i in range(self.units):
            # A fixed schedule (no drift); waiting on the cancel event stops at once if the query ends.
            if ctx.cancelled.wait(max(0.0, start + (i + 1) * self.every_s - time.monotonic())):
                return
            yield sleep_unit(i, ms=self.unit_ms)


class ListProvider(flight.WorkUnitFeedProvider):
    """Units discovered beforehand, handed out as a shared queue."""

    shared = True

    def __init__(self, bodies: list[bytes]) -> None:
        self.bodies = bodies

    def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[bytes]:
        yield from self.bodies


class AllWorkers(flight.TaskEstimator):
    """One task per worker, without waiting for a discovery sample."""

    sample_units = 0
    sample_ms = 0.0

    def estimate(self, sample: flight.DiscoverySample, workers: int) -> flight.TaskEstimate:
        return flight.TaskEstimate(workers, ["forced: one task per worker"])


@dataclass(frozen=True)
class Timing:
    total_ms: float
    first_batch_ms: float
    tasks: int


def run(urls: list[str], provider: flight.WorkUnitFeedProvider, n: int, estimator: flight.TaskEstimator | None) -> Timing:
    """Run the query; time ``execute()`` to the first batch and to the end; check ids 0..n-1 once each."""
    ex = flight.DistributedExec(flight.from_feed(provider, "testing.sleep", SLEEP_SCHEMA), urls, estimator=estimator)
    started = time.perf_counter()
    first: float | None = None
    ids: list[int] = []
    for batch in ex.execute():
        if first is None:
            first = time.perf_counter() - started
        ids.extend(batch.column(0).to_pylist())
    total = time.perf_counter() - started
    if sorted(ids) != list(range(n)):
        raise RuntimeError(f"expected ids 0..{n - 1} once each; got {len(ids)} rows, {len(set(ids))} distinct")
    assert ex.metrics is not None and first is not None
    return Timing(total * 1000, first * 1000, len(ex.metrics.tasks))


def discover_then_plan(urls: list[str], paced: PacedProvider) -> Timing:
    """Collect every unit (same pacing), then run them; the clock covers both."""
    started = time.perf_counter()
    bodies = list(paced.feed(0, flight.FeedContext("collect", "collect", 0, 1)))
    discovered = time.perf_counter() - started
    t = run(urls, ListProvider(bodies), paced.units, None)
    return Timing(discovered * 1000 + t.total_ms, discovered * 1000 + t.first_batch_ms, t.tasks)


def show(name: str, timings: list[Timing], ideal_ms: float) -> None:
    total = statistics.median(t.total_ms for t in timings)
    first = statistics.median(t.first_batch_ms for t in timings)
    print(f"  {name:<34} total {total:7.0f} ms (ratio {total / ideal_ms:.2f}; runs {', '.join(f'{t.total_ms:.0f}' for t in timings)}), "
          f"first batch {first:5.0f} ms (runs {', '.join(f'{t.first_batch_ms:.0f}' for t in timings)}), "
          f"tasks {sorted({t.tasks for t in timings})}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--units", type=int, default=100)
    p.add_argument("--every-ms", type=float, default=20.0, help="discovery: one unit per this many ms")
    p.add_argument("--unit-ms", type=float, default=20.0, help="processing time of one unit on a worker")
    p.add_argument("--runs", type=int, default=3, help="runs of each mode (median reported)")
    p.add_argument("--small-sample-ms", type=float, default=5.0, help="sample_ms of the smaller-sample variant")
    args = p.parse_args(argv)

    n = args.units
    paced = PacedProvider(n, args.every_ms / 1000, args.unit_ms)
    ideal = max(n * args.every_ms, n * args.unit_ms / WORKERS)
    print(f"slow_discovery: {n} units, one per {args.every_ms:g} ms, {args.unit_ms:g} ms each; "
          f"{WORKERS} workers; ideal {ideal:.0f} ms")
    variants: dict[str, flight.TaskEstimator | None] = {
        "streaming (default estimator)": None,
        f"streaming (sample_ms={args.small_sample_ms:g})": flight.DefaultTaskEstimator(sample_ms=args.small_sample_ms),
        "streaming (all workers, no sample)": AllWorkers(),
    }
    results: dict[str, list[Timing]] = {name: [] for name in [*variants, "discover-then-plan"]}
    with flight.LocalCluster(WORKERS, extensions=["flight.dev.testing"]) as cluster:
        run(cluster.urls, ListProvider([sleep_unit(i) for i in range(4)]), 4, None)  # warm-up: connections, imports
        for r in range(args.runs):
            for name, estimator in variants.items():
                results[name].append(run(cluster.urls, paced, n, estimator))
            results["discover-then-plan"].append(discover_then_plan(cluster.urls, paced))
            print(f"[slow_discovery] run {r + 1}: " + ", ".join(f"{k} {v[-1].total_ms:.0f} ms" for k, v in results.items()),
                  file=sys.stderr, flush=True)
    for name, timings in results.items():
        show(name, timings, ideal)
    default = results["streaming (default estimator)"]
    print(f"first_batch_ms: {statistics.median(t.first_batch_ms for t in default):.0f}")
    print(f"slow_discovery_ratio: {statistics.median(t.total_ms for t in default) / ideal:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
