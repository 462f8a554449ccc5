"""Plan rewrites that change cost, never results.

``prune_columns`` pushes the columns a plan actually uses down into its scans,
so a worker reads (and a shuffle moves) only those.
"""

from __future__ import annotations

from dataclasses import replace

from flight.plan.nodes import FeedScanNode, FilterNode, LimitNode, Node, ProjectNode
from flight.plan.relnodes import AggregateNode, JoinNode, SortNode, UnionNode

__all__ = ["prune_columns"]


def prune_columns(node: Node, needed: set[str] | None = None) -> Node:
    """``node`` with every scan reading only the columns above it need (``None``: all of its output)."""
    if needed is None:
        needed = set(node.schema.names)
    if isinstance(node, ProjectNode):
        kept = [(n, e) for n, e in node.exprs if n in needed] or node.exprs[:1]
        used: set[str] = set().union(*(e.referenced_fields() for _, e in kept))
        return ProjectNode(prune_columns(node.input, used), kept)
    if isinstance(node, FilterNode):
        return FilterNode(prune_columns(node.input, needed | node.predicate.referenced_fields()), node.predicate)
    if isinstance(node, LimitNode):
        return LimitNode(prune_columns(node.input, needed), node.count, node.offset)
    if isinstance(node, SortNode):
        child = prune_columns(node.input, needed | {k for k, _ in node.keys})
        return SortNode(child, node.keys, node.nulls_first, node.fetch)
    if isinstance(node, AggregateNode):
        used = set(node.keys).union(*(c.expr.referenced_fields() for c in node.calls if c.expr is not None))
        return AggregateNode(prune_columns(node.input, used), node.keys, node.calls, node.label_text, node.partial)
    if isinstance(node, JoinNode):
        return _prune_join(node, needed)
    if isinstance(node, UnionNode):
        return UnionNode([prune_columns(n, None) for n in node.inputs])
    if isinstance(node, FeedScanNode):
        available = node.schema.names
        columns = [c for c in available if c in needed] or available[:1]
        if columns == available:
            return node
        return replace(node, columns=columns)
    return node


def _prune_join(node: JoinNode, needed: set[str]) -> Node:
    left_names = set(node.left.schema.names)
    left_needed = {n for n in left_names if n in needed} | set(node.left_keys)
    right_needed = set(node.right_keys)
    if node.join_type not in ("left semi", "left anti"):
        for r in node.right.schema.names:
            suffixed = r in left_names
            if (r + node.right_suffix if suffixed else r) in needed:
                right_needed.add(r)
                if suffixed:
                    left_needed.add(r)  # keep the collision, so the right column keeps its suffixed name
    # A left column that a kept right column collides with must stay too (same reason).
    left_needed |= {r for r in right_needed if r in left_names and node.join_type not in ("left semi", "left anti")}
    return JoinNode(
        prune_columns(node.left, left_needed),
        prune_columns(node.right, right_needed),
        node.left_keys,
        node.right_keys,
        node.join_type,
        node.right_suffix,
        node.strategy,
    )
