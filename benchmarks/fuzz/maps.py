"""The ``map`` family: hostile record batches (bad offsets, wrong types, odd shapes) up a map stage's exchange."""

from __future__ import annotations

import random
import struct
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from benchmarks.fuzz.data import DATA_SCHEMA, data_table, ipc_stream, schema_bytes
from benchmarks.fuzz.frames import member_frame
from benchmarks.fuzz.headers import plan_of
from benchmarks.fuzz.ipc import empty_batch, item_names, offsets_array
from benchmarks.fuzz.proto import P, parse, ser
from benchmarks.fuzz.schemas import odd_types
from benchmarks.fuzz.scripts import frame_bytes, input_end_frame, op, walk
from benchmarks.fuzz.settings import BOMB_ROWS

if TYPE_CHECKING:
    from benchmarks.fuzz.mutator import Mutator
    from benchmarks.fuzz.seeds import Seed

__all__ = [
    "MAP_EXTRAS", "MAP_UPLOADS", "MAP_VARIANTS", "insert_extra", "map_binary_utf8", "map_dictionary", "map_duplicate_names", "map_list_offsets",
    "map_mismatch", "map_retyped", "map_shapes", "map_string_offsets", "map_zeros", "mutate_exchange_schema", "set_exchange_schema",
]


# -- map: what goes up a map stage's exchange

def _stream_ops(schema: pa.Schema, batches: Sequence[pa.RecordBatch], rng: random.Random) -> list[dict[str, Any]]:
    compression = rng.choice([None, None, "lz4", "zstd"])
    script = [op("begin", schema=schema_bytes(schema), compression=compression)]
    script += [op("batch", ipc=ipc_stream(schema, [b])) for b in batches]
    end = input_end_frame(sum(b.num_rows for b in batches), len(batches))
    if end is not None:
        script.append(op("frame", data=end))
    return script + [op("await_finished"), op("half_close")]


def _data_batches(rows: int = 30, chunk: int = 10) -> list[pa.RecordBatch]:
    return data_table(rows).to_batches(max_chunksize=chunk)


def _swap_name(batch: pa.RecordBatch, column: pa.Array) -> pa.RecordBatch:
    arrays = [column if f.name == "name" else batch.column(i) for i, f in enumerate(batch.schema)]
    fields = [pa.field("name", column.type) if f.name == "name" else f for f in batch.schema]
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


def map_string_offsets(m: Mutator) -> tuple[pa.Schema | None, list[dict[str, Any]]]:
    batches = _data_batches()
    i = m.rng.randrange(len(batches))
    types: list[pa.DataType] = [pa.string(), pa.string(), pa.binary()]
    typ = m.rng.choice(types)
    column, how = offsets_array(typ, item_names(batches[i].num_rows), m.rng)
    m.note(f"{typ} offsets {how}")
    batches = [_swap_name(b, column if j == i else b.column(1).cast(typ)) for j, b in enumerate(batches)]
    return None, _stream_ops(batches[0].schema, batches, m.rng)


def map_dictionary(m: Mutator) -> tuple[pa.Schema | None, list[dict[str, Any]]]:
    batches = _data_batches()
    bad = m.rng.choice([7, 1000, 2**31 - 1, -1])
    dictionary = pa.array([f"item-{i}" for i in range(7)])
    out = []
    for j, b in enumerate(batches):
        indices = pa.array([bad if (j == 1 and i == 3) else i % 7 for i in range(b.num_rows)], pa.int32())
        out.append(_swap_name(b, pa.DictionaryArray.from_arrays(indices, dictionary, safe=False)))
    m.note(f"dictionary index {bad}")
    return None, _stream_ops(out[0].schema, out, m.rng)


def map_list_offsets(m: Mutator) -> tuple[pa.Schema | None, list[dict[str, Any]]]:
    batches = _data_batches()
    out = []
    for j, b in enumerate(batches):
        rows = b.num_rows
        offsets = list(range(0, rows * 2 + 1, 2))
        if j == 1:
            offsets[m.rng.randrange(1, rows)] = m.rng.choice([1 << 30, -(1 << 20), rows * 2 + 5])
        buffer = pa.py_buffer(struct.pack(f"<{len(offsets)}i", *offsets))
        tags = pa.Array.from_buffers(pa.list_(pa.int64()), rows, [None, buffer], children=[pa.array(range(rows * 2), pa.int64())])
        out.append(pa.RecordBatch.from_arrays([*b.columns, tags], schema=b.schema.append(pa.field("tags", pa.list_(pa.int64())))))
    return out[0].schema, _stream_ops(out[0].schema, out, m.rng)


