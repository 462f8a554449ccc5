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

Applied to an inner join's side (a condition beside its keys, if any, only drops more rows) at the scan its
key comes from (under filters and projects, and through the inner joins, semi joins' left sides and left outer
joins' preserved sides of that side: the semi join lands right above the scan, deep in the side if need be) when the bounding table is
reached from the other side's key through another join's key equality (one the key only passes through from is
that join's own input, which it filters already), is filtered (an unfiltered table bounds nothing a foreign
key does not), is estimated at least ``RATIO`` times smaller than the scan and small enough to broadcast, and
reads repeatable sources (it is read a second time for this). A scan whose key a semi join bounds already is
left alone on that key; each of its other keys a filtered table bounds adds a semi join beneath (TPC-DS q72's
catalog_sales, bounded by its household profiles and by its dates of one year, meets inventory by item: reduced
by the profiles alone it carried four years of sales into that join, 34.7 s at SF 10 on two hosts; by both, 1.9 s).
Only for plans of more than one task: one task moves nothing.

A reduction can make a table filtered that bounds another join's key, so the walk runs again (at most
``PASSES`` times) while it finds more: TPC-H Q5's region (``ASIA``) bounds nation's region key, nation's keys
then bound supplier's and, through ``c_nationkey = s_nationkey``, customer's, whose 1.5 million rows at SF 10
were broadcast whole to meet lineitem where a fifth of them could match (a task's query 1.13 -> 0.95 s in
DuckDB alone with that fifth). Below another join of its side, a scan is reduced only when its key meets no
join on the way (there the other side bounds it soon anyway: TPC-H Q9's lineitem and part, 11% slower with
both), bounded by a table derived through joins or a plain filtered one of a few rows (``FEW_KEYS``: TPC-H
Q7's two nations; TPC-DS q72's 720 household profiles were 1.5 times as long), and it stays reduced only when
it is large (``LARGE_ROWS``): a small one (a dimension) is read in place by every task, and a semi join made
it a stage of its own (TPC-H Q7's supplier, 1.16 -> 1.73 s); its reduction served only to bound a larger
scan's key, and is taken out again once the walks end.

A subplan the query repeats (a CTE's uses, a ROLLUP's input) has its own joins reduced, alike in every use so
it stays one subplan; a join outside it reduces nothing inside. TPC-DS q80 left-joins store_sales with
store_returns (too large to broadcast), then with 30 days' dates, in its ROLLUP's repeated input: all of
store_sales was shuffled to meet its returns (3.7 GB at SF 10 on two hosts, 13.2 s); reduced by those dates
(and its items and promotions) first, 525 MB and 3.5 s. A left outer join's preserved side is reduced only
where the join is surely shuffled (its other side over ``LARGE_BROADCAST`` times ``broadcast_bytes``): a
broadcast keeps that side's rows in place, and its reduction was a stage more (TPC-DS q40 0.08 -> 0.12 s).

Where the join beside such a scan is estimated too large to broadcast (``shuffled``: the scan's rows will be
shuffled to meet it, unless co-located), a plain filtered table bounds the scan whatever its size and whichever
side is larger: dropping rows before they move is worth more than the join order DuckDB would pick in one query.
TPC-DS q17 joins store_sales, store_returns and catalog_sales by customer and item, then each with its filtered
dates: at SF 10 on two hosts the facts were shuffled whole (1,071 MB moved, 5.3 s); each now reads only its
dates first (69 MB, 1.3 s). A derived bound keeps the rule above (TPC-H Q5's lineitem, co-located with orders,
would lose that), and so does a join the cutter co-locates (``colocated``: TPC-DS q50's store_sales and
store_returns, clustered by ticket; their reduction made a stage of its own, 0.88 -> 1.22 s, before such joins
were told apart).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pyarrow as pa

from flight.plan.expr import col
from flight.plan.nodes import FeedScanNode, FilterNode, Node, ProjectNode
from flight.plan.relnodes import JoinNode
from flight.planner.cost import LARGE_BROADCAST, row_width
from flight.planner.eager import map_children
from flight.planner.keysets import estimated_rows, filtered, smallest_source
from flight.planner.notes import join_text, repeatable
from flight.planner.optimize import join_sides

__all__ = ["DEEP_RATIO", "FEW_KEYS", "LARGE_ROWS", "PASSES", "RATIO", "reduce_join_inputs"]

RATIO = 10.0
"""How much smaller (in rows) the bounding table must be estimated than the scan side."""

PASSES = 4
"""The most walks over the plan: each may find the reductions the one before made possible."""

DEEP_RATIO = 100.0
"""As ``RATIO``, for a scan below another join of its side: the joins between may meet the bound anyway (TPC-H Q21's
lineitem, co-located with orders once its joins are rotated, was cut off from that by a reduction with orders'
keys at 13 times fewer rows)."""

FEW_KEYS = 100
"""A plain filtered table bounds a large scan below another join only when estimated at most this many rows."""

LARGE_ROWS = 500_000
"""A scan below another join of its side stays reduced only when estimated at least this many rows (module doc)."""


def reduce_join_inputs(
    root: Node, max_bytes: float, keep: set[int] | None = None, colocated: Callable[[JoinNode], bool] | None = None
) -> tuple[Node, list[str]]:
    """``root`` with each inner join's scan side reading only the keys a filtered table beneath the other side
    can match (module doc). ``keep``: ids of nodes left as they are (a CTE's uses, ``keysets``); ``colocated``:
    whether the cutter would co-locate a join (no rows moved to meet it), when known."""
    reducer = _Reducer(max_bytes, keep or set(), colocated)
    for _ in range(PASSES):
        found = len(reducer.made)
        root = reducer.walk(root)
        if len(reducer.made) == found:
            break
    root = reducer.cleaned(root)
    return root, [note for note, kept in reducer.made.values() if kept]


class _Reducer:
    """One plan's reductions: ``made`` holds each semi join it made (by id) with its note, and whether it stays."""

    def __init__(self, max_bytes: float, keep: set[int], colocated: Callable[[JoinNode], bool] | None = None) -> None:
        self.max_bytes, self.keep, self.colocated = max_bytes, keep, colocated
        self.made: dict[int, tuple[str, bool]] = {}

    def walk(self, node: Node) -> Node:
        if id(node) in self.made:
            return node
        node = map_children(node, self.walk)
        if not isinstance(node, JoinNode) or node.join_type != "inner":
            return node  # an inner join's condition beside its keys only drops more rows: the keys still bound
        left = self.reduced(node.left, node.left_keys, node.right, node.right_keys, node)
        if left is not None:
            node = replace(node, left=left)
        right = self.reduced(node.right, node.right_keys, node.left, node.left_keys, node)
        return node if right is None else replace(node, right=right)

    def cleaned(self, node: Node) -> Node:
        """``node`` without the reductions that served only to bound others (their semi joins' left sides instead)."""
        if id(node) in self.made:  # a reduction, maybe stacked on others: each one decided on its own
            assert isinstance(node, JoinNode)
            inner = self.cleaned(node.left)
            if not self.made[id(node)][1]:
                return inner
            return node if inner is node.left else replace(node, left=inner)
        return map_children(node, self.cleaned)

    def reduced(self, side: Node, keys: list[str], other: Node, other_keys: list[str], join: JoinNode) -> Node | None:
        """``side`` with the scan one of ``keys`` comes from semi-joined with the smallest filtered table beneath
        ``other``'s joins bounding that key, or None."""
        for key, other_key in zip(keys, other_keys):

            def bounded(scan: Node, column: str, beside: Node | None, near: JoinNode | None,
                        other_key: str = other_key, key: str = key) -> Node | None:
                rows = estimated_rows(scan)
                joined = beside is not None
                moved = joined and self.shuffled(beside, near)  # type: ignore[arg-type]
                larger = joined and rows is not None and rows >= LARGE_ROWS and (estimated_rows(beside) or 0.0) < rows  # type: ignore[arg-type]
                if rows is None or (larger and not moved):
                    return None  # a large scan below a join it is the larger side of: it stays where it is read
                # The other side itself bounds a scan below another join of this side: that join has not met it yet.
                found = [(n, c) for n, c in _bounding(other, other_key, hopped=joined) if filtered(n)]
                best = smallest_source(found, scan.schema.field(column).type)
                if best is None:
                    return None
                small, source, bound = best
                stays = not joined or rows >= LARGE_ROWS  # a small one's reduction only bounds others' (module doc)
                plain = not any(isinstance(n, JoinNode) for n in source.walk())
                if larger and not plain:
                    return None  # past the rule above only by a plain dimension (a star's: TPC-DS q17's dates)
                if joined and stays and small > FEW_KEYS and plain and not moved:
                    return None  # a plain filtered table: the stage's engine joins it in the order it likes (TPC-DS q72)
                ratio = DEEP_RATIO if joined and stays else RATIO
                if small * ratio > rows or small * row_width(pa.schema([source.schema.field(bound)])) > self.max_bytes or not repeatable(source):
                    return None
                keys_only = ProjectNode(source, [(bound, col(bound))])
                where = " (below a join of its side)" if joined else ""
                note = (f"{join_text(join)}: its side {scan.label().split('[')[0]}{where} (~{rows:,.0f} rows) reads only the "
                        f"{bound!r} values of a filtered {source.label().split('[')[0]} beneath the other side (~{small:,.0f} rows), "
                        f"which {key!r} equals through the joins")
                made = JoinNode(scan, keys_only, [column], [bound], "left semi")
                self.made[id(made)] = note, stays
                return made

            made = self.at_scan(side, key, bounded)
            if made is not None:
                return made
        return None

    def shuffled(self, beside: Node, near: JoinNode | None) -> bool:
        """Whether the side ``beside`` a scan, of the join ``near`` it, is estimated too large to broadcast and the
        join not co-located: then the scan's rows are shuffled to meet it, and a bound that drops them is worth more
        than the order of the joins."""
        rows = estimated_rows(beside)
        outer = near is not None and near.join_type == "left outer"  # its preserved side stays put unless surely shuffled
        if rows is None or rows * row_width(beside.schema) <= self.max_bytes * (LARGE_BROADCAST if outer else 1):
            return False
        return near is None or self.colocated is None or not self.colocated(near)

    def at_scan(self, node: Node, key: str, make: Callable[[Node, str, Node | None, JoinNode | None], Node | None],
                beside: Node | None = None, near: JoinNode | None = None) -> Node | None:
        """``node`` with ``make(scan side, column, beside, near)`` in place of the scan side that ``key`` comes from
        (through projections, filters, inner joins and semi joins' left sides: each drops the rows the reduction
        drops and keeps the column's values), or None: the key is computed, crosses another kind of join, meets
        a join with a filtered table below ``node``'s top (``_met``), or the scan was reduced already. ``beside``:
        the other input of the inner join nearest the scan on the way, ``near`` (None: no inner join lies between). Only the
        path the key takes is rebuilt: a subplan used twice keeps its other use."""
        if id(node) in self.made:  # a scan reduced on another key already: reduced on this one too, beneath
            assert isinstance(node, JoinNode)
            inner = None if key in node.left_keys else self.at_scan(node.left, key, make, beside, near)
            if inner is None:
                return None
            stacked = replace(node, left=inner)
            self.made[id(stacked)] = self.made.pop(id(node))
            return stacked
        if _scan_side(node):
            return make(node, key, beside, near)
        if isinstance(node, FilterNode):
            inner = self.at_scan(node.input, key, make, beside, near)
            return None if inner is None else replace(node, input=inner)
        if isinstance(node, ProjectNode):
            source = dict(node.exprs).get(key)
            name = None if source is None else source.column_name()
            inner = None if name is None else self.at_scan(node.input, name, make, beside, near)
            return None if inner is None else replace(node, input=inner)
        if isinstance(node, JoinNode) and node.join_type in ("inner", "left semi", "left outer"):
            where = join_sides(node).get(key)
            if where is None or (node.join_type == "left semi" and where[1] in node.left_keys) or _met(node, *where):
                return None  # computed, bounded by that semi join already, or met by a filtered table there
            side, name = where
            if node.join_type == "left outer" and side != "left":
                return None  # a null-extended side: its rows are not dropped with their key
            joined = node.join_type != "left semi"
            other = (node.right if side == "left" else node.left) if joined else beside
            inner = self.at_scan(node.left if side == "left" else node.right, name, make, other, node if joined else near)
            if inner is None:
                return None
            return replace(node, left=inner) if side == "left" else replace(node, right=inner)
        return None


def _met(join: JoinNode, side: str, name: str) -> bool:
    """Whether ``name`` of ``join``'s ``side`` is a key ``join`` equates with a filtered table's (a scan under its
    filters) on its other side: that bounds the column there (TPC-H Q9's lineitem meets part), and a reduction
    below would repeat it."""
    keys, other, other_keys = ((join.left_keys, join.right, join.right_keys) if side == "left"
                               else (join.right_keys, join.left, join.left_keys))
    return name in keys and any(filtered(n) and _scan_side(n) for n, _ in _bounding(other, other_keys[keys.index(name)], True))


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
