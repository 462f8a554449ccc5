"""Hostile input to the storage, partition, Iceberg and unit-tagging code, on real workers.

Store URIs that try to leave a ``--data-root s3://bucket/prefix``, URIs carrying secrets,
partition values that do not cast, malformed Iceberg ``field_ids``, ``tag_units`` on plans
that cannot be tagged; and, without processes, a ``UnitGate`` fed what a hostile worker
could send. Every case checks the error is a clean ``FlightExecError`` naming what was
wrong, carrying no secret, and that the worker still answers ``health``.


"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from support import error_of, header, healthy, raw_exchange

import flight
from flight.coordinator.units import UnitGate
from flight.errors import FlightExecError, PermissionDeniedError, ProtocolError, TaskFailedError
from flight.wire._proto import plan_pb2, protocol_pb2
from flight.wire.arrow_types import UNIT_COLUMN, UNIT_TYPE
from flight.wire.protocol import encode_schema

pytest.importorskip("moto", reason="the object-storage cases need moto (the dev extra)")

from benchmarks.local_s3 import SECRET_KEY, LocalS3, local_s3

BUCKET = "flight-hostile-storage"
LEAK = "hunter2-not-a-real-password"
"""A secret a hostile plan puts in a URI: no error may repeat it."""
SCHEMA = pa.schema([("x", pa.int64())])


class Units(flight.WorkUnitFeedProvider):
    """The given FileUnits, one partition."""

    def __init__(self, units: list[plan_pb2.FileUnit]) -> None:
        self.units = units

    def partitions(self) -> int | None:
        return 1

    def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[bytes]:
        for u in self.units:
            yield u.SerializeToString()


@pytest.fixture(scope="module")
def s3() -> Iterator[LocalS3]:
    with local_s3() as server:
        server.bucket(BUCKET)
        with server.fs.open_output_stream(f"{BUCKET}/secret/data.csv") as f:
            f.write(b"x\n424242\n")
        with server.fs.open_output_stream(f"{BUCKET}/prefix/ok.csv") as f:
            f.write(b"x\n1\n")
        yield server


@pytest.fixture(scope="module")
def local_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("root")
    pq.write_table(pa.table({"x": pa.array(range(100), pa.int64())}), root / "x.parquet", row_group_size=10)
    schema = pa.schema([pa.field("a", pa.int64(), metadata={b"PARQUET:field_id": b"1"}),
                        pa.field("s", pa.string(), metadata={b"PARQUET:field_id": b"2"})])
    pq.write_table(pa.table({"a": [1, 2, 3], "s": ["p", "q", "r"]}, schema=schema), root / "ice.parquet")
    return root


@pytest.fixture(scope="module")
def hostile_cluster(s3: LocalS3, local_root: Path) -> Iterator[flight.LocalCluster]:
    with flight.LocalCluster(1, data_roots=[f"s3://{BUCKET}/prefix", local_root], fs_options=s3.fs_options, env=s3.env) as cluster:
        yield cluster


def _run(cluster: flight.LocalCluster, query: flight.Query) -> pa.Table:
    return flight.DistributedExec(query, cluster.urls).to_table()


def _fails(cluster: flight.LocalCluster, query: flight.Query, kind: type[FlightExecError] = TaskFailedError) -> str:
    with pytest.raises(kind) as raised:
        _run(cluster, query)
    text = str(raised.value)
    assert "Traceback" not in text and SECRET_KEY not in text and "424242" not in text
    assert healthy(cluster.urls[0])
    return text


def _csv(uris: list[str]) -> flight.Query:
    return flight.from_feed(Units([plan_pb2.FileUnit(path=u) for u in uris]), "csv", SCHEMA)


# ------------------------------------------------------------ URIs that try to leave the store root


def test_a_store_root_reads_what_is_under_it(hostile_cluster: flight.LocalCluster) -> None:
    assert _run(hostile_cluster, _csv([f"s3://{BUCKET}/prefix/ok.csv"])).column("x").to_pylist() == [1]


@pytest.mark.parametrize(
    "uri",
    [
        f"s3://{BUCKET}/prefix/%2e%2e/secret/data.csv",
        f"s3://{BUCKET}/prefix/%2E%2E%2Fsecret%2Fdata.csv",
        f"s3://{BUCKET}/prefix/..%2fsecret/data.csv",
        f"s3://{BUCKET}/prefix\\..\\secret\\data.csv",
        f"s3://{BUCKET}/prefix/x\\..\\..\\secret/data.csv",
        f"s3://{BUCKET}/prefix/\uff0e\uff0e/secret/data.csv",
        f"s3://{BUCKET}/prefix/..\x01/secret/data.csv",
        f"s3://{BUCKET}/prefix/%00../secret/data.csv",
    ],
    ids=["pct-dotdot", "pct-slash", "dotdot-pct-slash", "backslash", "backslash-inner", "fullwidth-dots", "ctrl-1", "pct-nul"],
)
def test_encoded_escapes_from_a_store_root_read_nothing_outside_it(uri: str, hostile_cluster: flight.LocalCluster) -> None:
    """Keys are opaque to the store: these name objects under the prefix that do not exist."""
    text = _fails(hostile_cluster, _csv([uri]), (TaskFailedError, PermissionDeniedError))  # type: ignore[arg-type]
    assert "424242" not in text


@pytest.mark.parametrize(
    "uri",
    [f"s3://{BUCKET}/prefix/..\x00/secret/data.csv", f"s3://{BUCKET}/prefix/x/..\x00junk/..\x00/secret/data.csv",
     f"s3://{BUCKET}/prefix/..\x00/..\x00/{BUCKET}/secret/data.csv"],
    ids=["nul-dotdot", "nul-dotdot-suffix", "nul-to-bucket-level"],
)
def test_a_nul_in_a_store_key_does_not_escape_the_root(uri: str, hostile_cluster: flight.LocalCluster) -> None:
    with pytest.raises(FlightExecError) as raised:
        rows = _run(hostile_cluster, _csv([uri]))
        assert 424242 not in rows.column("x").to_pylist(), "read an object outside --data-root"
    assert "control characters" in str(raised.value)


@pytest.mark.parametrize(
    "uri",
    [
        f"s3://{BUCKET}/prefix/../secret/data.csv",
        f"s3://{BUCKET}/prefix/./../secret/data.csv",
        f"s3://{BUCKET}/secret/data.csv",
        f"s3://{BUCKET}/prefixsecret/data.csv",
        f"s3://{BUCKET.upper()}/prefix/ok.csv",
        f"s3://{BUCKET}:443/prefix/ok.csv",
        f"gs://{BUCKET}/prefix/ok.csv",
        "s3:///prefix/ok.csv",
        "file://otherhost/etc/passwd",
        "file:///etc/passwd",
        "file:///%2e%2e/etc/passwd",
        "s3://" + "a" * 20_000 + "/prefix/ok.csv",
        "unknown://x/y",
    ],
)
def test_uris_outside_every_root_are_refused(uri: str, hostile_cluster: flight.LocalCluster) -> None:
    text = _fails(hostile_cluster, _csv([uri]), FlightExecError)
    assert "rule: data roots" in text or "not allowed" in text or "names no" in text or "not one this worker reads" in text
    assert len(text) < 2000  # a long URI is clipped, not echoed whole


@pytest.mark.parametrize(
    "uri",
    [
        f"ftp://user:{LEAK}@host/prefix/x.csv",
        f"file://user:{LEAK}@host/etc/passwd",
        f"s3://{BUCKET}/prefix/x.csv?secret_key={LEAK}",
        f"s3://user:{LEAK}@{BUCKET}/prefix/x.csv#f",
        f"s3://user:{LEAK}@[{BUCKET}/prefix/x.csv",
    ],
    ids=["unknown-scheme", "file-host", "query", "fragment", "invalid"],
)
def test_a_uri_carrying_a_secret_is_refused_without_repeating_it(uri: str, hostile_cluster: flight.LocalCluster) -> None:
    text = _fails(hostile_cluster, _csv([uri]))
    assert LEAK not in text


def test_a_uri_with_credentials_before_the_bucket_is_refused_without_repeating_them(hostile_cluster: flight.LocalCluster) -> None:
    text = _fails(hostile_cluster, _csv([f"s3://user:{LEAK}@{BUCKET}/prefix/x.csv"]))
    assert "may not carry credentials" in text and LEAK not in text


# ------------------------------------------------------------ partition values


def _parquet(root: Path, schema: pa.Schema, **unit: object) -> flight.Query:
    return flight.from_feed(Units([plan_pb2.FileUnit(path=str(root / "x.parquet"), **unit)]), "parquet", schema)  # type: ignore[arg-type]


def test_thousands_of_partition_values_are_read(hostile_cluster: flight.LocalCluster, local_root: Path) -> None:
    values = {f"c{i}": "v" for i in range(20_000)} | {"part": "7"}
    schema = pa.schema([("x", pa.int64()), ("part", pa.int32())])
    got = _run(hostile_cluster, _parquet(local_root, schema, partition_values=values))
    assert got.num_rows == 100 and set(got.column("part").to_pylist()) == {7}


@pytest.mark.parametrize(
    "kind, text",
    [(pa.int32(), "zz"), (pa.int8(), "1000"), (pa.date32(), "not-a-date"), (pa.list_(pa.int32()), "1"),
     (pa.struct([("a", pa.int32())]), "1"), (pa.timestamp("ns", "UTC"), "2020-01-01T00:00:00")],
)
def test_a_partition_value_that_does_not_cast_is_named(kind: pa.DataType, text: str, hostile_cluster: flight.LocalCluster, local_root: Path) -> None:
    schema = pa.schema([("x", pa.int64()), ("part", kind)])
    message = _fails(hostile_cluster, _parquet(local_root, schema, partition_values={"part": text}))
    assert "partition value of column 'part'" in message and "work unit 0" in message


def test_a_filter_on_a_partition_column_prunes_nothing_it_should_keep(hostile_cluster: flight.LocalCluster, local_root: Path) -> None:
    schema = pa.schema([("x", pa.int64()), ("part", pa.string())])
    query = _parquet(local_root, schema, partition_values={"part": "a"})
    assert _run(hostile_cluster, query.filter(flight.col("part") == "a")).num_rows == 100
    assert _run(hostile_cluster, query.filter(flight.col("part") == "b")).num_rows == 0
    nulls = _parquet(local_root, schema, null_partitions=["part"])
    assert _run(hostile_cluster, nulls.filter(flight.col("part").is_null())).num_rows == 100


def test_a_partitioned_unit_whose_file_lacks_a_scan_column_names_it(hostile_cluster: flight.LocalCluster, local_root: Path) -> None:
    schema = pa.schema([("x", pa.int64()), ("y", pa.int64()), ("part", pa.string())])
    message = _fails(hostile_cluster, _parquet(local_root, schema, partition_values={"part": "a"}))
    assert "column 'y' is missing" in message


# ------------------------------------------------------------ the iceberg reader's field_ids


def _iceberg(root: Path, field_ids: str | None, schema: pa.Schema | None = None) -> flight.Query:
    options = {} if field_ids is None else {"field_ids": field_ids}
    schema = schema or pa.schema([("a", pa.int64()), ("s", pa.string())])
    return flight.from_feed(Units([plan_pb2.FileUnit(path=str(root / "ice.parquet"))]), "iceberg", schema, options=options)


def test_iceberg_reads_by_field_id(hostile_cluster: flight.LocalCluster, local_root: Path) -> None:
    got = _run(hostile_cluster, _iceberg(local_root, json.dumps({"a": 1, "s": 2})))
    assert got.sort_by("a").column("s").to_pylist() == ["p", "q", "r"]


@pytest.mark.parametrize("field_ids", [None, "", "null", "[]", '"x"', "{", '{"a": "x"}', '{"a": {"b": 1}}', '{"a": NaN}', '{"a": 1} trailing'])
def test_a_malformed_field_ids_option_is_named(field_ids: str | None, hostile_cluster: flight.LocalCluster, local_root: Path) -> None:
    assert "reader option field_ids" in _fails(hostile_cluster, _iceberg(local_root, field_ids))


@pytest.mark.parametrize("field_ids", ['{"a": Infinity}', '{"a": 1e400}', "[" * 50_000 + "]" * 50_000], ids=["infinity", "1e400", "deep"])
def test_an_overflowing_or_deep_field_ids_option_is_named(field_ids: str, hostile_cluster: flight.LocalCluster, local_root: Path) -> None:
    assert "reader option field_ids" in _fails(hostile_cluster, _iceberg(local_root, field_ids))


def test_field_ids_mapping_a_column_to_a_wrong_type_name_the_column(hostile_cluster: flight.LocalCluster, local_root: Path) -> None:
    schema = pa.schema([("a", pa.int64()), ("s", pa.int64())])
    message = _fails(hostile_cluster, _iceberg(local_root, json.dumps({"a": 2, "s": 1}), schema))
    assert "damaged" not in message and "'a'" in message


def test_field_ids_matching_nothing_read_nulls(hostile_cluster: flight.LocalCluster, local_root: Path) -> None:
    """Iceberg's rule for a column added after the file was written: nulls (here: every column)."""
    got = _run(hostile_cluster, _iceberg(local_root, json.dumps({f"c{i}": i + 100 for i in range(50_000)} | {"a": 99, "s": 98})))
    assert got.num_rows == 3 and got.column("a").null_count == 3


