"""Detached queries whose head outputs are retained: read any number of times, released or timed out.

Real workers; the head partitions are read with plain Flight ``DoGet``s (what a
Spark task does), and the rows compared with pyarrow's own computation.
"""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl
import pyarrow.parquet as pq
import pytest
from support import running_tasks, wait_until

import flight
from flight.coordinator.detached import DetachedQuery
from flight.plan.expr import col
from flight.wire.clients import read_stream


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory, data_roots: list[Path]) -> list[Path]:
    root = data_roots[0] / "detached"
    root.mkdir(exist_ok=True)
    files = []
    for i in range(3):
        path = root / f"part-{i}.parquet"
        keys = range(i * 50_000, (i + 1) * 50_000)
        pq.write_table(pa.table({"k": pa.array(keys, pa.int64()), "pad": [f"{k:040d}" for k in keys]}), path)
        files.append(path)
    return files


def read_all(query: DetachedQuery) -> pa.Table:
    batches = []
    for p in query.partitions:
        with fl.connect(p.url) as client:
            batches += list(read_stream(client, p.ticket))
    return pa.Table.from_batches(batches, schema=query.schema)


def expected(files: list[Path]) -> list[int]:
    table = pa.concat_tables([pq.read_table(f) for f in files])
    return sorted(table.filter(pc.less(table["k"], 120_000))["k"].to_pylist())


def test_retained_head_outputs_are_read_again_then_released(cluster: flight.LocalCluster, data: list[Path]) -> None:
    q = flight.read_parquet(data).filter(col("k") < 120_000)
    # A small output bound (1 MiB; each head task has about 2.5 MB of rows): the rest is spilled to
    # the worker's disk, and read back from there by every reader.
    query = flight.DistributedExec(q, cluster.urls, output_buffer_bytes=1 << 20).start_detached(retain=60)
    try:
        for _ in range(3):  # three readers, one after the other, each from the start
            assert sorted(read_all(query)["k"].to_pylist()) == expected(data)
        assert running_tasks(cluster.urls) >= 1  # still there: retained until released
    finally:
        query.release()
    assert query.wait(10)
    wait_until(lambda: running_tasks(cluster.urls) == 0, what="the released query's tasks to be freed")
    with pytest.raises(fl.FlightError, match="no task"):
        read_all(query)  # released: gone


def test_a_retained_query_nobody_releases_ends_after_its_retain_time(cluster: flight.LocalCluster, data: list[Path]) -> None:
    started = time.monotonic()
    query = flight.DistributedExec(flight.read_parquet(data), cluster.urls).start_detached(retain=1.5)
    assert read_all(query).num_rows == 150_000
    assert query.wait(30)  # the backstop released it
    assert time.monotonic() - started >= 1.5
    wait_until(lambda: running_tasks(cluster.urls) == 0, what="the expired query's tasks to be freed")


def test_negative_retain_is_refused(cluster: flight.LocalCluster, data: list[Path]) -> None:
    with pytest.raises(ValueError, match="retain"):
        flight.DistributedExec(flight.read_parquet(data), cluster.urls).start_detached(retain=-1)
