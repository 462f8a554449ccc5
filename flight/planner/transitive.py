"""A scan joined on a key that a filtered table elsewhere in the join bounds reads only that table's keys.

Why: TPC-H Q9 joins lineitem with the parts whose name holds "green" (~5% of them) and with partsupp,
``ps_partkey = l_partkey = p_partkey``. The part filter reached lineitem (their join is direct), but not
partsupp: on two hosts at SF 10 all 8 million partsupp rows (480 MB) were shuffled to meet lineitem,
where the ~430,000 of green parts could ever match. The keys equal across the joins say more than the
join order shows: every partsupp row the query keeps has a ``ps_partkey`` among the green parts'
``p_partkey``. So the scan side is semi-joined with that filtered table's key column, which the cutter
broadcasts (or co-locates) into the scan's tasks: the rows are dropped before they move. This is the
magic-set (sideways information passing) rewrite, done where the equalities are known at planning;
Trino's dynamic filters reach the same scans at run time.

Exact: the join keeps only rows whose key equals the filtered table's key through a chain of inner
joins (``_bounding`` follows it), so the semi join drops only rows the join would drop.

Applied to an inner join's side that is one scan (under filters and projects: the semi join lands at
the scan) when the bounding table is reached from the other side's key through another join's key
equality (one the key only passes through from is that join's own input, which it filters already),
is filtered (an unfiltered table bounds nothing a foreign key does not), is estimated at least
``RATIO`` times smaller than the scan side and small enough to broadcast, and reads repeatable sources
(it is read a second time for this). Only for plans of more than one task: one task moves nothing.
"""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa

from flight.plan.expr import col
from flight.plan.nodes import FeedScanNode, FilterNode, Node, ProjectNode
from flight.plan.relnodes import JoinNode
from flight.planner.cost import row_width
from flight.planner.eager import map_children
from flight.planner.keysets import estimated_rows, filtered, smallest_source
from flight.planner.notes import join_text, repeatable
from flight.planner.optimize import join_sides

__all__ = ["RATIO", "reduce_join_inputs"]

RATIO = 10.0
"""How much smaller (in rows) the bounding table must be estimated than the scan side."""


def reduce_join_inputs(root: Node, max_bytes: float, keep: set[int] | None = None) -> tuple[Node, list[str]]:
    """``root`` with each inner join's scan side reading only the keys a filtered table beneath the other side
    can match (module doc). ``keep``: ids of nodes left as they are (a CTE's uses, ``keysets``)."""
    notes: list[str] = []
    kept = keep or set()

    def walk(node: Node) -> Node:
        if id(node) in kept:
            return node
        node = map_children(node, walk)
        if not isinstance(node, JoinNode) or node.join_type != "inner" or node.filter is not None:
            return node
        left = _reduced(node.left, node.left_keys, node.right, node.right_keys, max_bytes, notes, node)
        if left is not None:
            node = replace(node, left=left)
        right = _reduced(node.right, node.right_keys, node.left, node.left_keys, max_bytes, notes, node)
        return node if right is None else replace(node, right=right)

    return walk(root), notes


def _scan_side(node: Node) -> bool:
    while isinstance(node, (ProjectNode, FilterNode)):
        node = node.input
    return isinstance(node, FeedScanNode)


def _bounding(node: Node, column: str, hopped: bool = False) -> list[tuple[Node, str]]:
    """Subplans beneath ``node`` whose ``column`` holds every value ``node``'s ``column`` may hold, reached through
    at least one join's key equality (``hopped``): one the column only passes through from is the join's own
    input, which that join filters already (TPC-H Q5's orders for lineitem, co-located with it)."""
    out = [(node, column)] if hopped else []
    if isinstance(node, ProjectNode):
        source = dict(node.exprs).get(column)
        name = None if source is None else source.column_name()
        return out + ([] if name is None else _bounding(node.input, name, hopped))
    if isinstance(node, FilterNode):
        return out + _bounding(node.input, column, hopped)
    if isinstance(node, JoinNode) and node.join_type in ("inner", "left semi"):
        where = join_sides(node).get(column)
        if where is None:
            return out
        side, name = where
        keys, other, other_keys = ((node.left_keys, node.right, node.right_keys) if side == "left"
                                   else (node.right_keys, node.left, node.left_keys))
        out += _bounding(node.left if side == "left" else node.right, name, hopped)
        if name in keys:  # the rows kept have equal keys on both sides
            out += _bounding(other, other_keys[keys.index(name)], True)
    return out


def _reduced(
    side: Node, keys: list[str], other: Node, other_keys: list[str], max_bytes: float, notes: list[str], join: JoinNode
) -> Node | None:
    """``side`` semi-joined with the smallest filtered table beneath ``other``'s joins bounding a key, or None."""
    rows = estimated_rows(side)
    if rows is None or not _scan_side(side):
        return None
    for key, other_key in zip(keys, other_keys):
        found = [(n, c) for n, c in _bounding(other, other_key) if filtered(n)]
        best = smallest_source(found, side.schema.field(key).type)
        if best is None:
            continue
        small, source, column = best
        if small * RATIO > rows or small * row_width(pa.schema([source.schema.field(column)])) > max_bytes or not repeatable(source):
            continue
        keys_only = ProjectNode(source, [(column, col(column))])
        notes.append(f"{join_text(join)}: its side {side.label().split('[')[0]} (~{rows:,.0f} rows) reads only the {column!r} "
                     f"values of a filtered {source.label().split('[')[0]} beneath the other side (~{small:,.0f} rows), "
                     f"which {key!r} equals through the joins")
        return JoinNode(side, keys_only, [key], [column], "left semi")
    return None