# ------------------------------------------------------------ tag_units on plans that cannot be tagged


def _scan(schema: pa.Schema = SCHEMA, reader: str = "parquet") -> plan_pb2.Operator:
    return plan_pb2.Operator(feed_scan=plan_pb2.FeedScan(feed=plan_pb2.WorkUnitFeed(feed_id="f"), reader=reader, schema=encode_schema(schema)))


def _untaggable() -> dict[str, plan_pb2.StagePlan]:
    scan = _scan()
    join = plan_pb2.HashJoin(left=scan, right=scan, left_keys=["x"], right_keys=["x"], join_type="inner")
    return {
        "aggregate": plan_pb2.StagePlan(root=plan_pb2.Operator(aggregate=plan_pb2.Aggregate(input=scan))),
        "limit": plan_pb2.StagePlan(root=plan_pb2.Operator(limit=plan_pb2.Limit(input=scan, count=1))),
        "join": plan_pb2.StagePlan(root=plan_pb2.Operator(hash_join=join)),
        "two-partitions": plan_pb2.StagePlan(root=scan, output=plan_pb2.OutputSpec(partitions=2, hash_keys=["x"], readers=1)),
        "values": plan_pb2.StagePlan(root=plan_pb2.Operator(values=plan_pb2.Values())),
        # (A filter without an input is no plan at all now: refused as such, header.plan.operators[0].inputs.)
        "filter-over-values": plan_pb2.StagePlan(root=plan_pb2.Operator(filter=plan_pb2.Filter(input=plan_pb2.Operator(values=plan_pb2.Values())))),
    }


