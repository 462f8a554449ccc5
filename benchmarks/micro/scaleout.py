"""Scale-out: TPC-H's or TPC-DS's SQL on N workers as N hosts, each pinned to its own cores, against DuckDB on the same cores.

Why: on one host the planner runs most queries as one DuckDB task on all its cores (docs/queries.md, "Small
queries"), which hides the plans a real fleet runs. Here each worker listens on its own loopback address
(``127.0.0.2``, ``127.0.0.3``, ...: the planner sees distinct hosts) and runs on its own ``--cores`` cores
(``taskset``, ``--engine-threads``), as a host of that size would. The same SQL runs three ways, interleaved
per query: flight-exec on the N workers; DuckDB with ``--cores`` threads pinned to worker 0's cores (one
host); DuckDB with N × ``--cores`` threads on all of them. Every flight-exec answer is compared with DuckDB's
(``--suite tpch``: the 22 texts of ``benchmarks/tpch_sql.py``; ``--suite tpcds``: DuckDB's 99, checked as
``flight-bench --suite tpcds`` checks them, ``benchmarks/tpcds_bench.py``).

Per query it prints the three medians (of ``--runs``), the speed-up over one host's DuckDB, the ratio to
DuckDB on all the cores, and the bytes the workers moved between them (``TaskStats.bytes_in``: read from
another worker) beside the Parquet bytes of the tables the query reads. The last lines::

    scaleout_duckdb_own_speedup: W     (geomean of DuckDB on all N x cores over DuckDB on one host's: its own scaling)
    scaleout_speedup_geomean: X        (over DuckDB on one host's cores; ideal N)
    scaleout_vs_duckdb_all_cores: Y    (geomean; DuckDB on the same N x cores = 1.0)
    scaleout_min_qN: Z                 (the query with the least speed-up)

With ``--suite tpcds`` the names start ``scaleout_tpcds_`` (``scaleout_tpcds_speedup_geomean: X``), so both
suites' figures can sit side by side in one log. ``duckdb_own_speedup`` says how close to N one engine's threads come on
these cores (memory bandwidth and caches are shared: on the 2-core machine of issue 42, 1.71 for TPC-H SF 10), the
reference for ``speedup_geomean``. TPC-DS's tables are one Parquet file each: without
``ExecOptions.cut_file_rows`` (``--cut-file-rows``, 1,000,000 by default with this suite) each scan is one task
and a query runs on one worker, which measures no fleet.

``--bytes-at 4,8`` runs the queries once on 4 and on 8 workers (distinct addresses, not pinned: bytes moved do
not depend on the cores) and prints the bytes moved per query at each N, untimed, then
``scaleout_bytes_moved_mb_at_N: MB`` for each N.

    python -m benchmarks.micro.scaleout [--suite tpch|tpcds] [--sf 10] [--workers 2] [--cores 1] [--memory-limit 4GB]
        [--queries 18,10] [--runs 3]
"""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

if __name__ == "__main__" and not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pyarrow as pa

import flight
from benchmarks.progress import Progress
from benchmarks.tpcds_bench import tpcds_workload
from benchmarks.tpch_queries import Files, duckdb_connection, duckdb_table
from benchmarks.tpch_sql import ALL_QUERIES
from benchmarks.workload import Workload, tpch_workload
from flight.coordinator.metrics import QueryMetrics

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.micro.scaleout", description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", choices=("tpch", "tpcds"), default="tpch", help="the queries (default: %(default)s)")
    p.add_argument("--sf", type=float, default=10.0)
    p.add_argument("--workers", type=int, default=2, help="workers, each on its own address and cores (default: %(default)s)")
    p.add_argument("--cores", type=int, default=1, help="cores per worker (default: %(default)s)")
    p.add_argument("--memory-limit", default="4GB", help="each worker's --memory-limit (default: %(default)s)")
    p.add_argument("--queries", default="", help="query numbers, comma-separated (default: all of the suite's)")
    p.add_argument("--runs", type=int, default=3, help="runs per query and way; medians (default: %(default)s)")
    p.add_argument("--cut-file-rows", type=int, default=None,
                   help="ExecOptions.cut_file_rows (default: 1,000,000 with --suite tpcds, whose tables are one file each; 0 with tpch)")
    p.add_argument("--bytes-at", default="", help="only count bytes moved, once, at these worker counts (e.g. 4,8)")
    return p


