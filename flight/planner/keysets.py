"""An aggregate joined on its group keys reads only the keys the join can match.

Why: a decorrelated subquery is an aggregate over a whole table, grouped by the correlation keys,
joined back to the outer query on them (TPC-H Q17: the average quantity of every one of 200,000
parts, for the 200 parts of one brand and container; Q2 and Q20 alike). The join drops every group
whose key the other side lacks, so the aggregate's input may first be cut to the keys the other side
can have. Those keys come from a small subplan beneath that side: a filtered dimension whose key is
equated with the join key (``p_partkey`` of ``part`` filtered by brand and container). The
aggregate's input becomes a semi join with that subplan's key column, which the cutter broadcasts,
so the scan below the aggregate keeps only those keys before anything is grouped or moved. This is
what DuckDB's delim join and the magic-set rewrites do for correlated subqueries.

Exact: the semi join keeps every input row whose key the join could match, and a group depends
only on its own rows. Applied when the key subplan is filtered (an unfiltered table holds every key
a foreign key may name), is estimated at least ``_RATIO`` times smaller than the aggregate's input,
small enough to broadcast, reads repeatable sources (it is read a second time for this), and is
cheap: its scans read fewer rows than the aggregate's input holds. TPC-DS q04 joins six per-year,
per-channel aggregates of one CTE on the customer: each would otherwise read the keys of another as
its key subplan, which reads the keys of a third, and one DuckDB task computed 21 aggregates over
sales joins for the 6 the query names (1.6 s against 0.8 s without).
"""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa

from flight.plan.expr import col
from flight.plan.nodes import FeedScanNode, FilterNode, Node, ProjectNode
from flight.plan.relnodes import AggregateNode, JoinNode, UnionNode
from flight.planner.cost import row_width
from flight.planner.eager import map_children
from flight.planner.groups import aggregate_rows
from flight.planner.notes import join_text, repeatable
from flight.planner.optimize import join_sides
from flight.planner.ranges import filter_selectivity

__all__ = ["estimated_rows", "filtered", "key_sources", "reduce_aggregate_inputs", "scanned_rows", "smallest_source"]

_RATIO = 10.0
"""How much smaller (in rows) the key subplan must be estimated than the aggregate's input."""

_DROPS_UNMATCHED_RIGHT = ("inner", "left outer", "left semi", "left anti")
"""Join types whose output holds no right row without a matching left key."""


def reduce_aggregate_inputs(root: Node, max_bytes: float, keep: set[int] | None = None) -> tuple[Node, list[str]]:
    """``root`` with each aggregate joined on a group key reading only the keys the join can match.

    ``keep``: ids of nodes left as they are (the uses of a CTE: changing one use would make it
    differ from the others, which are then no longer computed once, ``flight.planner.reuse``)."""
    notes: list[str] = []
    kept = keep or set()

    def walk(node: Node) -> Node:
        if id(node) in kept:
            return node
        node = map_children(node, walk)
        if not isinstance(node, JoinNode):
            return node
        if node.join_type in _DROPS_UNMATCHED_RIGHT:
            right = _reduced(node.right, node.right_keys, node.left, node.left_keys, max_bytes, notes, node, kept)
            if right is not None:
                return replace(node, right=right)
        if node.join_type == "inner":
            left = _reduced(node.left, node.left_keys, node.right, node.right_keys, max_bytes, notes, node, kept)
            if left is not None:
                return replace(node, left=left)
        return node

    return walk(root), notes


def _reduced(
    side: Node, keys: list[str], other: Node, other_keys: list[str], max_bytes: float, notes: list[str], join: JoinNode, kept: set[int]
) -> Node | None:
    """``side`` with its aggregate's input semi-joined with the smallest key subplan beneath ``other``, or None."""
    for key, other_key in zip(keys, other_keys):
        found = _aggregate_key(side, key)
        if found is None or id(found[0]) in kept:
            continue
        agg, group_key = found
        below = estimated_rows(agg.input)
        if below is None:
            continue
        candidates = [(n, c) for n, c in key_sources(other, other_key) if filtered(n) and _cheap(n, below)]
        best = smallest_source(candidates, agg.input.schema.field(group_key).type)
        if best is None:
            continue
        rows, source, column = best
        if rows * _RATIO > below or rows * row_width(pa.schema([source.schema.field(column)])) > max_bytes or not repeatable(source):
            continue
        keys_only = ProjectNode(source, [(column, col(column))])
        semi = JoinNode(agg.input, keys_only, [group_key], [column], "left semi")
        notes.append(
            f"Aggregate[keys={agg.keys}] below {join_text(join)}: reads only the {column!r} values of "
            f"{source.label().split('[')[0]} (~{rows:,.0f} rows, against ~{below:,.0f}), the keys the join can match"
        )
        return _replaced(side, agg, replace(agg, input=semi))
    return None