@pytest.mark.parametrize("name", list(_untaggable()))
def test_tag_units_on_a_plan_it_cannot_tag_is_refused_naming_the_option(name: str, hostile_cluster: flight.LocalCluster) -> None:
    plan = _untaggable()[name]
    h = header(plan, {"f": [0]})
    h.options.tag_units = True
    frames, exc = raw_exchange(hostile_cluster.urls[0], h.SerializeToString())
    info = error_of(frames)
    assert info.code == protocol_pb2.ERROR_CODE_INVALID_ARGUMENT and info.field == "header.options.tag_units", info
    assert exc is not None and "Traceback" not in str(exc)
    assert healthy(hostile_cluster.urls[0])


def test_tag_units_with_a_scan_column_named_like_the_tag_is_refused(hostile_cluster: flight.LocalCluster) -> None:
    plan = plan_pb2.StagePlan(root=_scan(pa.schema([("x", pa.int64()), (UNIT_COLUMN, pa.uint64())])))
    h = header(plan, {"f": [0]})
    h.options.tag_units = True
    frames, _ = raw_exchange(hostile_cluster.urls[0], h.SerializeToString())
    info = error_of(frames)
    assert info.code == protocol_pb2.ERROR_CODE_INVALID_ARGUMENT and UNIT_COLUMN in info.message
    assert info.field.endswith("feed_scan.schema")
    assert healthy(hostile_cluster.urls[0])


