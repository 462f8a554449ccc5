"""Hostile encapsulated IPC schemas: duplicate names, deep structs, odd and view types (``Mutator.schema``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pyarrow as pa

from benchmarks.fuzz.data import DATA_SCHEMA, ipc_stream, schema_bytes
from benchmarks.fuzz.ipc import patch_bytes

if TYPE_CHECKING:
    from benchmarks.fuzz.mutator import Mutator

__all__ = [
    "SCHEMA_CORRUPTIONS", "odd_types", "schema_deep_struct", "schema_duplicate_names", "schema_empty_name", "schema_huge_metadata",
    "schema_many_fields", "schema_odd_type", "schema_view_types",
]


def odd_types() -> list[pa.DataType]:
    return [
        pa.map_(pa.string(), pa.int64()), pa.dense_union([pa.field("a", pa.int64()), pa.field("b", pa.string())]),
        pa.sparse_union([pa.field("a", pa.int64())]), pa.dictionary(pa.int8(), pa.string()), pa.large_string(),
        pa.decimal256(76, 10), pa.decimal128(38, -5), pa.binary(1), pa.run_end_encoded(pa.int32(), pa.string()),
        pa.duration("ns"), pa.timestamp("ns", tz="Mars/Olympus_Mons"), pa.timestamp("s", tz="+25:00"), pa.float16(),
        pa.null(), pa.struct([]), pa.large_list(pa.int8()), pa.list_(pa.int8(), 3), pa.month_day_nano_interval(),
        pa.time64("ns"), pa.date64(), pa.bool_(), pa.uint64(), pa.binary(),
    ]


def _schema_or_data(data: bytes) -> pa.Schema:
    try:
        return pa.ipc.read_schema(pa.py_buffer(data))
    except (pa.ArrowException, OSError, ValueError):
        return DATA_SCHEMA


def schema_duplicate_names(m: Mutator, data: bytes) -> bytes:
    schema = _schema_or_data(data)
    f = schema.field(m.rng.randrange(len(schema))) if len(schema) else pa.field("id", pa.int64())
    types: list[pa.DataType] = [pa.int64(), pa.string(), pa.bool_()]
    twin = f if m.rng.random() < 0.5 else pa.field(f.name, m.rng.choice(types))
    return schema_bytes(schema.append(twin))


def schema_deep_struct(m: Mutator, data: bytes) -> bytes:
    typ: pa.DataType = pa.int64()
    depth = m.rng.choice([32, 64, 65, 100, 500])
    for _ in range(depth):
        typ = pa.struct([("s", typ)])
    m.note(f"depth {depth}")
    return schema_bytes(_schema_or_data(data).append(pa.field("deep", typ)))


def schema_many_fields(m: Mutator, data: bytes) -> bytes:
    base = _schema_or_data(data)
    count = m.rng.choice([1_000, 5_000])
    return schema_bytes(pa.schema(list(base) + [pa.field(f"c{i}", pa.int64()) for i in range(count)]))


def schema_odd_type(m: Mutator, data: bytes) -> bytes:
    schema = _schema_or_data(data)
    typ = m.rng.choice(odd_types())
    m.note(str(typ))
    if not len(schema):
        return schema_bytes(pa.schema([pa.field("x", typ)]))
    i = m.rng.randrange(len(schema))
    return schema_bytes(schema.set(i, schema.field(i).with_type(typ)))


def schema_view_types(m: Mutator, data: bytes) -> bytes:
    schema = _schema_or_data(data)
    views = [pa.string_view(), pa.binary_view(), pa.list_view(pa.string_view()), pa.large_list_view(pa.int64()),
             pa.struct([("v", pa.string_view())]), pa.list_(pa.list_view(pa.binary_view()))]
    if not len(schema):
        return schema_bytes(pa.schema([pa.field("v", m.rng.choice(views))]))
    i = m.rng.randrange(len(schema))
    return schema_bytes(schema.set(i, schema.field(i).with_type(m.rng.choice(views))))


def schema_empty_name(m: Mutator, data: bytes) -> bytes:
    schema = _schema_or_data(data)
    name = m.rng.choice(["", " ", "x" * 70_000, "\x00", "a.b", "__index_level_0__"])
    return schema_bytes(schema.append(pa.field(name, pa.int64())))


def schema_huge_metadata(m: Mutator, data: bytes) -> bytes:
    schema = _schema_or_data(data)
    metadata = {b"k": b"v" * m.rng.choice([1 << 20, 8 << 20]), b"ARROW:extension:name": b"arrow.uuid"}
    return schema_bytes(schema.with_metadata(metadata))


SCHEMA_CORRUPTIONS: dict[str, Callable[[Mutator, bytes], bytes]] = {
    "duplicate-names": schema_duplicate_names,
    "deep-struct": schema_deep_struct,
    "many-fields": schema_many_fields,
    "odd-type": schema_odd_type,
    "view-types": schema_view_types,
    "empty": lambda m, d: schema_bytes(pa.schema([])),
    "empty-name": schema_empty_name,
    "huge-metadata": schema_huge_metadata,
    "stream-instead": lambda m, d: ipc_stream(_schema_or_data(d), []),
    "metadata-int": lambda m, d: _patch_schema_int(m, d),
    "truncated": lambda m, d: _truncated(m, d),
    "raw": lambda m, d: m.raw(d, "schema"),
}


def _truncated(m: Mutator, data: bytes) -> bytes:
    return data[: m.rng.randrange(len(data) or 1)]


def _patch_schema_int(m: Mutator, data: bytes) -> bytes:
    if len(data) < 16:
        return m.raw(data, "schema")
    at = m.rng.randrange(8, len(data) - 4) & ~3
    return patch_bytes(data, at, "<i", m.rng.choice([2**31 - 1, -1, -(2**31), len(data) + 64]))
