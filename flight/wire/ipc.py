"""Arrow payloads from a peer, checked before any kernel touches them.

Arrow's IPC readers trust what they read: a string offset past the end of its
data buffer is only noticed by a kernel that dereferences it (and that kernel
may crash the process), and a compressed buffer says itself how large it will
be. So every batch a worker receives — a map stage's input, another task's
shuffle output, a plan's ``Values`` — goes through here:

* ``check_batch``: its size against a limit, then ``validate(full=True)``
  (offsets, lengths, UTF-8, dictionary indices);
* ``read_ipc_stream``: for IPC bytes held in hand (plans), the *uncompressed*
  size of every compressed body is summed from the message metadata before
  anything is decompressed, so a small zstd payload cannot inflate unchecked.

Batches that arrive over Flight are decompressed by pyarrow before this code
sees them; there the check is on the decompressed batch (docs/protocol.md,
"Limits", says so).
"""

from __future__ import annotations

import struct

import pyarrow as pa

from flight.errors import ProtocolError
from flight.wire.limits import MAX_BATCH_BYTES, MAX_IPC_BYTES, clip

__all__ = ["check_batch", "check_schema", "read_ipc_stream"]

_BAD = (pa.ArrowException, OSError, ValueError, TypeError, IndexError, OverflowError, struct.error)


def check_schema(schema: pa.Schema, field: str) -> pa.Schema:
    """A schema from a peer: UTF-8 names, no two top-level fields sharing one (operators look columns up by name)."""
    try:
        names = schema.names
    except UnicodeDecodeError:
        raise ProtocolError(f"{field} has a column name that is not valid UTF-8", field=field) from None
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ProtocolError(f"{field} names column {clip(name)!r} twice; column names must be unique", field=field)
        seen.add(name)
    return schema


def check_batch(batch: pa.RecordBatch, field: str, limit: int = MAX_BATCH_BYTES) -> pa.RecordBatch:
    """``batch`` if it is within ``limit`` bytes and structurally valid; a ProtocolError naming ``field`` if not."""
    try:
        size = batch.get_total_buffer_size()
    except _BAD as exc:
        raise ProtocolError(f"{field} is not a readable record batch: {clip(exc)}", field=field) from None
    if size > limit:
        raise ProtocolError(f"{field} holds {size} bytes; a batch may hold at most {limit}", field=field)
    try:
        batch.validate(full=True)
    except _BAD as exc:
        raise ProtocolError(f"{field} is not a valid record batch: {clip(exc)}", field=field) from None
    return batch


# -- Arrow IPC message metadata (format/Message.fbs), read just far enough to size bodies.

_HEADER_DICTIONARY_BATCH = 2
_HEADER_RECORD_BATCH = 3


class _Flat:
    """A bounds-checked reader of the few flatbuffer tables an IPC message header has."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def u8(self, pos: int) -> int:
        return struct.unpack_from("<B", self.data, pos)[0]

    def u16(self, pos: int) -> int:
        return struct.unpack_from("<H", self.data, pos)[0]

    def u32(self, pos: int) -> int:
        return struct.unpack_from("<I", self.data, pos)[0]

    def i32(self, pos: int) -> int:
        return struct.unpack_from("<i", self.data, pos)[0]

    def i64(self, pos: int) -> int:
        return struct.unpack_from("<q", self.data, pos)[0]

    def field(self, table: int, index: int) -> int | None:
        """The position of field ``index`` of the table at ``table``, or None when absent."""
        vtable = table - self.i32(table)
        size = self.u16(vtable)
        slot = 4 + 2 * index
        if slot + 2 > size:
            return None
        offset = self.u16(vtable + slot)
        return table + offset if offset else None

    def table(self, table: int, index: int) -> int | None:
        pos = self.field(table, index)
        return None if pos is None else pos + self.u32(pos)


def _record_batch_table(meta: bytes) -> tuple[_Flat, int] | None:
    """The RecordBatch table of a record batch or dictionary batch message, else None."""
    fb = _Flat(meta)
    root = fb.u32(0)
    kind_pos = fb.field(root, 1)
    kind = fb.u8(kind_pos) if kind_pos is not None else 0
    header = fb.table(root, 2)
    if header is None:
        return None
    if kind == _HEADER_RECORD_BATCH:
        return fb, header
    if kind == _HEADER_DICTIONARY_BATCH:
        data = fb.table(header, 1)
        return (fb, data) if data is not None else None
    return None


def _uncompressed_size(message: pa.ipc.Message) -> int:
    """What the message's body takes once decompressed (its body size when not compressed)."""
    body = message.body
    body_size = body.size if body is not None else 0
    found = _record_batch_table(message.metadata.to_pybytes())
    if found is None:
        return body_size
    fb, batch = found
    if fb.field(batch, 3) is None:  # no BodyCompression: the body is what it is
        return body_size
    buffers = fb.field(batch, 2)
    if buffers is None:
        return 0
    vector = buffers + fb.u32(buffers)
    count = fb.u32(vector)
    raw = body.to_pybytes() if body is not None else b""
    total = 0
    for i in range(count):
        offset = fb.i64(vector + 4 + 16 * i)
        length = fb.i64(vector + 4 + 16 * i + 8)
        if length == 0:
            continue
        if offset < 0 or length < 8 or offset + length > len(raw):
            raise ValueError("a compressed buffer lies outside the message body")
        size = struct.unpack_from("<q", raw, offset)[0]
        total += length - 8 if size == -1 else size  # -1: stored uncompressed
    return total


def read_ipc_stream(data: bytes, field: str, limit: int = MAX_IPC_BYTES) -> pa.Table:
    """An Arrow IPC stream held in hand, sized before decompression and validated; ProtocolError naming ``field``."""
    if not data:
        raise ProtocolError(f"{field} is empty; expected an Arrow IPC stream", field=field)
    try:
        reader = pa.ipc.MessageReader.open_stream(pa.py_buffer(data))
        total = 0
        for message in reader:
            total += _uncompressed_size(message)
            if total > limit:
                raise ProtocolError(f"{field} decompresses to more than {limit} bytes", field=field)
        table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    except ProtocolError:
        raise
    except _BAD as exc:
        raise ProtocolError(f"{field} is not a valid Arrow IPC stream: {clip(exc)}", field=field) from None
    check_schema(table.schema, f"{field}.schema")
    for batch in table.to_batches():
        check_batch(batch, field, limit)
    return table
