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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pyarrow as pa

from flight.plan.expr import Expr, coalesce, col, lit
from flight.plan.nodes import FilterNode, LimitNode, Node, ProjectNode
from flight.plan.relnodes import AggCall, AggregateNode, JoinNode, SortNode, UnionNode

__all__ = ["eager_aggregates"]

_MERGE = {"count": "sum", "sum": "sum", "min": "min", "max": "max"}


def eager_aggregates(node: Node) -> tuple[Node, list[str]]:
    """``node`` with every aggregate that may be computed before its join so computed; what was done."""
    notes: list[str] = []
    return _walk(node, notes), notes


def _walk(node: Node, notes: list[str]) -> Node:
    node = _map_children(node, lambda child: _walk(child, notes))
    if isinstance(node, AggregateNode) and not node.partial:
        eager = _eager(node)
        if eager is not None:
            join = node.input
            assert isinstance(join, JoinNode)
            keys = ", ".join(f"{a}={b}" for a, b in zip(join.left_keys, join.right_keys))
            notes.append(
                f"Aggregate[keys={node.keys}] above HashJoin[{join.join_type}, {keys}]: computed on the right side "
                f"first, grouped by {join.right_keys}, and merged after the join"
            )
            return eager
    return node


def _map_children(node: Node, f: Callable[[Node], Node]) -> Node:
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


def _eager(agg: AggregateNode) -> Node | None:
    join = agg.input
    if not isinstance(join, JoinNode) or join.join_type not in ("inner", "left outer") or not agg.calls:
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
    joined = JoinNode(join.left, early, join.left_keys, join.right_keys, join.join_type, join.right_suffix)
    final = AggregateNode(joined, list(agg.keys), merged, agg.label_text)
    counts = {c.name for c in agg.calls if c.function == "count"} if join.join_type == "left outer" else set()
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