def map_binary_utf8(m: Mutator) -> tuple[pa.Schema | None, list[dict[str, Any]]]:
    batches = [_swap_name(b, pa.array([b"\xff\xfe" if i == 2 else b"ok" for i in range(b.num_rows)], pa.binary())) for b in _data_batches()]
    return None, _stream_ops(batches[0].schema, batches, m.rng)


def map_duplicate_names(m: Mutator) -> tuple[pa.Schema | None, list[dict[str, Any]]]:
    name = m.rng.choice(DATA_SCHEMA.names)
    batches = [pa.RecordBatch.from_arrays([*b.columns, b.column(name)], schema=b.schema.append(b.schema.field(name))) for b in _data_batches()]
    declared = batches[0].schema if m.rng.random() < 0.5 else None
    return declared, _stream_ops(batches[0].schema, batches, m.rng)


def map_retyped(m: Mutator) -> tuple[pa.Schema | None, list[dict[str, Any]]]:
    """The stream's columns are of other types (cast by name), or one is missing."""
    how = m.rng.choice(["int-as-string", "missing", "string-as-int", "all-null"])
    m.note(how)
    out = []
    for b in _data_batches():
        if how == "int-as-string":
            out.append(_swap_name(b, pa.array(range(b.num_rows), pa.int64())))
        elif how == "missing":
            out.append(b.drop_columns(["score"]))
        elif how == "string-as-int":
            i = b.schema.get_field_index("id")
            out.append(b.set_column(i, pa.field("id", pa.string()), pa.array(["12", "x"] * (b.num_rows // 2), pa.string())))
        else:
            out.append(pa.RecordBatch.from_arrays([pa.nulls(b.num_rows, pa.null())] * 4, names=DATA_SCHEMA.names))
    return None, _stream_ops(out[0].schema, out, m.rng)


def map_shapes(m: Mutator) -> tuple[pa.Schema | None, list[dict[str, Any]]]:
    """Zero-row batches, hundreds of one-row batches, thousands of columns, a deeply nested column."""
    how = m.rng.choice(["zero-rows", "many-small", "wide", "deep", "no-batches"])
    m.note(how)
    if how == "zero-rows":
        batches = [empty_batch(DATA_SCHEMA)] * 3
    elif how == "many-small":
        batches = data_table(50).to_batches(max_chunksize=1)  # a sequential client must stay within gRPC's buffers
    elif how == "no-batches":
        batches = []
    elif how == "wide":
        base = _data_batches()[0]
        extra = [pa.array([i] * base.num_rows, pa.int64()) for i in range(2_000)]
        schema = pa.schema(list(base.schema) + [pa.field(f"c{i}", pa.int64()) for i in range(2_000)])
        batches = [pa.RecordBatch.from_arrays([*base.columns, *extra], schema=schema)]
    else:
        base = _data_batches()[0]
        typ: pa.DataType = pa.int64()
        for _ in range(m.rng.choice([30, 60, 62])):  # the client's IPC writer stops at 64 levels
            typ = pa.struct([("s", typ)])
        deep = pa.array([None] * base.num_rows, typ)
        batches = [pa.RecordBatch.from_arrays([*base.columns, deep], schema=base.schema.append(pa.field("deep", typ)))]
    schema = batches[0].schema if batches else DATA_SCHEMA
    return None, _stream_ops(schema, batches, m.rng)


def map_zeros(m: Mutator) -> tuple[pa.Schema | None, list[dict[str, Any]]]:
    """Hundreds of MB of zeros that zstd sends in a few KB."""
    script = [op("begin", schema=schema_bytes(DATA_SCHEMA), compression="zstd"), op("zeros", rows=BOMB_ROWS)]
    end = input_end_frame(BOMB_ROWS, 1)
    return None, script + ([op("frame", data=end)] if end is not None else []) + [op("await_finished"), op("half_close")]


def map_mismatch(m: Mutator) -> tuple[pa.Schema | None, list[dict[str, Any]]]:
    """Plain input, but the stage declares a schema it cannot be conformed to."""
    typ = m.rng.choice(odd_types())
    name = m.rng.choice(DATA_SCHEMA.names)
    m.note(f"declared {name}: {typ}")
    i = DATA_SCHEMA.get_field_index(name)
    return DATA_SCHEMA.set(i, pa.field(name, typ)), _stream_ops(DATA_SCHEMA, _data_batches(), m.rng)


MAP_VARIANTS: list[tuple[str, float]] = [
    ("plain", 8), ("string-offsets", 18), ("dictionary", 10), ("list-offsets", 8), ("binary-utf8", 6),
    ("duplicate-names", 8), ("retyped", 8), ("shapes", 10), ("zeros", 3), ("mismatch", 6),
]
MAP_UPLOADS: dict[str, Callable[[Mutator], tuple[pa.Schema | None, list[dict[str, Any]]]]] = {
    "plain": lambda m: (None, _stream_ops(DATA_SCHEMA, _data_batches(), m.rng)),
    "string-offsets": map_string_offsets,
    "dictionary": map_dictionary,
    "list-offsets": map_list_offsets,
    "binary-utf8": map_binary_utf8,
    "duplicate-names": map_duplicate_names,
    "retyped": map_retyped,
    "shapes": map_shapes,
    "zeros": map_zeros,
    "mismatch": map_mismatch,
}


def _exchange_inputs(header: Any) -> tuple[Any, list[Any]]:
    plan = plan_of(header)
    return plan, [msg for msg in walk(plan) if msg.DESCRIPTOR.name == "ExchangeInput"]


def set_exchange_schema(header: Any, schema: pa.Schema) -> None:
    plan, inputs = _exchange_inputs(header)
    for found in inputs:
        found.schema = schema_bytes(schema)
    header.plan = ser(plan)


def mutate_exchange_schema(m: Mutator, header: Any) -> None:
    plan, inputs = _exchange_inputs(header)
    for found in inputs:
        found.schema = m.schema(found.schema, "ExchangeInput.schema")
    header.plan = ser(plan)


MAP_EXTRAS = ("empty", "cancel", "member", "garbage", "batch-frame", "input-end-first", "input-end-wrong", "no-input-end")


def insert_extra(m: Mutator, script: list[dict[str, Any]], seed: Seed, map_stage: bool = False) -> None:
    """Something else on a map stage's exchange: empty messages, frames, a batch carrying a frame."""
    kind = m.rng.choice(MAP_EXTRAS)
    m.note(f"map extra {kind}")
    begin = next((i for i, s in enumerate(script) if s["op"] == "begin"), 0)
    last = next((i for i, s in enumerate(script) if s["op"] in ("await_finished", "half_close")), len(script))
    at = m.rng.randint(begin, max(begin, last))
    if kind == "empty":
        script.insert(at, op("empty"))
    elif kind == "cancel":
        script.insert(at, op("frame", data=frame_bytes(cancel=P.Cancel(reason="fuzz"))))
    elif kind == "member":
        script.insert(at, op("frame", data=member_frame(m, seed)))
    elif kind == "garbage":
        script.insert(at, op("frame", data=m.rng.randbytes(m.rng.choice([1, 9, 300]))))
    elif kind == "batch-frame":
        batches = [i for i, s in enumerate(script) if s["op"] == "batch"]
        if batches:
            i = m.rng.choice(batches)
            script[i] = op("batch_frame", ipc=script[i]["ipc"], data=member_frame(m, seed))
    elif kind.startswith("input-end") or kind == "no-input-end":
        _input_end_extra(m, script, kind, begin)


def _input_end_extra(m: Mutator, script: list[dict[str, Any]], kind: str, begin: int) -> None:
    frames = [(i, parse(P.CoordinatorFrame, s["data"]) or P.CoordinatorFrame()) for i, s in enumerate(script) if s["op"] == "frame"]
    ends = [i for i, frame in frames if frame.WhichOneof("frame") == "input_end"]
    if kind == "no-input-end":
        for i in reversed(ends):
            del script[i]
        return
    rows = m.rng.choice([0, 1, 29, 31, 2**64 - 1])
    data = input_end_frame(rows, m.rng.choice([0, 1, 2**64 - 1]))
    if data is None:
        return
    if kind == "input-end-first":
        script.insert(begin, op("frame", data=data))
    elif ends:
        script[ends[0]] = op("frame", data=data)
