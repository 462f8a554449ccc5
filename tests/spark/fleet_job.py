"""A Spark application on ``local-cluster[2,1,1024]`` (two executor JVMs) that runs a flight fleet, for
tests/spark/test_spark_fleet.py: one SparkContext per process, and the suite's own is ``local[2,3]``.

Prints one JSON line of what it saw: the workers' URLs at start, their health, the query's answers,
the URLs after one worker's process was killed, and the worker PIDs left after ``stop()``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pyarrow as pa
from pyspark.sql import SparkSession

import flight
import flight.spark as fs
from flight.wire.clients import health_check


def fleet_pids() -> set[int]:
    """flight-worker processes whose parent is a Spark Python worker."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes()
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            parent = (Path("/proc") / str(ppid) / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if b"flight.worker" in cmd and b"pyspark" in parent:
            found.add(int(entry.name))
    return found


def wait(predicate, seconds: float) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def main() -> int:
    spark = (SparkSession.builder.master("local-cluster[2,1,1024]").appName("flight fleet test")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false").config("spark.task.maxFailures", "3").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    seen: dict[str, object] = {}
    table = pa.table({"k": [i % 7 for i in range(7000)], "v": list(range(7000))})
    query = flight.from_arrow(table).aggregate("k", v_sum=flight.agg.sum("v"))

    def answer(resolver: flight.WorkerResolver) -> dict[str, int]:
        got = flight.DistributedExec(query, resolver).to_table()
        return {str(k): v for k, v in zip(got.column("k").to_pylist(), got.column("v_sum").to_pylist(), strict=True)}

    try:
        with fs.start_workers(spark, 2, start_timeout=120) as fleet:
            first = fleet.urls
            seen["urls"] = first
            seen["healthy"] = [health_check(u, 5.0) is None for u in first]
            seen["pids"] = len(fleet_pids())
            with fleet.resolver(interval=0.2) as resolver:
                seen["answer"] = answer(resolver)
                os.kill(min(fleet_pids()), signal.SIGKILL)
                seen["replaced"] = wait(lambda: len(fleet.urls) == 2 and fleet.urls != first, 90.0)
                seen["urls_after"] = fleet.urls
                seen["followed"] = wait(lambda: resolver.get_urls() == fleet.urls, 10.0)
                seen["answer_after"] = answer(resolver)
        seen["left_after_stop"] = sorted(fleet_pids()) if not wait(lambda: not fleet_pids(), 30.0) else []
    finally:
        spark.stop()
    print(json.dumps(seen), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
