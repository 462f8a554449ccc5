"""Each scan reads only the columns the plan above it uses; a subplan with two parents is pruned once.

Why the second part: the SQL front end gives every use of a CTE, a view, or a grouping set's input
(``ROLLUP``, ``GROUPING SETS``: one aggregate per set, ``flight.sql.translate._grouping_union``) the
same input, which the rewrites before pruning copy (equal subplans, each over scans of its own). Pruned
per use, each copy became a subplan of its own, differing only in the columns it kept: TPC-DS q18's
five aggregates of a rollup each joined catalog_sales with five tables, no two alike, so neither the
cutter (``flight.planner.reuse``) nor a task's DuckDB query (``flight.engine.duck.shared``) could
compute that join once. Equal subplans (``subtree_keys``: equal operators over the same sources) are
pruned to the union of what their uses need, so they stay equal; each copy keeps its own scans.
"""

from __future__ import annotations

from dataclasses import replace

from flight.plan.nodes import OWN_KEY, FeedScanNode, FilterNode, InputCallNode, LimitNode, Node, ProjectNode, UnnestNode
from flight.plan.relnodes import AggregateNode, JoinNode, SortNode, UnionNode
from flight.plan.window import WindowNode
from flight.planner.reuse import subtree_keys

__all__ = ["prune_columns", "scan_columns"]


def prune_columns(node: Node, needed: set[str] | None = None) -> Node:
    """``node`` with every scan reading only the columns above it need (``None``: all of its output).

    Pruned for all of its output, a plan keeps what it was pruned to (a node never changes once made)."""
    if needed is None:
        return node.remembered("_pruned", lambda: _pruned(node, None))
    return _pruned(node, needed)


def _pruned(node: Node, needed: set[str] | None) -> Node:
    pruner = _gathered(node, needed)
    pruner.making = True
    return pruner.prune(node, needed)


def scan_columns(node: Node) -> list[tuple[Node, list[str]]]:
    """Each scan of ``node`` (a ``FeedScanNode`` or an ``InputCallNode``), once for each place it is used, with
    the columns ``prune_columns(node)`` would have it read: what sizing a plan needs, without making the pruned
    plan (making it was most of sizing TPC-DS q14, whose rewrites after sizing change the plan the planner prunes)."""
    pruner = _gathered(node, None)
    pruner.prune(node, None)
    return pruner.scans


def _gathered(node: Node, needed: set[str] | None) -> _Pruner:
    """A pruner for ``node`` that knows what each repeated subplan's users need (gathered until nothing grows)."""
    keys = subtree_keys(node)
    counts: dict[bytes, int] = {}
    reached: set[int] = set()
    shared: set[int] = set()
    for n in node.walk():  # each place a subplan is used
        counts[keys[id(n)]] = counts.get(keys[id(n)], 0) + 1
        (shared if id(n) in reached else reached).add(id(n))
    pruner = _Pruner(keys, {k for k, c in counts.items() if c > 1})
    pruner.shared = shared
    if pruner.repeated:
        while pruner.grew:
            pruner.grew = False
            pruner.seen.clear()
            pruner.prune(node, needed)
        pruner.scans.clear()
    pruner.gathering = False
    return pruner


def _same_operator(made: Node, was: Node) -> bool:
    """Whether pruning ``was`` to ``made`` left its own operator as it was (``OWN_KEY``: what it writes, its inputs
    left out): only inputs that lost columns, and, for a projection or a scan, every column kept."""
    if type(made) is not type(was) or isinstance(was, (FeedScanNode, InputCallNode)):
        return False
    return not isinstance(was, ProjectNode) or len(was.exprs) == len(made.exprs)  # type: ignore[attr-defined]


