"""flight.spark's surface, its light import, and its pieces that need no SparkSession."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pytest

import flight
import flight.spark as fs
from flight.errors import PlanError, ResolverError
from flight.spark._options import decode_options, encode_head, encode_units
from flight.spark._schema import Conformer, check_conformable
from flight.spark._workers import describe_workers
from flight.wire.plan_codec import encode_plan

pytest.importorskip("pyspark", reason="the Spark tests need the spark extra: pip install -e '.[dev,spark]'")

EXPECTED = {
    "DataFrameFeed", "FlightMap", "FlightRead", "ddl", "feed_from_dataframe", "flight_map", "input_schema",
    "map_in_arrow", "plan_options", "read", "register", "spark_schema", "sql", "start_read", "start_workers", "SparkWorkers",
    "table",
}


def test_public_api_is_exactly_what_is_exported() -> None:
    assert set(fs.__all__) == EXPECTED
    for name in fs.__all__:
        assert hasattr(fs, name), name


def test_importing_flight_spark_does_not_import_pyspark() -> None:
    code = "import sys, flight.spark; print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'py4j')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_arrow_types_map_to_spark_types() -> None:
    schema = pa.schema(
        [
            ("i8", pa.int8()), ("u32", pa.uint32()), ("u64", pa.uint64()), ("f", pa.float32()),
            ("d", pa.decimal128(15, 2)), ("s", pa.large_string()), ("v", pa.string_view()), ("b", pa.binary()),
            ("day", pa.date32()), ("ts", pa.timestamp("ns", tz="UTC")), ("ntz", pa.timestamp("us")),
            ("l", pa.list_(pa.int64())), ("m", pa.map_(pa.string(), pa.float64())),
            ("st", pa.struct([("a b", pa.int32())])), ("dict", pa.dictionary(pa.int32(), pa.string())),
        ]
    )
    assert fs.ddl(schema) == (
        "`i8` tinyint, `u32` bigint, `u64` decimal(20,0), `f` float, `d` decimal(15,2), `s` string, `v` string, "
        "`b` binary, `day` date, `ts` timestamp, `ntz` timestamp_ntz, `l` array<bigint>, `m` map<string,double>, "
        "`st` struct<`a b`:int>, `dict` string"
    )
    with pytest.raises(PlanError, match="column 't'"):
        fs.spark_schema(pa.schema([("t", pa.time64("us"))]))


def test_conformer_orders_casts_and_names_the_column() -> None:
    target = pa.schema([pa.field("b", pa.float64()), pa.field("a", pa.int32(), nullable=False)])
    conform = Conformer(target, "test")
    batch = pa.record_batch({"a": pa.array([1, 2], pa.int64()), "B": pa.array([3, 4], pa.int64()), "x": [0, 0]})
    out = conform(batch)
    assert out.schema.equals(target) and out.to_pydict() == {"b": [3.0, 4.0], "a": [1, 2]}
    with pytest.raises(PlanError, match="column 'a' is int64 but declared as int32, and a value does not fit"):
        conform(pa.record_batch({"a": pa.array([2**40]), "b": pa.array([1.0])}))
    with pytest.raises(PlanError, match="column 'a' is declared NOT NULL but has 1 null"):
        conform(pa.record_batch({"a": pa.array([None], pa.int32()), "b": pa.array([1.0])}))
    with pytest.raises(PlanError, match="declared column 'b' is missing"):
        conform(pa.record_batch({"a": pa.array([1], pa.int32())}))
    with pytest.raises(PlanError, match=r"column 'a' is list<item: int8> but declared as int32 and cannot be cast"):
        check_conformable(pa.schema([("a", pa.list_(pa.int8())), ("b", pa.float64())]), target, "test")


def test_workers_are_plain_data_and_bad_urls_fail_early(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert describe_workers("grpc://a:1, b:2") == {"kind": "static", "urls": ["grpc://a:1", "grpc://b:2"]}
    with pytest.raises(ResolverError, match="port"):
        describe_workers(["grpc://a:x"])
    with pytest.raises(ResolverError, match="no worker URLs"):
        describe_workers([])
    path = tmp_path / "workers.txt"
    path.write_text("grpc://a:1\n")
    with flight.FileWorkerResolver(path) as resolver:
        assert describe_workers(resolver)["kind"] == "file"
    with flight.PollingWorkerResolver(lambda: ["grpc://a:1"]) as polling, pytest.raises(ResolverError, match="cannot be described"):
        describe_workers(polling)


def test_data_source_options_round_trip_and_explain_mistakes() -> None:
    schema = pa.schema([("a", pa.int64())])
    head = decode_options(encode_head([("grpc://a:1", b"\x01\x02")], schema, "q1"))
    assert head.partitions == [("grpc://a:1", b"\x01\x02")] and head.schema.equals(schema) and head.query_id == "q1"
    plan = encode_plan(flight.from_arrow(pa.table({"a": [1]})).stage_plan())
    import base64

    options = {"plan": base64.b64encode(plan).decode(), "workers": "grpc://a:1", "units": encode_units([{"f": {0: [b"u"]}}, {"f": {}}])}
    spec = decode_options(options)
    assert spec.assign == [{"f": {0: [b"u"]}}, {"f": {}}] and spec.workers.urls() == ["grpc://a:1"]
    with pytest.raises(PlanError, match="needs option 'workers'"):
        decode_options({"plan": options["plan"]})
    with pytest.raises(PlanError, match="'tasks' is 3 but 'units' was made for 2"):
        decode_options({**options, "tasks": "3"})
    with pytest.raises(PlanError, match="not valid base64"):
        decode_options({"plan": "%%%", "workers": "grpc://a:1"})
    with pytest.raises(PlanError, match="give options 'coordinator' and 'sql'"):
        decode_options({})
