"""GROUPING SETS, ROLLUP and CUBE as a union of plain aggregates, one per grouping set.

DataFusion plans ``GROUP BY ROLLUP (a, b)`` as one ``Aggregate`` whose output is the distinct
grouping expressions, then ``__grouping_id`` (a bit per expression, the first expression the
highest bit, set where the expression is rolled up), then the aggregates; ``GROUPING(a)`` is a
projection above it that masks and shifts the id. The IR has no grouping sets: each set is an
aggregate of its own over the same input (the planner's reuse pass computes the shared input
once), its missing keys null and its id a constant, and their rows are one union.

DataFusion's Python API does not say which expressions a grouping set holds (``GroupingSet``
only builds new ones), but ``Expr.to_bytes`` gives the expression as DataFusion's own protobuf
(``LogicalExprNode``), whose grouping fields are stable: ``grouping_set`` (22), ``cube`` (23),
``rollup`` (24). The bytes come from this process's own plan, never from a peer, and each
member expression is read back with ``Expr.from_bytes``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from flight.sql.errors import unsupported

__all__ = ["MAX_SETS", "fields", "grouping_sets", "varints"]

DFExpr = Any

_GROUPING_SET, _CUBE, _ROLLUP = 22, 23, 24
MAX_SETS = 4096
"""Most grouping sets one GROUP BY may expand to (CUBE of 12 expressions); each is an aggregate of the plan."""


def grouping_sets(g: DFExpr) -> tuple[list[DFExpr], list[list[int]]]:
    """The distinct expressions of grouping set expression ``g``, in DataFusion's order (first use),
    and each set as the indexes of the expressions it groups by."""
    from datafusion import Expr

    top = list(fields(g.to_bytes()))
    if len(top) != 1 or top[0][0] not in (_GROUPING_SET, _CUBE, _ROLLUP):
        raise unsupported(f"the grouping {g.canonical_name()}")
    kind, body = top[0]
    members: list[bytes] = []
    sets: list[list[int]] = []

    def index(member: bytes) -> int:
        if member not in members:
            members.append(member)
        return members.index(member)

    if kind == _GROUPING_SET:
        for number, group in fields(body):
            if number == 1:
                sets.append([index(m) for n, m in fields(group) if n == 1])
    else:
        items = [index(m) for n, m in fields(body) if n == 1]
        if kind == _ROLLUP:
            sets = [items[:k] for k in range(len(items), -1, -1)]
        else:
            if len(items) > 12:
                raise unsupported(f"CUBE of {len(items)} expressions (at most 12)")
            sets = [[i for i, keep in zip(items, mask) if keep] for mask in itertools.product((True, False), repeat=len(items))]
    if len(sets) > MAX_SETS:
        raise unsupported(f"{len(sets)} grouping sets (at most {MAX_SETS})")
    return [Expr.from_bytes(m) for m in members], sets


def fields(data: bytes) -> Iterator[tuple[int, bytes]]:
    """The length-delimited fields of one protobuf message, as (field number, bytes); others skipped."""
    i, n = 0, len(data)
    while i < n:
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 2:
            size, i = _varint(data, i)
            yield number, data[i : i + size]
            i += size
        elif wire == 0:
            _, i = _varint(data, i)
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise unsupported("a grouping expression DataFusion encodes in an unknown way")


def varints(data: bytes) -> dict[int, int]:
    """The varint fields of one protobuf message (bools, enums, integers) by field number; others skipped."""
    out: dict[int, int] = {}
    i, n = 0, len(data)
    while i < n:
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            out[number], i = _varint(data, i)
        elif wire == 2:
            size, i = _varint(data, i)
            i += size
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise unsupported("an expression DataFusion encodes in an unknown way")
    return out


def _varint(data: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7
