"""Iceberg tables read by real workers, planned by the coordinator with pyiceberg's SQL catalog.

The catalog is pyiceberg's ``SqlCatalog`` on SQLite; the warehouse is a local directory,
or a bucket of the S3 server on loopback (moto). The table is written in several appends
with a partition spec, has rows deleted (pyiceberg rewrites the files), a column added and
one renamed; it is read at two snapshots and with a filter, and compared with pyiceberg's
own ``scan().to_arrow()``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import flight
from benchmarks.local_s3 import ACCESS_KEY, SECRET_KEY, LocalS3, local_s3
from flight.sources.storage import FileSystems, configure_storage, set_filesystems

pytest.importorskip("pyiceberg", reason="the Iceberg tests need pyiceberg (the dev extra)")

from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import DoubleType, LongType, NestedField, StringType

BUCKET = "flight-iceberg-tests"


def rows(start: int, n: int, note: bool = False) -> pa.Table:
    ids = list(range(start, start + n))
    columns: dict[str, pa.Array] = {
        "id": pa.array(ids, pa.int64()),
        "category": pa.array([("a", "b", "c")[i % 3] for i in ids], pa.string()),
        "value": pa.array([i * 1.5 for i in ids], pa.float64()),
    }
    if note:
        columns["note"] = pa.array([f"n{i}" for i in ids], pa.string())
    return pa.table(columns)


class Lake:
    """A table, the snapshot before its deletes and schema changes, and a cluster that can read it."""

    def __init__(self, table: Any, before: int, cluster: flight.LocalCluster) -> None:
        self.table, self.before, self.cluster = table, before, cluster


def build(catalog: SqlCatalog) -> tuple[Any, int]:
    catalog.create_namespace("db")
    schema = Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(2, "category", StringType(), required=False),
        NestedField(3, "value", DoubleType(), required=False),
    )
    spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="category"))
    table = catalog.create_table("db.events", schema=schema, partition_spec=spec)
    for k in range(3):
        table.append(rows(100 * k, 100))
    before = table.current_snapshot().snapshot_id
    table.delete(delete_filter="id >= 10 AND id < 20")  # rows inside files: pyiceberg rewrites them
    with table.update_schema() as update:
        update.add_column("note", StringType())
    table.append(rows(1000, 30, note=True))
    with table.update_schema() as update:
        update.rename_column("value", "amount")
    table.append(rows(2000, 9, note=True).rename_columns(["id", "category", "amount", "note"]))
    return table, before


@pytest.fixture(scope="module", params=["local", "s3"])
def lake(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lake]:
    root = tmp_path_factory.mktemp(f"iceberg-{request.param}")
    if request.param == "local":
        catalog = SqlCatalog("lake", uri=f"sqlite:///{root}/catalog.db", warehouse=f"file://{root}/warehouse")
        table, before = build(catalog)
        with flight.LocalCluster(2, data_roots=[root / "warehouse"]) as cluster:
            yield Lake(table, before, cluster)
        return
    with local_s3() as s3:
        yield from _s3_lake(s3, root)


def _s3_lake(s3: LocalS3, root: Path) -> Iterator[Lake]:
    s3.bucket(BUCKET)
    catalog = SqlCatalog(
        "lake", uri=f"sqlite:///{root}/catalog.db", warehouse=f"s3://{BUCKET}/warehouse",
        **{"s3.endpoint": f"http://{s3.endpoint}", "s3.access-key-id": ACCESS_KEY, "s3.secret-access-key": SECRET_KEY,
           "s3.region": "us-east-1"},
    )
    table, before = build(catalog)
    configure_storage({**s3.fs_options, "s3.access_key": ACCESS_KEY, "s3.secret_key": SECRET_KEY})
    try:
        with flight.LocalCluster(2, data_roots=[f"s3://{BUCKET}/warehouse"], fs_options=s3.fs_options, env=s3.env) as cluster:
            yield Lake(table, before, cluster)
    finally:
        set_filesystems(FileSystems())


def same(got: pa.Table, expected: pa.Table) -> None:
    """The same rows, whatever the order; pyiceberg's large strings compared as strings."""
    expected = expected.cast(pa.schema([pa.field(f.name, pa.string() if f.type == pa.large_string() else f.type) for f in expected.schema]))
    assert got.column_names == expected.column_names
    assert got.sort_by("id").equals(expected.sort_by("id")), f"{got.num_rows} rows, expected {expected.num_rows}"