def _hosts(n: int) -> list[str]:
    return [f"127.0.0.{2 + i}" for i in range(n)]


def moved(metrics: QueryMetrics | None) -> int:
    """Bytes the tasks read from another worker (Arrow, as it crossed the network; a read from the task's own
    worker is not counted)."""
    return 0 if metrics is None else sum(t.bytes_in - t.bytes_in_local for t in metrics.tasks)


def table_bytes(text: str, files: Files) -> int:
    """The Parquet bytes on disk of the tables the query names: what its scans read at most (DuckDB tasks report no
    scan counts of their own)."""
    words = set(re.findall(r"[a-z_]+", text.lower()))
    return sum(p.stat().st_size for t, paths in files.items() if t in words for p in paths)


def label(work: Workload, n: int) -> str:
    """``Q18`` (TPC-H's way) or ``q04`` (TPC-DS's, as ``flight-bench`` prints it)."""
    return f"Q{n}" if work.name == "tpch" else f"q{n:02d}"


def _prefix(work: Workload) -> str:
    return "scaleout" if work.name == "tpch" else f"scaleout_{work.name}"


class DuckDB:
    """DuckDB over the same files with ``threads`` threads, pinned to ``cores`` (its threads start on a pinned thread)."""

    def __init__(self, files: Files, threads: int, cores: Sequence[int]) -> None:
        before = os.sched_getaffinity(0)
        os.sched_setaffinity(0, set(cores))
        try:
            self.con = duckdb_connection(files)
            self.con.execute(f"SET threads = {threads}")
            duckdb_table(self.con, "select 1")  # its pool's threads exist now, pinned
        finally:
            os.sched_setaffinity(0, before)

    def run(self, text: str) -> tuple[float, pa.Table]:
        start = time.perf_counter()
        table = duckdb_table(self.con, text)
        return time.perf_counter() - start, table


def _flight(query: flight.Query, urls: list[str], cut_file_rows: int) -> tuple[float, pa.Table, QueryMetrics | None]:
    ex = flight.DistributedExec(query, urls, cut_file_rows=cut_file_rows)
    start = time.perf_counter()
    table = ex.to_table()
    return time.perf_counter() - start, table, ex.metrics


def _cluster(args: argparse.Namespace, n: int, pinned: bool, roots: list[Path]) -> flight.LocalCluster:
    cpus = [list(range(i * args.cores, (i + 1) * args.cores)) for i in range(n)] if pinned else None
    return flight.LocalCluster(n, data_roots=roots, hosts=_hosts(n), cpus=cpus,
                               worker_args=["--memory-limit", args.memory_limit, "--engine-threads", str(args.cores)])


def _catalog(work: Workload) -> flight.Catalog:
    return flight.Catalog({t: flight.read_parquet([str(p) for p in paths]) for t, paths in work.files.items()})


