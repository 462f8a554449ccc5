"""Stream trailers and their checksum (``flight.wire.integrity``), without sockets.

The checksum's one promise: what the sender hashed is what the reader hashes after Arrow's
IPC writer and reader carried the batch, for every layout and slicing, compressed or not;
and a batch that changed on the way hashes differently. The oracle is Arrow's own IPC round
trip (``pa.ipc``, the same writer Flight uses) and pyarrow's equality of batches.
"""

from __future__ import annotations

import decimal
import itertools
import struct
import threading
import zlib
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.flight as fl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flight.wire._proto import protocol_pb2
from flight.wire.clients import read_stream
from flight.wire.integrity import StreamCheck, StreamIntegrityError, Tally, batch_checksum


def _wire(batch: pa.RecordBatch, compression: str | None = None) -> pa.RecordBatch:
    """``batch`` as a reader gets it: through an IPC stream, as Flight writes it."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as w:
        w.write_batch(batch)
    return pa.ipc.open_stream(sink.getvalue()).read_next_batch()


def _layouts() -> pa.RecordBatch:
    n = 40
    return pa.record_batch(
        {
            "i": pa.array([i if i % 7 else None for i in range(n)], pa.int64()),
            "f": pa.array([i / 3 for i in range(n)], pa.float64()),
            "b": pa.array([None if i % 5 == 0 else i % 3 == 0 for i in range(n)]),
            "s": pa.array([None if i % 6 == 0 else "x" * (i % 4) for i in range(n)]),
            "ls": pa.array(["é" * (i % 3) for i in range(n)], pa.large_string()),
            "d": pa.array([decimal.Decimal(i) / 100 for i in range(n)], pa.decimal128(12, 2)),
            "dt": pa.array(list(range(n)), pa.date32()),
            "l": pa.array([None if i % 9 == 0 else list(range(i % 4)) for i in range(n)], pa.list_(pa.int32())),
            "st": pa.array([None if i % 8 == 0 else {"x": i, "y": str(i) if i % 3 else None} for i in range(n)]),
            "fl": pa.array([[i, i + 1] for i in range(n)], pa.list_(pa.int16(), 2)),
            "m": pa.array([[("k", i)] if i % 4 else [] for i in range(n)], pa.map_(pa.string(), pa.int64())),
            "dict": pa.array([str(i % 3) for i in range(n)]).dictionary_encode(),
            "nul": pa.nulls(n),
        }
    )


@pytest.mark.parametrize("compression", [None, "lz4", "zstd"])
@pytest.mark.parametrize("window", [(0, 40), (0, 17), (3, 20), (13, 27), (39, 1), (5, 0)])
def test_the_checksum_survives_the_ipc_round_trip_of_every_layout(compression: str | None, window: tuple[int, int]) -> None:
    sent, crc = batch_checksum(_layouts().slice(*window))
    assert sent.equals(_layouts().slice(*window))  # a sliced batch is sent as a compact copy of the same rows
    arrived = _wire(sent, compression)
    assert arrived.equals(sent)
    assert batch_checksum(arrived)[1] == crc


def test_a_changed_value_null_or_length_changes_the_checksum() -> None:
    base = pa.record_batch({"i": pa.array([1, 2, 3]), "s": pa.array(["a", "b", "c"])})
    crc = batch_checksum(base)[1]
    changed = [
        pa.record_batch({"i": pa.array([1, 2, 4]), "s": pa.array(["a", "b", "c"])}),
        pa.record_batch({"i": pa.array([1, None, 3]), "s": pa.array(["a", "b", "c"])}),
        pa.record_batch({"i": pa.array([1, 2, 3]), "s": pa.array(["a", "bb", "c"])}),
        pa.record_batch({"i": pa.array([1, 2]), "s": pa.array(["a", "b"])}),
    ]
    assert all(batch_checksum(c)[1] != crc for c in changed)


def test_bits_past_the_length_of_a_bitmap_do_not_count() -> None:
    """TPC-DS q14's head sent a 100-row slice of a 552-row batch: bits 100-103 of its validity bitmaps
    were set, and arrived zeroed. They belong to no row: both ends must hash them as 0."""
    big = pa.array([None if i % 3 == 0 else i for i in range(16)], pa.int64())
    flags = pa.array([i % 2 == 0 for i in range(16)])
    sliced = pa.record_batch({"i": big.slice(0, 10), "b": flags.slice(0, 10)})
    clean = pa.record_batch({"i": pa.array(big.slice(0, 10).to_pylist(), pa.int64()), "b": pa.array(flags.slice(0, 10).to_pylist())})
    assert sliced.column(0).buffers()[0].to_pybytes()[1] != clean.column(0).buffers()[0].to_pybytes()[1]  # bits 10-15 differ
    assert batch_checksum(sliced)[1] == batch_checksum(clean)[1]


def _long_layouts() -> pa.RecordBatch:
    """Columns whose buffers pass ``SUMMED_BYTES`` (summed, not hashed byte for byte), with ragged tails."""
    n = 3001
    return pa.record_batch(
        {
            "i": pa.array([i * 7919 if i % 11 else None for i in range(n)], pa.int64()),
            "s": pa.array(["v" * (i % 5) for i in range(n)]),
            "b": pa.array([i % 3 == 0 for i in range(n)]),
            "l": pa.array([list(range(i % 3)) for i in range(n)], pa.list_(pa.int32())),
        }
    )


@pytest.mark.parametrize("window", [(0, 3001), (0, 2999), (7, 2500), (1000, 2001)])
def test_long_buffers_hash_alike_after_the_ipc_round_trip(window: tuple[int, int]) -> None:
    sent, crc = batch_checksum(_long_layouts().slice(*window))
    assert batch_checksum(_wire(sent, "lz4"))[1] == crc


def test_a_long_range_is_hashed_as_its_word_sum_length_and_tail() -> None:
    """The definition in docs/protocol.md section 17, computed here in plain Python as the oracle."""
    values = [(i * 0x9E3779B97F4A7C15) % 2**64 for i in range(1000)]  # 8,000 bytes: one summed range
    data = struct.pack("<1000Q", *values) + b"\x01\x02\x03"  # a string column's data, 8,003 bytes
    column = pa.Array.from_buffers(pa.binary(), 1, [None, pa.py_buffer(struct.pack("<2i", 0, len(data))), pa.py_buffer(data)])
    words = sum(struct.unpack_from("<1000Q", data)) % 2**64
    expected = zlib.crc32(b"\x01\x02\x03", zlib.crc32(struct.pack("<QQ", words, len(data)), zlib.crc32(struct.pack("<2i", 0, len(data)))))
    assert batch_checksum(pa.record_batch({"b": column}))[1] == expected


@settings(max_examples=120, deadline=None)
@given(st.integers(0, 8 * 8003 - 1), st.sampled_from(["fixed", "data"]))
def test_any_one_bit_flipped_in_a_summed_range_changes_the_checksum(bit: int, where: str) -> None:
    values = pa.array(range(8003), pa.int64()) if where == "fixed" else pa.array(["abcdefgh"] * 8003)
    crc = batch_checksum(pa.record_batch({"c": values}))[1]
    buffers = values.buffers()
    index = 1 if where == "fixed" else 2
    raw = bytearray(buffers[index].to_pybytes())
    raw[bit // 8 % len(raw)] ^= 1 << (bit % 8)
    changed = list(buffers)
    changed[index] = pa.py_buffer(bytes(raw))
    flipped = pa.Array.from_buffers(values.type, len(values), changed)
    assert batch_checksum(pa.record_batch({"c": flipped}))[1] != crc


def test_batches_or_columns_in_another_order_change_the_checksum() -> None:
    a = pa.record_batch({"x": pa.array(range(1000), pa.int64()), "y": pa.array(range(1000, 2000), pa.int64())})
    b = pa.record_batch({"x": pa.array(range(1000, 2000), pa.int64()), "y": pa.array(range(1000), pa.int64())})
    assert batch_checksum(a)[1] != batch_checksum(b)[1]
    assert batch_checksum(b, batch_checksum(a)[1])[1] != batch_checksum(a, batch_checksum(b)[1])[1]


_values = st.lists(st.one_of(st.none(), st.integers(-(2**40), 2**40)), min_size=1, max_size=60)


def _layered(values: list[int | None]) -> pa.RecordBatch:
    """``values`` as integers, strings, booleans, lists and structs, nulls where a value is None."""
    return pa.record_batch(
        {
            "i": pa.array(values, pa.int64()),
            "s": pa.array([None if v is None else str(v) for v in values]),
            "b": pa.array([None if v is None else v % 2 == 0 for v in values]),
            "l": pa.array([None if v is None else [v] * (abs(v) % 3) for v in values]),
            "st": pa.array([None if v is None else {"v": v, "t": [str(v)]} for v in values]),
        }
    )


@settings(max_examples=150, deadline=None)
@given(_values, st.data())
def test_any_slice_of_strings_lists_and_bools_hashes_alike_on_both_ends(values: list[int | None], data: st.DataObject) -> None:
    n = len(values)
    batch = _layered(values)
    start = data.draw(st.integers(0, n - 1))
    length = data.draw(st.integers(0, n - start))
    sent, crc = batch_checksum(batch.slice(start, length))
    assert batch_checksum(_wire(sent, data.draw(st.sampled_from([None, "lz4"]))))[1] == crc


def _meta(partition: int | None = None, heartbeat: bool = False, trailer: Tally | None = None) -> bytes:
    m = protocol_pb2.BatchMetadata(heartbeat=heartbeat)
    if partition is not None:
        m.partition = partition
    if trailer is not None:
        m.trailer.CopyFrom(trailer.trailer())
    return m.SerializeToString()


def _sent(*batches: pa.RecordBatch) -> Tally:
    t = Tally()
    for b in batches:
        t.add(b)
    return t


B1 = pa.record_batch({"x": pa.array([1, 2, 3])})
B2 = pa.record_batch({"x": pa.array([4, 5])})


def _check(start: int = 0, end: int = 2) -> StreamCheck:
    return StreamCheck(start, end, "q/1/0", "grpc://producer:1")


def test_a_whole_stream_passes_and_counts_what_it_delivered() -> None:
    c = _check()
    assert c.message(B1, _meta(0))
    assert not c.message(B1.slice(0, 0), _meta(0, heartbeat=True))
    assert c.message(B2, _meta(0))
    assert not c.message(B1.slice(0, 0), _meta(0, trailer=_sent(B1, B2)))
    assert not c.message(B1.slice(0, 0), _meta(1, trailer=_sent()))  # an empty partition ends with its trailer too
    c.finish()
    assert (c.rows, c.batches) == (5, 2)


def test_a_lost_batch_fails_naming_the_producer_the_task_and_the_partition() -> None:
    c = _check()
    c.message(B1, _meta(0))
    with pytest.raises(StreamIntegrityError) as err:
        c.message(B1.slice(0, 0), _meta(0, trailer=_sent(B1, B2)))
    assert err.value.worker_url == "grpc://producer:1" and err.value.stage_key == "q/1/0"
    assert "partition 0" in str(err.value) and "5 rows in 2 batches, 3 rows in 1 arrived" in str(err.value)


def test_a_changed_batch_fails_on_its_checksum() -> None:
    c = _check()
    c.message(pa.record_batch({"x": pa.array([1, 2, 9])}), _meta(0))
    with pytest.raises(StreamIntegrityError, match="checksum"):
        c.message(B1.slice(0, 0), _meta(0, trailer=_sent(B1)))


def test_a_stream_without_its_last_trailer_ended_short() -> None:
    c = _check()
    c.message(B1, _meta(0))
    c.message(B1.slice(0, 0), _meta(0, trailer=_sent(B1)))
    with pytest.raises(StreamIntegrityError, match=r"partition 1 of the producer.s output: the stream ended without the partition.s trailer"):
        c.finish()


@pytest.mark.parametrize(
    "meta, why",
    [
        (_meta(1), "partition 1 arrived before its trailer"),
        (_meta(None), "partition none arrived"),
        (b"\xff\xff", "not a BatchMetadata"),
    ],
)
def test_a_message_out_of_place_fails(meta: bytes, why: str) -> None:
    with pytest.raises(StreamIntegrityError, match=why):
        _check().message(B1, meta)


def test_a_message_after_the_last_trailer_fails() -> None:
    c = _check(0, 1)
    c.message(B1.slice(0, 0), _meta(0, trailer=_sent()))
    with pytest.raises(StreamIntegrityError, match="after the last partition"):
        c.message(B1, _meta(0))


def test_a_trailer_without_checksum_is_checked_by_its_counts() -> None:
    c = _check(0, 1)
    c.message(B1, _meta(0))
    off = Tally(checksums=False)
    off.add(B1)
    c.message(B1.slice(0, 0), _meta(0, trailer=off))
    c.finish()


class _Server(fl.FlightServerBase):
    """Sends the batches it is given the way a worker does (``Tally.add`` then pyarrow's writer), then a trailer."""

    def __init__(self) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.batches: list[pa.RecordBatch] = []
        self.compression: str | None = None

    def do_get(self, context: fl.ServerCallContext, ticket: fl.Ticket) -> fl.FlightDataStream:
        tally = Tally()
        sent = [(tally.add(b), _meta(0)) for b in self.batches if b.num_rows]
        sent.append((self.batches[0].slice(0, 0), _meta(0, trailer=tally)))
        options = pa.ipc.IpcWriteOptions(compression=self.compression)
        return fl.GeneratorStream(self.batches[0].schema, iter(sent), options=options)


@pytest.fixture(scope="module")
def server() -> Iterator[_Server]:
    s = _Server()
    threading.Thread(target=s.serve, daemon=True).start()
    yield s
    s.shutdown()


@settings(max_examples=60, deadline=None)
@given(_values, st.data())
def test_through_flight_any_slice_hashes_alike_on_both_ends(server: _Server, values: list[int | None], data: st.DataObject) -> None:
    """pyarrow Flight's writer, not only ``pa.ipc``'s: slices at offset 0 keep their buffers' tails (q14's case)."""
    batch = _layered(values)
    n = len(values)
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=3)))
    bounds = [0, *cuts, n]
    server.batches = [batch.slice(a, b - a) for a, b in itertools.pairwise(bounds)] or [batch]
    server.compression = data.draw(st.sampled_from([None, "lz4"]))
    with fl.connect(f"grpc://127.0.0.1:{server.port}") as client:
        got = list(read_stream(client, protocol_pb2.Ticket(partition_start=0, partition_end=1).SerializeToString(), url="test"))
    assert pa.Table.from_batches(got, schema=batch.schema).equals(pa.Table.from_batches([batch]))
