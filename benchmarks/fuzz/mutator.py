"""``Mutator``: deterministic corruptions (one ``random.Random``) of bytes, protobuf messages, IPC schemas and streams.

Structured mutations reach fields that raw bit flips almost never produce valid enough to be parsed.
"""

from __future__ import annotations

import math
import random
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from benchmarks.fuzz.ipc import IPC_CORRUPTIONS
from benchmarks.fuzz.proto import L, P, parse, ser
from benchmarks.fuzz.schemas import SCHEMA_CORRUPTIONS
from benchmarks.fuzz.scripts import is_map_field
from benchmarks.fuzz.settings import BLOWUP_BYTES

__all__ = ["BLOWUPS", "EMBEDDED", "EMBEDDED_MESSAGES", "FLOATS", "INTS", "STRINGS", "Mutator", "Slot", "short_repr", "weighted"]


# ------------------------------------------------------------------- mutation

INTS: dict[int, list[int]] = {
    FieldDescriptor.CPPTYPE_INT32: [0, 1, -1, 2**31 - 1, -(2**31), 7, 4096],
    FieldDescriptor.CPPTYPE_INT64: [0, 1, -1, 2**63 - 1, -(2**63), 2**32, -(2**32), 10**15],
    FieldDescriptor.CPPTYPE_UINT32: [0, 1, 2, 2**32 - 1, 2**31, 65_535, 65_536, 4_097, 99],
    FieldDescriptor.CPPTYPE_UINT64: [0, 1, 2**64 - 1, 2**63, 2**32, 1 << 40],
    FieldDescriptor.CPPTYPE_ENUM: [0, 1, 2, 3, 5, 8, 99, -1, 2**31 - 1],
}
FLOATS = [math.nan, math.inf, -math.inf, -0.0, 1e308, 5e-324, 0.0]
STRINGS = ["", "x" * 70_000, "\x00", "é" * 600, "../../../../etc/passwd", "id", "name", "score", "day", "unit",
           "files", "no-such", " ", "\U0001f4a5" * 10, "a/b/c", "drain", "%", "*"]
BLOWUPS = [2, 10, 100, 1_000, 10_000, 70_000]
EMBEDDED: dict[tuple[str, str], str] = {
    ("TaskHeader", "plan"): "StagePlan",
    ("ProducerTask", "stage_key"): "StageKey",
    ("WorkUnit", "body"): "FileUnit",
    ("FeedScan", "schema"): "schema",
    ("ExchangeInput", "schema"): "schema",
    ("ShuffleRead", "schema"): "schema",
    ("StagePlan", "output_schema"): "schema",
    ("CastOptions", "target_type"): "schema",
    ("Values", "ipc_stream"): "ipc:values",
    ("Literal", "arrow"): "ipc:literal",
    ("SetLookupOptions", "value_set"): "ipc:value_set",
}
"""Bytes fields that hold something structured: a serialized message, an IPC schema or an IPC stream."""
EMBEDDED_MESSAGES = {"StagePlan": L.StagePlan, "StageKey": P.StageKey, "FileUnit": L.FileUnit}


@dataclass
class Slot:
    """A field of a message in a tree; ``commit`` writes embedded messages back into their bytes fields."""

    owner: Message
    fd: Any  # a FieldDescriptor (pure-Python or upb)
    path: str
    commit: Callable[[], None]


def weighted(rng: random.Random, options: Sequence[tuple[Any, float]]) -> Any:
    return rng.choices([o for o, _ in options], weights=[w for _, w in options])[0]


