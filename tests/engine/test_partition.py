"""The output hash partitioning (flight/engine/partition.py) against its spec.

The reference is the plain-Python re-implementation of docs/protocol.md ("Output
partitioning") in test_raw_client.py, which checks a real worker against it.
"""

from __future__ import annotations

import datetime
import math
import random
import struct
import sys
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

# The independent implementation of the spec lives with the raw client (tests/worker), which is
# written from docs/protocol.md alone; importing it by name needs its directory on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "worker"))
from test_raw_client import spec_hashed_positions, spec_key_value, spec_partition

from flight.engine.partition import hash_columns, key_values, partition_ids, split_by_hash

NAN_PAYLOADS = [  # NaNs of both signs, quiet and signalling, with payloads
    struct.unpack("<d", struct.pack("<Q", bits))[0]
    for bits in (0x7FF8000000000000, 0xFFF8000000000000, 0x7FF0000000000001, 0xFFF4000000000123)
]
FLOATS = [0.0, -0.0, 1.5, -1.5, 0.1, 1e300, -1e300, 5e-324, 2.0**63, -(2.0**63), 2.0**64, math.inf, -math.inf, None]
FLOATS += NAN_PAYLOADS
STRINGS = ["", None, "a", "abc", "é", "e\u0301", "日本語", "🙂", "Straße"]
BYTES = [b"", None, b"\x00", b"\xff\xfe\x00", b"abc"]


def _ints(bits: int, signed: bool) -> list[int | None]:
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    return [lo, hi, 0, 1, None, lo + 1, hi - 1] + ([-1, -2] if signed else [])


def _decimals(precision: int, scale: int) -> list[Decimal | None]:
    def exact(unscaled: int) -> Decimal:  # no context rounding, whatever the precision
        return Decimal(f"{unscaled}E-{scale}")

    big = 10**precision - 1
    return [exact(big), exact(-big), exact(0), exact(-1), exact(1234 * 10 ** (scale - 2)) if scale >= 2 else exact(12), None]