# ------------------------------------------------------------ UnitGate: what a hostile worker could send (no processes)


def _batch(tags: pa.Array, name: str = UNIT_COLUMN) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array(range(len(tags)), pa.int64()), tags], names=["x", name])


def _ree(ids: list[int | None], run_ends: pa.DataType | None = None, values: pa.DataType | None = None) -> pa.Array:
    return pc.run_end_encode(pa.array(ids, values or pa.uint64()), run_end_type=run_ends or pa.int32())  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "batch, why",
    [
        (_batch(pa.array([1, 1], pa.uint64())), "no '__flight_unit' last column"),
        (_batch(_ree([1, 1], values=pa.int64())), "no '__flight_unit' last column"),
        (_batch(_ree([1, 1], run_ends=pa.int16())), "no '__flight_unit' last column"),
        (_batch(_ree([1, 1]), name="other"), "no '__flight_unit' last column"),
        (pa.RecordBatch.from_arrays([], names=[]), "no '__flight_unit' last column"),
        (_batch(_ree([1, None])), "null work unit ids"),
        (_batch(_ree([1, 2, 1])), "split by another's"),
        (_batch(_ree([1, 1, 2, 2, 3, 1])), "split by another's"),
    ],
    ids=["plain-uint64", "int64-values", "int16-ends", "other-name", "no-columns", "null-id", "interleaved", "interleaved-late"],
)
def test_the_gate_refuses_malformed_tags(batch: pa.RecordBatch, why: str) -> None:
    with pytest.raises(ProtocolError, match=why):
        UnitGate("task t on w").feed(batch)


