"""Hash partitioning of a task's output for a shuffle.

Producers on different workers must agree on a row's partition, so the hash
is a fixed function of the key values, computed with Arrow kernels: numeric,
temporal and decimal keys as integers through a multiplicative mix; string
keys through a CRC32 of each distinct value. Rows whose keys are equal always
land in the same partition; nulls hash like zero / the empty string.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["hash_columns", "split_by_hash"]

_GOLDEN = pa.scalar(0x9E3779B97F4A7C15, pa.uint64())
_SHIFT = pa.scalar(29, pa.uint64())


def _is_stringy(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)


def hash_columns(types: Sequence[pa.DataType]) -> list[int]:
    """Which key positions to hash: the non-string ones if any (cheap), else all of them.

    Hashing a subset of the keys is still correct (equal keys, equal subset);
    both sides of a join have the same key types, so they pick the same positions.
    """
    cheap = [i for i, t in enumerate(types) if not _is_stringy(t)]
    return cheap or list(range(len(types)))


def _as_uint64(column: pa.Array) -> pa.Array:
    t = column.type
    if _is_stringy(t):
        values = column.cast(pa.large_binary()) if not pa.types.is_large_binary(t) else column
        unique = pc.unique(values)
        codes = pa.array([zlib.crc32(v or b"") for v in unique.to_pylist()], pa.uint64())
        return pc.take(codes, pc.index_in(values, unique)).fill_null(0)
    if pa.types.is_boolean(t):
        column = column.cast(pa.uint8())
    elif pa.types.is_temporal(t) and not pa.types.is_integer(t):
        column = column.cast(pa.int64() if t.bit_width == 64 else pa.int32())
    elif pa.types.is_decimal(t) or pa.types.is_floating(t):
        column = column.cast(pa.int64(), safe=False)
    return column.fill_null(0).cast(pa.int64(), safe=False).cast(pa.uint64(), safe=False)


def split_by_hash(batch: pa.RecordBatch, keys: Sequence[str], partitions: int) -> list[tuple[int, pa.RecordBatch]]:
    """The non-empty pieces of ``batch`` per partition."""
    if partitions <= 1:
        return [(0, batch)]
    positions = hash_columns([batch.schema.field(k).type for k in keys])
    h = None
    for i in positions:
        v = _as_uint64(batch.column(keys[i]))
        h = v if h is None else pc.bit_wise_xor(pc.multiply(h, pa.scalar(31, pa.uint64())), v)
    assert h is not None
    mixed = pc.shift_right(pc.multiply(h, _GOLDEN), _SHIFT)
    n = pa.scalar(partitions, pa.uint64())
    ids = pc.subtract(mixed, pc.multiply(pc.divide(mixed, n), n))
    pieces = []
    for p in range(partitions):
        piece = batch.filter(pc.equal(ids, pa.scalar(p, pa.uint64())))
        if piece.num_rows:
            pieces.append((p, piece))
    return pieces
