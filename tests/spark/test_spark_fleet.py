"""Workers on the Spark cluster (``flight.spark.start_workers``): who may register.

The registry's rules, without sockets; then a classic session's fleet (the session's ``local[2,3]``:
a failed task is tried up to three times): a worker starts as a Spark task and registers, answers
``health`` and runs a query (checked against pyarrow's own group-by); its process is SIGKILLed and
Spark's retry registers another, which the resolver follows; ``stop()`` leaves no worker process
(checked by PID). On two executor JVMs, from Spark Connect: tests/spark/test_spark_connect.py (one
Spark application for both, as each costs a JVM start).
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import pyarrow as pa
import pytest
from spark_support import fleet_pids
from support import wait_until

import flight
import flight.spark as fs
from flight.spark._fleet import Registry
from flight.wire.clients import health_check

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


def test_workers_run_as_spark_tasks_and_follow_the_fleet(spark: Any) -> None:
    table = pa.table({"k": [i % 7 for i in range(7000)], "v": list(range(7000))})
    want = {r["k"]: r["v_sum"] for r in table.group_by("k").aggregate([("v", "sum")]).to_pylist()}
    query = flight.from_arrow(table).aggregate("k", v_sum=flight.agg.sum("v"))

    def answer(resolver: flight.WorkerResolver) -> dict[int, int]:
        got = flight.DistributedExec(query, resolver).to_table()
        return dict(zip(got.column("k").to_pylist(), got.column("v_sum").to_pylist(), strict=True))

    with fs.start_workers(spark, 1, start_timeout=60) as fleet:
        (first,) = fleet.urls
        assert health_check(first, 5.0) is None
        (pid,) = fleet_pids()
        with fleet.resolver(interval=0.2) as resolver:
            assert answer(resolver) == want
            os.kill(pid, signal.SIGKILL)  # its task fails; Spark's retry starts another worker, which registers
            wait_until(lambda: fleet.urls not in ([], [first]), 60.0, "a new worker to register")
            wait_until(lambda: resolver.get_urls() == fleet.urls, 10.0, "the resolver to follow")
            assert answer(resolver) == want
        pids = fleet_pids()
        assert pids and pid not in pids
    wait_until(lambda: not fleet_pids(), 30.0, "the fleet's workers to exit after stop()")
