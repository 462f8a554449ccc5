"""Spark Connect, for tests/spark/test_spark_connect.py: the flight integration from a Connect session.

A local Connect server (``SparkSession.builder.remote("local[2,3]")`` starts one, a JVM of its own)
and, beside it, two workers (``LocalCluster``) and a ``flight-coordinator`` over a Parquet table made
here. Prints one JSON line: for each way in (``read``, ``sql``, the service's ``coordinator``/``sql``
options with a filter, ``CREATE TEMPORARY VIEW … USING flight``, ``map_in_arrow``, ``start_workers``)
whether its rows equal Spark SQL's over the same file, and what was left running after.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import flight
import flight.spark as fs


def rows(df) -> list[tuple]:  # type: ignore[no-untyped-def]
    return sorted(tuple(r) for r in df.collect())


def main() -> int:
    spark = SparkSession.builder.remote("local[2,3]").getOrCreate()
    seen: dict[str, object] = {"session": type(spark).__module__}
    tmp = Path(tempfile.mkdtemp(prefix="flight-connect-"))
    table = pa.table({"k": [i % 13 for i in range(20000)], "v": list(range(20000)), "s": [f"n{i % 101}" for i in range(20000)]})
    path = tmp / "t.parquet"
    pq.write_table(table, path, row_group_size=2000)
    spark.read.parquet(str(path)).createOrReplaceTempView("t")
    text = "select k, sum(v) as total, count(*) as n from t group by k"
    want = rows(spark.sql(text))
    with flight.LocalCluster(2, data_roots=[tmp]) as cluster:
        proc = subprocess.Popen([sys.executable, "-m", "flight.service", "--port", "0", "--workers", ",".join(cluster.urls),
                                 "--table", f"t={path}", "--log-level", "WARNING"], stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            url = proc.stdout.readline().split()[-1]
            fs.register(spark)
            query = flight.sql(text, {"t": flight.read_parquet([str(path)])})
            seen["read"] = rows(fs.read(spark, query, cluster.urls)) == want
            seen["sql"] = rows(fs.sql(spark, text, {"t": str(path)}, cluster.urls)) == want
            service = spark.read.format("flight").option("coordinator", url).option("sql", "select k, v, s from t").load()
            where = (F.col("v") < 5000) & F.col("s").startswith("n1")
            seen["coordinator"] = rows(service.filter(where)) == rows(spark.sql("select k, v, s from t").filter(where))
            spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW ft USING flight OPTIONS (coordinator '{url}', sql '{text}')")
            seen["view"] = rows(spark.sql("select * from ft")) == want
            stage = flight.map_input(pa.schema([("id", pa.int64())])).select("id", twice=flight.col("id") * 2)
            mapped = fs.map_in_arrow(spark.range(1000), stage, cluster.urls)
            seen["map_in_arrow"] = rows(mapped) == [(i, 2 * i) for i in range(1000)]
            with fs.start_workers(spark, 1, worker_args=["--data-root", str(tmp)], start_timeout=120) as fleet:
                seen["fleet_urls"] = len(fleet.urls)
                with fleet.resolver() as resolver:
                    seen["fleet_query"] = sorted(flight.DistributedExec(query, resolver).to_table().to_pylist(),
                                                 key=lambda r: r["k"]) == [dict(zip(("k", "total", "n"), r, strict=True)) for r in want]
        finally:
            proc.terminate()
            proc.wait(30)
    spark.stop()
    print(json.dumps(seen), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
