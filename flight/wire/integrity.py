"""End-to-end accounting of a stream that carries rows: what was sent, proven on arrival.

Why: a DoGet stream ends OK when its task has finished and every requested partition
is drained, and a producer or reader that lost a batch on the way, for whatever bug,
ended just as OK: "exact or an error" was a promise nothing checked (issue 24 once saw
TPC-H Q14 0.04 % off, reported complete). Now each partition of a stream ends with a
``StreamTrailer``: its rows, its non-empty batches and a checksum of what was sent,
computed as it is sent, and the reader checks them (docs/protocol.md, section 17).

The checksum is over each batch's Arrow buffers, the bytes each column needs (validity
only when it has nulls, offsets from 0 to its length, values up to the last offset; a
bitmap's bits past the length taken as 0: the IPC writer may send them zeroed),
not over the IPC message: the reader never sees the IPC bytes (pyarrow decodes them),
and serialising a batch again to hash it ran at 1 GB/s. Each such byte range of at least
``SUMMED_BYTES`` is reduced to the wrapping 64-bit sum of its little-endian 8-byte words
(``pyarrow.compute.sum``, 20 GB/s here) and its length, and those 16 bytes, with the range's
last ``len % 8`` bytes, go through zlib's CRC-32; a shorter range goes through it whole.
CRC-32 over every byte (4-5 GB/s) cost a third of ``transport_ratio`` with both ends on two
shared cores (0.52-0.57 against 0.83-0.84 without; xxHash3 or CRC32C would each be a runtime
dependency of their own). What the sum gives up: a reorder of words inside one range, or
changes in several words that cancel modulo 2**64, pass; any change within 64 consecutive
bits, a lost, added or moved range, column or batch, and every count, do not
(docs/protocol.md, section 17).
Arrow's IPC writer sends a *canonical* array's buffers byte for byte: offset 0, offsets
starting at 0. The sender makes a batch canonical before it sends it (a copy, only for
a sliced batch), so both ends hash the same bytes. Union, view and run-end-encoded
columns are counted by rows only: their layouts are not walked.

The reader's side is ``StreamCheck``, a state machine without I/O (tested alone).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from flight.errors import WorkerUnavailableError
from flight.wire._proto import protocol_pb2

__all__ = ["StreamCheck", "StreamIntegrityError", "Tally", "batch_checksum", "compact"]


class StreamIntegrityError(WorkerUnavailableError):
    """A stream ended short, out of order, or not as its producer said it sent it.

    Retryable, and it names the producer's worker: recovery treats it as a lost stream
    (that worker's tasks of the attempt run again elsewhere, docs/architecture.md)."""


class _NotCanonical(Exception):
    """An array the IPC writer would not send byte for byte (sliced, offsets not from 0)."""


def _offset(buf: pa.Buffer, i: int, width: int) -> int:
    return int.from_bytes(memoryview(buf)[i * width : (i + 1) * width], "little", signed=True)


SUMMED_BYTES = 4096
"""A byte range at least this long is hashed as (the wrapping sum of its 8-byte words, its length, its
tail); a shorter one byte for byte (the sum's fixed cost, a few microseconds, would outweigh it)."""

_SUM_AND_LENGTH = struct.Struct("<QQ")
_SUM, _SUM_OPTIONS, _WORD = pc.get_function("sum"), pc.ScalarAggregateOptions(skip_nulls=True, min_count=1), pa.uint64()


def _bytes(buf: pa.Buffer | None, size: int, crc: int) -> int:
    if buf is None or size <= 0:
        return crc
    if size > buf.size:
        raise _NotCanonical
    if size < SUMMED_BYTES:
        return zlib.crc32(memoryview(buf)[:size], crc)
    words = size // 8
    total = _SUM.call([pa.Array.from_buffers(_WORD, words, [None, buf])], _SUM_OPTIONS).as_py()  # wraps modulo 2**64
    crc = zlib.crc32(_SUM_AND_LENGTH.pack(total, size), crc)
    return zlib.crc32(memoryview(buf)[words * 8 : size], crc) if size % 8 else crc


def _bits(buf: pa.Buffer | None, n: int, crc: int) -> int:
    """A bitmap of ``n`` bits: its whole bytes, then the last byte's bits below ``n`` (those past it are
    nobody's: Arrow's IPC writer sends them as they are, or zeroed, depending on the path)."""
    if buf is None or n <= 0:
        return crc
    full, rest = divmod(n, 8)
    if buf.size < full + (1 if rest else 0):
        raise _NotCanonical
    crc = _bytes(buf, full, crc)
    return zlib.crc32(bytes([memoryview(buf)[full] & ((1 << rest) - 1)]), crc) if rest else crc


def _array_crc(arr: pa.Array, crc: int) -> int:
    """The CRC of ``arr``'s canonical buffers (``_NotCanonical`` if it is not canonical)."""
    if arr.offset:
        raise _NotCanonical
    n = len(arr)
    t = arr.type
    kind = _LAYOUTS.get(t.id) or _layout(t)
    if kind == "extension":
        return _array_crc(arr.storage, crc)  # type: ignore[attr-defined]
    if kind == "rows":
        return crc  # counted by rows only (the module's docstring)
    bufs = arr.buffers()
    if kind == "dictionary":
        crc = _bits(bufs[0], n, crc) if arr.null_count else crc
        crc = _array_crc(arr.indices, crc)  # type: ignore[attr-defined]
        return _array_crc(arr.dictionary, crc)  # type: ignore[attr-defined]
    if arr.null_count:
        crc = _bits(bufs[0], n, crc)
    if kind == "fixed":
        return _bytes(bufs[1], (n * t.bit_width + 7) // 8, crc)
    if kind in ("binary", "large binary"):
        width = 8 if kind == "large binary" else 4
        return _bytes(bufs[2], _offsets(bufs[1], n, width), _bytes(bufs[1], (n + 1) * width, crc))
    if kind == "boolean":
        return _bits(bufs[1], n, crc)
    if kind in ("list", "large list"):
        width = 8 if kind == "large list" else 4
        end = _offsets(bufs[1], n, width)
        crc = _bytes(bufs[1], (n + 1) * width, crc)
        child = arr.values  # type: ignore[attr-defined]  # unsliced: the list's offsets index it
        return _array_crc(child if len(child) == end else child.slice(0, end), crc)
    if kind == "fixed-size list":
        child = arr.values  # type: ignore[attr-defined]
        end = n * t.list_size
        return _array_crc(child if len(child) == end else child.slice(0, end), crc)
    if kind == "struct":
        for i in range(t.num_fields):
            crc = _array_crc(arr.field(i), crc)  # type: ignore[attr-defined]
    return crc  # a struct's children's; any other layout: counted by rows only


_LAYOUTS: dict[int, str] = {}
"""Each Arrow type id's layout, as ``_layout`` names it: worked out once (the ``pyarrow.types`` checks, per
column per batch, were a third of the checksum's time on a stream of eight columns)."""


def _layout(t: pa.DataType) -> str:
    if isinstance(t, pa.BaseExtensionType):
        kind = "extension"
    elif pa.types.is_dictionary(t):
        kind = "dictionary"
    elif pa.types.is_null(t) or pa.types.is_union(t) or pa.types.is_run_end_encoded(t) or _is_view(t):
        kind = "rows"
    elif pa.types.is_boolean(t):
        kind = "boolean"
    elif _is_fixed(t):
        kind = "fixed"
    elif pa.types.is_string(t) or pa.types.is_binary(t):
        kind = "binary"
    elif pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        kind = "large binary"
    elif pa.types.is_list(t) or pa.types.is_map(t):
        kind = "list"
    elif pa.types.is_large_list(t):
        kind = "large list"
    elif pa.types.is_fixed_size_list(t):
        kind = "fixed-size list"
    elif pa.types.is_struct(t):
        kind = "struct"
    else:
        kind = "other"
    _LAYOUTS[t.id] = kind
    return kind


def _offsets(buf: pa.Buffer | None, n: int, width: int) -> int:
    """The last offset of a canonical offsets buffer (its first must be 0)."""
    if buf is None:
        return 0
    if buf.size < (n + 1) * width or _offset(buf, 0, width) != 0:
        raise _NotCanonical
    return max(_offset(buf, n, width), 0)


def _is_fixed(t: pa.DataType) -> bool:
    try:
        return t.bit_width > 0 and not pa.types.is_boolean(t)
    except ValueError:  # not fixed-width
        return False


def _is_view(t: pa.DataType) -> bool:
    return t in (pa.string_view(), pa.binary_view()) or type(t).__name__ in ("ListViewType", "LargeListViewType")


def _batch_crc(batch: pa.RecordBatch, crc: int) -> int:
    for column in batch.columns:
        crc = _array_crc(column, crc)
    return crc


def compact(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A copy of ``batch`` in fresh buffers: offsets 0, offsets from 0 (canonical)."""
    return pa.RecordBatch.from_arrays([pa.concat_arrays([c]) for c in batch.columns], schema=batch.schema)


def batch_checksum(batch: pa.RecordBatch, crc: int = 0) -> tuple[pa.RecordBatch, int]:
    """(``batch`` as it is to be sent, the CRC-32 of its canonical buffers continuing ``crc``).

    A batch that is not canonical (sliced) comes back as a compact copy: send that one, so that
    the IPC writer sends the very bytes hashed."""
    try:
        return batch, _batch_crc(batch, crc)
    except _NotCanonical:
        batch = compact(batch)
        return batch, _batch_crc(batch, crc)


@dataclass
class Tally:
    """What one partition of a stream carried so far: rows, non-empty batches, the running CRC."""

    checksums: bool = True
    rows: int = 0
    batches: int = 0
    crc: int = 0

    def add(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """Count ``batch`` (non-empty); it comes back as it is to be sent (``batch_checksum``)."""
        self.rows += batch.num_rows
        self.batches += 1
        if self.checksums:
            batch, self.crc = batch_checksum(batch, self.crc)
        return batch

    def trailer(self) -> protocol_pb2.StreamTrailer:
        t = protocol_pb2.StreamTrailer(rows=self.rows, batches=self.batches)
        if self.checksums:
            t.checksum = self.crc
        return t


@dataclass
class StreamCheck:
    """A reader's check of a stream of partitions [start, end) of task ``key`` on ``url``.

    Feed it every message (``message``: the batch and its app_metadata), then ``end``
    when the stream ended OK. It raises ``StreamIntegrityError`` at the first thing wrong:
    a message of a partition other than the one being read, a trailer whose counts or
    checksum differ from what arrived, a stream that ends before every partition's trailer.
    """

    start: int
    end: int
    key: str
    url: str
    checksums: bool = True
    partition: int = field(init=False)
    tally: Tally = field(init=False)
    rows: int = field(init=False, default=0)
    batches: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.partition = self.start
        self.tally = Tally(self.checksums)

    def _fail(self, what: str) -> StreamIntegrityError:
        message = f"stream integrity: partition {self.partition} of the producer's output: {what}"
        return StreamIntegrityError(message, worker_url=self.url, stage_key=self.key, cause=what)

    def message(self, batch: pa.RecordBatch | None, metadata: bytes | None) -> bool:
        """Whether ``batch`` carries rows for the reader (heartbeats and trailers do not)."""
        meta = protocol_pb2.BatchMetadata()
        try:
            meta.ParseFromString(metadata or b"")
        except Exception:  # noqa: BLE001 - protobuf's DecodeError and friends: a peer's bytes
            raise self._fail("a batch's app_metadata is not a BatchMetadata") from None
        if meta.heartbeat:
            return False
        if self.partition >= self.end:
            raise self._fail(f"a message after the last partition's trailer (partition {meta.partition if meta.HasField('partition') else '?'})")
        if not meta.HasField("partition") or meta.partition != self.partition:
            got = meta.partition if meta.HasField("partition") else "none"
            raise self._fail(f"a message of partition {got} arrived before its trailer")
        if meta.HasField("trailer"):
            self.close(meta.trailer)
            return False
        if batch is None or not batch.num_rows:
            return False
        self.tally.add(batch)
        return True

    def close(self, sent: protocol_pb2.StreamTrailer) -> None:
        """The partition being read ended with ``sent``: it must match what arrived."""
        got = self.tally
        if (sent.rows, sent.batches) != (got.rows, got.batches):
            raise self._fail(f"the producer sent {sent.rows} rows in {sent.batches} batches, {got.rows} rows in {got.batches} arrived")
        if self.checksums and sent.HasField("checksum") and sent.checksum != got.crc:
            raise self._fail(f"checksum {got.crc:08x} of what arrived differs from the producer's {sent.checksum:08x}")
        self.rows += got.rows
        self.batches += got.batches
        self.partition += 1
        self.tally = Tally(self.checksums)

    def finish(self) -> None:
        """The stream ended OK: every partition's trailer must have arrived."""
        if self.partition < self.end:
            raise self._fail("the stream ended without the partition's trailer (ended short)")
