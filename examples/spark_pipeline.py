"""A Spark job with a flight-exec step in the middle.

1. Spark reads TPC-H ``lineitem`` from Parquet.
2. A flight-exec map stage enriches it on the workers (``mapInArrow`` with
   ``flight.spark.map_in_arrow``): keep shipped lines, compute the discounted
   revenue and charge, the ship year, and whether the line arrived late.
3. The result goes back into Spark SQL (a temporary view and a GROUP BY).
4. Spark writes the summary to Parquet.

Run it from the repository root after ``pip install -e '.[dev,spark]'``::

    python examples/spark_pipeline.py --out /tmp/lineitem_summary [--sf 0.05]

It generates (once) and caches the TPC-H data with ``tpchgen-cli``, starts two
local workers and a ``local[2]`` SparkSession, and prints the summary.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

if __name__ == "__main__" and not __package__:
    # Run as `python examples/spark_pipeline.py`: the repo root holds the benchmarks package (TPC-H data).
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import flight
import flight.spark
from flight import col, if_else, lit

SUMMARY_SQL = """
SELECT l_returnflag, l_linestatus, ship_year,
       count(*)                 AS lines,
       sum(revenue)             AS revenue,
       sum(charge)              AS charge,
       sum(late)                AS late_lines
FROM enriched
GROUP BY l_returnflag, l_linestatus, ship_year
ORDER BY l_returnflag, l_linestatus, ship_year
"""

COLUMNS = ["l_orderkey", "l_returnflag", "l_linestatus", "l_extendedprice", "l_discount", "l_tax",
           "l_shipdate", "l_commitdate", "l_receiptdate"]
CUTOFF = dt.date(1998, 9, 2)


def enrich_stage(input_schema: pa.Schema) -> flight.Query:
    """The map stage the workers run on every Spark partition."""
    price = col("l_extendedprice").cast(pa.float64())
    revenue = price * (1 - col("l_discount").cast(pa.float64()))
    return (
        flight.map_input(input_schema)
        .filter(col("l_shipdate") <= lit(CUTOFF))
        .select(
            "l_orderkey",
            "l_returnflag",
            "l_linestatus",
            revenue=revenue,
            charge=revenue * (1 + col("l_tax").cast(pa.float64())),
            ship_year=col("l_shipdate").year().cast(pa.int32()),
            late=if_else(col("l_receiptdate") > col("l_commitdate"), lit(1), lit(0)),
        )
    )


def run_pipeline(spark, workers: Sequence[str], lineitem: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str]):  # type: ignore[no-untyped-def]
    """Steps 1-4; returns the summary DataFrame (read back from ``out``)."""
    lineitem_df = spark.read.parquet(*[str(p) for p in lineitem]).select(*COLUMNS)            # 1. Spark reads
    stage = enrich_stage(flight.spark.input_schema(lineitem_df))
    enriched = flight.spark.map_in_arrow(lineitem_df, stage, list(workers))                 # 2. workers enrich
    enriched.createOrReplaceTempView("enriched")
    spark.sql(SUMMARY_SQL).write.mode("overwrite").parquet(str(out))                        # 3. SQL, 4. write
    return spark.read.parquet(str(out)).orderBy("l_returnflag", "l_linestatus", "ship_year")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="directory to write the summary Parquet to")
    p.add_argument("--sf", type=float, default=0.05, help="TPC-H scale factor (default 0.05)")
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args(argv)

    from pyspark.sql import SparkSession

    from benchmarks.tpch import ensure_tpch, table_files

    lineitem = table_files(ensure_tpch(args.sf, ["lineitem"]), "lineitem")
    # Spark's Python workers must run this interpreter (it has flight-exec installed).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("flight-exec spark pipeline")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        roots = sorted({str(Path(p).resolve().parent) for p in lineitem})  # the workers read only under these
        with flight.LocalCluster(args.workers, data_roots=roots) as cluster:
            summary = run_pipeline(spark, cluster.urls, lineitem, args.out)
            summary.show(50, truncate=False)
            print(f"wrote {summary.count()} rows to {args.out}")
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
