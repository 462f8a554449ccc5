"""Which keys an aggregate's rows are hash-shuffled on (``flight.planner.colocate.spread_keys``).

A worker hashes only a shuffle's non-string keys when it has any (docs/protocol.md, "Output
partitioning"); when the footers bound those to few values, the planner shuffles on the string
keys instead, so that the groups spread over the tasks (TPC-H Q16: 8 sizes, 88% of the rows in
one of two tasks). Answers are compared with DuckDB's.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import flight
from flight.engine.partition import partition_ids
from flight.planner.stages import StageSpec

N = 40_000


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("spread")
    table = pa.table({
        "brand": pa.array([f"Brand#{i % 23}" for i in range(N)]),
        "kind": pa.array([f"kind {i % 37}" for i in range(N)]),
        "size": pa.array([i % 8 for i in range(N)], pa.int32()),  # the footers bound it to 8 values
        "wide": pa.array([(i * 7919) % 100_000 for i in range(N)], pa.int64()),
        "v": pa.array(range(N), pa.int64()),
    })
    paths = []
    for i in range(4):
        path = root / f"part{i}.parquet"
        pq.write_table(table.slice(i * N // 4, N // 4), path)
        paths.append(path)
    return paths


def _hashed(ex: flight.DistributedExec) -> list[StageSpec]:
    return [s for s in ex.plan.stages if s.output_mode == "hash"]


def test_few_values_of_the_other_keys_shuffle_on_the_string_keys(files: list[Path]) -> None:
    q = flight.read_parquet(files).aggregate(["brand", "kind", "size"], n=flight.agg.count_all(), s=flight.agg.sum("v"))
    (stage,) = _hashed(flight.DistributedExec(q, ["grpc://127.0.0.1:1", "grpc://127.0.0.1:2"], small_query_bytes=0))
    assert stage.output_keys == ["brand", "kind"]
    # What it avoids: hashed on the size alone (the worker's rule), two tasks get very uneven shares.
    sizes = pa.record_batch({"size": pa.array([i % 8 for i in range(N)], pa.int32())})
    shares = [int(c) for c in pa.array(partition_ids(sizes, ["size"], 2).to_numpy()).value_counts().field(1).to_pylist()]
    assert max(shares) > 0.6 * N, shares


def test_many_values_keep_every_key(files: list[Path]) -> None:
    q = flight.read_parquet(files).aggregate(["brand", "wide"], n=flight.agg.count_all())
    (stage,) = _hashed(flight.DistributedExec(q, ["grpc://127.0.0.1:1", "grpc://127.0.0.1:2"], small_query_bytes=0))
    assert stage.output_keys == ["brand", "wide"]


def test_computed_keys_are_kept(files: list[Path]) -> None:
    # A computed key's values are not bounded by any footer: nothing is assumed about them.
    q = flight.read_parquet(files).select("brand", s2=flight.col("size") * 2, v="v").aggregate(["brand", "s2"], t=flight.agg.sum("v"))
    (stage,) = _hashed(flight.DistributedExec(q, ["grpc://127.0.0.1:1", "grpc://127.0.0.1:2"], small_query_bytes=0))
    assert stage.output_keys == ["brand", "s2"]


def test_aggregates_shuffled_on_the_string_keys_match_duckdb(cluster: flight.LocalCluster, files: list[Path]) -> None:
    listed = ", ".join(f"'{p}'" for p in files)
    oracle = duckdb.connect()
    for calls, sql in [
        ({"n": flight.agg.count_all(), "s": flight.agg.sum("v")}, "count(*) AS n, sum(v) AS s"),
        ({"d": flight.agg.count_distinct("wide")}, "count(DISTINCT wide) AS d"),
    ]:
        q = flight.read_parquet(files).aggregate(["brand", "kind", "size"], **calls)
        ex = flight.DistributedExec(q, cluster.urls, small_query_bytes=0)
        got = ex.to_table().sort_by([("brand", "ascending"), ("kind", "ascending"), ("size", "ascending")])
        assert [s.output_keys for s in _hashed(ex)] == [["brand", "kind"]]
        want = oracle.sql(f"SELECT brand, kind, size, {sql} FROM read_parquet([{listed}]) GROUP BY ALL ORDER BY ALL").arrow().read_all()
        assert got.to_pylist() == want.to_pylist()
