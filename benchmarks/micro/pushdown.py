"""Scan pushdown: a 1 % selective filter on a sorted column, with row-group pruning ÷ without.

Why: a filter right above a Parquet scan lets the reader skip the row groups whose
statistics exclude it (docs/storage.md, "Scan pushdown"); this measures what that saves.

Setup: one Parquet file of ``--rows`` rows sorted on ``k`` (plus three payload columns),
in ``--groups`` row groups, on local disk and in moto's S3 server on loopback; two
workers. The query keeps 1 % of the rows (a range of ``k``) and streams them back. Each
source is run ``--runs`` times with pruning and without (the reader option
``prune=false``), alternating, after a warm-up; each answer is checked against pyarrow's
own filtering of the file. The last line is ``pushdown_speedup: X``: the geometric mean
over the sources of the median time without ÷ with (goal ≥ 5).

    python -m benchmarks.micro.pushdown [--rows 10000000] [--groups 200] [--runs 3]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __name__ == "__main__" and not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import flight
from benchmarks.local_s3 import ACCESS_KEY, SECRET_KEY, local_s3

BUCKET = "flight-bench-pushdown"


def _write(path: Path, rows: int, groups: int) -> None:
    k = pa.array(range(rows), pa.int64())
    table = pa.table({"k": k, "a": pc.multiply(k, 2), "b": pc.cast(k, pa.float64()), "c": pc.cast(pc.bit_wise_and(k, 1023), pa.string())})
    pq.write_table(table, path, row_group_size=max(1, rows // groups))


def _run(uri: str, schema: pa.Schema, low: int, high: int, prune: bool, urls: list[str]) -> tuple[float, pa.Table]:
    scan = flight.from_feed(flight.FileListProvider([uri]), "parquet", schema, options={"prune": "true" if prune else "false"})
    ex = flight.DistributedExec(scan.filter((flight.col("k") >= low) & (flight.col("k") < high)), urls)
    started = time.perf_counter()
    got = ex.to_table()
    return time.perf_counter() - started, got


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--groups", type=int, default=200)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args(argv)
    low = args.rows // 2
    high = low + args.rows // 100
    ok = True
    speedups = []
    with tempfile.TemporaryDirectory(prefix="flight-pushdown-") as tmp, local_s3() as s3:
        path = Path(tmp) / "sorted.parquet"
        _write(path, args.rows, args.groups)
        schema = pq.read_schema(path)
        s3.bucket(BUCKET)
        (remote,) = s3.upload([path], f"{BUCKET}/pushdown")
        flight.configure_storage({**s3.fs_options, "s3.access_key": ACCESS_KEY, "s3.secret_key": SECRET_KEY})
        expected = pq.read_table(path).slice(low, high - low)
        print(f"{args.rows:,} rows sorted on k in {args.groups} row groups; a filter keeping 1% ({high - low:,} rows); 2 workers")
        with flight.LocalCluster(2, data_roots=[tmp, f"s3://{BUCKET}/pushdown"], fs_options=s3.fs_options, env=s3.env) as cluster:
            print(f"{'source':>6} {'pruned s':>9} {'full s':>7} {'speedup':>8}  result")
            for name, uri in (("local", str(path)), ("s3", remote)):
                times: dict[bool, list[float]] = {True: [], False: []}
                for prune in (True, False):
                    _run(uri, schema, low, high, prune, cluster.urls)  # warm-up
                for _ in range(args.runs):
                    for prune in (True, False):
                        seconds, got = _run(uri, schema, low, high, prune, cluster.urls)
                        times[prune].append(seconds)
                        ok &= got.sort_by("k").equals(expected)
                pruned, full = statistics.median(times[True]), statistics.median(times[False])
                speedups.append(full / pruned)
                print(f"{name:>6} {pruned:>9.3f} {full:>7.3f} {full / pruned:>8.1f}  {'matches pyarrow' if ok else 'DIFFERS'}", flush=True)
    print(f"pushdown_speedup: {math.exp(statistics.fmean(math.log(s) for s in speedups)):.1f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