def _cases() -> list[tuple[str, pa.Array, list[Any]]]:
    """(id, an array, the values the reference sees for it)."""
    cases: list[tuple[str, pa.Array, list[Any]]] = []

    def add(name: str, array: pa.Array, values: list[Any] | None = None) -> None:
        cases.append((name, array, array.to_pylist() if values is None else values))

    for bits in (8, 16, 32, 64):
        for signed in (True, False):
            t = getattr(pa, f"{'' if signed else 'u'}int{bits}")()
            add(str(t), pa.array(_ints(bits, signed), t))
    add("bool", pa.array([True, False, None]))
    add("float64", pa.array(FLOATS, pa.float64()))
    add("float32", pa.array(FLOATS, pa.float64()).cast(pa.float32(), safe=False))
    add("float16", pa.array([0.0, -0.0, 1.5, -2.25, 65504.0, math.inf, math.nan, None], pa.float64()).cast(pa.float16()))
    for t in (pa.decimal32(9, 2), pa.decimal64(18, 4), pa.decimal128(38, 10), pa.decimal128(10, 0), pa.decimal256(76, 20)):
        add(str(t), pa.array(_decimals(t.precision, t.scale), t))
    days = [0, -1, 1, 19000, -25567, 2932896, None]
    add("date32", pa.array(days, pa.int32()).cast(pa.date32()))
    add("date64", pa.array([None if d is None else d * 86_400_000 for d in days], pa.int64()).cast(pa.date64()))
    ticks = [0, -1, 1, 1_700_000_000, -86_399, 2**62, None]
    for unit in ("s", "ms", "us", "ns"):
        for tz in (None, "Europe/Paris"):
            t = pa.timestamp(unit, tz)
            add(str(t), pa.array(ticks, pa.int64()).cast(t), ticks)  # the stored integers
        add(f"duration[{unit}]", pa.array(ticks, pa.int64()).cast(pa.duration(unit)), ticks)
    in_day = [0, 1, 3599, 86_399, None]
    add("time32[s]", pa.array(in_day, pa.int32()).cast(pa.time32("s")), in_day)
    add("time32[ms]", pa.array(in_day, pa.int32()).cast(pa.time32("ms")), in_day)
    add("time64[us]", pa.array(in_day, pa.int64()).cast(pa.time64("us")), in_day)
    add("time64[ns]", pa.array(in_day, pa.int64()).cast(pa.time64("ns")), in_day)
    add("time64[us] as time", pa.array([datetime.time(0, 0), datetime.time(13, 37, 5, 250), None], pa.time64("us")))
    add("date32 as date", pa.array([datetime.date(1969, 12, 31), datetime.date(2024, 2, 29), None], pa.date32()))
    add("timestamp[us] as datetime", pa.array([datetime.datetime(1969, 12, 31, 23, 59, 59, 1), None], pa.timestamp("us")))
    for t in (pa.string(), pa.large_string(), pa.string_view()):
        add(str(t), pa.array(STRINGS, t))
    for t in (pa.binary(), pa.large_binary(), pa.binary_view()):
        add(str(t), pa.array(BYTES, t))
    add("fixed_size_binary", pa.array([b"abc", b"\x00\x00\x00", None, b"\xff\xfe\xfd"], pa.binary(3)))
    add("dictionary<string>", pa.array(STRINGS * 2).dictionary_encode())
    add("dictionary<int64>", pa.array([5, -5, None, 5]).dictionary_encode())
    add("dictionary<float64>", pa.array(FLOATS).dictionary_encode())
    add("null", pa.nulls(3))
    uuids = [bytes(range(16)), None, b"\xff" * 16]
    add("uuid extension", pa.ExtensionArray.from_storage(pa.uuid(), pa.array(uuids, pa.binary(16))), uuids)
    return cases


CASES = _cases()


@pytest.mark.parametrize(("array", "values"), [(a, v) for _, a, v in CASES], ids=[c[0] for c in CASES])
def test_key_values_are_the_documented_64_bit_values(array: pa.Array, values: list[Any]) -> None:
    expected = [spec_key_value(v, array.type) for v in values]
    got = key_values(array)
    assert got.type == pa.uint64() and got.null_count == 0
    assert got.to_pylist() == expected
    # A slice (an offset into the buffers) hashes the same values.
    assert key_values(array.slice(1)).to_pylist() == expected[1:]


def test_documented_test_vectors() -> None:
    """The table of test vectors in docs/protocol.md ("Output partitioning")."""
    vectors: list[tuple[list[Any], list[pa.DataType], int, int]] = [
        ([1], [pa.int64()], 2, 3),
        ([True], [pa.bool_()], 2, 3),
        ([-1], [pa.int32()], 1, 4),
        ([0], [pa.int64()], 0, 0),
        ([-0.0], [pa.float64()], 0, 0),
        ([""], [pa.string()], 0, 0),
        ([None], [pa.int64()], 0, 0),
        ([1.5], [pa.float64()], 6, 2),
        ([math.nan], [pa.float64()], 2, 4),
        (["abc"], [pa.string()], 5, 1),
        (["é"], [pa.string()], 3, 7),
        ([Decimal("-12.34")], [pa.decimal128(10, 2)], 0, 3),
        ([7, 1.5], [pa.int64(), pa.float64()], 5, 2),
        (["abc", "é"], [pa.string(), pa.string()], 3, 3),
        (["abc", 7], [pa.string(), pa.int64()], 4, 3),
    ]
    for values, types, in7, in8 in vectors:
        batch = pa.record_batch([pa.array([v], t) for v, t in zip(values, types)], names=[f"k{i}" for i in range(len(values))])
        for n, expected in ((7, in7), (8, in8)):
            assert partition_ids(batch, batch.schema.names, n).to_pylist() == [expected], (values, types, n)
            assert spec_partition(values, types, n) == expected, (values, types, n)


