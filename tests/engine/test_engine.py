"""The per-task engine on real workers: memory limits and spilling, engine choice, errors.

Answers are checked against pyarrow computing the same thing in the test process
(an oracle independent of DuckDB, the workers' engine).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import flight
from flight import col

MEMORY_LIMIT_MB = 64
BUILD_ROWS = 3_000_000
"""About 270 MB of keys and 80-character strings: four times the workers' memory limit."""


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], list[Path], pa.Table, pa.Table]:
    root = tmp_path_factory.mktemp("spill")
    keys = pa.array(range(BUILD_ROWS), pa.int64())
    payload = pc.binary_join_element_wise(pc.cast(keys, pa.string()), "-" + "x" * 72, "")
    build = pa.table({"k": keys, "p": payload})
    probe_keys = pc.multiply(pa.array(range(BUILD_ROWS // 3), pa.int64()), 3)
    probe = pa.table({"pk": probe_keys, "v": pc.add(probe_keys, 1)})
    build_files, probe_files = [], []
    for i in range(4):
        part = build.slice(i * BUILD_ROWS // 4, BUILD_ROWS // 4)
        path = root / f"build.{i}.parquet"
        pq.write_table(part, path, row_group_size=256_000)
        build_files.append(path)
    path = root / "probe.parquet"
    pq.write_table(probe, path)
    probe_files.append(path)
    return build_files, probe_files, build, probe


@pytest.fixture(scope="module")
def small_memory(data_roots: list[Path]) -> Iterator[flight.LocalCluster]:
    # One engine thread: DuckDB's spilling operators need some memory of their own per thread,
    # and a tiny limit must still leave room for them.
    args = ["--memory-limit", f"{MEMORY_LIMIT_MB}MB", "--engine-threads", "1"]
    with flight.LocalCluster(1, data_roots=data_roots, worker_args=args) as c:
        yield c


@pytest.mark.slow
def test_join_with_a_build_side_four_times_the_memory_limit(small_memory: flight.LocalCluster, big: tuple) -> None:
    build_files, probe_files, build, probe = big
    query = (
        flight.read_parquet(probe_files)
        .join(flight.read_parquet(build_files), left_on="pk", right_on="k")
        .aggregate([], rows=flight.agg.count_all(), v=flight.agg.sum(col("v")), longest=flight.agg.max(col("p")))
    )
    got = flight.DistributedExec(query, small_memory.urls).to_table().to_pylist()
    joined = probe.join(build, keys="pk", right_keys="k")
    want = [{"rows": joined.num_rows, "v": pc.sum(joined["v"]).as_py(), "longest": pc.max(joined["p"]).as_py()}]
    assert got == want


@pytest.mark.slow
def test_aggregate_with_groups_four_times_the_memory_limit(small_memory: flight.LocalCluster, big: tuple) -> None:
    build_files, _, build, _ = big
    query = (
        flight.read_parquet(build_files)
        .aggregate(["p"], n=flight.agg.count_all(), k=flight.agg.max(col("k")))
        .aggregate([], groups=flight.agg.count_all(), n=flight.agg.sum(col("n")), k=flight.agg.sum(col("k")))
    )
    got = flight.DistributedExec(query, small_memory.urls).to_table().to_pylist()
    grouped = build.group_by("p").aggregate([("k", "max"), ("k", "count")])
    want = [{"groups": grouped.num_rows, "n": pc.sum(grouped["k_count"]).as_py(), "k": pc.sum(grouped["k_max"]).as_py()}]
    assert got == want


@pytest.mark.slow
def test_a_query_that_cannot_fit_fails_clearly(data_roots: list[Path], big: tuple) -> None:
    build_files, _, _, _ = big
    args = ["--memory-limit", "16MB", "--engine-threads", "2"]  # two threads cannot aggregate in 16 MB
    query = flight.read_parquet(build_files).aggregate(["p"], n=flight.agg.count_all())
    with flight.LocalCluster(1, data_roots=data_roots, worker_args=args) as c:
        with pytest.raises(flight.TaskFailedError) as info:
            flight.DistributedExec(query, c.urls).to_table()
    text = str(info.value)
    assert "needs more memory than the worker's --memory-limit allows" in text
    assert c.urls[0] in text


@pytest.fixture(scope="module")
def acero_cluster(data_roots: list[Path]) -> Iterator[flight.LocalCluster]:
    with flight.LocalCluster(2, data_roots=data_roots, worker_args=["--engine", "acero"]) as c:
        yield c


def test_both_engines_answer_alike(cluster: flight.LocalCluster, acero_cluster: flight.LocalCluster, tmp_path: Path) -> None:
    table = pa.table({
        "g": pa.array(["a", "b", None, "a", "c", "b"] * 50),
        "x": pa.array([1.5, None, 3.0, -2.0, 0.0, 7.25] * 50),
        "n": pa.array([1, 2, 3, None, 5, 6] * 50, pa.int32()),
    })
    files = []
    for i in range(3):
        path = tmp_path / f"t{i}.parquet"
        pq.write_table(table, path)
        files.append(path)
    query = (
        flight.read_parquet(files)
        .filter((col("n") > 1) | col("g").is_null())
        .select("g", y=col("x") * 2.0, m=col("n") + 1)
        .aggregate(["g"], c=flight.agg.count_all(), s=flight.agg.sum(col("y")), lo=flight.agg.min(col("m")))
        .sort(["g"])
    )
    duck = flight.DistributedExec(query, cluster.urls).to_table()
    acero = flight.DistributedExec(query, acero_cluster.urls).to_table()
    assert duck.schema == acero.schema
    assert duck.to_pylist() == acero.to_pylist()


@pytest.mark.parametrize("groups", [7, 20_000], ids=["few", "many"])
def test_a_stage_over_few_rows_of_other_stages_runs_on_acero(cluster: flight.LocalCluster, tmp_path: Path, groups: int) -> None:
    # The final aggregate reads the partial aggregates of two tasks: a few rows (Acero: DuckDB's
    # start would cost more), or more than SMALL_INPUT_ROWS (DuckDB). The answer is the same.
    n = 60_000
    table = pa.table({"g": pa.array([i % groups for i in range(n)], pa.int64()), "v": pa.array(range(n), pa.int64())})
    files = []
    for i in range(4):
        path = tmp_path / f"g{groups}-{i}.parquet"
        pq.write_table(table.slice(i * n // 4, n // 4), path)
        files.append(path)
    query = flight.read_parquet(files).aggregate(["g"], s=flight.agg.sum(col("v")), c=flight.agg.count_all())
    ex = flight.DistributedExec(query, cluster.urls, small_query_bytes=0)
    got = ex.to_table().sort_by("g")
    want = table.group_by("g").aggregate([("v", "sum"), ("v", "count")]).sort_by("g")
    assert got["g"].to_pylist() == want["g"].to_pylist()
    assert got["s"].to_pylist() == want["v_sum"].to_pylist()
    assert got["c"].to_pylist() == want["v_count"].to_pylist()
    assert ex.metrics is not None
    final = [t for t in ex.metrics.tasks if t.rows_in > 0]
    assert final, "the final aggregate read the partial ones"
    assert {t.engine for t in final} == {"acero" if groups < 8192 else "duckdb"}, [(t.stage_key, t.rows_in, t.engine) for t in final]


def test_a_stage_run_again_binds_its_query_once(tmp_path: Path) -> None:
    # A stage whose Parquet scans are read whole binds its query over empty stand-ins before it
    # takes a unit (Acero can still take over then); the same query again, over other files of
    # the same schemas, skips that bind, and both answers are DuckDB's own.
    import duckdb

    from flight.engine.duck import engine

    def write(name: str, offset: int) -> tuple[list[Path], list[Path]]:
        (tmp_path / name).mkdir()
        left = pa.table({"k": pa.array(range(offset, offset + 500), pa.int64()), "a": pa.array([i % 7 for i in range(500)], pa.int64())})
        right = pa.table({"k": pa.array(range(offset, offset + 1500, 3), pa.int64()), "b": pa.array(range(500), pa.int64())})
        paths = (tmp_path / name / "l.parquet", tmp_path / name / "r.parquet")
        pq.write_table(left, paths[0])
        pq.write_table(right, paths[1])
        return [paths[0]], [paths[1]]

    engine._BOUND.clear()
    for i, name in enumerate(["first", "second"]):
        left, right = write(name, 1000 * i)
        q = (flight.read_parquet(left).join(flight.read_parquet(right), left_on="k", right_on="k")
             .aggregate(["a"], n=flight.agg.count_all(), s=flight.agg.sum(col("b"))).sort(["a"]))
        got = flight.run_local(q, engine="duckdb").read_all()
        oracle = f"SELECT a, count(*) AS n, sum(b) AS s FROM '{left[0]}' JOIN '{right[0]}' USING (k) GROUP BY a ORDER BY a"
        want = duckdb.sql(oracle).arrow().read_all()
        assert got.to_pylist() == want.to_pylist()
        if i == 0:
            bound = len(engine._BOUND)
            assert bound >= 1, "the first run bound its whole-feed query"
    assert len(engine._BOUND) == bound, "the second run bound nothing new"
