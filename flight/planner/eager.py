"""Eager aggregation: an aggregate grouped by a join's left keys, over right-side columns, is
computed on the right side first, by the right keys, and merged after the join.

Why: TPC-H Q13 counts each customer's orders through a left outer join; joined first, 1.5
million orders rows cross the network to meet 150,000 customers. Aggregated first, each
customer's count is one row (Yan and Larson's eager group-by).

Exact, whatever the keys' multiplicities: a left row joins either every right row of its key
(the original) or the one pre-aggregated row of that key (the rewrite), so a group made of n
left rows of key k sees n times the right rows of k either way, and ``count`` and ``sum`` merge
as ``sum`` of the partials, ``min`` and ``max`` as themselves. A left row without a match
(left outer join) meets nulls both ways: ``sum``, ``min``, ``max`` of nothing are null as
before, and a ``count`` of nothing, null after the merge, becomes 0 again (``coalesce``).

Only when it is plainly safe: an inner or left outer join whose sides share no column name,
an aggregate whose group keys are exactly the join's left keys, and calls of ``count``,
``sum``, ``min`` or ``max`` on a right-side column. The rewritten aggregate must produce the
original's schema (names and types), or the plan is left as it was.

*Sunk* pre-aggregates (``_sunk``), the other form: an aggregate above a chain of joins whose
calls read one side only, where that side is itself a join's output and the other side is a
lookup (scans, projects and joins only: no filter, so it keeps the rows it meets). TPC-H Q10
sums lineitem's revenue by seven customer columns after joining orders, customer and nation:
15,000 lineitem rows per customer group meet the customer's wide columns, and the group keys
hash two long strings per row. Summed by ``o_custkey`` first, right above the lineitem-orders
join, a third as many rows meet customer (one task's query: 47 -> 12 ms in DuckDB alone). The
pre-aggregate is grouped by every column of its side that something above reads (the group
keys, the keys of the joins above), so each of its rows stands for rows that met the same rows
above, and the aggregate merges the partials as above. Projections that only select columns (the SQL
front end puts one between each pair of joins) are passed through, and the pre-aggregate is made
only where it is grouped by one input's columns of the join it sits on (a join key stands for its
partner): grouped by both, about every joined row is a group. It is ``partial``: the planner leaves it
in the tasks of the join below it, never shuffles for it, and a key may come out of several
tasks; the merge above counts each once per row it meets, as the original did. It never goes
onto a side that is a scan (the join beside it may filter most of its rows away: TPC-H Q5's
lineitem meets one region's suppliers), nor below a join, at any level, whose other side filters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pyarrow as pa

from flight.plan.expr import Expr, coalesce, col, lit
from flight.plan.nodes import FilterNode, LimitNode, Node, ProjectNode
from flight.plan.relnodes import AggCall, AggregateNode, JoinNode, SortNode, UnionNode

__all__ = ["eager_aggregates", "map_children"]

_MERGE = {"count": "sum", "sum": "sum", "min": "min", "max": "max"}


def eager_aggregates(node: Node) -> tuple[Node, list[str]]:
    """``node`` with every aggregate that may be computed before its join so computed; what was done."""
    notes: list[str] = []
    return _walk(node, notes), notes


def _walk(node: Node, notes: list[str]) -> Node:
    node = map_children(node, lambda child: _walk(child, notes))
    if isinstance(node, AggregateNode) and not node.partial:
        sunk = _sunk(node)
        if sunk is not None:
            out, where = sunk
            notes.append(
                f"Aggregate[keys={node.keys}]: pre-aggregated by {where.keys} below the joins above it, "
                f"right above {where.input.label()}, and merged after them"
            )
            return out
        eager = _eager(node)
        if eager is not None:
            join = _join_below(node)
            assert join is not None
            keys = ", ".join(f"{a}={b}" for a, b in zip(join.left_keys, join.right_keys))
            notes.append(
                f"Aggregate[keys={node.keys}] above HashJoin[{join.join_type}, {keys}]: computed on the right side "
                f"first, grouped by {join.right_keys}, and merged after the join"
            )
            return eager
    return node


def map_children(node: Node, f: Callable[[Node], Node]) -> Node:
    """``node`` with ``f`` applied to each child (itself when no child changed)."""
    if isinstance(node, (AggregateNode, LimitNode, SortNode, FilterNode, ProjectNode)):
        child = f(node.input)
        return node if child is node.input else replace(node, input=child)
    if isinstance(node, JoinNode):
        left, right = f(node.left), f(node.right)
        return node if left is node.left and right is node.right else replace(node, left=left, right=right)
    if isinstance(node, UnionNode):
        inputs = [f(n) for n in node.inputs]
        return node if all(a is b for a, b in zip(inputs, node.inputs)) else UnionNode(inputs)
    return node


def _join_below(agg: AggregateNode) -> JoinNode | None:
    """The join ``agg`` reads, directly or through projections that only select columns (the SQL front end puts
    them there: TPC-H Q13's text was no longer rewritten once it came from SQL, its 15 million orders rows shuffled
    to meet customer at SF 10); None otherwise. Dropping those projections keeps what ``agg`` reads: its keys and
    its calls' columns are the join's own."""
    node = agg.input
    while isinstance(node, ProjectNode) and all(e.column_name() == n for n, e in node.exprs):
        node = node.input
    return node if isinstance(node, JoinNode) else None


def _eager(agg: AggregateNode) -> Node | None:
    join = _join_below(agg)
    if join is None or join.join_type not in ("inner", "left outer") or not agg.calls or join.filter is not None:
        return None
    right_names = set(join.right.schema.names)
    if set(join.left.schema.names) & right_names or list(agg.keys) != list(join.left_keys):
        return None
    pre: list[AggCall] = []
    merged: list[AggCall] = []
    for i, c in enumerate(agg.calls):
        column = c.expr.column_name() if c.expr is not None else None
        if c.function not in _MERGE or column is None or column not in right_names:
            return None
        part = f"__eager{i}"
        pre.append(AggCall(part, c.function, c.expr))
        merged.append(AggCall(c.name, _MERGE[c.function], col(part)))
    early = AggregateNode(join.right, list(join.right_keys), pre, "EagerAggregate")
    joined = JoinNode(join.left, early, join.left_keys, join.right_keys, join.join_type, join.right_suffix, filter=join.filter)
    final = AggregateNode(joined, list(agg.keys), merged, agg.label_text)
    counts = frozenset(c.name for c in agg.calls if c.function == "count") if join.join_type == "left outer" else frozenset()
    return _merged(agg, final, counts)


def _merged(agg: AggregateNode, final: AggregateNode, counts: frozenset[str] = frozenset()) -> Node | None:
    """``final`` projected to ``agg``'s schema (None if it cannot be); ``counts`` of nothing are 0."""
    exprs: list[tuple[str, Expr]] = []
    for f in agg.schema:
        e = col(f.name)
        if f.name in counts:
            e = coalesce(e, lit(0, pa.int64()))
        if final.schema.field(f.name).type != f.type:
            e = e.cast(f.type)
        exprs.append((f.name, e))
    out = ProjectNode(final, exprs)
    return out if out.schema.equals(agg.schema) else None


