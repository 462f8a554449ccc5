"""Distribution overhead: TPC-H queries on 2 local workers vs the same plan in one process.

For each query the same builder plan runs two ways, alternating, in one run:

* distributed: ``DistributedExec`` on a ``LocalCluster`` (stages, shuffles or
  broadcasts, DoExchange / DoGet, worker processes);
* single process: ``flight.run_local`` — the same plan as one task in this
  process, on the same engine as the workers (DuckDB), no network.

The distributed result is checked against the single-process one. Prints the
medians and the ratio per query; the last line is ``overhead_geomean: X``, the
geometric mean of distributed time / single-process time (lower is better;
below 1 the workers' extra cores pay for the overhead).

    python benchmarks/micro/overhead.py [--sf 1] [--workers 2] [--runs 3] [--queries 1,6]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

if __name__ == "__main__" and not __package__:
    # Run as `python benchmarks/micro/overhead.py`: the repo root holds the benchmarks package.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import flight
from benchmarks.tpch import ensure_tpch
from benchmarks.tpch_queries import ORDERED, QUERY_NUMBERS, TABLES, compare, query, tpch_files


def log(msg: str) -> None:
    print(f"[overhead] {msg}", file=sys.stderr, flush=True)


def timed(fn):  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sf", type=float, default=1.0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--queries", default=",".join(map(str, QUERY_NUMBERS)))
    args = p.parse_args(argv)
    numbers = [int(q) for q in args.queries.split(",")]
    log(f"TPC-H SF {args.sf}: generating or reusing data")
    data_dir = ensure_tpch(args.sf, TABLES)
    files = tpch_files(data_dir, TABLES)
    ratios: list[float] = []
    print(f"TPC-H SF {args.sf}, {args.workers} workers vs one process, median of {args.runs}")
    print(f"{'query':>5} {'distributed':>12} {'one process':>12} {'ratio':>7}")
    with flight.LocalCluster(args.workers, data_roots=[data_dir]) as cluster:
        for n in numbers:
            dist_t, local_t = [], []
            for i in range(args.runs + 1):  # the first round warms caches and is not counted
                td, got = timed(lambda: flight.DistributedExec(query(n, files), cluster.urls).to_table())
                tl, ref = timed(lambda: flight.run_local(query(n, files)).read_all())
                if i == 0:
                    problem = compare(got, ref, ORDERED.get(n))
                    if problem:
                        print(f"Q{n}: distributed and single-process results differ: {problem}")
                        return 1
                    continue
                dist_t.append(td)
                local_t.append(tl)
            d, l_ = statistics.median(dist_t), statistics.median(local_t)
            ratios.append(d / l_)
            print(f"{'Q' + str(n):>5} {d:11.3f}s {l_:11.3f}s {d / l_:7.2f}", flush=True)
    geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    print(f"overhead_geomean: {geomean:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
