"""Feed throughput: work units dispatched per second from one provider to the workers.

A provider yields N 100-byte units (an 8-byte big-endian sequence number,
then padding), dealt over the feed's partitions (one per task); the query is
``flight.units(provider)``, whose built-in reader turns each unit into a row
of one binary column, run with ``DistributedExec`` on a ``LocalCluster``.
The clock runs from ``execute()`` to the end of the result; the run counts
only if every sequence number came back exactly once. Reading the units back
is deliberately trivial, so this measures the feed's dispatch path: discovery
queue, credit round trips, frames on the DoExchange, the worker's inboxes.

``--sweep`` tries a grid of ``feed_window`` x ``max_units_per_frame`` to help
choose defaults. The last line is ``feed_units_per_s: X``.

    python benchmarks/micro/feed.py [--units 200000] [--runs 3] [--feed-window W] [--max-units-per-frame F]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from collections.abc import Iterator

import flight

UNIT_BYTES = 100
_PAD = b"x" * (UNIT_BYTES - 8)


class SequenceProvider(flight.WorkUnitFeedProvider):
    """``n`` units ``seq.to_bytes(8) + padding``; partition p gets the seqs congruent to p."""

    def __init__(self, n: int) -> None:
        self.n = n

    def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[bytes]:
        for seq in range(partition, self.n, ctx.partitions):
            yield seq.to_bytes(8, "big") + _PAD


def run_once(urls: list[str], n: int, overrides: dict[str, int]) -> float:
    """Seconds from ``execute()`` to the last row; raises unless each unit came back exactly once."""
    ex = flight.DistributedExec(flight.units(SequenceProvider(n)), urls, **overrides)
    started = time.perf_counter()
    batches = list(ex.execute())
    elapsed = time.perf_counter() - started
    seqs = sorted(int.from_bytes(body[:8], "big") for b in batches for body in b.column(0).to_pylist())
    if len(seqs) != n or seqs != list(range(n)):
        raise RuntimeError(f"expected units 0..{n - 1} once each; got {len(seqs)} rows, {len(set(seqs))} distinct")
    return elapsed


def measure(urls: list[str], n: int, runs: int, overrides: dict[str, int]) -> float:
    """Median units/s over ``runs`` after one warm-up run."""
    run_once(urls, min(n, 10_000), overrides)
    times = [run_once(urls, n, overrides) for _ in range(runs)]
    print(f"[feed] {overrides or 'defaults'}: runs {', '.join(f'{t:.3f}s' for t in times)}", file=sys.stderr, flush=True)
    return n / statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--units", type=int, default=200_000, help="work units per run")
    p.add_argument("--runs", type=int, default=3, help="timed runs (median reported)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--feed-window", type=int, default=None, help="ExecOptions.feed_window (default: the library's)")
    p.add_argument("--max-units-per-frame", type=int, default=None, help="ExecOptions.max_units_per_frame")
    p.add_argument("--discovery-buffer", type=int, default=None, help="ExecOptions.discovery_buffer")
    p.add_argument("--sweep", action="store_true", help="also try a grid of feed_window x max_units_per_frame")
    args = p.parse_args(argv)

    overrides = {k: v for k, v in {
        "feed_window": args.feed_window,
        "max_units_per_frame": args.max_units_per_frame,
        "discovery_buffer": args.discovery_buffer,
    }.items() if v is not None}
    shown = ", ".join(f"{k}={v}" for k, v in overrides.items()) or "library defaults"
    print(f"feed: {args.units:,} units of {UNIT_BYTES} bytes, {args.workers} workers, {shown}")
    with flight.LocalCluster(args.workers) as cluster:
        if args.sweep:
            for window, frame in itertools.product([64, 256, 1024, 4096], [64, 256, 1024, 4096]):
                rate = measure(cluster.urls, args.units, args.runs, {**overrides, "feed_window": window, "max_units_per_frame": frame})
                print(f"  feed_window={window:<6} max_units_per_frame={frame:<5} {rate:>10,.0f} units/s")
        rate = measure(cluster.urls, args.units, args.runs, overrides)
    print(f"{rate:,.0f} units/s (median of {args.runs})")
    print(f"feed_units_per_s: {rate:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
