"""Shared-queue feeds: each unit exactly once, to whichever task has credit; affinity; failures."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from support import make_table, running_tasks, wait_until

import flight
from flight import col
from flight.dev.testing import SLEEP_SCHEMA, sleep_unit


@pytest.fixture(scope="module")
def skewed(data_roots: list[Path]) -> Iterator[flight.LocalCluster]:
    """Three workers; the first adds 40 ms to every unit (an overloaded node)."""
    extra = [["--unit-delay-ms", "40"], [], []]
    with flight.LocalCluster(3, extensions=["flight.dev.testing"], data_roots=data_roots, per_worker_args=extra) as c:
        yield c


@pytest.fixture(scope="module")
def skewed_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Files of very different sizes (a heavy tail), split in row groups of very different sizes."""
    root = tmp_path_factory.mktemp("skew")
    rng = random.Random(7)
    paths, offset = [], 0
    for i in range(8):
        n = int(200 * rng.paretovariate(1.2))
        path = root / f"f{i}.parquet"
        pq.write_table(make_table(n, offset), path, row_group_size=max(1, n // rng.randint(1, 6)))
        paths.append(path)
        offset += n
    return paths


class RowGroups(flight.WorkUnitFeedProvider):
    """Discovers every row group of every file as a unit: one stream for the whole leaf."""

    shared = True

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths

    def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[flight.Unit]:
        for p in self.paths:
            meta = pq.ParquetFile(p).metadata
            for rg in range(meta.num_row_groups):
                yield flight.Unit(flight.file_unit(str(p), [rg]), rows=meta.row_group(rg).num_rows)


def test_every_unit_exactly_once_under_skew(skewed: flight.LocalCluster, skewed_files: list[Path]) -> None:
    schema = pq.read_schema(skewed_files[0])
    q = flight.read_parquet(RowGroups(skewed_files), schema=schema).filter(col("qty") >= 5).select("id", "qty")
    # Force every worker into play: the row hints alone would justify one task.
    ex = flight.DistributedExec(q, skewed.resolver(), estimator=flight.DefaultTaskEstimator(target_rows_per_task=1))
    got = ex.to_table()

    src = pa.concat_tables(pq.read_table(p) for p in skewed_files)
    expected = src.filter(pc.greater_equal(src["qty"], 5)).select(["id", "qty"])
    assert got.num_rows == expected.num_rows
    assert pc.sum(got["id"]).as_py() == pc.sum(expected["id"]).as_py()
    assert sorted(got["id"].to_pylist()) == sorted(expected["id"].to_pylist())  # no row lost or doubled
    assert ex.metrics is not None
    units = sum(pq.ParquetFile(p).num_row_groups for p in skewed_files)
    assert sum(f.units for t in ex.metrics.tasks for f in t.feeds) == units


def test_slow_worker_gets_fewer_units(skewed: flight.LocalCluster) -> None:
    class Work(flight.WorkUnitFeedProvider):
        shared = True

        def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[bytes]:
            for i in range(90):
                yield sleep_unit(i, ms=5)

    ex = flight.DistributedExec(flight.from_feed(Work(), "testing.sleep", SLEEP_SCHEMA), skewed.resolver())
    got = ex.to_table()
    assert sorted(got["id"].to_pylist()) == list(range(90))
    assert ex.metrics is not None
    per_worker = {t.worker_url: sum(f.units for f in t.feeds) for t in ex.metrics.tasks}
    slow, fast = per_worker[skewed.urls[0]], min(per_worker[u] for u in skewed.urls[1:])
    assert slow < fast, per_worker


def test_affinity_sends_units_to_their_preferred_worker(cluster: flight.LocalCluster) -> None:
    target = cluster.urls[1]

    class Local(flight.WorkUnitFeedProvider):
        shared = True

        def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[flight.Unit]:
            for i in range(40):
                yield flight.Unit(sleep_unit(i, ms=1), preferred_worker=target)

    ex = flight.DistributedExec(
        flight.from_feed(Local(), "testing.sleep", SLEEP_SCHEMA),
        cluster.resolver(),
        estimator=flight.DefaultTaskEstimator(sample_units=40),
        affinity_wait=5.0,  # long enough that the preferred task always has credit in time
    )
    got = ex.to_table()
    assert sorted(got["id"].to_pylist()) == list(range(40))
    assert ex.metrics is not None and len(ex.metrics.tasks) == 2
    per_worker = {t.worker_url: sum(f.units for f in t.feeds) for t in ex.metrics.tasks}  # as the workers counted
    assert per_worker[target] == 40 and per_worker[cluster.urls[0]] == 0


def test_affinity_gives_way_when_the_preferred_worker_is_busy(cluster: flight.LocalCluster) -> None:
    """Units preferring one worker still spread once the wait bound passes (no stall)."""

    class Local(flight.WorkUnitFeedProvider):
        shared = True

        def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[flight.Unit]:
            for i in range(30):
                yield flight.Unit(sleep_unit(i, ms=30), preferred_worker=cluster.urls[0])

    ex = flight.DistributedExec(
        flight.from_feed(Local(), "testing.sleep", SLEEP_SCHEMA),
        cluster.resolver(),
        estimator=flight.DefaultTaskEstimator(sample_units=30),
        affinity_wait=0.01,
    )
    assert sorted(ex.to_table()["id"].to_pylist()) == list(range(30))
    assert ex.metrics is not None
    assert all(sum(f.units for f in t.feeds) > 0 for t in ex.metrics.tasks)


def test_shared_discovery_error_fails_the_query_and_frees_tasks(cluster: flight.LocalCluster) -> None:
    class Breaks(flight.WorkUnitFeedProvider):
        shared = True

        def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[bytes]:
            for i in range(10):
                yield sleep_unit(i, ms=2)
            raise ConnectionError("listing page 2: connection reset")

    with pytest.raises(ConnectionError, match="page 2") as info:
        flight.DistributedExec(flight.from_feed(Breaks(), "testing.sleep", SLEEP_SCHEMA), cluster.resolver()).to_table()
    assert any("shared discovery" in n for n in info.value.__notes__)
    wait_until(lambda: running_tasks(cluster.urls) == 0, timeout=2.0, what="tasks to be freed")


def test_slow_shared_discovery_keeps_tasks_busy(cluster: flight.LocalCluster) -> None:
    done = threading.Event()
    pause = threading.Event()

    class Trickle(flight.WorkUnitFeedProvider):
        shared = True

        def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[bytes]:
            for i in range(40):
                pause.wait(0.02)
                yield sleep_unit(i, ms=20)
            done.set()

    reader = flight.DistributedExec(flight.from_feed(Trickle(), "testing.sleep", SLEEP_SCHEMA), cluster.resolver()).execute()
    first = reader.read_next_batch()
    assert not done.is_set(), "results waited for discovery to finish"
    rest = reader.read_all()
    assert sorted(first["id"].to_pylist() + rest["id"].to_pylist()) == list(range(40))


def test_empty_shared_discovery_gives_empty_result(cluster: flight.LocalCluster) -> None:
    class Nothing(flight.WorkUnitFeedProvider):
        shared = True

        def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[bytes]:
            return iter(())

    ex = flight.DistributedExec(flight.from_feed(Nothing(), "testing.sleep", SLEEP_SCHEMA).select(x=col("id") + 1), cluster.resolver())
    got = ex.to_table()
    assert got.num_rows == 0 and got.schema == pa.schema([("x", pa.int64())])
    assert ex.stage.task_count == 1