def _cheap(node: Node, rows: float) -> bool:
    """Whether computing ``node`` reads (its scans' estimated rows) fewer rows than ``rows``."""
    scanned = scanned_rows(node)
    return scanned is not None and scanned < rows


def _aggregate_key(node: Node, key: str) -> tuple[AggregateNode, str] | None:
    """The aggregate beneath ``node`` (through filters, and projects that pass ``key`` on) grouping by what ``key`` is."""
    while isinstance(node, (ProjectNode, FilterNode)):
        if isinstance(node, ProjectNode):
            source = dict(node.exprs).get(key)
            name = None if source is None else source.column_name()
            if name is None:
                return None
            key = name
        node = node.input
    if isinstance(node, AggregateNode) and not node.partial and key in node.keys:
        return node, key
    return None


def _replaced(node: Node, old: Node, new: Node) -> Node:
    """``node`` with ``old`` (beneath it through projects and filters) replaced by ``new``."""
    if node is old:
        return new
    assert isinstance(node, (ProjectNode, FilterNode))
    return replace(node, input=_replaced(node.input, old, new))


def key_sources(node: Node, column: str) -> list[tuple[Node, str]]:
    """Subplans beneath ``node`` whose ``column`` holds every value ``node``'s ``column`` may hold."""
    out = [(node, column)]
    if isinstance(node, ProjectNode):
        source = dict(node.exprs).get(column)
        name = None if source is None else source.column_name()
        if name is not None:
            out += key_sources(node.input, name)
    elif isinstance(node, FilterNode):
        out += key_sources(node.input, column)
    elif isinstance(node, AggregateNode) and column in node.keys:
        out += key_sources(node.input, column)
    elif isinstance(node, JoinNode) and node.join_type in ("inner", "left semi", "left outer", "left anti"):
        where = join_sides(node).get(column)
        if where is None:
            return out
        side, name = where
        keys, other, other_keys = (
            (node.left_keys, node.right, node.right_keys) if side == "left" else (node.right_keys, node.left, node.left_keys)
        )
        out += key_sources(node.left if side == "left" else node.right, name)
        if name in keys and node.join_type in ("inner", "left semi"):  # the rows kept have equal keys on both sides
            out += key_sources(other, other_keys[keys.index(name)])
    return out


def smallest_source(found: list[tuple[Node, str]], key_type: pa.DataType) -> tuple[float, Node, str] | None:
    """The candidate estimated smallest (the first, nearest the join, among equals), of the key's type."""
    best: tuple[float, Node, str] | None = None
    for node, column in found:
        rows = estimated_rows(node)
        if rows is not None and node.schema.field(column).type == key_type and (best is None or rows < best[0]):
            best = (rows, node, column)
    return best


def filtered(node: Node) -> bool:
    """Whether ``node`` drops rows of what it reads: an unfiltered table bounds nothing a foreign key does not."""
    return any(isinstance(n, FilterNode) or (isinstance(n, JoinNode) and n.join_type == "left semi") for n in node.walk())


def scanned_rows(node: Node) -> float | None:
    """The rows the scans beneath ``node`` are estimated to read (None: unknown): what computing it costs."""
    total = 0.0
    for n in node.walk():
        if isinstance(n, FeedScanNode):
            rows = n.feed.inner().estimated_rows()
            if rows is None:
                return None
            total += rows
    return total


def estimated_rows(node: Node) -> float | None:
    """The rows ``node`` is estimated to give, as the cutter estimates them (None: unknown)."""
    if isinstance(node, FeedScanNode):
        return node.feed.inner().estimated_rows()
    if isinstance(node, FilterNode):
        rows = estimated_rows(node.input)
        return None if rows is None else rows * filter_selectivity(node)
    if isinstance(node, ProjectNode):
        return estimated_rows(node.input)
    if isinstance(node, AggregateNode):
        return aggregate_rows(node, estimated_rows(node.input))
    if isinstance(node, JoinNode):
        left, right = estimated_rows(node.left), estimated_rows(node.right)
        if node.join_type in ("left semi", "left anti"):
            return left
        return None if left is None or right is None else max(left, right)
    if isinstance(node, UnionNode):
        parts = [estimated_rows(n) for n in node.inputs]
        return None if any(p is None for p in parts) else sum(p or 0.0 for p in parts)
    return None