class _Pruner:
    """One pruning of a plan: a ``repeated`` subplan (its key, ``subtree_keys``) gets the union of what its
    users need, so that its copies stay equal."""

    def __init__(self, keys: dict[int, bytes], repeated: set[bytes]) -> None:
        self.keys = keys
        self.repeated = repeated
        self.needs: dict[bytes, set[str]] = {}
        self.seen: set[tuple[bytes, frozenset[str]]] = set()
        self.gathering = True
        self.making = False  # whether it makes the pruned plan (else it only works out needs and ``scans``)
        self.scans: list[tuple[Node, list[str]]] = []  # each scan reached, with the columns it keeps
        self.grew = True
        self.shared: set[int] = set()

    def prune(self, node: Node, needed: set[str] | None) -> Node:
        key = self.keys.get(id(node))
        if key is None or key not in self.repeated:
            return self._prune(node, needed)
        if not self.gathering:
            return self._prune(node, self.needs[key])
        had = self.needs.get(key, set())
        now = had | (set(node.schema.names) if needed is None else needed)
        if now != had:
            self.needs[key], self.grew = now, True
        if (key, frozenset(now)) in self.seen:  # gathered below with these needs already
            return node
        self.seen.add((key, frozenset(now)))
        return self._prune(node, now)

    def _same(self, node: Node, child: Node, was: Node | None = None) -> bool:
        """Whether ``node`` may stay as it is, its input pruned to ``child`` (``was``: that input, by default
        ``node.input``). A node reached twice (a subplan two parents share) is made anew for each: the planner
        counts and cuts each use apart (``repeated_subtrees``). While only needs are worked out (``making`` off),
        every node stays."""
        return not self.making or (child is (node.input if was is None else was) and id(node) not in self.shared)  # type: ignore[attr-defined]

    def _prune(self, node: Node, needed: set[str] | None) -> Node:
        out = self._pruned(node, needed)
        if out is not node and OWN_KEY in node.__dict__ and _same_operator(out, node):
            out.__dict__[OWN_KEY] = node.__dict__[OWN_KEY]  # its inputs lost columns, its operator did not change
        return out

    def _pruned(self, node: Node, needed: set[str] | None) -> Node:
        if needed is None:
            needed = set(node.schema.names)
        if isinstance(node, ProjectNode):
            kept = [(n, e) for n, e in node.exprs if n in needed] or node.exprs[:1]
            used: set[str] = set().union(*(e.referenced_fields() for _, e in kept))
            child = self.prune(node.input, used)
            return node if self._same(node, child) and (not self.making or len(kept) == len(node.exprs)) else node.keeping(child, kept)
        if isinstance(node, FilterNode):
            child = self.prune(node.input, needed | node.predicate.referenced_fields())
            return node if self._same(node, child) else FilterNode(child, node.predicate, node.origins)
        if isinstance(node, LimitNode):
            child = self.prune(node.input, needed)
            return node if self._same(node, child) else LimitNode(child, node.count, node.offset)
        if isinstance(node, SortNode):
            child = self.prune(node.input, needed | {k for k, _ in node.keys})
            return node if self._same(node, child) else SortNode(child, node.keys, node.nulls_first, node.fetch)
        if isinstance(node, AggregateNode):
            used = set(node.keys).union(*(e.referenced_fields() for c in node.calls for e in c.expressions()))
            child = self.prune(node.input, used)
            return node if self._same(node, child) else AggregateNode(child, node.keys, node.calls, node.label_text, node.partial)
        if isinstance(node, JoinNode):
            return self._join(node, needed)
        if isinstance(node, UnionNode):
            inputs = [self.prune(n, None) for n in node.inputs]
            return node if all(self._same(node, a, b) for a, b in zip(inputs, node.inputs)) else UnionNode(inputs)
        if isinstance(node, UnnestNode):
            child = self.prune(node.input, (needed & set(node.input.schema.names)) | {node.column})
            return node if self._same(node, child) else replace(node, input=child)
        if isinstance(node, WindowNode):
            used = (needed & set(node.input.schema.names)) | set(node.partition_by) | {k for k, _ in node.order_by}
            child = self.prune(node.input, used | {c.column for c in node.calls if c.column})
            return node if self._same(node, child) else replace(node, input=child)
        if isinstance(node, (FeedScanNode, InputCallNode)):  # an input (a Spark DataFrame) sends only these
            available = node.schema.names
            columns = [c for c in available if c in needed] or available[:1]
            self.scans.append((node, columns))
            if columns == available or not self.making:
                return node
            return node.reading(columns) if isinstance(node, FeedScanNode) else replace(node, columns=columns)
        return node

    def _join(self, node: JoinNode, needed: set[str]) -> Node:
        left_names = set(node.left.schema.names)
        left_needed = {n for n in left_names if n in needed} | set(node.left_keys)
        right_needed = set(node.right_keys)
        if node.filter is not None:  # the join's own condition reads columns of both sides
            used = node.filter.referenced_fields()
            left_needed |= used & left_names
            right_needed |= used & set(node.right.schema.names)
        if node.join_type not in ("left semi", "left anti"):
            for r in node.right.schema.names:
                suffixed = r in left_names
                if (r + node.right_suffix if suffixed else r) in needed:
                    right_needed.add(r)
                    if suffixed:
                        left_needed.add(r)  # keep the collision, so the right column keeps its suffixed name
        # A left column that a kept right column collides with must stay too (same reason).
        left_needed |= {r for r in right_needed if r in left_names and node.join_type not in ("left semi", "left anti")}
        left, right = self.prune(node.left, left_needed), self.prune(node.right, right_needed)
        if self._same(node, left, node.left) and self._same(node, right, node.right):
            return node
        return JoinNode(
            left,
            right,
            node.left_keys,
            node.right_keys,
            node.join_type,
            node.right_suffix,
            node.strategy,
            node.filter,
        )
