"""Scan pushdown: a filter right above a Parquet scan lets the reader skip row groups by their statistics.

Real workers read a sorted file of 100 row groups; the answer is checked against pyarrow's
own filtering of the file, and the row groups read come from the tasks' metrics
(``explain(analyze=True)`` shows the same numbers).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import flight

ROWS, GROUPS = 200_000, 100


@pytest.fixture(scope="module")
def sorted_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pruning") / "sorted.parquet"
    k = pa.array(range(ROWS), pa.int64())
    pq.write_table(pa.table({"k": k, "v": pc.multiply(k, 3), "s": pc.cast(k, pa.string())}), path, row_group_size=ROWS // GROUPS)
    return path


def row_groups(ex: flight.DistributedExec) -> tuple[int, int]:
    assert ex.metrics is not None
    return sum(t.row_groups_read for t in ex.metrics.tasks), sum(t.row_groups_skipped for t in ex.metrics.tasks)


def oracle(path: Path, low: int, high: int) -> pa.Table:
    t = pq.read_table(path)
    return t.filter(pc.and_(pc.greater_equal(t["k"], low), pc.less(t["k"], high)))


@pytest.mark.parametrize("split", [False, True], ids=["file-units", "row-group-units"])
def test_a_selective_filter_on_a_sorted_file_reads_under_a_tenth_of_its_row_groups(
    split: bool, sorted_file: Path, cluster: flight.LocalCluster
) -> None:
    low, high = 100_500, 102_500  # 1% of the rows, in 2 of the 100 row groups
    q = flight.read_parquet([sorted_file], split_row_groups=split).filter((flight.col("k") >= low) & (flight.col("k") < high))
    ex = flight.DistributedExec(q, cluster.urls)
    got = ex.to_table()
    assert got.sort_by("k").equals(oracle(sorted_file, low, high))
    read, skipped = row_groups(ex)
    assert read + skipped == GROUPS and read < GROUPS // 10, (read, skipped)
    assert f"row groups {read}/" in ex.explain(analyze=True) or split  # per task when the units are split


class _Scattered(flight.WorkUnitFeedProvider):
    """Units of two row groups that are not one run (``g`` and ``g + 50``): DuckDB cannot read them as a range of
    the file's row numbers, so pyarrow reads them for the fragment DuckDB runs."""

    dealt = True

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[flight.WorkUnit]:
        for g in range(partition, GROUPS // 2, ctx.partitions):
            yield flight.file_unit(self.path, [g, g + GROUPS // 2])


def _filtered_total(scan: flight.Query) -> flight.Query:
    return scan.filter(flight.col("k") < 4_000).aggregate([], n=flight.agg.count_all(), total=flight.agg.sum("v"))


def test_an_aggregate_over_a_filtered_scan_of_scattered_row_groups_prunes_too(sorted_file: Path, cluster: flight.LocalCluster) -> None:
    # Not a streaming scan: DuckDB runs the fragment, pyarrow reads the row-group units for it.
    q = _filtered_total(flight.read_parquet(_Scattered(sorted_file), schema=pq.read_schema(sorted_file)))
    for small in (0, 64 << 20):  # split over the workers, or one task reading all its units in one query
        ex = flight.DistributedExec(q, cluster.urls, small_query_bytes=small)
        got = ex.to_table()
        assert got.to_pylist() == [{"n": 4_000, "total": 3 * sum(range(4_000))}]
        assert ex.metrics is not None and {t.engine for t in ex.metrics.tasks if t.rows_in == 0} == {"duckdb"}
        read, skipped = row_groups(ex)
        assert read == 2 and skipped == GROUPS - 2, small


def test_an_aggregate_over_runs_of_row_groups_is_read_by_duckdb(sorted_file: Path, cluster: flight.LocalCluster) -> None:
    # One row group a unit is a run: DuckDB reads it as a range of the file's row numbers (and skips row groups by
    # the filter itself, counted by no reader of ours), in both ways a stage runs its units.
    q = _filtered_total(flight.read_parquet([sorted_file], split_row_groups=True))
    for small in (0, 64 << 20):
        ex = flight.DistributedExec(q, cluster.urls, small_query_bytes=small)
        assert ex.to_table().to_pylist() == [{"n": 4_000, "total": 3 * sum(range(4_000))}]
        assert ex.metrics is not None and {t.engine for t in ex.metrics.tasks if t.rows_in == 0} == {"duckdb"}
        assert row_groups(ex) == (0, 0), small


def test_pruning_can_be_turned_off_and_never_changes_the_answer(sorted_file: Path, cluster: flight.LocalCluster) -> None:
    schema = pq.read_schema(sorted_file)
    for prune in ("true", "false"):
        scan = flight.from_feed(flight.FileListProvider([str(sorted_file)]), "parquet", schema, options={"prune": prune})
        ex = flight.DistributedExec(scan.filter(flight.col("k") >= ROWS - 10), cluster.urls)
        assert sorted(ex.to_table()["k"].to_pylist()) == list(range(ROWS - 10, ROWS))
        assert row_groups(ex)[0] == (1 if prune == "true" else GROUPS)


def test_a_predicate_statistics_cannot_decide_reads_everything(sorted_file: Path, cluster: flight.LocalCluster) -> None:
    q = flight.read_parquet([sorted_file]).filter(flight.col("s").startswith("1999"))
    ex = flight.DistributedExec(q, cluster.urls)
    t = pq.read_table(sorted_file)
    assert ex.to_table().num_rows == pc.sum(pc.starts_with(t["s"], "1999")).as_py()
    assert row_groups(ex) == (GROUPS, 0)
