"""One stage end to end on real workers, checked against single-process pyarrow / DuckDB."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from pyarrow import feather
from support import make_table, running_tasks, sorted_table, wait_until

import flight
import flight.plan.nodes
from flight import col, lit


class Files(flight.WorkUnitFeedProvider):
    """A provider that discovers files (optionally split by row group), dealt over partitions."""

    def __init__(self, paths: list[Path], row_groups: bool = False) -> None:
        self.paths = paths
        self.row_groups = row_groups

    def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[object]:
        units = []
        for p in self.paths:
            groups = range(pq.ParquetFile(p).num_row_groups) if self.row_groups else [None]
            units += [flight.file_unit(str(p), [] if g is None else [g]) for g in groups]
        yield from units[partition :: ctx.partitions]


def oracle(paths: list[Path]) -> pa.Table:
    return pa.concat_tables(pq.read_table(p) for p in paths)


def test_provider_discovered_parquet_on_two_workers(cluster: flight.LocalCluster, parquet_files: list[Path]) -> None:
    schema = pq.read_schema(parquet_files[0])
    q = (
        flight.read_parquet(Files(parquet_files, row_groups=True), schema=schema)
        .filter((col("qty") > 10) & col("name").is_not_null())
        .select("id", "name", total=col("qty") * 2 + 1)
    )
    ex = flight.DistributedExec(q, cluster.resolver(), small_query_bytes=0)  # several stages, though the data is small
    got = ex.to_table()

    src = oracle(parquet_files)
    mask = pc.and_(pc.greater(src["qty"], 10), pc.is_valid(src["name"]))
    f = src.filter(mask)
    expected = pa.table({"id": f["id"], "name": f["name"], "total": pc.add(pc.multiply(f["qty"], 2), 1)})
    assert sorted_table(got).equals(sorted_table(expected))

    # Both workers did part of the work, every unit was read once.
    assert ex.metrics is not None
    assert {t.worker_url for t in ex.metrics.tasks} == set(cluster.urls)
    assert sum(f.units for t in ex.metrics.tasks for f in t.feeds) == 6 * 4
    assert ex.metrics.rows == expected.num_rows


def test_result_matches_duckdb(cluster: flight.LocalCluster, parquet_files: list[Path]) -> None:
    q = flight.read_parquet(parquet_files).filter(col("name").like("item-1%") & (col("day") < lit(pa.scalar(100, pa.int32()).cast(pa.date32())))).select(
        "id", upper=col("name").upper(), month=col("day").month()
    )
    got = flight.DistributedExec(q, cluster.resolver()).to_table()
    files = ", ".join(f"'{p}'" for p in parquet_files)
    expected = duckdb.sql(
        f"select id, upper(name) as upper, month(day) as month from read_parquet([{files}]) "
        f"where name like 'item-1%' and day < date '1970-01-01' + interval 100 day"
    ).arrow()
    if isinstance(expected, pa.RecordBatchReader):
        expected = expected.read_all()
    got_rows = sorted(zip(*[got[c].to_pylist() for c in got.column_names]))
    exp_rows = sorted(zip(*[expected[c].to_pylist() for c in expected.column_names]))
    assert got_rows == exp_rows and len(got_rows) > 0


def test_ipc_and_csv_readers(cluster: flight.LocalCluster, tmp_path: Path) -> None:
    tables = [make_table(700, i * 700) for i in range(3)]
    ipc_files, csv_files = [], []
    for i, t in enumerate(tables):
        feather.write_feather(t, tmp_path / f"t{i}.arrow", compression="uncompressed")
        ipc_files.append(tmp_path / f"t{i}.arrow")
        pacsv.write_csv(t.select(["id", "qty"]), tmp_path / f"t{i}.csv")
        csv_files.append(tmp_path / f"t{i}.csv")
    whole = pa.concat_tables(tables)

    got_ipc = flight.DistributedExec(flight.read_ipc(ipc_files, columns=["id", "day"]), cluster.resolver()).to_table()
    assert sorted_table(got_ipc).equals(sorted_table(whole.select(["id", "day"])))

    schema = pa.schema([("id", pa.int64()), ("qty", pa.float64())])
    q = flight.from_feed(flight.FileListProvider(csv_files), "csv", schema).filter(col("id").between(100, 1500))
    got_csv = flight.DistributedExec(q, cluster.resolver()).to_table()
    ids = whole["id"]
    expected = whole.select(["id", "qty"]).filter(pc.and_(pc.greater_equal(ids, 100), pc.less_equal(ids, 1500)))
    assert sorted_table(got_csv).equals(sorted_table(expected))


def test_an_ipc_file_read_again_is_its_rows_and_a_changed_one_its_new_rows(cluster: flight.LocalCluster, tmp_path: Path) -> None:
    """A worker keeps a mapped IPC file's batches once read whole (``readers._BATCHES``): read again, each
    selection of columns gives the file's rows; rewritten, the file's new rows, not the kept ones."""
    path = tmp_path / "kept.arrow"
    first = make_table(900, 0)
    feather.write_feather(first, path, compression="uncompressed", chunksize=300)
    for columns in (None, ["id"], ["day", "id"], None):
        got = flight.DistributedExec(flight.read_ipc([path], columns=columns), cluster.resolver()).to_table()
        assert sorted_table(got).equals(sorted_table(first if columns is None else first.select(columns)))
    second = make_table(1300, 5000)
    feather.write_feather(second, path, compression="uncompressed", chunksize=300)
    got = flight.DistributedExec(flight.read_ipc([path]), cluster.resolver()).to_table()
    assert sorted_table(got).equals(sorted_table(second))


def test_string_view_is_normalised_at_the_scan(cluster: flight.LocalCluster, tmp_path: Path) -> None:
    t = pa.table({"s": pa.array(["a", "bb", None, "ccc"], pa.string_view()), "n": pa.array([1, 2, 3, 4])})
    path = tmp_path / "views.parquet"
    pq.write_table(t, path, store_schema=True)
    q = flight.read_parquet([path]).filter(col("n") > 1)
    assert q.schema.field("s").type == pa.string()
    got = flight.DistributedExec(q, cluster.resolver()).to_table()
    assert got.schema.field("s").type == pa.string()
    assert sorted(got["s"].to_pylist(), key=str) == sorted(["bb", None, "ccc"], key=str)


def test_values_and_limit(cluster: flight.LocalCluster, parquet_files: list[Path]) -> None:
    table = pa.table({"x": list(range(100))})
    got = flight.DistributedExec(flight.from_arrow(table).filter(col("x") >= 90), cluster.resolver()).to_table()
    assert got["x"].to_pylist() == list(range(90, 100))

    limited = flight.DistributedExec(flight.read_parquet(parquet_files).limit(25, offset=10), cluster.resolver()).to_table()
    assert limited.num_rows == 25
    ids = set(limited["id"].to_pylist())
    assert ids <= set(oracle(parquet_files)["id"].to_pylist()) and len(ids) == 25


@pytest.mark.parametrize("compression", ["none", "lz4", "zstd"])
def test_ipc_compression_on_the_wire(cluster: flight.LocalCluster, parquet_files: list[Path], compression: str) -> None:
    q = flight.read_parquet(parquet_files, columns=["id", "name"])
    got = flight.DistributedExec(q, cluster.resolver(), compression=compression).to_table()
    assert sorted_table(got).equals(sorted_table(oracle(parquet_files).select(["id", "name"])))


def test_streaming_reader_and_early_stop_frees_tasks(cluster: flight.LocalCluster, parquet_files: list[Path]) -> None:
    """Stopping after the first batch cancels the query; the workers free its tasks."""
    ex = flight.DistributedExec(flight.read_parquet(parquet_files * 20), cluster.resolver(), output_buffer_bytes=1 << 16, small_query_bytes=0)
    reader = ex.execute()
    first = reader.read_next_batch()
    assert first.num_rows > 0
    reader.close()
    del reader
    wait_until(lambda: running_tasks(cluster.urls) == 0, timeout=2.0, what="workers to free the tasks")


def test_explain_names_stage_tasks_and_workers(cluster: flight.LocalCluster, parquet_files: list[Path]) -> None:
    q = flight.read_parquet(parquet_files).filter(col("qty") > 1).select("id")
    ex = flight.DistributedExec(q, cluster.resolver(), small_query_bytes=0)  # several stages, though the data is small
    text = ex.explain()
    assert "Stage 0" in text and "2 task(s)" in text
    for url in cluster.urls:
        assert url in text
    assert "Filter[" in text and "FeedScan[" in text
    ex.to_table()
    after = ex.explain(analyze=True)
    assert "Executed query" in after and "units" in after and "rows in" in after


def test_one_worker_resolver_runs_one_task(cluster: flight.LocalCluster, parquet_files: list[Path]) -> None:
    ex = flight.DistributedExec(flight.read_parquet(parquet_files), [cluster.urls[0]])
    assert ex.stage.task_count == 1
    assert ex.to_table().num_rows == oracle(parquet_files).num_rows


def test_map_stage_streams_batches_through_a_worker(cluster: flight.LocalCluster) -> None:
    schema = pa.schema([("id", pa.int64()), ("qty", pa.float64())])
    stage = flight.map_input(schema).filter(col("qty") >= 25).select("id", double=col("qty") * 2)
    source = make_table(50_000).select(["id", "qty"])
    batches = source.to_batches(max_chunksize=4096)
    out = pa.Table.from_batches(list(flight.map_batches(stage, batches, cluster.urls[1])))
    f = source.filter(pc.greater_equal(source["qty"], 25))
    expected = pa.table({"id": f["id"], "double": pc.multiply(f["qty"], 2)})
    assert sorted_table(out).equals(sorted_table(expected))


def test_map_stage_with_empty_input(cluster: flight.LocalCluster) -> None:
    stage = flight.map_input(pa.schema([("id", pa.int64())])).select(x=col("id") + 1)
    assert list(flight.map_batches(stage, [], cluster.urls[0])) == []


def test_scans_read_only_the_columns_the_plan_uses(cluster: flight.LocalCluster, parquet_files: list[Path]) -> None:
    q = flight.read_parquet(parquet_files).filter(col("qty") > 40).select(n=col("name").upper())
    ex = flight.DistributedExec(q, cluster.resolver(), small_query_bytes=0)  # several stages, though the data is small
    (scan,) = [n for n in ex.stage.root.walk() if isinstance(n, flight.plan.nodes.FeedScanNode)]
    assert scan.columns == ["qty", "name"]
    src = oracle(parquet_files)
    expected = pc.utf8_upper(src.filter(pc.greater(src["qty"], 40))["name"])
    assert sorted(ex.to_table()["n"].to_pylist(), key=str) == sorted(expected.to_pylist(), key=str)


def test_self_join_reads_the_source_twice(cluster: flight.LocalCluster, parquet_files: list[Path]) -> None:
    q = flight.read_parquet(parquet_files[:2]).select("id", "qty")
    joined = q.join(q.select("id", q2=col("qty") * 2), on="id")
    got = flight.DistributedExec(joined, cluster.resolver()).to_table()
    src = oracle(parquet_files[:2])
    assert got.num_rows == src.num_rows
    assert sorted(got["q2"].to_pylist()) == sorted(v * 2 for v in src["qty"].to_pylist())


def test_shuffle_within_one_worker_skips_the_network(cluster: flight.LocalCluster, parquet_files: list[Path]) -> None:
    """Producer and consumer tasks on the same worker: shuffled rows never touch the wire."""
    class TwoSlotsOnOneWorker(flight.WorkerResolver):
        def get_urls(self) -> list[str]:
            return [cluster.urls[0]] * 2

    q = flight.read_parquet(parquet_files).aggregate(["name"], n=flight.agg.count_all())
    ex = flight.DistributedExec(q, TwoSlotsOnOneWorker(), rows_per_task=1, small_query_bytes=0)
    got = ex.to_table()
    src = oracle(parquet_files)
    assert sorted(got["n"].to_pylist()) == sorted(pc.value_counts(src["name"]).field("counts").to_pylist())
    assert ex.metrics is not None
    readers = [t for t in ex.metrics.tasks if t.bytes_in]
    assert readers and all(t.bytes_in_local == t.bytes_in for t in readers)
    assert "local)" in ex.explain(analyze=True)


def test_shuffle_across_workers_reads_remote_partitions(cluster: flight.LocalCluster, parquet_files: list[Path]) -> None:
    q = flight.read_parquet(parquet_files).aggregate(["name"], n=flight.agg.count_all())
    ex = flight.DistributedExec(q, cluster.urls, rows_per_task=1, small_query_bytes=0)
    ex.to_table()
    assert ex.metrics is not None
    total = sum(t.bytes_in for t in ex.metrics.tasks)
    local = sum(t.bytes_in_local for t in ex.metrics.tasks)
    assert 0 < local < total  # half the partitions are on the reader's own worker


def test_explain_shows_the_rows_each_stage_sent_beside_what_its_readers_received(
    cluster: flight.LocalCluster, parquet_files: list[Path]
) -> None:
    q = flight.read_parquet(parquet_files).aggregate(["name"], n=flight.agg.count_all())
    ex = flight.DistributedExec(q, cluster.urls, rows_per_task=1, small_query_bytes=0)
    result = ex.to_table()
    shown = ex.explain(analyze=True)
    lines = [line for line in shown.splitlines() if line.strip().startswith("rows: sent")]
    assert lines, shown
    for line in lines:
        sent, received = re.match(r"\s*rows: sent ([\d,]+), received ([\d,]+) by", line).groups()  # type: ignore[union-attr]
        assert sent == received and int(sent.replace(",", "")) > 0, line
    # the stage below the head sent its partial groups; the oracle counts the source's distinct names
    names = duckdb.sql(f"select count(*) from (select distinct name from read_parquet({[str(p) for p in parquet_files]}))").fetchall()[0][0]
    assert result.num_rows == names


def test_explain_shows_each_join_strategy_with_its_estimates_and_each_stage_estimated_beside_actual(
    cluster: flight.LocalCluster, parquet_files: list[Path]
) -> None:
    """The broadcast decision names the sizes it compared; after the run every stage's estimated output
    stands beside what its tasks produced, and the head's actual rows are the result's (DuckDB counts them)."""
    small = flight.read_parquet(parquet_files[:1]).filter(col("id") < 5).select(k="name", kid="id")
    q = flight.read_parquet(parquet_files).select("id", "name").join(small, left_on="name", right_on="k")  # names: in every file
    ex = flight.DistributedExec(q, cluster.urls, small_query_bytes=0)
    before = ex.explain()
    decision = next(line for line in before.splitlines() if "HashJoin[inner, name=k]: broadcast into" in line)
    assert re.search(r"build side ~[\d,]+ rows, [\d.]+ MiB, probe side ~[\d,]+ rows, [\d.]+ MiB: its copies", decision), decision
    assert "actual" not in before
    result = ex.to_table()
    shown = ex.explain(analyze=True)
    outputs = re.findall(r"Stage (\d+) .*?\n(?:.*\n)*?  output: estimated ~[\d,]+ rows, [\d.]+ MiB; actual ([\d,]+) rows", shown)
    assert {int(s) for s, _ in outputs} == {s.stage_id for s in ex.plan.stages if s.output_rows is not None}, shown
    head = dict(outputs)[str(ex.plan.head.stage_id)]
    files = [str(p) for p in parquet_files]
    expected = duckdb.sql(f"select count(*) from read_parquet({files}) a join read_parquet({[files[0]]}) b "
                          "on a.name = b.name where b.id < 5").fetchall()[0][0]
    assert int(head.replace(",", "")) == result.num_rows == expected


def test_inner_join_broadcasts_a_small_left_side(cluster: flight.LocalCluster, parquet_files: list[Path]) -> None:
    """A small left side of an inner join is broadcast into the big right side's tasks."""
    small = flight.read_parquet(parquet_files[:1]).filter(col("id") < 50).select(k="id", tag="name")
    big = flight.read_parquet(parquet_files).select("id", "qty")
    q = small.join(big, left_on="k", right_on="id")
    ex = flight.DistributedExec(q, cluster.resolver(), small_query_bytes=0)  # several stages, though the data is small
    assert "sides swapped" in ex.explain()
    got = ex.to_table()
    assert got.column_names == ["k", "tag", "id", "qty"]
    src = oracle(parquet_files)
    expected = src.filter(pc.less(src["id"], 50))
    assert sorted(got["id"].to_pylist()) == sorted(expected["id"].to_pylist())
    assert got["k"].to_pylist() == got["id"].to_pylist()


