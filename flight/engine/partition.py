"""Hash partitioning of a task's output for a shuffle.

Producers on different workers (and in other languages) must agree on a row's
partition, so the hash is a fixed function of the key *values*, specified
exactly in docs/protocol.md ("Output partitioning") and computed here with
Arrow kernels:

1. each hashed key gives a 64-bit value ``v`` (``key_values``): integers,
   booleans, dates, times, timestamps and durations their integer value;
   decimals their unscaled integer; floats the IEEE-754 bits of the float64
   value (-0.0 made +0.0, every NaN the canonical NaN) with their two 32-bit
   halves swapped; strings and binaries the CRC-32 of their bytes; nulls 0;
2. ``h = v0``, then ``h = (h * 31) ^ vi`` for the next hashed keys, in order;
3. ``partition = ((h * 0x9E3779B97F4A7C15) >> 29) % n``; all in uint64 (mod 2**64).

Only the non-string keys are hashed when there are any (``hash_columns``).
Rows whose keys are equal always land in the same partition.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import cast

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["hash_columns", "key_values", "partition_ids", "split_by_hash"]

_U64 = pa.uint64()
_GOLDEN = pa.scalar(0x9E3779B97F4A7C15, _U64)
_SHIFT = pa.scalar(29, _U64)
_PRIME = pa.scalar(31, _U64)
_NAN = pa.scalar(float("nan"), pa.float64())  # the canonical quiet NaN, bits 0x7FF8000000000000
_ZERO = pa.scalar(0.0, pa.float64())
_HALF = pa.scalar(32, _U64)

# Decimal types of scale 0 with the same layout: a view as one of these reads the unscaled integer.
_UNSCALED = {32: pa.decimal32(9, 0), 64: pa.decimal64(18, 0), 128: pa.decimal128(38, 0), 256: pa.decimal256(76, 0)}


def _value_type(t: pa.DataType) -> pa.DataType:
    """The logical type a key is hashed as: extension types by storage, dictionaries by value."""
    while True:
        if isinstance(t, pa.BaseExtensionType):
            t = t.storage_type
        elif pa.types.is_dictionary(t):
            t = t.value_type
        else:
            return t


def _is_stringy(t: pa.DataType) -> bool:
    t = _value_type(t)
    return (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_string_view(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_binary_view(t)
        or pa.types.is_fixed_size_binary(t)
    )


def hash_columns(types: Sequence[pa.DataType]) -> list[int]:
    """Which key positions to hash: the non-string ones if any (cheap), else all of them.

    Hashing a subset of the keys is still correct (equal keys, equal subset);
    both sides of a join have the same key types, so they pick the same positions.
    """
    cheap = [i for i, t in enumerate(types) if not _is_stringy(t)]
    return cheap or list(range(len(types)))


def key_values(column: pa.Array) -> pa.Array:
    """The 64-bit value of each key (a uint64 array without nulls); docs/protocol.md states it per type."""
    t = column.type
    if isinstance(t, pa.BaseExtensionType):
        return key_values(cast(pa.ExtensionArray, column).storage)
    if pa.types.is_dictionary(t):
        dictionary = cast(pa.DictionaryArray, column)
        return pc.take(key_values(dictionary.dictionary), dictionary.indices).fill_null(0)
    if _is_stringy(t):
        # CRC-32 (zlib, IEEE) of each distinct value's bytes, spread over the rows by index.
        encoded = cast(pa.DictionaryArray, pc.dictionary_encode(column))  # nulls stay null in the indices, not in the dictionary
        distinct = encoded.dictionary
        if not pa.types.is_large_binary(distinct.type):
            distinct = distinct.cast(pa.large_binary())
        values = cast("list[bytes]", distinct.to_pylist())  # no nulls: they stay in the indices
        codes = pa.array([zlib.crc32(v) for v in values], _U64)
        return pc.take(codes, encoded.indices).fill_null(0)
    if pa.types.is_null(t):
        return pa.nulls(len(column), _U64).fill_null(0)
    if pa.types.is_boolean(t):
        column = column.cast(pa.uint8())
    elif pa.types.is_floating(t):
        x = column if pa.types.is_float64(t) else column.cast(pa.float64())
        if x.null_count:
            x = x.fill_null(_ZERO)
        nan = pc.is_nan(x)
        x = pc.add(x, _ZERO)  # -0.0 + 0.0 is +0.0 (IEEE-754, rounding to nearest)
        if nan.true_count:  # NaNs of any sign and payload become the canonical NaN
            x = pc.if_else(nan, _NAN, x)
        # The IEEE-754 bits with their 32-bit halves swapped: the final multiply only carries bits
        # upwards, and "round" floats (1.0, 2.5, ...) have all-zero low bits.
        bits = x.view(_U64)
        return pc.bit_wise_or(pc.shift_left(bits, _HALF), pc.shift_right(bits, _HALF))
    elif pa.types.is_decimal(t):
        # The unscaled integer's low 64 bits (an unsafe decimal->int64 cast keeps the low bits).
        column = column.view(_UNSCALED[t.bit_width]).cast(pa.int64(), safe=False)
    elif pa.types.is_temporal(t) and not pa.types.is_interval(t):
        column = column.cast(pa.int64() if t.bit_width == 64 else pa.int32())  # date, time, timestamp, duration
    elif not pa.types.is_integer(t):
        raise pa.ArrowNotImplementedError(f"cannot hash-partition on a key of type {t}")
    # Integers: sign-extended (signed) or zero-extended (unsigned) to 64 bits, i.e. the value mod 2**64.
    return column.fill_null(0).cast(pa.int64(), safe=False).cast(_U64, safe=False)


def partition_ids(batch: pa.RecordBatch, keys: Sequence[str], partitions: int) -> pa.Array:
    """Each row's output partition (uint64, in ``[0, partitions)``)."""
    if not keys:
        raise ValueError("hash partitioning needs at least one key")
    types = []
    for k in keys:
        i = batch.schema.get_field_index(k)
        if i < 0:
            raise pa.ArrowInvalid(f"hash key {k!r} is not a column of the task's output {batch.schema.names}")
        types.append(batch.schema.field(i).type)
    h = None
    for i in hash_columns(types):
        v = key_values(batch.column(keys[i]))
        h = v if h is None else pc.bit_wise_xor(pc.multiply(h, _PRIME), v)
    assert h is not None
    mixed = pc.shift_right(pc.multiply(h, _GOLDEN), _SHIFT)  # wrapping uint64 multiply, logical shift
    if partitions & (partitions - 1) == 0:  # a power of two: the same as the modulo
        return pc.bit_wise_and(mixed, pa.scalar(partitions - 1, _U64))
    n = pa.scalar(partitions, _U64)
    return pc.subtract(mixed, pc.multiply(pc.divide(mixed, n), n))


def split_by_hash(batch: pa.RecordBatch, keys: Sequence[str], partitions: int) -> list[tuple[int, pa.RecordBatch]]:
    """The non-empty pieces of ``batch`` per partition."""
    if partitions <= 1:
        return [(0, batch)]
    ids = partition_ids(batch, keys, partitions)
    pieces = []
    for p in range(partitions):
        piece = batch.filter(pc.equal(ids, pa.scalar(p, _U64)))
        if piece.num_rows:
            pieces.append((p, piece))
    return pieces
