"""A ``flight.spark.read`` DataFrame whose worker is killed while Spark reads it.

Spark runs ``local[2,3]`` (the session's ``spark``, tests/conftest.py): two task threads, and a
failed task is retried (up to three attempts), as on a cluster. The driver replaces the lost head task on another worker
(same stage key, every unit it had been sent); the retried Spark task finds it there.
The answer is checked against the rows the feed describes, built here in Python.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import running_tasks, wait_until

import flight
import flight.spark as fs
from flight.dev.testing import SLEEP_SCHEMA, sleep_unit

pyspark = pytest.importorskip("pyspark", reason="the Spark tests need the spark extra: pip install -e '.[dev,spark]'")

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PARTITIONS, UNITS, ROWS = 3, 60, 50


class Units(flight.WorkUnitFeedProvider):
    def partitions(self) -> int:
        return PARTITIONS

    def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[bytes]:
        for i in range(UNITS):
            yield sleep_unit(partition * 1000 + i, rows=ROWS)


def expected_rows() -> list[tuple[int, int]]:
    return sorted((p * 1000 + i, r) for p in range(PARTITIONS) for i in range(UNITS) for r in range(ROWS))


def test_a_read_survives_a_worker_killed_during_its_job(spark, data_roots: list[Path]) -> None:  # type: ignore[no-untyped-def]
    # The victim takes 40 ms a unit: its head task is still producing when it is killed.
    args = [[], ["--unit-delay-ms", "40"], []]
    with flight.LocalCluster(3, data_roots=data_roots, per_worker_args=args, extensions=["flight.dev.testing"]) as cluster:
        victim, url = cluster.processes[1], cluster.urls[1]
        with fs.start_read(spark, flight.from_feed(Units(), "testing.sleep", SLEEP_SCHEMA), cluster.urls) as handle:
            wait_until(lambda: running_tasks([url]) > 0, timeout=30.0, what="the victim to run its head task")
            killer = threading.Timer(0.8, lambda: victim.send_signal(signal.SIGKILL))
            killer.start()
            first = sorted(tuple(r) for r in handle.df.collect())
            killer.join()
            assert first == expected_rows()
            # A second action reads every partition again, the replaced one from its new worker.
            assert sorted(tuple(r) for r in handle.df.collect()) == first
            lost = [a for a in handle.query.attempts if a.replayed is not None]
            assert [a.lost for a in lost] == [(url,)], handle.query.attempts
            assert lost[0].replaced_by in cluster.urls and lost[0].replaced_by != url
        wait_until(lambda: running_tasks([u for u in cluster.urls if u != url]) == 0, what="the released query's tasks to be freed")


def test_a_multi_stage_read_survives_a_worker_killed_during_its_job(spark, data_roots: list[Path]) -> None:  # type: ignore[no-untyped-def]
    # An aggregate: a scan stage below a hash-partitioned head. The tasks the victim took (scan and
    # head) run again on the others under a new epoch, the head tasks that read them too; the
    # retained head task keeps its key on another worker, where the retried Spark task finds it: its
    # first worker, a survivor the task moved from, answers UNAVAILABLE (Cancel.lost_worker), not NOT_FOUND.
    args = [[], ["--unit-delay-ms", "40"], []]
    query = flight.from_feed(Units(), "testing.sleep", SLEEP_SCHEMA).aggregate(["id"], n=flight.agg.count_all())
    expected = sorted((p * 1000 + i, ROWS) for p in range(PARTITIONS) for i in range(UNITS))
    with flight.LocalCluster(3, data_roots=data_roots, per_worker_args=args, extensions=["flight.dev.testing"]) as cluster:
        victim, url = cluster.processes[1], cluster.urls[1]
        with fs.start_read(spark, query, cluster.urls) as handle:
            wait_until(lambda: running_tasks([url]) > 0, timeout=30.0, what="the victim to run its tasks")
            killer = threading.Timer(0.8, lambda: victim.send_signal(signal.SIGKILL))
            killer.start()
            first = sorted(tuple(r) for r in handle.df.collect())
            killer.join()
            assert first == expected
            assert sorted(tuple(r) for r in handle.df.collect()) == first
            assert {a.lost for a in handle.query.attempts} == {(url,)}, handle.query.attempts
