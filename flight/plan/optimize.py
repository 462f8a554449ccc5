"""Plan rewrites that change cost, never results.

``prune_columns`` pushes the columns a plan actually uses down into its scans,
so a worker reads only those from Parquet / IPC / CSV.
"""

from __future__ import annotations

from dataclasses import replace

from flight.plan.nodes import FeedScanNode, FilterNode, LimitNode, Node, ProjectNode

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
    if isinstance(node, FeedScanNode):
        available = node.schema.names
        columns = [c for c in available if c in needed] or available[:1]
        if columns == available:
            return node
        return replace(node, columns=columns)
    return node