class Mutator:
    """Deterministic corruptions (one ``random.Random``) of bytes, messages, IPC schemas and streams.

    Every mutation appends a short note (where and what) that names the case in reports.
    """

    def __init__(self, rng: random.Random, donors: Sequence[bytes] = ()) -> None:
        self.rng = rng
        self.donors = donors
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        self.notes.append(text)

    # ----------------------------------------------------------------- raw bytes

    def raw(self, data: bytes, where: str) -> bytes:
        ops: list[tuple[Callable[[bytearray], bytearray], float]] = [
            (self._flip, 30), (self._set_byte, 10), (self._truncate, 15), (self._delete, 10), (self._duplicate, 8),
            (self._insert, 8), (self.splice, 7), (self._huge_varint, 7), (self._huge_length, 5),
        ]
        mutate = weighted(self.rng, ops)
        self.note(f"{where}: {mutate.__name__.strip('_').replace('_', '-')}")
        return bytes(mutate(bytearray(data)))

    def _pos(self, data: bytearray) -> int:
        return self.rng.randrange(len(data)) if data else 0

    def _flip(self, data: bytearray) -> bytearray:
        for _ in range(self.rng.choice([1, 1, 1, 2, 3, 8])):
            if data:
                data[self._pos(data)] ^= 1 << self.rng.randrange(8)
        return data

    def _set_byte(self, data: bytearray) -> bytearray:
        if data:
            data[self._pos(data)] = self.rng.choice([0x00, 0xFF, 0x7F, 0x80, 0x01])
        return data

    def _truncate(self, data: bytearray) -> bytearray:
        return data[: self._pos(data)]

    def _delete(self, data: bytearray) -> bytearray:
        start = self._pos(data)
        return data[:start] + data[start + self.rng.randint(1, 32):]

    def _duplicate(self, data: bytearray) -> bytearray:
        start = self._pos(data)
        span = data[start:start + self.rng.randint(1, 64)]
        at = self._pos(data)
        return data[:at] + span * self.rng.choice([1, 2, 16]) + data[at:]

    def _insert(self, data: bytearray) -> bytearray:
        at = self._pos(data)
        return data[:at] + bytearray(self.rng.randbytes(self.rng.randint(1, 64))) + data[at:]

    def splice(self, data: bytearray) -> bytearray:
        if not self.donors:
            return self._flip(data)
        donor = self.rng.choice(self.donors)
        return data[: self._pos(data)] + bytearray(donor[self.rng.randrange(len(donor) or 1):])

    def _huge_varint(self, data: bytearray) -> bytearray:
        at = self._pos(data)
        return data[:at] + bytearray(b"\xff" * 9 + b"\x01") + data[at + self.rng.randint(0, 10):]

    def _huge_length(self, data: bytearray) -> bytearray:
        """A length-delimited field whose length says 4 GB."""
        tags = [i for i, b in enumerate(data[:-1]) if b & 7 == 2 and 1 <= b >> 3 <= 15]
        if not tags:
            return self._huge_varint(data)
        at = self.rng.choice(tags) + 1
        return data[:at] + bytearray(b"\xff\xff\xff\xff\x0f") + data[at + 1:]

    # --------------------------------------------------------------- structured

    def slots(self, msg: Message, path: str, commit: Callable[[], None] = lambda: None) -> list[Slot]:
        """Every field of ``msg`` and of the messages in it, embedded ones included."""
        out: list[Slot] = []
        for fd in msg.DESCRIPTOR.fields:
            here = f"{path}.{fd.name}"
            out.append(Slot(msg, fd, here, commit))
            if is_map_field(fd):
                continue
            if fd.message_type is not None:
                items = list(getattr(msg, fd.name))[:20] if fd.is_repeated else [getattr(msg, fd.name)] if msg.HasField(fd.name) else []
                for i, item in enumerate(items):
                    out += self.slots(item, f"{here}[{i}]" if fd.is_repeated else here, commit)
                continue
            role = EMBEDDED.get((msg.DESCRIPTOR.name, fd.name), "")
            inner = parse(EMBEDDED_MESSAGES[role], getattr(msg, fd.name)) if role in EMBEDDED_MESSAGES else None
            if inner is not None:
                out += self.slots(inner, f"{here}<{role}>", _committer(msg, fd.name, inner, commit))
        return out

    def message(self, msg: Message, where: str) -> None:
        """One structured mutation somewhere in ``msg``'s tree."""
        slots = self.slots(msg, where)
        if slots:
            self.mutate_slot(self.rng.choice(slots))

    def mutate_slot(self, slot: Slot) -> None:
        fd = slot.fd
        if is_map_field(fd):
            self._map(slot)
        elif fd.is_repeated:
            self._repeated(slot)
        elif fd.message_type is not None:
            self._submessage(slot)
        elif (slot.owner.DESCRIPTOR.name, fd.name) in EMBEDDED and self.rng.random() < 0.6:
            self._embedded(slot)
        else:
            self._scalar(slot)
        slot.commit()

    def _scalar(self, slot: Slot) -> None:
        fd, owner = slot.fd, slot.owner
        current = getattr(owner, fd.name)
        if fd.cpp_type == fd.CPPTYPE_BOOL:
            value: Any = not current
        elif fd.cpp_type in INTS:
            value = self.rng.choice(INTS[fd.cpp_type])
        elif fd.cpp_type in (fd.CPPTYPE_DOUBLE, fd.CPPTYPE_FLOAT):
            value = self.rng.choice(FLOATS)
        elif fd.type == fd.TYPE_BYTES:
            value = self._bytes_value(current)
        else:
            value = self.rng.choice([*STRINGS, current + current, current[:-1], current.upper()])
        setattr(owner, fd.name, value)
        self.note(f"{slot.path} = {short_repr(value)}")

    def _bytes_value(self, current: bytes) -> bytes:
        return bytes(self.rng.choice([b"", self.rng.randbytes(16), b"\x00" * 1024, b"\xff" * 64, current[: len(current) // 2],
                                      current + current, self.raw(current, "bytes")]))

    def _submessage(self, slot: Slot) -> None:
        owner, name = slot.owner, slot.fd.name
        choice = self.rng.choice(["clear", "empty", "recurse", "recurse"])
        if choice == "recurse" and owner.HasField(name):
            self.message(getattr(owner, name), slot.path)
            return
        owner.ClearField(name)
        if choice != "clear":
            getattr(owner, name).SetInParent()  # set but empty; in a oneof, switches the kind
        self.note(f"{slot.path}: {'cleared' if choice == 'clear' else 'empty'}")

    def _repeated(self, slot: Slot) -> None:
        items = getattr(slot.owner, slot.fd.name)
        choice = self.rng.choice(["clear", "blow-up", "blow-up", "drop", "add", "reverse"])
        if choice == "clear" or (not len(items) and choice != "add"):
            slot.owner.ClearField(slot.fd.name)
            choice = "clear"
        elif choice == "blow-up":
            choice = self._blow_up(items, slot)
        elif choice == "drop":
            del items[self.rng.randrange(len(items))]
        elif choice == "add":
            self._append(items, slot.fd)
        else:
            values = list(items)
            del items[:]
            items.extend(reversed(values))
        self.note(f"{slot.path}: {choice}")

    def _blow_up(self, items: Any, slot: Slot) -> str:
        item = items[self.rng.randrange(len(items))]
        size = len(ser(item)) if slot.fd.message_type is not None else 10
        count = min(self.rng.choice(BLOWUPS), max(1, BLOWUP_BYTES // max(1, size)))
        if slot.fd.message_type is not None:
            for _ in range(count):
                items.add().CopyFrom(item)
        else:
            items.extend([item] * count)
        return f"blow-up x{count}"

    def _append(self, items: Any, fd: FieldDescriptor) -> None:
        if fd.message_type is not None:
            items.add()
        elif fd.cpp_type in INTS:
            items.extend(self.rng.sample(INTS[fd.cpp_type], 3))
        elif fd.cpp_type in (fd.CPPTYPE_DOUBLE, fd.CPPTYPE_FLOAT):
            items.append(self.rng.choice(FLOATS))
        elif fd.cpp_type == fd.CPPTYPE_BOOL:
            items.append(True)
        elif fd.type == fd.TYPE_BYTES:
            items.append(self.rng.randbytes(8))
        else:
            items.append(self.rng.choice(STRINGS))

    def _map(self, slot: Slot) -> None:
        entries = getattr(slot.owner, slot.fd.name)
        choice = self.rng.choice(["clear", "weird", "many"])
        if choice == "clear":
            entries.clear()
        elif choice == "weird":
            entries[self.rng.choice(["delimiter", "", "x" * 300])] = self.rng.choice(["", "\x00", "ab", ";", "\n", "\"", "é"])
        else:
            for i in range(self.rng.choice([100, 10_000])):
                entries[f"k{i}"] = "v"
        self.note(f"{slot.path}: map {choice}")

    def _embedded(self, slot: Slot) -> None:
        role = EMBEDDED[(slot.owner.DESCRIPTOR.name, slot.fd.name)]
        data = getattr(slot.owner, slot.fd.name)
        if role == "schema":
            new = self.schema(data, slot.path)
        elif role.startswith("ipc:"):
            new = self.ipc(data, role[4:], slot.path)
        else:
            new = self.raw(data, slot.path)
        setattr(slot.owner, slot.fd.name, new)

    # ------------------------------------------------------------- Arrow payloads

    def ipc(self, data: bytes, role: str, where: str) -> bytes:
        """A corrupted Arrow IPC stream for a ``Values`` (role ``values``), a literal or a value set."""
        kinds: list[tuple[str, float]] = [
            ("string-offsets", 14), ("binary-offsets", 5), ("large-string-offsets", 4), ("list-offsets", 5),
            ("dictionary-indices", 6), ("zstd-bomb", 3), ("compressed-length", 8), ("metadata-int", 12),
            ("metadata-length", 5), ("body-truncated", 5), ("deep-type", 3), ("duplicate-names", 5),
            ("many-columns", 2), ("odd-stream", 6), ("raw", 17),
        ]
        kind = weighted(self.rng, kinds)
        try:
            out = IPC_CORRUPTIONS[kind](self, data, role)
        except (pa.ArrowException, OSError, ValueError, TypeError, IndexError, struct.error) as exc:
            self.note(f"{where}: ipc {kind} failed on the client ({type(exc).__name__}); raw instead")
            return self.raw(data, where)
        self.note(f"{where}: ipc {kind}")
        return out

    def schema(self, data: bytes, where: str) -> bytes:
        """A corrupted or hostile encapsulated IPC schema message."""
        kinds: list[tuple[str, float]] = [
            ("duplicate-names", 15), ("deep-struct", 6), ("many-fields", 4), ("odd-type", 20), ("view-types", 6),
            ("empty", 5), ("empty-name", 4), ("huge-metadata", 3), ("stream-instead", 4), ("metadata-int", 8),
            ("truncated", 5), ("raw", 20),
        ]
        kind = weighted(self.rng, kinds)
        try:
            out = SCHEMA_CORRUPTIONS[kind](self, data)
        except (pa.ArrowException, OSError, ValueError, TypeError, IndexError, struct.error) as exc:
            self.note(f"{where}: schema {kind} failed on the client ({type(exc).__name__}); raw instead")
            return self.raw(data, where)
        self.note(f"{where}: schema {kind}")
        return out


def _committer(owner: Message, name: str, inner: Message, commit: Callable[[], None]) -> Callable[[], None]:
    def write_back() -> None:
        setattr(owner, name, ser(inner))
        commit()

    return write_back


def short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:30]}...({len(text)} chars)"