def _random_batch(rows: int, seed: int) -> pa.RecordBatch:
    rng = random.Random(seed)

    def maybe(draw: Any) -> list[Any]:
        return [None if rng.random() < 0.05 else draw() for _ in range(rows)]

    return pa.record_batch(
        {
            "id": pa.array(range(rows), pa.int64()),
            "i64": pa.array(maybe(lambda: rng.choice([rng.randrange(-(2**63), 2**63), rng.randrange(-50, 50)])), pa.int64()),
            "u64": pa.array(maybe(lambda: rng.randrange(0, 2**64)), pa.uint64()),
            "i16": pa.array(maybe(lambda: rng.randrange(-(2**15), 2**15)), pa.int16()),
            "f64": pa.array(maybe(lambda: rng.choice([rng.uniform(-1e9, 1e9), float(rng.randrange(-9, 9)), *NAN_PAYLOADS, -0.0])), pa.float64()),
            "f32": pa.array(maybe(lambda: rng.uniform(-100, 100)), pa.float64()).cast(pa.float32(), safe=False),
            "dec": pa.array(maybe(lambda: Decimal(f"{rng.randrange(-(10**30), 10**30)}E-6")), pa.decimal128(38, 6)),
            "day": pa.array(maybe(lambda: rng.randrange(-30000, 30000)), pa.int32()).cast(pa.date32()),
            "ts": pa.array(maybe(lambda: rng.randrange(-(2**62), 2**62)), pa.int64()).cast(pa.timestamp("ns")),
            "flag": pa.array(maybe(lambda: rng.random() < 0.5), pa.bool_()),
            "s": pa.array(maybe(lambda: "".join(rng.choice("ab-é日🙂") for _ in range(rng.randrange(0, 6)))), pa.string()),
            "ls": pa.array(maybe(lambda: f"k{rng.randrange(1000)}"), pa.large_string()),
            "bin": pa.array(maybe(lambda: rng.randbytes(rng.randrange(0, 5))), pa.binary()),
        }
    )


KEY_SETS = [
    ["i64"],
    ["u64"],
    ["f64"],
    ["dec"],
    ["s"],
    ["i64", "f64"],
    ["f64", "i64"],  # order matters
    ["i16", "day", "flag", "dec"],
    ["s", "ts"],  # only ts is hashed
    ["s", "ls", "bin"],  # only string-like keys: all three
    ["ls", "f32", "s", "u64"],
]


def _reference_values(batch: pa.RecordBatch, name: str) -> list[Any]:
    column = batch.column(name)
    if pa.types.is_timestamp(column.type):  # the stored integers (datetime cannot hold ns)
        return column.cast(pa.int64()).to_pylist()
    return column.to_pylist()


@pytest.mark.parametrize("partitions", [2, 3, 4, 5, 7, 8, 16, 31, 64, 1000])
def test_partition_ids_match_the_reference(partitions: int) -> None:
    batch = _random_batch(600, seed=partitions)
    for keys in KEY_SETS:
        types = [batch.schema.field(k).type for k in keys]
        columns = [_reference_values(batch, k) for k in keys]
        expected = [spec_partition(list(row), types, partitions) for row in zip(*columns)]
        got = partition_ids(batch, keys, partitions)
        assert got.type == pa.uint64()
        assert got.to_pylist() == expected, keys


