"""Recovery: what losing a worker mid-query costs, and whether the answer stays exact.

Why: a query that loses a worker before its first row reached the caller runs again
on the workers that remain; a streaming scan replays the lost task's undelivered work
units on another worker, even after rows reached the caller (docs/architecture.md,
"Losing a worker"). This measures that price: the time of a query whose worker is
killed (SIGKILL) at the midpoint of its undisturbed time, divided by the undisturbed
time, in the same run.

Setup: TPC-H at ``--sf`` (generated once into the benchmarks' cache), ``--workers``
workers. For each query: its undisturbed time on a cluster that stays up (median of
``--runs`` after a warm-up); then ``--runs`` disturbed runs, each on a fresh cluster
(started before the clock starts), killing one worker (drawn with a fixed seed) at
half the undisturbed median. Every result is compared with DuckDB's. The query
``scan`` is the streaming one: lineitem (a unit per row group), filtered and projected,
read by the caller as it comes; it is checked by its row count, its distinct keys
(no row twice) and its sums, against DuckDB's. The last two
lines are ``recovered: N/N`` (disturbed runs that returned DuckDB's answer) and
``recovery_overhead: X`` (geometric mean over the queries of disturbed median ÷
undisturbed median; goal ≤ 2.0).

    python -m benchmarks.micro.recovery [--sf 1] [--workers 3] [--queries 3,5,10,13,scan] [--runs 3]
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

import pyarrow as pa
import pyarrow.compute as pc

import flight
from benchmarks.tpch import ensure_tpch
from benchmarks.tpch_queries import ORDERED, TABLES, compare, duckdb_answer, duckdb_connection, query, tpch_files

SCAN_SQL = (
    "SELECT count(*), count(DISTINCT (l_orderkey, l_linenumber)), sum(l_orderkey), sum(l_extendedprice)::DOUBLE "
    "FROM lineitem WHERE l_quantity < 30"
)


def _scan(files: dict[str, list[Path]]) -> flight.Query:
    """The streaming scan: rows straight back to the caller, one unit per row group."""
    scan = flight.read_parquet(files["lineitem"], split_row_groups=True)
    return scan.filter(flight.col("l_quantity") < flight.lit(30.0)).select("l_orderkey", "l_linenumber", "l_extendedprice")


def _scan_sums(t: pa.Table) -> tuple[int, int, int, float]:
    t = t.combine_chunks()  # into fresh buffers: decimals read from the wire may sit unaligned for Acero
    keys = t.group_by(["l_orderkey", "l_linenumber"]).aggregate([]).num_rows
    price = pc.sum(pc.cast(t["l_extendedprice"], pa.float64())).as_py() or 0.0
    return t.num_rows, keys, pc.sum(t["l_orderkey"]).as_py() or 0, price


def _check(got: pa.Table, n: int | str, expected: dict[int | str, object]) -> str | None:
    if n != "scan":
        return compare(got, expected[n], ORDERED.get(n))  # type: ignore[arg-type,call-overload]
    rows, keys, orderkeys, price = _scan_sums(got)
    want = expected[n]
    assert isinstance(want, tuple)
    if (rows, keys, orderkeys) != tuple(want[:3]) or not math.isclose(price, want[3], rel_tol=1e-9):
        return f"{rows} rows ({keys} distinct keys, sums {orderkeys}, {price:.2f}); expected {want}"
    return None


def _query(n: int | str, files: dict[str, list[Path]]) -> flight.Query:
    return _scan(files) if n == "scan" else query(n, files)  # type: ignore[arg-type]


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
    p.add_argument("--queries", default="3,5,10,13,scan")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seed", type=int, default=12)
    args = p.parse_args(argv)
    numbers: list[int | str] = [q if q == "scan" else int(q) for q in args.queries.split(",")]
    rng = random.Random(args.seed)
    root = ensure_tpch(args.sf, TABLES)
    files = tpch_files(root, TABLES)
    con = duckdb_connection(files)
    expected: dict[int | str, object] = {
        n: con.execute(SCAN_SQL).fetchone() if n == "scan" else duckdb_answer(n, files, con)  # type: ignore[arg-type]
        for n in numbers
    }
    con.close()
    print(f"TPC-H SF {args.sf:g} on {args.workers} workers; one worker killed at the midpoint; DuckDB as the reference")
    print(f"{'query':>5} {'undisturbed s':>14} {'killed s':>9} {'ratio':>6}  attempts  result   (r: units replayed, the query went on)")
    recovered = total = 0
    ratios = []
    for n in numbers:
        with flight.LocalCluster(args.workers, data_roots=[root]) as cluster:
            _timed(flight.DistributedExec(_query(n, files), cluster.urls))  # warm-up
            calm = statistics.median(_timed(flight.DistributedExec(_query(n, files), cluster.urls))[0] for _ in range(args.runs))
        killed_times = []
        notes = []
        for _ in range(args.runs):
            victim = rng.randrange(args.workers)
            with flight.LocalCluster(args.workers, data_roots=[root]) as cluster:
                ex = flight.DistributedExec(_query(n, files), cluster.urls)
                timer = threading.Timer(calm / 2, cluster.processes[victim].send_signal, args=(signal.SIGKILL,))
                timer.start()
                seconds, got = _timed(ex)
                timer.cancel()
            total += 1
            verdict = str(got) if isinstance(got, Exception) else _check(got, n, expected)  # type: ignore[arg-type]
            recovered += verdict is None
            killed_times.append(seconds)
            replayed = sum(a.replayed is not None for a in ex.attempts)
            notes.append(f"{len(ex.attempts)}" + ("r" if replayed else "") + ("" if verdict is None else f" ({verdict})"))
        killed = statistics.median(killed_times)
        ratios.append(killed / calm)
        print(f"{n:>5} {calm:>14.3f} {killed:>9.3f} {killed / calm:>6.2f}  {','.join(notes):>8}  "
              f"{'matches DuckDB' if all(x.rstrip('r').isdigit() for x in notes) else 'differs'}", flush=True)
    print(f"recovered: {recovered}/{total}")
    print(f"recovery_overhead: {math.exp(statistics.fmean(math.log(r) for r in ratios)):.2f}")
    return 0 if recovered == total else 1


if __name__ == "__main__":
    sys.exit(main())
