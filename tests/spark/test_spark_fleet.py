"""Workers on the Spark cluster (``flight.spark.start_workers``): started as Spark tasks, found, replaced, stopped.

The registry's rules are checked without sockets. Then a Spark application of its own
(``fleet_job.py``, in a subprocess: a process has one SparkContext, and the suite's is ``local[2,3]``)
on ``local-cluster[2,1,1024]``, two executor JVMs of one core each: two workers start as Spark tasks
and register, answer ``health`` and run a query (checked against pyarrow's own group-by); one's
process is SIGKILLed, Spark's retry of its task starts another that registers at a new URL, which
the resolver follows, and the query runs again; ``stop()`` leaves no worker process (checked by PID).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from flight.spark._fleet import Registry

pyspark = pytest.importorskip("pyspark", reason="the Spark tests need the spark extra: pip install -e '.[dev,spark]'")

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SECRET = "s" * 64


def body(**fields: object) -> bytes:
    return json.dumps({"secret": SECRET, "index": 0, "attempt": 0, "url": "grpc://127.0.0.1:9000", **fields}).encode()


def test_the_registry_takes_only_its_fleets_workers() -> None:
    r = Registry(SECRET, workers=2, expire=5.0)
    with pytest.raises(PermissionError):
        r.register(body(secret="x" * 64), 0.0)
    with pytest.raises(ValueError, match="field 'index'"):
        r.register(body(index=2), 0.0)
    with pytest.raises(ValueError, match="field 'url'"):
        r.register(body(url="http://evil/path?x=1"), 0.0)
    with pytest.raises(ValueError, match="at most"):
        r.register(b"{" + b" " * 5000 + b"}", 0.0)
    with pytest.raises(ValueError, match="JSON object"):
        r.register(b"[1]", 0.0)
    assert r.register(body(), 0.0) == "grpc://127.0.0.1:9000"
    r.register(body(attempt=1, url="grpc://127.0.0.1:9001"), 1.0)  # Spark's retry of the task: the index's new URL
    with pytest.raises(ValueError, match="replaced by attempt 1"):
        r.register(body(attempt=0), 2.0)  # the old attempt, late
    r.register(body(index=1, url="grpc://127.0.0.1:9002"), 2.0)
    assert r.live(3.0) == ["grpc://127.0.0.1:9001", "grpc://127.0.0.1:9002"]
    assert r.live(6.5) == ["grpc://127.0.0.1:9002"]  # task 0 stopped beating 5.5 s ago


@pytest.mark.required
def test_workers_run_as_spark_tasks_on_executors_and_follow_the_fleet() -> None:
    """Two executor JVMs (``local-cluster[2,1,1024]``), a worker on each, one killed and replaced, then stopped."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("fleet_job.py"))], capture_output=True, text=True,
                          timeout=400, env=env, cwd=Path(__file__).parents[2])
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    table = pa.table({"k": [i % 7 for i in range(7000)], "v": list(range(7000))})
    want = {str(r["k"]): r["v_sum"] for r in table.group_by("k").aggregate([("v", "sum")]).rename_columns(["k", "v_sum"]).to_pylist()}
    assert len(seen["urls"]) == 2 and seen["healthy"] == [True, True] and seen["pids"] == 2, seen
    assert seen["answer"] == want and seen["answer_after"] == want, seen
    assert seen["replaced"] and seen["followed"] and len(set(seen["urls_after"]) - set(seen["urls"])) == 1, seen
    assert seen["left_after_stop"] == [], seen
