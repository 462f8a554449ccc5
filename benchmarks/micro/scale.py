"""Scale: the TPC-H queries at a large scale factor on workers with a memory limit, checked against DuckDB.

Why: a worker runs within ``--memory-limit`` and spills past it (docs/engine.md,
"Memory"). At SF 10 the joins and aggregates of the ten queries hold more than a
small limit, so this is where the limit and the spilling are exercised at size,
and where a worker's real peak memory shows.

Setup: TPC-H at ``--sf`` (generated once into the benchmarks' cache), a
``LocalCluster`` of ``--workers`` workers each started with ``--memory-limit``;
each query runs once on flight-exec and once in DuckDB (one process, the
reference answer), alternating. Prints per query both times and whether the
answers match, each worker's peak RSS (its ``VmHWM``, over the whole run) and
last ``scale_sf{SF}: N/22 match, worker_peak_rss_mb: A, B``. flight-exec runs each query's SQL
text through ``flight.sql`` (``--flight-plans builder``: the ten builder plans).

    python -m benchmarks.micro.scale [--sf 10] [--workers 2] [--memory-limit 4GB] [--queries 1,3] [--flight-plans sql]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __name__ == "__main__" and not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import flight
from benchmarks.tpch import ensure_tpch
from benchmarks.tpch_queries import QUERY_NUMBERS, TABLES, compare, duckdb_answer, duckdb_connection, query, tpch_files
from benchmarks.tpch_sql import ALL_QUERIES, ORDERED, SQL


def _hwm_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sf", type=float, default=10.0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--memory-limit", default="4GB", help="each worker's --memory-limit (default: %(default)s)")
    p.add_argument("--queries", default=None, help="default: all 22 (the builder's ten with --flight-plans builder)")
    p.add_argument("--flight-plans", choices=("sql", "builder"), default="sql")
    args = p.parse_args(argv)
    suite = ALL_QUERIES if args.flight_plans == "sql" else QUERY_NUMBERS
    numbers = [int(q) for q in args.queries.split(",")] if args.queries else list(suite)
    root = ensure_tpch(args.sf, TABLES)
    files = tpch_files(root, TABLES)
    con = duckdb_connection(files)
    catalog = flight.Catalog({t: flight.read_parquet([str(f) for f in files[t]]) for t in TABLES})

    def make(n: int) -> flight.Query:
        return flight.sql(SQL[n], catalog) if args.flight_plans == "sql" else query(n, files)

    matched = 0
    print(f"TPC-H SF {args.sf:g}, {args.workers} workers with --memory-limit {args.memory_limit}; DuckDB as the reference")
    print(f"{'query':>5} {'flight s':>9} {'duckdb s':>9}  result")
    worker_args = ["--memory-limit", args.memory_limit]
    with flight.LocalCluster(args.workers, data_roots=[root], worker_args=worker_args) as cluster:
        for n in numbers:
            started = time.perf_counter()
            try:
                got = flight.DistributedExec(make(n), cluster.urls).to_table()
                error = None
            except flight.FlightExecError as exc:
                got, error = None, str(exc)
            flight_s = time.perf_counter() - started
            started = time.perf_counter()
            expected = duckdb_answer(n, files, con)
            duck_s = time.perf_counter() - started
            verdict = error if got is None else compare(got, expected, ORDERED.get(n))
            matched += verdict is None
            print(f"{n:>5} {flight_s:>9.2f} {duck_s:>9.2f}  {'matches DuckDB' if verdict is None else verdict}", flush=True)
        peaks = [_hwm_mb(proc.pid) for proc in cluster.processes]
    print("worker peak RSS (VmHWM): " + ", ".join(f"{url} {mb:.0f} MB" for url, mb in zip(cluster.urls, peaks)))
    print(f"scale_sf{args.sf:g}: {matched}/{len(numbers)} match, worker_peak_rss_mb: {', '.join(f'{mb:.0f}' for mb in peaks)}")
    return 0 if matched == len(numbers) else 1


if __name__ == "__main__":
    sys.exit(main())
