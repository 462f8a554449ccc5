"""Everything of flight.spark from a Spark Connect session, against a local Connect server.

``connect_job.py`` runs in a subprocess (it starts its own Connect server, a JVM, with
``SparkSession.builder.remote("local[2,3]")``; this process's classic SparkContext is the suite's):
a query's result through ``read``, embedded ``sql``, a service's statement with a Spark filter, a
``CREATE TEMPORARY VIEW … USING flight``, a ``map_in_arrow`` stage, and ``start_workers`` with a query
on its fleet, each compared with Spark SQL's rows over the same Parquet file.
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
def test_every_way_works_from_a_spark_connect_session() -> None:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("connect_job.py"))], capture_output=True, text=True,
                          timeout=400, env=env, cwd=Path(__file__).parents[2])
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen == {"session": "pyspark.sql.connect.session", "read": True, "sql": True, "coordinator": True, "view": True,
                    "map_in_arrow": True, "fleet_urls": 1, "fleet_query": True}
