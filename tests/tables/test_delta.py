"""Delta Lake tables read by real workers, the files found by the coordinator in the table's log.

Written with ``deltalake`` (several appends, partitioned, rows deleted, a null partition),
read at two versions and with a filter, and compared with ``deltalake``'s own reading
(``DeltaTable(...).to_pyarrow_table()``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

import flight

pytest.importorskip("deltalake", reason="the Delta tests need deltalake (the dev extra)")

from deltalake import DeltaTable, write_deltalake


def rows(start: int, n: int) -> pa.Table:
    ids = list(range(start, start + n))
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "cat": pa.array([(None if i % 7 == 0 else ("a", "b", "c")[i % 3]) for i in ids], pa.string()),
        "day": pa.array([i % 4 for i in ids], pa.int32()),
        "value": pa.array([i * 0.5 for i in ids], pa.float64()),
    })


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, flight.LocalCluster]]:
    root = tmp_path_factory.mktemp("delta")
    uri = str(root / "events")
    for k in range(3):
        write_deltalake(uri, rows(100 * k, 100), mode="append", partition_by=["cat", "day"])
    DeltaTable(uri).delete("id < 10")  # rewrites files (no deletion vectors)
    with flight.LocalCluster(2, data_roots=[root]) as cluster:
        yield uri, cluster


def same(got: pa.Table, expected: pa.Table) -> None:
    expected = expected.select(got.column_names)
    plain = [pa.field(f.name, pa.string() if f.type in (pa.large_string(), pa.string_view()) else f.type) for f in expected.schema]
    expected = expected.cast(pa.schema(plain))
    assert got.sort_by("id").equals(expected.sort_by("id")), f"{got.num_rows} rows, expected {expected.num_rows}"


def test_the_latest_version_reads_as_deltalake_reads_it(table: tuple[str, flight.LocalCluster]) -> None:
    uri, cluster = table
    got = flight.DistributedExec(flight.read_delta(uri), cluster.urls).to_table()
    same(got, DeltaTable(uri).to_pyarrow_table())
    assert got.num_rows == 290 and got["cat"].null_count > 0  # the null partition, as nulls


def test_an_older_version_reads_its_own_files(table: tuple[str, flight.LocalCluster]) -> None:
    uri, cluster = table
    got = flight.DistributedExec(flight.read_delta(uri, version=1), cluster.urls).to_table()
    same(got, DeltaTable(uri, version=1).to_pyarrow_table())
    assert got.num_rows == 200


def test_a_filter_on_partition_columns_prunes_files_and_filters_rows(table: tuple[str, flight.LocalCluster]) -> None:
    uri, cluster = table
    where = (flight.col("cat") == "b") & (flight.col("day") >= 2) & (flight.col("value") > 10)
    ex = flight.DistributedExec(flight.read_delta(uri, filter=where), cluster.urls)
    got = ex.to_table()
    t = DeltaTable(uri).to_pyarrow_table()
    expected = t.filter((pa.compute.field("cat") == "b") & (pa.compute.field("day") >= 2) & (pa.compute.field("value") > 10))
    same(got, expected)
    assert ex.metrics is not None and 0 < ex.metrics.units < len(DeltaTable(uri).file_uris())


def test_a_filter_on_other_columns_prunes_files_by_their_statistics(table: tuple[str, flight.LocalCluster]) -> None:
    uri, cluster = table
    ex = flight.DistributedExec(flight.read_delta(uri, filter=flight.col("id") >= 250), cluster.urls)
    got = ex.to_table()
    t = DeltaTable(uri).to_pyarrow_table()
    same(got, t.filter(pa.compute.field("id") >= 250))
    assert ex.metrics is not None and 0 < ex.metrics.units < len(DeltaTable(uri).file_uris())  # only the third append's


def test_a_table_with_deletion_vectors_is_refused(tmp_path: Path) -> None:
    uri = str(tmp_path / "dv")
    write_deltalake(uri, rows(0, 10), configuration={"delta.enableDeletionVectors": "true"})
    with pytest.raises(flight.PlanError, match="deletionVectors"):
        flight.read_delta(uri)


def test_a_missing_table_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(flight.PlanError, match="cannot open the Delta table"):
        flight.read_delta(str(tmp_path / "nothing"))