def timed(args: argparse.Namespace, work: Workload, queries: list[int]) -> int:
    n, cores = args.workers, args.cores
    if n * cores > (os.cpu_count() or 1):
        raise SystemExit(f"{n} workers x {cores} cores need {n * cores} cores; this machine has {os.cpu_count()}")
    catalog, texts = _catalog(work), work.texts["duckdb"]
    one, every = DuckDB(work.files, cores, range(cores)), DuckDB(work.files, n * cores, range(n * cores))
    speedups, ratios, own, wrong = [], [], [], 0
    print(f"{'query':>5} {'flight':>8} {'duck 1h':>8} {'duck all':>8} {'speed-up':>8} {'vs all':>7} {'moved MB':>9} {'tables MB':>9}")
    with _cluster(args, n, True, [work.data_dir]) as cluster:
        for q in queries:
            times: dict[str, list[float]] = {"flight": [], "one": [], "all": []}
            got = want = None
            metrics = None
            failed = None
            for _ in range(args.runs):
                try:
                    s, got, metrics = _flight(flight.sql(texts[q], catalog), cluster.urls, args.cut_file_rows)
                except flight.FlightExecError as exc:  # reported, counted, and the suite goes on
                    failed = f"{type(exc).__name__}: {exc}"
                    break
                times["flight"].append(s)
                s, want = one.run(texts[q])
                times["one"].append(s)
                times["all"].append(every.run(texts[q])[0])
            if failed is not None:
                wrong += 1
                print(f"{label(work, q):>5} FAILED {failed}", flush=True)
                continue
            assert got is not None and want is not None
            difference = work.check(q, got, want)
            wrong += difference is not None
            med = {k: statistics.median(v) for k, v in times.items()}
            speedups.append((q, med["one"] / med["flight"]))
            ratios.append(med["all"] / med["flight"])
            own.append(med["one"] / med["all"])
            out, scanned = moved(metrics), table_bytes(texts[q], work.files)
            print(f"{label(work, q):>5} {med['flight']:8.2f} {med['one']:8.2f} {med['all']:8.2f} {speedups[-1][1]:8.2f} "
                  f"{ratios[-1]:7.2f} {out / 1e6:9.1f} {scanned / 1e6:9.1f}" + ("" if difference is None else f"  WRONG: {difference}"),
                  flush=True)
    if not speedups:
        print(f"answers: none of {len(queries)} queries ran")
        return 1
    geo = lambda xs: math.exp(sum(math.log(x) for x in xs) / len(xs))  # noqa: E731
    worst = min(speedups, key=lambda p: p[1])
    print(f"answers: {len(queries) - wrong}/{len(queries)} equal DuckDB's; geomeans of the speed-up over DuckDB on one host's "
          f"cores (ideal {n}) and of the ratio to DuckDB on the same {n} x {cores} cores (1.0: as fast); the slowest query")
    prefix = _prefix(work)
    print(f"{prefix}_duckdb_own_speedup: {geo(own):.2f}")
    print(f"{prefix}_speedup_geomean: {geo([s for _, s in speedups]):.2f}")
    print(f"{prefix}_vs_duckdb_all_cores: {geo(ratios):.2f}")
    print(f"{prefix}_min_{label(work, worst[0]).lower()}: {worst[1]:.2f}")
    return 1 if wrong else 0


def bytes_only(args: argparse.Namespace, work: Workload, queries: list[int], counts: list[int]) -> int:
    catalog, texts = _catalog(work), work.texts["duckdb"]
    table: dict[int, dict[int, int]] = {q: {} for q in queries}
    for n in counts:
        with _cluster(args, n, False, [work.data_dir]) as cluster:
            for q in queries:
                _, _, metrics = _flight(flight.sql(texts[q], catalog), cluster.urls, args.cut_file_rows)
                table[q][n] = moved(metrics)
    print(f"{'query':>5} " + " ".join(f"{f'moved MB at {n}':>14}" for n in counts) + f" {'tables MB':>9}")
    for q in queries:
        print(f"{label(work, q):>5} " + " ".join(f"{table[q][n] / 1e6:14.1f}" for n in counts)
              + f" {table_bytes(texts[q], work.files) / 1e6:9.1f}")
    totals = {n: sum(table[q][n] for q in queries) for n in counts}
    print("bytes moved between workers by all the queries, MB, at each worker count")
    for n in counts:
        print(f"{_prefix(work)}_bytes_moved_mb_at_{n}: {totals[n] / 1e6:.1f}")
    return 0


def _refuse_unknown(title: str, asked: list[int], known: Sequence[int]) -> None:
    unknown = sorted(set(asked) - set(known))
    if unknown:
        raise SystemExit(f"{title} has no queries {unknown}: it has {min(known)}..{max(known)}")


def workload(args: argparse.Namespace) -> tuple[Workload, list[int]]:
    """The suite's data (generated when missing) and texts, and the queries asked for (all of them by default)."""
    asked = [int(q) for q in args.queries.split(",") if q.strip()]
    if args.cut_file_rows is None:
        args.cut_file_rows = 1_000_000 if args.suite == "tpcds" else 0
    with Progress(live=False) as progress:
        if args.suite == "tpch":
            _refuse_unknown("TPC-H", asked, ALL_QUERIES)  # before generating the tables they read
            work = tpch_workload(args.sf, asked or list(ALL_QUERIES), None, progress)
        else:
            work = tpcds_workload(args.sf, None, progress)
            _refuse_unknown("TPC-DS", asked, work.queries)
    return work, asked or list(work.queries)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    work, queries = workload(args)
    if args.bytes_at:
        return bytes_only(args, work, queries, [int(n) for n in args.bytes_at.split(",")])
    return timed(args, work, queries)


if __name__ == "__main__":
    sys.exit(main())
