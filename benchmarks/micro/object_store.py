"""Object storage: TPC-H read from an S3-compatible server ÷ the same files read from local disk.

Why: work units may name ``s3://`` objects (docs/storage.md); this measures what reading
through a store costs against the local files, side by side in one run.

Setup: TPC-H at ``--sf`` (generated once into the benchmarks' cache), uploaded to moto's
S3 server on loopback (``benchmarks/local_s3.py``); two clusters of ``--workers`` workers,
one reading the local files, one the objects (its store options and credentials its own).
For each query, one warm-up each, then ``--runs`` runs alternating local and S3; every
result is checked against DuckDB's over the local files. Prints per-query medians and
the last line ``s3_ratio: X`` (geometric mean over the queries of S3 median ÷ local median).

What limits it here: moto is a Python (werkzeug) server, one request at a time per
connection, serving objects from memory; a real store serves ranged reads in parallel.

    python -m benchmarks.micro.object_store [--sf 1] [--workers 2] [--queries 1,6] [--runs 3]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

if __name__ == "__main__" and not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import flight
from benchmarks.local_s3 import ACCESS_KEY, SECRET_KEY, local_s3
from benchmarks.tpch import ensure_tpch
from benchmarks.tpch_queries import ORDERED, TABLES, compare, duckdb_answer, query, tpch_files

BUCKET = "flight-bench-object-store"


def _timed(ex: flight.DistributedExec) -> tuple[float, object]:
    started = time.perf_counter()
    got = ex.to_table()
    return time.perf_counter() - started, got


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sf", type=float, default=1.0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--queries", default="1,6")
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args(argv)
    numbers = [int(q) for q in args.queries.split(",")]
    root = ensure_tpch(args.sf, TABLES)
    local = tpch_files(root, TABLES)
    expected = {n: duckdb_answer(n, local) for n in numbers}
    ratios = []
    ok = True
    with local_s3() as s3:
        s3.bucket(BUCKET)
        started = time.perf_counter()
        remote = {t: s3.upload(local[t], f"{BUCKET}/tpch/{t}") for t in TABLES}
        print(f"TPC-H SF {args.sf:g}, {args.workers} workers; uploaded to moto on {s3.endpoint} in {time.perf_counter() - started:.1f}s")
        flight.configure_storage({**s3.fs_options, "s3.access_key": ACCESS_KEY, "s3.secret_key": SECRET_KEY})
        with (
            flight.LocalCluster(args.workers, data_roots=[root]) as disk,
            flight.LocalCluster(args.workers, data_roots=[f"s3://{BUCKET}/tpch"], fs_options=s3.fs_options, env=s3.env) as store,
        ):
            print(f"{'query':>5} {'local s':>8} {'s3 s':>8} {'ratio':>6}  result")
            for n in numbers:
                runs: dict[str, list[float]] = {"local": [], "s3": []}
                for files, urls in ((local, disk.urls), (remote, store.urls)):
                    _timed(flight.DistributedExec(query(n, files), urls))  # type: ignore[arg-type]  # warm-up
                verdicts = []
                for _ in range(args.runs):
                    for name, files, urls in (("local", local, disk.urls), ("s3", remote, store.urls)):
                        seconds, got = _timed(flight.DistributedExec(query(n, files), urls))  # type: ignore[arg-type]
                        runs[name].append(seconds)
                        verdicts.append(compare(got, expected[n], ORDERED.get(n)))  # type: ignore[arg-type]
                a, b = statistics.median(runs["local"]), statistics.median(runs["s3"])
                ratios.append(b / a)
                bad = [v for v in verdicts if v is not None]
                ok &= not bad
                print(f"{n:>5} {a:>8.3f} {b:>8.3f} {b / a:>6.2f}  {'matches DuckDB' if not bad else bad[0]}", flush=True)
    print(f"s3_ratio: {math.exp(statistics.fmean(math.log(r) for r in ratios)):.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
