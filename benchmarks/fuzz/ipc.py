"""Corrupted Arrow IPC streams: offsets out of range, lying lengths, zstd bombs, deep types (``Mutator.ipc``)."""

from __future__ import annotations

import random
import struct
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from benchmarks.fuzz.data import data_table, ipc_file, ipc_stream, table_stream, zstd_bomb

if TYPE_CHECKING:
    from benchmarks.fuzz.mutator import Mutator

__all__ = [
    "IPC_CORRUPTIONS", "empty_batch", "ipc_body_truncated", "ipc_bomb", "ipc_compressed_length", "ipc_deep_type", "ipc_dictionary",
    "ipc_duplicate_names", "ipc_list_offsets", "ipc_many_columns", "ipc_metadata_int", "ipc_metadata_length", "ipc_odd_stream", "ipc_raw",
    "ipc_string_offsets", "item_names", "messages", "offsets_array", "patch_bytes", "replace_name",
]


# ------------------------------------------------------------- IPC corruptions


def offsets_array(typ: pa.DataType, values: Sequence[bytes], rng: random.Random, wide: bool = False) -> tuple[pa.Array, str]:
    """A string/binary array whose *middle* offsets are wrong (first and last stay valid, so cheap checks pass)."""
    offsets, data = [0], b""
    for v in values:
        data += v
        offsets.append(len(data))
    how = rng.choice(["huge", "negative", "past-end", "max", "min", "backwards"])
    i = rng.randrange(1, len(values))
    offsets[i] = {"huge": 1 << 30, "negative": -(1 << 20), "past-end": len(data) + 1, "max": 2**31 - 1,
                  "min": -(2**31), "backwards": offsets[i - 1] - 3}[how]
    fmt = "q" if wide else "i"
    buffer = pa.py_buffer(struct.pack(f"<{len(offsets)}{fmt}", *offsets))
    return pa.Array.from_buffers(typ, len(values), [None, buffer, pa.py_buffer(data)]), how


def item_names(rows: int) -> list[bytes]:
    return [f"item-{i % 7}".encode() for i in range(rows)]


def replace_name(table: pa.Table, column: pa.Array) -> pa.Table:
    i = table.schema.get_field_index("name")
    return table.set_column(i, pa.field("name", column.type), column)


def _role_table(role: str) -> pa.Table:
    return data_table(20) if role == "values" else pa.table({"name": pa.array(["item-1"], pa.string())})


def _with_column(m: Mutator, role: str, column: pa.Array) -> bytes:
    table = _role_table(role) if role == "values" else pa.table({"name": pa.array(["x"] * len(column))})
    return table_stream(replace_name(table, column))


def ipc_string_offsets(m: Mutator, data: bytes, role: str, typ: pa.DataType | None = None, wide: bool = False) -> bytes:
    rows = 20 if role == "values" else 3
    column, how = offsets_array(typ or pa.string(), item_names(rows), m.rng, wide)
    m.note(f"offsets {how}")
    return _with_column(m, role, column)


def ipc_list_offsets(m: Mutator, data: bytes, role: str) -> bytes:
    rows = 20 if role == "values" else 3
    child = pa.array(range(rows * 2), pa.int64())
    offsets = list(range(0, rows * 2 + 1, 2))
    offsets[m.rng.randrange(1, rows)] = m.rng.choice([1 << 30, -(1 << 20), rows * 2 + 5, 2**31 - 1])
    buffer = pa.py_buffer(struct.pack(f"<{len(offsets)}i", *offsets))
    column = pa.Array.from_buffers(pa.list_(pa.int64()), rows, [None, buffer], children=[child])
    base = _role_table(role) if role == "values" else pa.table({"name": pa.array(["x"] * rows)})
    return table_stream(base.append_column("tags", column))


