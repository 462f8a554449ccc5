"""Service overhead: TPC-H through ADBC and ``flight-coordinator`` vs the same SQL through ``DistributedExec`` in-process.

For each query the same SQL text runs two ways, alternating, on the same two workers:

* service: the ADBC Flight SQL driver (one connection, as an application keeps one) against a
  ``flight-coordinator`` subprocess (``--workers`` the cluster's URLs, direct endpoints: the client
  reads the workers);
* in-process: ``DistributedExec(flight.sql(text, catalog), urls).to_table()`` in this process.

Both answers are checked against DuckDB's over the same files. Prints the medians and the ratio per
query; the last line is ``service_overhead_geomean: X`` (service time / in-process time; the goal
is at most 1.10).

    python benchmarks/micro/service.py [--sf 1] [--runs 5] [--queries 1,3,4,5,6,10,12,13,14,19]
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

if __name__ == "__main__" and not __package__:
    # Run as `python benchmarks/micro/service.py`: the repo root holds the benchmarks package.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pyarrow as pa

import flight
from benchmarks.tpch import ensure_tpch
from benchmarks.tpch_queries import ORDERED, TABLES, compare, decimals_as_numbers, duckdb_connection, duckdb_table, tpch_files
from benchmarks.tpch_sql import SQL

DEFAULT_QUERIES = "1,3,4,5,6,10,12,13,14,19"


def log(msg: str) -> None:
    print(f"[service] {msg}", file=sys.stderr, flush=True)


def through_adbc(cursor: object, text: str) -> pa.Table:
    cursor.execute(text)  # type: ignore[attr-defined]
    return cursor.fetch_arrow_table()  # type: ignore[attr-defined, no-any-return]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sf", type=float, default=1.0)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--queries", default=DEFAULT_QUERIES)
    args = p.parse_args(argv)
    numbers = [int(q) for q in args.queries.split(",")]
    data_dir = ensure_tpch(args.sf, TABLES)
    files = tpch_files(data_dir, TABLES)
    catalog = flight.Catalog({t: flight.read_parquet([str(f) for f in files[t]]) for t in TABLES})
    con = duckdb_connection(files)
    ratios: list[float] = []
    ok = True
    print(f"TPC-H SF {args.sf}, 2 workers: ADBC through flight-coordinator vs DistributedExec in-process, median of {args.runs}")
    print(f"{'query':>5} {'service':>9} {'in-process':>11} {'ratio':>7}")
    with flight.LocalCluster(2, data_roots=[data_dir]) as cluster:
        # The same file lists the in-process catalog has (a directory would be listed as the query runs,
        # and its plans would differ: no sizes or key ranges from the footers while planning).
        tables = [a for t in TABLES for a in ("--table", f"{t}={','.join(str(f) for f in files[t])}")]
        proc = subprocess.Popen([sys.executable, "-m", "flight.service", "--port", "0", "--workers", ",".join(cluster.urls),
                                 "--log-level", "WARNING", *tables], stdout=subprocess.PIPE, text=True)
        try:
            from adbc_driver_flightsql import dbapi

            assert proc.stdout is not None
            url = proc.stdout.readline().split()[-1]
            conn = dbapi.connect(url, autocommit=True)  # one connection, as an application keeps one
            cursor = conn.cursor()
            for n in numbers:
                want = decimals_as_numbers(duckdb_table(con, SQL[n]))
                times: dict[str, list[float]] = {"service": [], "local": []}
                for run in range(args.runs + 1):  # the first of each is a warm-up
                    for way in ("service", "local"):
                        started = time.perf_counter()
                        got = through_adbc(cursor, SQL[n]) if way == "service" else flight.DistributedExec(
                            flight.sql(SQL[n], catalog), cluster.urls).to_table()
                        elapsed = time.perf_counter() - started
                        difference = compare(got, want, ORDERED.get(n))
                        if difference is not None:
                            ok = False
                            log(f"Q{n} {way}: differs from DuckDB: {difference}")
                        if run:
                            times[way].append(elapsed)
                service, local = statistics.median(times["service"]), statistics.median(times["local"])
                ratios.append(service / local)
                print(f"{'Q' + str(n):>5} {service:9.3f} {local:11.3f} {service / local:7.2f}", flush=True)
            cursor.close()
            conn.close()
        finally:
            proc.terminate()
            proc.wait(30)
    print(f"service_overhead_geomean: {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
