"""The wire's messages without the library: the generated protobuf modules loaded by path, and protobuf written by hand.

Why by path: the fuzzer tests the wire, not the client library, so it never imports the ``flight`` package;
why by hand: hostile messages (100,000 nested calls, a length that says 4 GB) are more than protobuf libraries build.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from google.protobuf.message import DecodeError, Message

__all__ = [
    "FLAT_EXPRESSIONS",
    "FLAT_OPERATORS",
    "FRAME_MEMBERS",
    "INPUT_CALL_PATH",
    "REPO_ROOT",
    "L",
    "P",
    "Wrap",
    "field_number",
    "load_proto",
    "nest",
    "nest_wrapper",
    "parse",
    "pb_field",
    "pb_int_field",
    "ser",
    "varint",
]


REPO_ROOT = Path(__file__).resolve().parents[2]


def load_proto(name: str) -> ModuleType:
    """``flight/wire/_proto/NAME.py`` without importing the ``flight`` package: the wire, not the library."""
    full = f"flight.wire._proto.{name}"
    if full in sys.modules:
        return sys.modules[full]
    path = REPO_ROOT / "flight" / "wire" / "_proto" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(full, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the generated protobuf module {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[full] = module
    spec.loader.exec_module(module)
    return module


P = load_proto("protocol_pb2")
L = load_proto("plan_pb2")
INPUT_CALL_PATH = "flight-exec.input"  # the descriptor path of an input call (docs/protocol.md, section 16)


FRAME_MEMBERS = [f.name for f in P.CoordinatorFrame.DESCRIPTOR.oneofs_by_name["frame"].fields]
FLAT_EXPRESSIONS = "nodes" in L.Expression.DESCRIPTOR.fields_by_name
FLAT_OPERATORS = "operators" in L.StagePlan.DESCRIPTOR.fields_by_name
"""Whether a plan's operators travel as a flat list (``StagePlan.operators``, protocol 6) rather than nested in ``root``."""


def ser(msg: Message) -> bytes:
    return bytes(msg.SerializeToString(deterministic=True))


def parse(cls: Any, data: bytes) -> Any | None:
    """``cls`` parsed from ``data``, or None where the worker's own parser would fail too."""
    try:
        return cls.FromString(data)
    except (DecodeError, RecursionError, ValueError):
        return None


def field_number(message: Any, name: str) -> int:
    return int(message.DESCRIPTOR.fields_by_name[name].number)


# ----------------------------------------------------------------- protobuf wire


_SMALL = [bytes((i,)) for i in range(128)]


def varint(n: int) -> bytes:
    if 0 <= n < 128:
        return _SMALL[n]
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | 0x80 if n else low)
        if not n:
            return bytes(out)


def pb_field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (a message, string or bytes)."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def pb_int_field(number: int, value: int) -> bytes:
    return varint(number << 3) + varint(value)


Wrap = Callable[[int], tuple[bytes, bytes]]


def nest_wrapper(outer: int, before: bytes, inner: int, after: bytes = b"") -> Wrap:
    """One nesting level: field ``outer`` holding ``before``, field ``inner`` (the level below), ``after``."""

    def wrap(size: int) -> tuple[bytes, bytes]:
        head = varint(inner << 3 | 2) + varint(size)
        body = len(before) + len(head) + size + len(after)
        return varint(outer << 3 | 2) + varint(body) + before + head, after

    return wrap


def nest(core: bytes, wrap: Wrap, depth: int) -> bytes:
    """``depth`` levels of ``wrap`` around ``core``, built in linear time (protobuf libraries recurse)."""
    prefixes, suffixes, size = [], [], len(core)
    for _ in range(depth):
        prefix, suffix = wrap(size)
        prefixes.append(prefix)
        suffixes.append(suffix)
        size += len(prefix) + len(suffix)
    return b"".join(reversed(prefixes)) + core + b"".join(suffixes)
