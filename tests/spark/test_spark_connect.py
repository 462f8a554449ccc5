"""Everything of flight.spark from a Spark Connect session on two executor JVMs, and a fleet on them.

``connect_job.py`` runs in a subprocess (it starts its own Connect server on
``local-cluster[2,1,1024]``: a process has one SparkContext, and this one's is the suite's): a query's
result through ``read``, embedded ``sql``, a service's statement with a Spark filter, a ``CREATE
TEMPORARY VIEW … USING flight``, a ``map_in_arrow`` stage and a DataFrame as a table (``flight.spark.table``), each compared with Spark SQL's rows over
the same Parquet file; then ``start_workers`` puts a worker on each executor, one is SIGKILLed and
Spark's retry of its task registers a replacement the resolver follows, and ``stop()`` leaves no
worker process (checked by PID).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark.sql.connect.session", reason="Spark Connect needs the spark extra (pyspark[connect])")

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.mark.required
@pytest.mark.timeout(420)  # a Spark application of its own: three JVMs to start, a worker to replace (87 s in CI)
def test_every_way_works_from_a_spark_connect_session() -> None:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("connect_job.py"))], capture_output=True, text=True,
                          timeout=400, env=env, cwd=Path(__file__).parents[2])
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    ways = {k: seen.pop(k) for k in ("session", "read", "sql", "coordinator", "view", "map_in_arrow", "table")}
    assert ways == {"session": "pyspark.sql.connect.session", "read": True, "sql": True, "coordinator": True, "view": True,
                    "map_in_arrow": True, "table": True}
    # The fleet on the executors: two workers, healthy, a query; one killed and replaced; none left after stop().
    assert seen == {"fleet_urls": 2, "fleet_healthy": True, "fleet_pids": 2, "fleet_query": True, "fleet_replaced": True,
                    "fleet_followed": True, "fleet_query_after": True, "fleet_left_after_stop": []}