def _sunk(agg: AggregateNode) -> tuple[Node, AggregateNode] | None:
    """``agg`` with a partial pre-aggregate sunk below the joins under it (module docstring), and that
    pre-aggregate; None where the rule does not apply."""
    if not agg.calls or any(c.function not in _MERGE or c.expr is None for c in agg.calls):
        return None
    args: set[str] = set()
    for c in agg.calls:
        assert c.expr is not None
        args |= c.expr.referenced_fields()
    pre = [AggCall(f"__sunk{i}", c.function, c.expr) for i, c in enumerate(agg.calls)]
    placed: list[AggregateNode] = []
    below = _sink(agg.input, set(agg.keys), args, pre, placed)
    if below is None:
        return None
    merged = [AggCall(c.name, _MERGE[c.function], col(f"__sunk{i}")) for i, c in enumerate(agg.calls)]
    out = _merged(agg, AggregateNode(below, list(agg.keys), merged, agg.label_text))
    return None if out is None else (out, placed[0])


def _sink(node: Node, needed: set[str], args: set[str], pre: list[AggCall], placed: list[AggregateNode]) -> Node | None:
    """``node`` (a join) with the pre-aggregate placed as deep as it may go on the side ``args`` come from.
    A projection that only selects columns is passed through: above the pre-aggregate it passes the partial
    columns on in place of the columns ``args`` names (the SQL front end selects columns between joins)."""
    if isinstance(node, ProjectNode) and _selected(node) is not node:
        below = _sink(node.input, needed, args, pre, placed)  # it selects: the columns are named alike below
        if below is None:
            return None
        kept = [(n, e) for n, e in node.exprs if n in below.schema.names]
        return ProjectNode(below, [*kept, *((c.name, col(c.name)) for c in pre if c.name not in dict(kept))])
    if not isinstance(node, JoinNode) or node.join_type not in ("inner", "left outer"):
        return None
    if node.filter is not None:  # its condition reads columns the pre-aggregate must keep, and no argument
        used = node.filter.referenced_fields()
        if used & args:
            return None
        needed = needed | used
    left_names, right_names = set(node.left.schema.names), set(node.right.schema.names)
    if left_names & right_names:
        return None
    if args <= left_names:
        side, other, keys, names = node.left, node.right, node.left_keys, left_names
    elif args <= right_names and node.join_type == "inner":
        side, other, keys, names = node.right, node.left, node.right_keys, right_names
    else:
        return None
    if not isinstance(_selected(side), JoinNode):
        return None  # never onto a scan: the join beside it may keep few of its rows
    if not _lookup(other):
        return None  # nor below a join that drops rows (TPC-H Q5's region): the rows aggregated would be dropped after
    need = (needed & names) | set(keys)
    deeper = _sink(side, need, args, pre, placed)
    if deeper is None:
        group = [n for n in side.schema.names if n in need]
        below = _selected(side)
        assert isinstance(below, JoinNode)
        if not _one_sided(below, group):
            return None  # grouped by both sides' columns, about every joined row is a group (TPC-H Q5's customer and supplier)
        deeper = AggregateNode(side, group, list(pre), "EagerAggregate", partial=True)
        placed.append(deeper)
    return replace(node, left=deeper) if side is node.left else replace(node, right=deeper)


def _one_sided(join: JoinNode, group: list[str]) -> bool:
    """Whether ``group`` names columns of one of ``join``'s inputs only, a join key standing for its partner (equal
    values): grouped so, there are at most as many groups as that input has rows."""
    lefts, rights = set(join.left.schema.names), set(join.right.schema.names)
    return all(g in lefts or g in join.right_keys for g in group) or all(g in rights or g in join.left_keys for g in group)


def _selected(node: Node) -> Node:
    """``node`` under the projections that only select its columns."""
    while isinstance(node, ProjectNode) and node.selects():
        node = node.input
    return node


def _lookup(node: Node) -> bool:
    """Whether ``node`` only reads and joins (inner or left outer): it filters nothing, so a row
    joined with it on its keys is not dropped for a reason the pre-aggregate could have seen."""
    if isinstance(node, ProjectNode):
        return _lookup(node.input)
    if isinstance(node, JoinNode):
        return node.join_type in ("inner", "left outer") and node.filter is None and _lookup(node.left) and _lookup(node.right)
    return not node.children()
