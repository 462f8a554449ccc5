"""Family ``command``: Flight SQL commands with hostile fields, in envelopes that lie.

Why: the service unpacks whatever a descriptor's ``cmd``, a ticket or an action's body holds
(``flight/service/commands.py``: ``unpack``), then plans SQL, matches LIKE patterns and builds
metadata tables from the fields. Each case takes a command the service answers and corrupts
one layer: a field (structured, as the worker fuzzer's ``Mutator`` does, or a LIKE pattern, a huge
or deeply nested SQL text, a string that is not UTF-8), the ``Any``'s ``type_url`` (empty, another
package, an unanswered or another answered message, huge), its value, or the envelope's bytes.
"""

from __future__ import annotations

import random
from typing import Any

from benchmarks.fuzz.mutator import Mutator
from benchmarks.fuzz.proto import ser
from benchmarks.fuzz.scripts import op
from benchmarks.fuzz.service.sqlproto import FLIPPED, HANDLE, PREFIX, S, command_seed, envelope, parameter_queries, statements

__all__ = ["LIKE_PATTERNS", "command_case", "deep_sql", "send"]

LIKE_PATTERNS = ["%" * 2_000 + "x", "%_" * 40 + "z", "_%" * 30 + "q", "%a" * 25 + "%b", "%" * 100_000, "_" * 5_000, "\\", "[a-", ".*(",
                 "%\x00%", "((((", "%p%u%b%l%i%c%" * 20, "é%", "%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%x"]
"""Filter patterns that make a backtracking matcher take exponential time, or that a regex translation chokes on."""


def deep_sql(rng: random.Random) -> str:
    """A statement deeper or longer than a parser likes: nested parentheses, long chains, 1 Mi characters."""
    n = rng.choice([100, 1_000, 10_000, 100_000])
    kind = rng.choice(["parens", "plus", "and", "case", "long", "unicode", "subquery"])
    if kind == "parens":
        return "SELECT " + "(" * n + "1" + ")" * n
    if kind == "plus":
        return "SELECT " + "1+" * n + "1"
    if kind == "and":
        return "SELECT id FROM t WHERE " + " AND ".join(["id > 0"] * min(n, 20_000))
    if kind == "case":
        return "SELECT " + "CASE WHEN id > 0 THEN " * min(n, 2_000) + "1" + " END" * min(n, 2_000) + " FROM t"
    if kind == "long":
        return "SELECT 1 " + " " * ((1 << 20) + rng.choice([-20, 0, 1, 100]))
    if kind == "unicode":
        return "SELECT '" + "\U0001f4a5" * n + "' AS x"
    return "SELECT * FROM " + "(SELECT * FROM " * min(n, 1_000) + "t" + ") AS s" * min(n, 1_000)


def _string_fields(message: Any) -> list[str]:
    return [f.name for f in message.DESCRIPTOR.fields if f.type == f.TYPE_STRING and not f.is_repeated]


def _hostile_field(rng: random.Random, m: Mutator, message: Any) -> bytes | None:
    """A field set to something hostile; bytes when the message had to be written by hand (not UTF-8)."""
    names = _string_fields(message)
    how = rng.choice(["struct", "struct", "like", "sql", "utf8"] if names else ["struct"])
    if how == "struct":
        m.message(message, message.DESCRIPTOR.name)
        return None
    name = rng.choice(names)
    if how == "like":
        like = [n for n in names if n.endswith("pattern")] or names
        name = rng.choice(like)
        setattr(message, name, rng.choice(LIKE_PATTERNS))
    elif how == "sql":
        setattr(message, name, deep_sql(rng) if name == "query" else rng.choice(statements() + parameter_queries()))
    else:  # a placeholder of the same length, replaced in the bytes by ones that are not UTF-8
        bad = rng.choice([b"\xff", b"\xc3(", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"SELECT \x80 FROM t"])
        setattr(message, name, "\x01" * len(bad))
        m.note(f"{message.DESCRIPTOR.name}.{name}: not UTF-8")
        return ser(message).replace(b"\x01" * len(bad), bad)
    m.note(f"{message.DESCRIPTOR.name}.{name} = {getattr(message, name)[:30]!r}... ({len(getattr(message, name))} chars)")
    return None


TYPE_URLS = [
    "", PREFIX, PREFIX[:-1], "type.googleapis.com/google.protobuf.Empty", PREFIX + "CommandStatementUpdate", PREFIX + "CommandGetTables",
    PREFIX + "CommandStatementQuery ", PREFIX.upper() + "CommandStatementQuery", PREFIX + "X" * 70_000, PREFIX + "CommandGetCatalogs\x00",
    "/" * 500, PREFIX + "ActionCreatePreparedStatementRequest", PREFIX + "TicketStatementQuery", PREFIX + "CommandPreparedStatementQuery",
]


def _wrapped(rng: random.Random, m: Mutator, message: Any, value: bytes) -> bytes:
    """The ``Any`` around ``value``: true, or lying in its type, its value or its bytes."""
    how = rng.choice(["true", "true", "true", "type", "value", "raw", "nested", "groups", "other-bytes"])
    name = PREFIX + message.DESCRIPTOR.name
    if how == "true":
        return envelope(name, value)
    m.note(f"Any: {how}")
    if how == "type":
        return envelope(rng.choice(TYPE_URLS), value)
    if how == "value":
        return envelope(name, m.raw(value, "Any.value"))
    if how == "raw":
        return m.raw(envelope(name, value), "Any")
    if how == "nested":  # an Any inside the value, many times over
        inner = value
        for _ in range(rng.choice([2, 10, 100])):
            inner = envelope(name, inner)
        return envelope(name, inner)
    if how == "groups":  # unknown groups nested deeper than a parser recurses
        depth = rng.choice([50, 101, 1_000, 100_000])
        return envelope(name, value + b"\x7b" * depth + b"\x7c" * depth)
    return envelope(rng.choice([name.encode() + b"\xff", b"\xc3(" + name.encode()]), value)


def send(where: str, data: bytes, read: bool = True) -> dict[str, Any]:
    """The step that sends ``data`` (an ``Any``) where it goes: a descriptor, a ticket, or an action's body."""
    if where == "info":
        return op("info", cmd=data, read=read)
    if where == "schema":
        return op("schema", cmd=data)
    if where == "doget":
        return op("doget", ticket=data)
    if where == "put":
        return op("put", cmd=data, schema=b"", batches=[], compression=None)
    return op("action", type=where, body=data)


def command_case(rng: random.Random, m: Mutator) -> list[dict[str, Any]]:
    """One hostile command, after a prepared statement exists (so that a command naming one reaches it)."""
    where, message = command_seed(rng)
    value = _hostile_field(rng, m, message) if rng.random() < 0.75 else None
    data = _wrapped(rng, m, message, ser(message) if value is None else value)
    flip = rng.randrange(128)
    if rng.random() < 0.1:
        data = data.replace(HANDLE, FLIPPED)
        m.note(f"handle with bit {flip} flipped")
    create = op("action", type="CreatePreparedStatement", body=envelope(PREFIX + "ActionCreatePreparedStatementRequest",
                                                                        ser(S.ActionCreatePreparedStatementRequest(query="SELECT 1 AS one"))))
    m.note(f"{where}: {message.DESCRIPTOR.name}")
    return [create, {**send(where, data), "flip": flip}, op("close_all")]