def test_the_current_snapshot_reads_as_pyiceberg_reads_it(lake: Lake) -> None:
    got = flight.DistributedExec(flight.read_iceberg(lake.table), lake.cluster.urls).to_table()
    same(got, lake.table.scan().to_arrow())
    assert got.column_names == ["id", "category", "amount", "note"]  # renamed, and added: by field id
    assert got.num_rows == 300 - 10 + 30 + 9


def test_an_older_snapshot_reads_with_its_own_schema_and_rows(lake: Lake) -> None:
    got = flight.DistributedExec(flight.read_iceberg(lake.table, snapshot_id=lake.before), lake.cluster.urls).to_table()
    same(got, lake.table.scan(snapshot_id=lake.before).to_arrow())
    assert got.num_rows == 300 and got.column_names == ["id", "category", "value"]


def test_a_filter_prunes_files_and_filters_rows(lake: Lake) -> None:
    where = (flight.col("category") == "b") & (flight.col("id") >= 1000)
    ex = flight.DistributedExec(flight.read_iceberg(lake.table, filter=where), lake.cluster.urls)
    got = ex.to_table()
    same(got, lake.table.scan(row_filter=And(EqualTo("category", "b"), GreaterThanOrEqual("id", 1000))).to_arrow())
    assert ex.metrics is not None
    all_files = len(list(lake.table.scan().plan_files()))
    assert 0 < ex.metrics.units < all_files, "the filter pruned no data file"


def test_columns_and_a_catalog_identifier(lake: Lake) -> None:
    catalog = lake.table.catalog if hasattr(lake.table, "catalog") else None
    query = flight.read_iceberg(catalog, "db.events", columns=["id", "note"]) if catalog is not None else None
    if query is None:
        pytest.skip("this pyiceberg table does not name its catalog")
    got = flight.DistributedExec(query, lake.cluster.urls).to_table()
    same(got, lake.table.scan(selected_fields=("id", "note")).to_arrow())


def test_planning_a_manifest_at_a_time_finds_what_pyiceberg_plans(lake: Lake) -> None:
    from flight.tables.iceberg import IcebergProvider

    where = flight.col("category") == "a"
    for snapshot in (None, lake.before):
        streamed = IcebergProvider(lake.table, filter=where, snapshot_id=snapshot)
        planned = lake.table.scan(row_filter=EqualTo("category", "a"), snapshot_id=snapshot).plan_files()
        assert sorted(t.file.file_path for t in streamed.tasks()) == sorted(t.file.file_path for t in planned)


def test_the_filter_to_pyiceberg_keeps_every_row_the_filter_keeps() -> None:
    from flight.tables.iceberg import iceberg_filter

    col = flight.col
    assert repr(iceberg_filter((col("a") == 1) & (col("b") > 2.5))) == repr(And(EqualTo("a", 1), _gt("b", 2.5)))
    assert repr(iceberg_filter(col("a") + 1 == 2)) == "AlwaysTrue()"  # a function: no pruning
    assert repr(iceberg_filter((col("a") == 1) & (col("a") + 1 == 2))) == repr(EqualTo("a", 1))  # the known half
    assert repr(iceberg_filter((col("a") == 1) | (col("a") + 1 == 2))) == "AlwaysTrue()"
    assert repr(iceberg_filter(~((col("a") == 1) & (col("a") + 1 == 2)))) == "AlwaysTrue()"  # not of an approximation
    assert repr(iceberg_filter(lit_left := (flight.lit(3) < col("a")))) == repr(_gt("a", 3)), lit_left


def _gt(name: str, value: object) -> Any:
    from pyiceberg.expressions import GreaterThan

    return GreaterThan(name, value)
