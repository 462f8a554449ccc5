"""Spark offload: TPC-H queries in Spark SQL vs the same SQL run by flight-exec and read into Spark.

For each query, interleaved, median of ``--runs`` after a warm-up:

* (a) Spark SQL on ``local[2]`` over the Parquet files (Spark's own reader), collected to Arrow;
* (b) ``spark.read.format("flight").option("coordinator", URL).option("sql", SQL)`` against a
  ``flight-coordinator`` on two workers, collected the same way: from the start to the DataFrame
  collected in Spark.

Both answers are compared with DuckDB's. Then **pushdown**: a filter keeping about 1 % of
``lineitem`` on ``l_orderkey`` (its files are sorted by it), through Spark with the data source's
pushdown asked for and without; the bytes the workers sent to Spark and the rows the scan stage made,
from the service's API. Figure lines last: ``spark_offload_geomean`` (Spark's time ÷ flight's; goal
≥ 3), ``spark_pushdown_bytes_ratio`` (with ÷ without; goal ≤ 0.1).

    python -m benchmarks.micro.spark_offload [--sf 1] [--runs 5] [--queries 1,3,9,18,21]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pyarrow.parquet as pq

import flight
import flight.spark as fs
from benchmarks.micro._service import coordinator
from benchmarks.tpch import ensure_tpch
from benchmarks.tpch_queries import ORDERED, TABLES, compare, decimals_as_numbers, duckdb_connection, duckdb_table, tpch_files
from benchmarks.tpch_sql import SQL

DEFAULT_QUERIES = "1,3,9,18,21"


def log(msg: str) -> None:
    print(f"[spark_offload] {msg}", file=sys.stderr, flush=True)


def session(tmp: Path, cores: int) -> Any:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master(f"local[{cores}]").appName("flight-exec spark_offload")
             .config("spark.ui.enabled", "false").config("spark.driver.memory", "4g")
             .config("spark.sql.shuffle.partitions", str(2 * cores)).config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1").config("spark.sql.session.timeZone", "UTC")
             .config("spark.local.dir", str(tmp)).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def api(page: str, path: str) -> Any:
    with urllib.request.urlopen(page + path, timeout=30) as response:
        return json.loads(response.read())


def moved(page: str, marker: str) -> tuple[int, int]:
    """(bytes the head tasks sent, rows the leaf stage made) of the latest statement whose SQL holds ``marker``."""
    data = api(page, "api/queries")
    query = next(q for q in [*data["running"], *data["ended"]] if marker in q["sql"])
    stages = api(page, f"api/queries/{query['id']}")["stages"]
    head = sum(t["bytes"] for s in stages if not s["consumers"] for t in s["tasks"])
    leaf = sum(t["rows"] for t in stages[0]["tasks"])
    return head, leaf


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sf", type=float, default=1.0)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--queries", default=DEFAULT_QUERIES)
    p.add_argument("--spark-cores", type=int, default=2)
    args = p.parse_args(argv)
    numbers = [int(q) for q in args.queries.split(",")]
    data_dir = ensure_tpch(args.sf, TABLES)
    files = tpch_files(data_dir, TABLES)
    con = duckdb_connection(files)
    ok, ratios = True, []
    tmp = Path(tempfile.mkdtemp(prefix="spark-offload-"))
    spark = session(tmp, args.spark_cores)
    for table in TABLES:
        spark.read.parquet(*[str(f) for f in files[table]]).createOrReplaceTempView(table)
    fs.register(spark)
    print(f"TPC-H SF {args.sf:g}: Spark SQL local[{args.spark_cores}] vs flight-exec (2 workers, flight-coordinator) read by "
          f"Spark, median of {args.runs}")
    print(f"{'query':>5} {'spark':>8} {'flight':>8} {'spark/flight':>13}")
    with flight.LocalCluster(2, data_roots=[data_dir]) as cluster:
        with coordinator(cluster.urls, files) as (url, page, _):
            for n in numbers:
                want = decimals_as_numbers(duckdb_table(con, SQL[n]))
                times: dict[str, list[float]] = {"spark": [], "flight": []}
                for run in range(args.runs + 1):
                    for way in ("spark", "flight"):
                        started = time.perf_counter()
                        df = spark.sql(SQL[n]) if way == "spark" else (
                            spark.read.format("flight").option("coordinator", url).option("sql", SQL[n]).option("retain", "30").load())
                        got = df.toArrow()
                        elapsed = time.perf_counter() - started
                        difference = compare(decimals_as_numbers(got), want, ORDERED.get(n))
                        if difference is not None:
                            ok = False
                            log(f"Q{n} {way}: differs from DuckDB: {difference}")
                        if run:
                            times[way].append(elapsed)
                s, f = statistics.median(times["spark"]), statistics.median(times["flight"])
                ratios.append(s / f)
                print(f"{'Q' + str(n):>5} {s:8.3f} {f:8.3f} {s / f:13.2f}", flush=True)
            top = max(pq.read_table(files["lineitem"][-1], columns=["l_orderkey"]).column(0).to_pylist())  # files go up by orderkey
            cutoff = max(1, int(top * 0.01))
            text = "select l_orderkey, l_partkey, l_quantity, l_extendedprice, l_shipdate, l_comment from lineitem"
            from pyspark.sql import functions as F

            counts = {}
            for push in ("true", "false"):
                df = (spark.read.format("flight").option("coordinator", url).option("sql", text + f" /* pushdown {push} */")
                      .option("pushdown", push).option("retain", "30").load())
                counts[push] = df.filter(F.col("l_orderkey") < cutoff).count()
            with_push = moved(page, "flight_pushed")
            without = moved(page, "/* pushdown false */")
            if counts["true"] != counts["false"]:
                ok = False
                log(f"pushdown: {counts['true']} rows with it, {counts['false']} without")
            print(f"pushdown of l_orderkey < {cutoff} ({counts['false']} rows): bytes to Spark {with_push[0]:,} with, "
                  f"{without[0]:,} without; rows the scan stage made {with_push[1]:,} with, {without[1]:,} without")
    spark.stop()
    print(f"spark_pushdown_bytes_ratio: {with_push[0] / max(1, without[0]):.4f}")
    print(f"spark_offload_geomean: {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
