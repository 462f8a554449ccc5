"""Spark Connect on two executor JVMs, for tests/spark/test_spark_connect.py: every flight.spark way.

A local Connect server whose master is ``local-cluster[2,1,1024]`` (``SparkSession.builder.remote``
starts it: a driver JVM and two executor JVMs of one core each) and, beside it, two workers
(``LocalCluster``) and a ``flight-coordinator`` over a Parquet table made here. Prints one JSON
line: for each way (``read``, ``sql``, the service's ``coordinator``/``sql`` options with a filter,
``CREATE TEMPORARY VIEW … USING flight``, ``map_in_arrow``) whether its rows equal Spark SQL's over
the same file; then a fleet of two workers on the executors (``start_workers``): registered and
healthy, a query on it, one worker SIGKILLed and replaced by Spark's retry of its task (the
resolver follows), the query again, and no worker process left after ``stop()``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from spark_support import fleet_pids  # this script's directory is on sys.path

import flight
import flight.spark as fs
from flight.wire.clients import health_check


def wait(predicate: Callable[[], bool], seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def rows(df) -> list[tuple]:  # type: ignore[no-untyped-def]
    return sorted(tuple(r) for r in df.collect())


def main() -> int:
    spark = SparkSession.builder.remote("local-cluster[2,1,1024]").getOrCreate()
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
            # A Connect DataFrame as a table, joined on the workers with the Parquet file (Spark SQL the oracle).
            events = spark.range(3000).selectExpr("id % 13 AS k", "id AS e")
            events.createOrReplaceTempView("events")
            joined = "select t.k, count(*) as n, sum(e.e) as se from events e join t on e.k = t.k where t.v < 700 group by t.k"
            fed = fs.sql(spark, joined, {"events": fs.table(events, name="events", partitions=3), "t": str(path)}, cluster.urls)
            seen["table"] = rows(fed) == rows(spark.sql(joined))
            expected = [dict(zip(("k", "total", "n"), r, strict=True)) for r in want]

            def answer(resolver: flight.WorkerResolver) -> bool:
                return sorted(flight.DistributedExec(query, resolver).to_table().to_pylist(), key=lambda r: r["k"]) == expected

            # Last: the fleet takes both executors' task slots (one core each) for its life.
            with fs.start_workers(spark, 2, worker_args=["--data-root", str(tmp)], start_timeout=120) as fleet:
                first = fleet.urls
                seen["fleet_urls"] = len(first)
                seen["fleet_healthy"] = all(health_check(u, 5.0) is None for u in first)
                seen["fleet_pids"] = len(fleet_pids())
                with fleet.resolver(interval=0.2) as resolver:
                    seen["fleet_query"] = answer(resolver)
                    os.kill(min(fleet_pids()), signal.SIGKILL)  # its task fails; Spark's retry registers a new worker
                    seen["fleet_replaced"] = wait(lambda: len(fleet.urls) == 2 and len(set(fleet.urls) - set(first)) == 1, 90.0)
                    seen["fleet_followed"] = wait(lambda: resolver.get_urls() == fleet.urls, 10.0)
                    seen["fleet_query_after"] = answer(resolver)
            seen["fleet_left_after_stop"] = [] if wait(lambda: not fleet_pids(), 30.0) else sorted(fleet_pids())
        finally:
            proc.terminate()
            proc.wait(30)
    spark.stop()
    print(json.dumps(seen), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