def test_the_gate_takes_empty_and_offset_sliced_batches() -> None:
    gate = UnitGate("task t on w")
    assert gate.feed(_batch(_ree([]))) == ([], [])
    full = _batch(_ree([1, 1, 2, 2, 3, 3, 4]))
    released, done = gate.feed(full.slice(1, 3))  # rows of units 1, 2, 2
    assert done == [1] and [b.column(0).to_pylist() for b in released] == [[1]]
    released, done = gate.feed(full.slice(4, 3))  # 3, 3, 4
    assert done == [2, 3] and [b.column(0).to_pylist() for b in released] == [[2, 3], [4, 5]]
    released, done = gate.end()
    assert done == [4] and [b.column(0).to_pylist() for b in released] == [[6]]
    assert all(b.schema.names == ["x"] for b in released)


def test_the_gate_refuses_a_batch_whose_run_ends_are_malformed() -> None:
    """Run ends out of order (a hostile or broken worker): validated in full before use."""
    tags = pa.Array.from_buffers(UNIT_TYPE, 5, [None], children=[pa.array([3, 1, 5], pa.int32()), pa.array([1, 2, 3], pa.uint64())])
    with pytest.raises(ProtocolError, match="tags are malformed"):
        UnitGate("task t on w").feed(_batch(tags))
