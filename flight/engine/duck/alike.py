"""Join sides that compute the same rows under other column names: made a table once per task.

Why: the planner names every column of a plan apart, so a CTE the SQL uses three times is three subplans
equal but for their names. In a stage run as one DuckDB query, each join side that is more than a scan is
made a table first (``Translator.right_side``): TPC-DS q14's stage of its three channels built the
cross-channel items and the average sale once per channel, 15 tables where 5 differ, and no text of one
equals another's. A build whose subplan is another's under other names is not built again: it is the first
table's columns renamed (``share_alike_builds``).

When two subplans share a key (``alike_key``): one is the other with its column names changed one for one,
every name a scan reads kept. Each operator then reads the same columns, in the same places, and computes
the same rows; the i-th output column of one is the i-th of the other. What the key holds:

* every field of every operator, expression and option, in field order; strings that name a column
  (``NAMES``) by their first appearance (``#0``, ``#1``, ...) unless a scan reads that name, where they
  stay as they are; every other string (``VERBATIM``: literals, functions, join types) as it is. A string
  field in neither list (a new field of plan.proto) makes no key: a test keeps the lists whole;
* a scan by its feed's token, which ``whole_feeds`` replaces with the files its units name: two scans are
  alike only if their units name the same files. Only Parquet scans a query reads whole; a subplan with
  any other leaf (another stage's rows, constant rows, a client's input) has no key: each of those is a
  read of its own (a producer counts its reads).

Exact: a subplan without volatile functions (the translator writes none) gives the same rows each time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from flight.engine.duck.sql import ident
from flight.wire._proto import plan_pb2
from flight.wire.protocol import decode_schema

__all__ = ["NAMES", "VERBATIM", "Alike", "alike_key", "share_alike_builds"]

NAMES = frozenset({
    ("FieldRef", "name"), ("NamedExpression", "name"), ("Aggregate", "keys"), ("AggregateCall", "column"),
    ("AggregateCall", "name"), ("AggregateCall", "filter"), ("AggregateOrder", "column"), ("HashJoin", "left_keys"),
    ("HashJoin", "right_keys"), ("SortKey", "column"), ("Window", "partition_by"), ("WindowCall", "column"),
    ("WindowCall", "name"), ("Unnest", "column"), ("Unnest", "name"),
})
"""The string fields of plan.proto's operators and expressions that name a column."""

VERBATIM = frozenset({
    ("FeedScan", "reader"), ("FeedScan", "columns"), ("ReaderOptionsEntry", "key"), ("ReaderOptionsEntry", "value"),
    ("Literal", "string_value"), ("Call", "function"), ("MatchSubstringOptions", "pattern"), ("RoundOptions", "round_mode"),
    ("PadOptions", "padding"), ("ReplaceSubstringOptions", "pattern"), ("ReplaceSubstringOptions", "replacement"),
    ("TrimOptions", "characters"), ("JoinOptions", "null_handling"), ("JoinOptions", "null_replacement"),
    ("RoundTemporalOptions", "unit"), ("StrftimeOptions", "format"), ("StrptimeOptions", "format"),
    ("StrptimeOptions", "unit"), ("AggregateCall", "function"), ("AggregateCall", "separator"), ("HashJoin", "join_type"),
    ("HashJoin", "right_suffix"), ("WindowCall", "function"), ("ProducerTask", "url"), ("ExchangeInput", "input_id"),
})
"""The other string fields: values, functions and kinds, compared as they are. (A scan's ``columns`` are
names its files have, kept as they are; ``WorkUnitFeed.feed_id`` becomes the feed's token.)"""

_LEAVES = ("shuffle_read", "values", "exchange_input")


@dataclass(frozen=True)
class Alike:
    """A build's key (its scans' tokens still in it) and its output columns' names."""

    key: str
    names: tuple[str, ...]


class _NoKey(Exception):
    """The subplan has a leaf or a field a key cannot stand for."""


