"""Recovery: what losing a worker mid-query costs, and whether the answer stays exact.

Why: a query that loses a worker before its first row reached the caller runs again
on the workers that remain (docs/architecture.md, "Losing a worker"). This measures
that price: the time of a query whose worker is killed (SIGKILL) at the midpoint of
its undisturbed time, divided by the undisturbed time, in the same run.

Setup: TPC-H at ``--sf`` (generated once into the benchmarks' cache), ``--workers``
workers. For each query: its undisturbed time on a cluster that stays up (median of
``--runs`` after a warm-up); then ``--runs`` disturbed runs, each on a fresh cluster
(started before the clock starts), killing one worker (drawn with a fixed seed) at
half the undisturbed median. Every result is compared with DuckDB's. The last two
lines are ``recovered: N/N`` (disturbed runs that returned DuckDB's answer) and
``recovery_overhead: X`` (geometric mean over the queries of disturbed median ÷
undisturbed median; goal ≤ 2.0).

    python -m benchmarks.micro.recovery [--sf 1] [--workers 3] [--queries 3,5,10,13] [--runs 3]
"""

from __future__ import annotations

import argparse
import math
import random
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

if __name__ == "__main__" and not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import flight
from benchmarks.tpch import ensure_tpch
from benchmarks.tpch_queries import ORDERED, TABLES, compare, duckdb_answer, duckdb_connection, query, tpch_files


def _timed(ex: flight.DistributedExec) -> tuple[float, object]:
    started = time.perf_counter()
    try:
        got: object = ex.to_table()
    except flight.FlightExecError as exc:
        got = exc
    return time.perf_counter() - started, got


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sf", type=float, default=1.0)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--queries", default="3,5,10,13")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seed", type=int, default=12)
    args = p.parse_args(argv)
    numbers = [int(q) for q in args.queries.split(",")]
    rng = random.Random(args.seed)
    root = ensure_tpch(args.sf, TABLES)
    files = tpch_files(root, TABLES)
    con = duckdb_connection(files)
    expected = {n: duckdb_answer(n, files, con) for n in numbers}
    con.close()
    print(f"TPC-H SF {args.sf:g} on {args.workers} workers; one worker killed at the midpoint; DuckDB as the reference")
    print(f"{'query':>5} {'undisturbed s':>14} {'killed s':>9} {'ratio':>6}  attempts  result")
    recovered = total = 0
    ratios = []
    for n in numbers:
        with flight.LocalCluster(args.workers, data_roots=[root]) as cluster:
            _timed(flight.DistributedExec(query(n, files), cluster.urls))  # warm-up
            calm = statistics.median(_timed(flight.DistributedExec(query(n, files), cluster.urls))[0] for _ in range(args.runs))
        killed_times = []
        notes = []
        for _ in range(args.runs):
            victim = rng.randrange(args.workers)
            with flight.LocalCluster(args.workers, data_roots=[root]) as cluster:
                ex = flight.DistributedExec(query(n, files), cluster.urls)
                timer = threading.Timer(calm / 2, cluster.processes[victim].send_signal, args=(signal.SIGKILL,))
                timer.start()
                seconds, got = _timed(ex)
                timer.cancel()
            total += 1
            verdict = str(got) if isinstance(got, Exception) else compare(got, expected[n], ORDERED.get(n))  # type: ignore[arg-type]
            recovered += verdict is None
            killed_times.append(seconds)
            notes.append(f"{len(ex.attempts)}" + ("" if verdict is None else f" ({verdict})"))
        killed = statistics.median(killed_times)
        ratios.append(killed / calm)
        print(f"{n:>5} {calm:>14.3f} {killed:>9.3f} {killed / calm:>6.2f}  {','.join(notes):>8}  "
              f"{'matches DuckDB' if all(x.isdigit() for x in notes) else 'differs'}", flush=True)
    print(f"recovered: {recovered}/{total}")
    print(f"recovery_overhead: {math.exp(statistics.fmean(math.log(r) for r in ratios)):.2f}")
    return 0 if recovered == total else 1


if __name__ == "__main__":
    sys.exit(main())
