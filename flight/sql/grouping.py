"""GROUPING SETS, ROLLUP and CUBE as a union of plain aggregates, one per grouping set.

DataFusion plans ``GROUP BY ROLLUP (a, b)`` as one ``Aggregate`` whose output is the distinct
grouping expressions, then ``__grouping_id`` (a bit per expression, the first expression the
highest bit, set where the expression is rolled up), then the aggregates; ``GROUPING(a)`` is a
projection above it that masks and shifts the id. The IR has no grouping sets: each set is an
aggregate of its own, its missing keys null and its id a constant, and their rows are one union.

Where every aggregate merges (``agg.MERGEABLE``: sums, counts, minima, maxima, means as a sum and a
count) and the keys have few values together, the input is first aggregated once by all the keys,
and each set aggregates those groups instead of the input (``grouping_union``): the input, often a
join of a fact table with its dimensions, is then read once, and each set reads a few groups where
it read every row. TPC-DS q22's rollup of inventory by four columns of item read its 2.3 million
joined rows five times (each level a copy of the join; 0.26 s, pre-aggregated 0.16). "Few" is known
from the tables the keys come from (``_few_groups``): the keys of q67 (item's, date_dim's, store's)
may have as many values together as its input has rows, and grouping by them first cost more than
it saved (1.2 s, pre-aggregated 1.8); there a task's DuckDB query computes the copies of the input
once instead (``flight.engine.duck.shared``).

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

import pyarrow as pa

from flight.plan import agg
from flight.plan.expr import Expr, coalesce, col, if_else, lit
from flight.plan.nodes import FeedScanNode, FilterNode, LimitNode, Node, ProjectNode
from flight.plan.query import Query
from flight.plan.relnodes import AggregateNode, JoinNode, SortNode, UnionNode
from flight.sql.errors import unsupported

__all__ = ["MAX_SETS", "fields", "grouping_sets", "grouping_union", "varints"]

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


def grouping_union(
    query: Query, keys: list[str], sets: list[list[int]], calls: dict[str, agg.Agg], id_type: pa.DataType, grouped_total: bool = False
) -> Query:
    """One aggregate per grouping set, its missing keys null, ``__grouping_id`` a constant (a bit per
    key, the first key the highest, set where the key is rolled up), the rows of all sets in one union;
    over ``query`` aggregated by all of ``keys`` first where the calls merge (module doc).
    ``grouped_total``: the empty set is a group too (Spark's), so no rows give no total row."""
    types = [query.schema.field(k).type for k in keys]
    source, merged, finish = query, calls, {name: col(name) for name in calls}
    if len(sets) > 1 and all(c.function in agg.MERGEABLE for c in calls.values()) and _few_groups(query.node, keys):
        direct = query.aggregate(keys, calls).schema  # each call's type, as the sets would compute it
        source, merged, finish = _pre_aggregated(query, keys, calls, direct)
    branches = []
    for members in sets:
        if not members and grouped_total:
            grouped = source.with_columns(__total=lit(0)).aggregate(["__total"], merged)
        else:
            grouped = source.aggregate([keys[i] for i in members], merged)
        gid = sum(1 << (len(keys) - 1 - i) for i in range(len(keys)) if i not in members)
        items: dict[str, Expr] = {
            k: col(k) if i in members else lit(None, t) for i, (k, t) in enumerate(zip(keys, types))
        }
        items["__grouping_id"] = lit(gid, id_type)
        items.update(finish)
        branches.append(grouped.select(**items))
    return branches[0].union(*branches[1:]) if len(branches) > 1 else branches[0]


def _pre_aggregated(
    query: Query, keys: list[str], calls: dict[str, agg.Agg], direct: pa.Schema
) -> tuple[Query, dict[str, agg.Agg], dict[str, Expr]]:
    """``query`` aggregated by all ``keys`` into parts, the calls that merge the parts per set, and each
    output from its merged parts, of the type the call has over ``query`` itself."""
    parts: dict[str, agg.Agg] = {}
    merged: dict[str, agg.Agg] = {}
    known: dict[tuple[str, bytes], str] = {}

    def part(function: str, expr: Expr | None) -> str:
        """The merged column of ``function(expr)`` over the parts; equal ones are computed once."""
        key = (function, b"" if expr is None else expr.wire())
        if key not in known:
            name = known[key] = f"__part{len(known)}"
            parts[name] = agg.Agg(function, expr)
            merged[name] = agg.Agg("sum" if function in ("count", "count_all", "sum") else function, col(name))
        return known[key]

    finish: dict[str, Expr] = {}
    for name, c in calls.items():
        out = direct.field(name).type
        if c.function == "mean":
            assert c.expr is not None
            total, n = col(part("sum", c.expr.cast(pa.float64()))), col(part("count", c.expr))
            finish[name] = if_else(coalesce(n, lit(0)) > 0, total / n.cast(pa.float64()), lit(None, pa.float64())).cast(out)
        elif c.function in ("count", "count_all"):
            finish[name] = coalesce(col(part(c.function, c.expr)), lit(0)).cast(out)  # no groups: a count of 0
        else:
            finish[name] = col(part(c.function, c.expr)).cast(out)
    return query.aggregate(keys, parts), merged, finish


_FEW = 10.0
"""How many times fewer than the rows of the largest table the keys' values together must be bounded to."""


def _few_groups(node: Node, keys: list[str]) -> bool:
    """Whether ``keys`` of ``node`` have at most 1/``_FEW`` as many values together as its largest table has
    rows: each key's values are bounded by the rows of the tables it is computed from (a constant: one
    value), the keys' together by the product over those tables, each counted once."""
    scans = [n for n in node.walk() if isinstance(n, FeedScanNode)]
    largest = max((n.feed.inner().estimated_rows() or 0.0 for n in scans), default=0.0)
    tables: dict[int, float] = {}
    for key in keys:
        found = _origins(node, key)
        if found is None:
            return False
        for scan in found:
            rows = scan.feed.inner().estimated_rows()
            if rows is None:
                return False
            tables[id(scan.feed.inner())] = rows
    bound = 1.0
    for rows in tables.values():
        bound *= max(rows, 1.0)
    return bound * _FEW <= largest


def _origins(node: Node, column: str) -> list[FeedScanNode] | None:
    """The scans whose columns ``column`` of ``node`` is computed from (None: unknown, an aggregate's)."""
    if isinstance(node, ProjectNode):
        expr = dict(node.exprs).get(column)
        if expr is None:
            return None
        out: list[FeedScanNode] = []
        for name in sorted(expr.referenced_fields()):
            found = _origins(node.input, name)
            if found is None:
                return None
            out += found
        return out
    if isinstance(node, (FilterNode, LimitNode, SortNode)):
        return _origins(node.input, column)
    if isinstance(node, AggregateNode):
        return _origins(node.input, column) if column in node.keys else None
    if isinstance(node, JoinNode):
        left, right = node.left.schema.names, node.right.schema.names
        if column in left:
            return _origins(node.left, column)
        if node.join_type in ("left semi", "left anti"):
            return None
        if column in right:
            return _origins(node.right, column)
        base = column[: -len(node.right_suffix)] if node.right_suffix and column.endswith(node.right_suffix) else None
        return _origins(node.right, base) if base in right else None
    if isinstance(node, UnionNode):
        at = node.schema.names.index(column)
        parts = [_origins(n, n.schema.names[at]) for n in node.inputs]
        return None if any(p is None for p in parts) else [s for p in parts for s in p or []]
    if isinstance(node, FeedScanNode):
        return [node]
    return None