def alike_key(op: plan_pb2.Operator, tokens: Mapping[str, str]) -> str | None:
    """The key of the subplan ``op`` (module doc); ``tokens`` maps each feed id to its scan's token. None:
    a leaf other than a whole Parquet scan, or a field the key does not know."""
    try:
        fixed: set[str] = set()
        for scan in _scans(op):
            fixed.update(decode_schema(scan.schema, "feed_scan.schema").names)
            fixed.update(scan.columns)
        out: list[str] = []
        _walk(op, out, {}, fixed, tokens)
    except _NoKey:
        return None
    return "\x1f".join(out)


def share_alike_builds(
    builds: list[tuple[str, str]], text: str, alike: Mapping[str, Alike], sources: Mapping[str, str]
) -> tuple[list[tuple[str, str]], str]:
    """``builds`` (inner ones first: (table, query)) without those alike to an earlier one, and ``text`` and
    the later builds reading the earlier table instead, its columns under the names they knew.
    ``sources`` maps each scan's token to what it reads (the files of its units)."""
    first: dict[str, tuple[str, tuple[str, ...]]] = {}
    swaps: dict[str, str] = {}
    kept: list[tuple[str, str]] = []
    for name, query in builds:
        query = _swapped(query, swaps)
        found = alike.get(name)
        if found is not None:
            key = found.key
            for token, source in sources.items():
                key = key.replace(token, source)
            if key in first:
                table, names = first[key]
                items = ", ".join(f"{ident(a)} AS {ident(b)}" for a, b in zip(names, found.names))
                swaps[name] = f"(SELECT {items} FROM {table})"
                continue
            first[key] = (name, found.names)
        kept.append((name, query))
    return kept, _swapped(text, swaps)


def _swapped(text: str, swaps: Mapping[str, str]) -> str:
    for old, new in swaps.items():  # build names end in "__": none is the start of another
        text = text.replace(old, new)
    return text


def _scans(op: plan_pb2.Operator) -> Iterable[plan_pb2.FeedScan]:
    kind = op.WhichOneof("kind")
    if kind == "feed_scan":
        if op.feed_scan.reader != "parquet":
            raise _NoKey
        yield op.feed_scan
    elif kind in _LEAVES or kind is None:
        raise _NoKey
    elif kind == "hash_join":
        yield from _scans(op.hash_join.left)
        yield from _scans(op.hash_join.right)
    elif kind == "union":
        for child in op.union.inputs:
            yield from _scans(child)
    else:
        yield from _scans(getattr(op, kind).input)


def _walk(msg: Message, out: list[str], renamed: dict[str, str], fixed: set[str], tokens: Mapping[str, str]) -> None:
    kind = msg.DESCRIPTOR.name
    out.append(f"<{kind}")
    for field, value in msg.ListFields():
        out.append(field.name)
        if kind == "WorkUnitFeed" and field.name == "feed_id":
            if value not in tokens:
                raise _NoKey
            out.append(tokens[value])
        elif field.message_type is not None and field.message_type.GetOptions().map_entry:
            items = dict(value)  # map<string, string> reader_options: values, in key order
            if not all(isinstance(v, str) for v in items.values()):
                raise _NoKey
            out.append(repr(sorted(items.items())))
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            for item in value if field.is_repeated else [value]:
                _walk(item, out, renamed, fixed, tokens)
        elif field.type == FieldDescriptor.TYPE_STRING:
            for item in value if field.is_repeated else [value]:
                out.append(_string(kind, field.name, item, renamed, fixed))
        elif field.type == FieldDescriptor.TYPE_BYTES:
            out.append(hashlib.blake2b(value, digest_size=16).hexdigest())
        else:
            out.append(repr(list(value) if field.is_repeated else value))
    out.append(">")


def _string(kind: str, field: str, value: str, renamed: dict[str, str], fixed: set[str]) -> str:
    if (kind, field) in NAMES:
        if value in fixed:
            return repr(value)
        return renamed.setdefault(value, f"#{len(renamed)}")
    if (kind, field) in VERBATIM:
        return repr(value)
    raise _NoKey