class _NoUnits(flight.FileListProvider):
    """Files that discover no work unit (an empty listing): every task reads nothing."""

    def feed(self, partition, ctx):  # type: ignore[no-untyped-def]
        return iter(())


@pytest.mark.parametrize("split", [True, False])
def test_global_counts_over_no_unit_are_zero_as_in_duckdb(cluster: flight.LocalCluster, parquet_files: list[Path], split: bool) -> None:
    """A task with no unit gave a global aggregate no row on DuckDB's engine: split across tasks, the merged count of
    no partial row was null (``select count(*)`` of an empty listing said NULL, not 0)."""
    schema = pq.read_schema(parquet_files[0])
    query = flight.from_feed(_NoUnits([str(p) for p in parquet_files]), "parquet", schema)
    query = query.aggregate(n=flight.agg.count_all(), c=flight.agg.count(col("id")), s=flight.agg.sum(col("id")))
    options = {"small_query_bytes": 0, "one_host_query_bytes": 0} if split else {}
    got = flight.DistributedExec(query, cluster.urls, **options).to_table()
    empty = pa.table({"id": pa.array([], schema.field("id").type)})
    want = duckdb.sql("select count(*) as n, count(id) as c, sum(id) as s from empty").to_arrow_table()
    assert got.to_pylist() == want.to_pylist()