def test_split_by_hash_puts_each_row_in_its_partition_once() -> None:
    batch = _random_batch(2000, seed=7)
    keys, n = ["s", "i64", "f64"], 6
    types = [batch.schema.field(k).type for k in keys]
    expected = {
        row_id: spec_partition(list(row), types, n)
        for row_id, *row in zip(batch.column("id").to_pylist(), *(batch.column(k).to_pylist() for k in keys))
    }
    pieces = split_by_hash(batch, keys, n)
    assert [p for p, _ in pieces] == sorted({p for p, _ in pieces})
    landed: dict[int, int] = {}
    for p, piece in pieces:
        assert piece.num_rows > 0 and piece.schema == batch.schema
        for row_id in piece.column("id").to_pylist():
            assert row_id not in landed
            landed[row_id] = p
    assert landed == expected
    assert split_by_hash(batch, keys, 1) == [(0, batch)]
    assert split_by_hash(batch.slice(0, 0), keys, n) == []


def test_hashed_positions() -> None:
    s, i, d = pa.string(), pa.int64(), pa.date32()
    dict_s = pa.dictionary(pa.int32(), pa.string())
    cases = [
        ([s, i, d], [1, 2]),
        ([i, s, d], [0, 2]),
        ([s, pa.binary()], [0, 1]),
        ([dict_s, pa.float64()], [1]),
        ([dict_s, pa.large_string(), pa.string_view(), pa.binary(4), pa.binary_view(), pa.large_binary()], [0, 1, 2, 3, 4, 5]),
        ([pa.dictionary(pa.int8(), pa.int64()), s], [0]),
        ([pa.uuid(), pa.bool_()], [1]),
    ]
    for types, positions in cases:
        assert hash_columns(types) == positions, types
        assert spec_hashed_positions(types) == positions, types


def test_equal_keys_land_together_whatever_their_encoding() -> None:
    n = 13
    ints = [0, 1, -1, 123456, -(2**31), None]

    def ids(array: pa.Array) -> list[int]:
        return partition_ids(pa.record_batch([array], names=["k"]), ["k"], n).to_pylist()

    assert ids(pa.array(ints, pa.int32())) == ids(pa.array(ints, pa.int64())) == ids(pa.array(ints, pa.int64()).dictionary_encode())
    text = ids(pa.array(STRINGS, pa.string()))
    for t in (pa.large_string(), pa.string_view()):
        assert ids(pa.array(STRINGS, t)) == text
    assert ids(pa.array(STRINGS).dictionary_encode()) == text
    assert ids(pa.array([s.encode() if s is not None else None for s in STRINGS], pa.binary())) == text
    floats = ids(pa.array([0.0, -0.0, *NAN_PAYLOADS]))
    assert floats[0] == floats[1] and len(set(floats[2:])) == 1
    assert ids(pa.array([1.5, -0.0, None], pa.float32())) == ids(pa.array([1.5, 0.0, None], pa.float64()))


def test_round_floats_and_fractions_spread_over_the_partitions() -> None:
    # Integral floats have all-zero low bits and fractions truncate to 0: neither may pile up.
    for values in ([float(i) for i in range(4000)], [i / 4000 for i in range(4000)], [i / 2 for i in range(4000)]):
        for n in (4, 7, 8, 16):
            counts = Counter(partition_ids(pa.record_batch([pa.array(values)], names=["f"]), ["f"], n).to_pylist())
            assert len(counts) == n and max(counts.values()) < 2 * len(values) / n, (n, counts)


def test_unsupported_key_types_and_missing_keys_fail() -> None:
    for array in (
        pa.array([[1], [2]]),
        pa.array([{"a": 1}, {"a": 2}]),
        pa.array([(1, 2, 3)] * 2, pa.month_day_nano_interval()),
    ):
        batch = pa.record_batch([array, pa.array([1, 2])], names=["k", "x"])
        with pytest.raises(pa.ArrowNotImplementedError, match="cannot hash-partition"):
            partition_ids(batch, ["k"], 4)
        with pytest.raises(pa.ArrowNotImplementedError):
            partition_ids(batch, ["x", "k"], 4)
    batch = pa.record_batch([pa.array([1, 2])], names=["x"])
    with pytest.raises(pa.ArrowInvalid, match="'missing' is not a column"):
        split_by_hash(batch, ["missing"], 4)
