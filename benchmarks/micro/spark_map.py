"""mapInArrow through flight-exec workers vs the same function in Spark's own Python workers.

TPC-H ``lineitem`` (SF 1: 6 million rows) goes through a filter + projection,
in one SparkSession (``local[2]``), two ways, alternating, in one run:

* flight: ``df.mapInArrow(flight_map(stage, workers))``: each Spark task streams
  its partition up one DoExchange to a worker, which runs the map stage (Acero),
  and streams the result back;
* spark: ``df.mapInArrow(fn)`` where ``fn`` does the same filter and projection
  with ``pyarrow.compute`` inside Spark's Python worker.

Both write to Spark's ``noop`` sink, so the rows are produced and dropped. The
first round checks that both give the same row count and revenue and is not
timed. The last line is ``spark_map_ratio: X`` = median time with flight_map /
median time without (lower is better).

    python benchmarks/micro/spark_map.py [--sf 1] [--runs 5] [--workers 2]
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

if __name__ == "__main__" and not __package__:
    # Run as `python benchmarks/micro/spark_map.py`: the repo root holds the benchmarks package.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pyarrow as pa
import pyarrow.compute as pc

import flight
import flight.spark
from benchmarks.tpch import ensure_tpch, table_files
from flight import col, lit

COLUMNS = ["l_orderkey", "l_quantity", "l_extendedprice", "l_discount", "l_returnflag", "l_shipdate"]
CUTOFF = dt.date(1998, 9, 2)
MAX_QTY = 25


def log(msg: str) -> None:
    print(f"[spark_map] {msg}", file=sys.stderr, flush=True)


def stage(input_schema: pa.Schema) -> flight.Query:
    """The flight-exec map stage: filter, then project."""
    return (
        flight.map_input(input_schema)
        .filter((col("l_shipdate") <= lit(CUTOFF)) & (col("l_quantity").cast(pa.float64()) < MAX_QTY))
        .select(
            "l_orderkey",
            "l_returnflag",
            revenue=col("l_extendedprice").cast(pa.float64()) * (1 - col("l_discount").cast(pa.float64())),
        )
    )


def local_map(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The same filter and projection with pyarrow.compute, in Spark's Python worker."""
    cutoff = pa.scalar(CUTOFF, pa.date32())
    for b in batches:
        keep = pc.and_(pc.less_equal(b["l_shipdate"], cutoff), pc.less(pc.cast(b["l_quantity"], pa.float64()), MAX_QTY))
        b = b.filter(keep)
        price = pc.cast(b["l_extendedprice"], pa.float64())
        revenue = pc.multiply(price, pc.subtract(1, pc.cast(b["l_discount"], pa.float64())))
        yield pa.RecordBatch.from_arrays([b["l_orderkey"], b["l_returnflag"], revenue], names=["l_orderkey", "l_returnflag", "revenue"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sf", type=float, default=1.0)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-rows", type=int, default=10_000, help="spark.sql.execution.arrow.maxRecordsPerBatch")
    args = p.parse_args(argv)

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    log(f"TPC-H SF {args.sf}: generating or reusing lineitem")
    files = [str(f) for f in table_files(ensure_tpch(args.sf, ["lineitem"]), "lineitem")]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("flight-exec spark_map benchmark")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(args.batch_rows))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        with flight.LocalCluster(args.workers) as cluster:
            df = spark.read.parquet(*files).select(*COLUMNS)
            rows = df.count()
            fm = flight.spark.flight_map(stage(flight.spark.input_schema(df)), cluster.urls)
            ways = {
                "flight": df.mapInArrow(fm, fm.schema),
                "spark": df.mapInArrow(local_map, fm.schema),
            }
            checks = {
                name: out.agg(F.count("*").alias("n"), F.sum("revenue").alias("r")).collect()[0] for name, out in ways.items()
            }
            (n1, r1), (n2, r2) = checks["flight"], checks["spark"]
            if n1 != n2 or not math.isclose(r1, r2, rel_tol=1e-9):
                print(f"results differ: flight {n1} rows, revenue {r1}; spark {n2} rows, revenue {r2}")
                return 1
            log(f"{rows} rows in, {n1} out; both ways agree")
            times: dict[str, list[float]] = {name: [] for name in ways}
            for i in range(args.runs):
                for name, out in ways.items():
                    started = time.perf_counter()
                    out.write.format("noop").mode("overwrite").save()
                    times[name].append(time.perf_counter() - started)
                log(f"round {i + 1}: " + ", ".join(f"{n} {t[-1]:.2f}s" for n, t in times.items()))
    finally:
        spark.stop()
    flight_t, spark_t = statistics.median(times["flight"]), statistics.median(times["spark"])
    print(f"lineitem SF {args.sf:g}: {rows} rows, {args.workers} workers, median of {args.runs}")
    print(f"mapInArrow with flight_map:      {flight_t:7.2f}s")
    print(f"mapInArrow with pyarrow.compute: {spark_t:7.2f}s")
    print(f"spark_map_ratio: {flight_t / spark_t:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