def ipc_dictionary(m: Mutator, data: bytes, role: str) -> bytes:
    rows = 20 if role == "values" else 3
    bad = m.rng.choice([7, 1000, 2**31 - 1, -1, -(2**31)])
    indices = pa.array([bad if i == rows // 2 else i % 7 for i in range(rows)], pa.int32())
    column = pa.DictionaryArray.from_arrays(indices, pa.array([f"item-{i}" for i in range(7)]), safe=False)
    return _with_column(m, role, column)


def ipc_bomb(m: Mutator, data: bytes, role: str) -> bytes:
    return zstd_bomb("values" if role == "values" else "column")


def messages(data: bytes) -> list[tuple[int, int, int, int]]:
    """(metadata start, metadata length, body start, body length) of each message of an IPC stream."""
    out, buf, pos = [], pa.py_buffer(data), 0
    while pos + 8 <= len(data):
        (marker,) = struct.unpack_from("<I", data, pos)
        head = 8 if marker == 0xFFFFFFFF else 4
        (length,) = struct.unpack_from("<i", data, pos + head - 4)
        if length <= 0:
            break
        reader = pa.BufferReader(buf)
        reader.seek(pos)
        try:
            message = pa.ipc.read_message(reader)
        except (pa.ArrowException, OSError):
            break
        end = reader.tell()
        body = message.body.size if message.body is not None else 0
        out.append((pos + head, length, end - body, body))
        pos = end
    return out


def patch_bytes(data: bytes, at: int, fmt: str, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, at, value)
    return bytes(out)


def _readable(data: bytes, role: str) -> bytes:
    """``data`` if it is an IPC stream with a record batch, else a fresh one for ``role``."""
    found = messages(data)
    return data if len(found) >= 2 else table_stream(_role_table(role))


def ipc_compressed_length(m: Mutator, data: bytes, role: str) -> bytes:
    """A compressed buffer whose 8-byte uncompressed-length prefix lies."""
    stream = table_stream(_role_table(role), m.rng.choice(["zstd", "lz4"]))
    _, _, body, size = messages(stream)[-1]
    starts = [body + i for i in range(0, size - 8, 8) if struct.unpack_from("<q", stream, body + i)[0] in _buffer_sizes(role)]
    at = m.rng.choice(starts or [body])
    value = m.rng.choice([2**40, 2**62, 2**63 - 1, -2, 0, 1, 2**31, 7])
    m.note(f"uncompressed length {value}")
    return patch_bytes(stream, at, "<q", value)


def _buffer_sizes(role: str) -> set[int]:
    rows = 20 if role == "values" else 1
    return {rows * 8, rows * 4 + 4, rows * 4, (rows + 7) // 8, 40 + rows}


def ipc_metadata_int(m: Mutator, data: bytes, role: str) -> bytes:
    """An 8-byte integer in a record batch's metadata (a length, a buffer offset or size) set to an extreme."""
    stream = _readable(data, role)
    meta, length, _, body = messages(stream)[-1]
    spots = [meta + i for i in range(0, length - 7, 8) if 0 < struct.unpack_from("<q", stream, meta + i)[0] <= max(body, 64)]
    at = m.rng.choice(spots or [meta])
    value = m.rng.choice([2**62, 2**63 - 1, -1, -(2**63), 2**31, body + 8, 1 << 40])
    m.note(f"metadata int64 at {at - meta} = {value}")
    return patch_bytes(stream, at, "<q", value)


def ipc_metadata_length(m: Mutator, data: bytes, role: str) -> bytes:
    stream = _readable(data, role)
    meta, _, _, _ = m.rng.choice(messages(stream))
    return patch_bytes(stream, meta - 4, "<i", m.rng.choice([2**31 - 1, -8, 0, 7, 1 << 24]))


def ipc_body_truncated(m: Mutator, data: bytes, role: str) -> bytes:
    stream = _readable(data, role)
    _, _, body, size = messages(stream)[-1]
    return stream[: body + m.rng.randrange(max(1, size))]


def ipc_deep_type(m: Mutator, data: bytes, role: str) -> bytes:
    depth = m.rng.choice([40, 63, 64, 65, 100, 300])
    typ: pa.DataType = pa.int64()
    for _ in range(depth):
        typ = pa.struct([("s", typ)]) if m.rng.random() < 0.7 else pa.list_(typ)
    m.note(f"depth {depth}")
    column = pa.array([None] * 2, typ)
    base = _role_table(role).slice(0, 2) if role == "values" else pa.table({"name": ["x", "y"]})
    return table_stream(base.append_column("deep", column))


def ipc_duplicate_names(m: Mutator, data: bytes, role: str) -> bytes:
    table = _role_table(role)
    name = m.rng.choice(table.schema.names)
    extra = table.column(name) if m.rng.random() < 0.5 else pa.chunked_array([pa.array([1] * table.num_rows, pa.int64())])
    return table_stream(table.append_column(name, extra))


def ipc_many_columns(m: Mutator, data: bytes, role: str) -> bytes:
    count = m.rng.choice([1_000, 5_000])
    rows = 2
    table = pa.table({f"c{i}": pa.array([i] * rows, pa.int64()) for i in range(count)})
    base = _role_table(role).slice(0, rows) if role == "values" else pa.table({"name": ["x"] * rows})
    for f in base.schema:
        table = table.append_column(f, base.column(f.name))
    return table_stream(table)


def ipc_odd_stream(m: Mutator, data: bytes, role: str) -> bytes:
    table = _role_table(role)
    kind = m.rng.choice(["empty", "eos-only", "schema-only", "two-streams", "file-format", "no-eos", "two-batches", "zero-rows"])
    m.note(kind)
    stream = table_stream(table)
    if kind == "empty":
        return b""
    if kind == "eos-only":
        return b"\xff\xff\xff\xff\x00\x00\x00\x00"
    if kind == "schema-only":
        return ipc_stream(table.schema, [])
    if kind == "two-streams":
        return stream + stream
    if kind == "file-format":
        return ipc_file(table.schema, table.to_batches())
    if kind == "no-eos":
        return stream[:-8]
    if kind == "two-batches":
        return ipc_stream(table.schema, table.to_batches() * 2)
    return ipc_stream(table.schema, [empty_batch(table.schema)])


def empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)


def ipc_raw(m: Mutator, data: bytes, role: str) -> bytes:
    return m.raw(_readable(data, role), "ipc")


IPC_CORRUPTIONS: dict[str, Callable[[Mutator, bytes, str], bytes]] = {
    "string-offsets": ipc_string_offsets,
    "binary-offsets": lambda m, d, r: ipc_string_offsets(m, d, r, pa.binary()),
    "large-string-offsets": lambda m, d, r: ipc_string_offsets(m, d, r, pa.large_string(), wide=True),
    "list-offsets": ipc_list_offsets,
    "dictionary-indices": ipc_dictionary,
    "zstd-bomb": ipc_bomb,
    "compressed-length": ipc_compressed_length,
    "metadata-int": ipc_metadata_int,
    "metadata-length": ipc_metadata_length,
    "body-truncated": ipc_body_truncated,
    "deep-type": ipc_deep_type,
    "duplicate-names": ipc_duplicate_names,
    "many-columns": ipc_many_columns,
    "odd-stream": ipc_odd_stream,
    "raw": ipc_raw,
}
