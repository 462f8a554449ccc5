"""Semi and anti joins moved down to the input whose rows they keep or drop, below the joins above it.

Why: SQL's ``IN`` and ``EXISTS`` subqueries become semi joins (``NOT IN``, ``NOT EXISTS``: anti
joins) that DataFusion places where the text put them, above the joins of the outer query. TPC-H
Q18 keeps ~600 of 1.5 million orders (those whose quantity passes 300), but its semi join sat
above ``customer ⋈ orders ⋈ lineitem``: on two hosts the plan shuffled all ~60 million joined rows
by ``o_custkey`` before the semi join threw nearly all of them away.

A left semi (anti) join keeps (drops) each row of its left input by that row's key alone, whatever
else the row holds: it is a filter on the left input's key columns, and moves like one
(``optimize.push_filters``): through a project that passes its keys through (renamed), a filter, a
sort without a fetch, and onto the side of a join that owns every key where that side's rows are not
null-extended (either side of an inner join, the preserved side of an outer join, the left of a semi
or anti join). It stops above anything else (an aggregate, a union, a limit, a window). Through an inner
join whose equality keys pair its keys with the other side's columns, a semi join whose build side is one
filtered scan (no join, no union) also lands on that other side, on those columns: every row the join outputs has
equal values there, so the same rows survive (Q18's lineitem, co-located with the subquery's own aggregate,
keeps ~4,000 of 60 million rows instead of being shuffled whole). Its build side is then computed twice,
which a build side of joins (TPC-DS q14's) cannot afford, nor one whose rows nothing filters (a fact table's
item keys, TPC-DS q37's and q82's: nearly every item), nor a plan of one task (``copies``), where it only
reads that scan again: one DuckDB query filters the other side by the join's own build. A semi join with a condition beside its keys
(``JoinNode.filter``, which reads its build side) stays where it is.
"""

from __future__ import annotations

from flight.plan.nodes import FeedScanNode, FilterNode, Node, ProjectNode
from flight.plan.relnodes import JoinNode, SortNode, UnionNode
from flight.planner.optimize import PUSHABLE_SIDES, join_sides

__all__ = ["push_semi_joins"]

_MOVABLE = ("left semi", "left anti")


def push_semi_joins(root: Node, copies: bool = True) -> tuple[Node, list[str]]:
    """``root`` with every movable semi or anti join as low as it goes; and one note per join moved. ``copies``:
    one whose build side is one filtered scan is also copied onto the other side of an inner join it passes."""
    notes: list[str] = []
    return _Rewrite(notes, copies).node(root), notes


class _Rewrite:
    """One pass; a subtree used twice (a CTE: ``reuse.repeated_subtrees`` finds it by identity) is rewritten once."""

    def __init__(self, notes: list[str], copies: bool) -> None:
        self.notes, self.copies = notes, copies
        self.done: dict[int, Node] = {}

    def node(self, node: Node) -> Node:
        key = id(node)
        if key not in self.done:
            self.done[key] = _rewrite(node, self)
        return self.done[key]


def _rewrite(node: Node, pass_: _Rewrite) -> Node:
    notes = pass_.notes
    node = _with_children(node, pass_)
    if isinstance(node, JoinNode) and node.join_type in _MOVABLE and node.filter is None:
        where: list[str] = []
        sunk = _sink(node.left, node, list(node.left_keys), where, pass_.copies)
        if sunk is not None and where:  # below a project or a filter alone it saves nothing: left where it is
            keys = ", ".join(f"{a}={b}" for a, b in zip(node.left_keys, node.right_keys))
            notes.append(f"HashJoin[{node.join_type}, {keys}] moved below {' and '.join(where)}: it keeps or drops their input's "
                         "rows before they are joined (and moved)")
            return sunk
    return node


def _with_children(node: Node, pass_: _Rewrite) -> Node:
    if isinstance(node, JoinNode):
        left, right = pass_.node(node.left), pass_.node(node.right)
        if left is node.left and right is node.right:
            return node
        return _join(node, left, right)
    if isinstance(node, UnionNode):
        inputs = [pass_.node(n) for n in node.inputs]
        return node if all(a is b for a, b in zip(inputs, node.inputs)) else UnionNode(inputs)
    child = getattr(node, "input", None)
    if isinstance(child, Node):
        new = pass_.node(child)
        if new is not child:
            return _with_input(node, new)
    return node


def _sink(below: Node, semi: JoinNode, keys: list[str], where: list[str], copies: bool) -> Node | None:
    """``below`` with ``semi`` (matching ``keys``, columns of ``below``'s output) applied inside it, as low as it
    goes; None where it cannot go below ``below`` at all (then it stays where it was)."""
    if isinstance(below, ProjectNode):
        passthrough = {n: c for n, e in below.exprs if (c := e.column_name()) is not None}
        if not all(k in passthrough for k in keys):
            return None
        inner = [passthrough[k] for k in keys]
        return ProjectNode(_sink(below.input, semi, inner, where, copies) or _apply(below.input, semi, inner), below.exprs)
    if isinstance(below, FilterNode) or (isinstance(below, SortNode) and below.fetch == 0):
        return _with_input(below, _sink(below.input, semi, keys, where, copies) or _apply(below.input, semi, keys))
    if isinstance(below, JoinNode):
        sides = join_sides(below)
        if not all(k in sides for k in keys):
            return None
        side = {sides[k][0] for k in keys}
        if len(side) != 1 or (target := side.pop()) not in PUSHABLE_SIDES.get(below.join_type, ()):
            return None
        names = [sides[k][1] for k in keys]
        child = below.left if target == "left" else below.right
        where.append(f"HashJoin[{below.join_type}, {', '.join(f'{a}={b}' for a, b in zip(below.left_keys, below.right_keys))}]")
        moved = _sink(child, semi, names, where, copies) or _apply(child, semi, names)
        left, right = (moved, below.right) if target == "left" else (below.left, moved)
        paired = _paired(below, target, names) if copies and _copyable(semi.right) else None
        if paired is not None:  # the other side's rows meet only rows whose keys equal these: the same filter holds there
            other = below.right if target == "left" else below.left
            copy = _sink(other, semi, paired, where, copies) or _apply(other, semi, paired)
            left, right = (left, copy) if target == "left" else (copy, right)
            where.append(f"(also onto its other side, on {', '.join(paired)})")
        return _join(below, left, right)
    return None


def _paired(join: JoinNode, side: str, names: list[str]) -> list[str] | None:
    """For an inner join whose equality keys pair each of ``names`` (columns of ``side``) with a column of the other
    side: those columns, in order. A semi join on ``names`` holds on them too: every row the join outputs has equal
    values there. None otherwise (another join type, or a key the join does not pair)."""
    if join.join_type != "inner":
        return None
    mine, theirs = (join.left_keys, join.right_keys) if side == "left" else (join.right_keys, join.left_keys)
    pairs = dict(zip(mine, theirs))
    return [pairs[n] for n in names] if all(n in pairs for n in names) else None


def _copyable(build: Node) -> bool:
    """Whether a semi join's build side is worth computing twice: one scan under it, no join, no union, and a
    filter that drops rows of that scan. (Copied, TPC-DS q14's IN subqueries, each a join of three tables, made a
    one-task plan of 91 source threads; and a bare scan's column, q37's and q82's items of every catalog or store
    sale, holds nearly every key there is: its copy read the sales table again to keep nearly every row of
    inventory.) Q18's build side, orders whose quantity passes 300, is a filter over an aggregate of lineitem. The
    filter is a proxy for "drops keys", read from the plan's shape: one that drops nothing still counts, and a
    build side reduced some other way (a limit) is not copied."""
    nodes = list(build.walk())
    return (sum(isinstance(n, FeedScanNode) for n in nodes) == 1 and not any(isinstance(n, (JoinNode, UnionNode)) for n in nodes)
            and any(isinstance(n, FilterNode) for n in nodes))


def _apply(node: Node, semi: JoinNode, keys: list[str]) -> Node:
    """``semi``'s build side joined to ``node`` on ``keys``: the same rows of ``node``, its columns only."""
    return JoinNode(node, semi.right, keys, list(semi.right_keys), semi.join_type, semi.right_suffix, semi.strategy, None)


def _join(node: JoinNode, left: Node, right: Node) -> Node:
    """``node`` over ``left`` and ``right``: its sides with a semi join moved into them, their columns the same."""
    return node.with_inputs(left=left, right=right)


def _with_input(node: Node, child: Node) -> Node:
    """``node`` over ``child``: its input with a semi join moved into it, its columns the same."""
    return node.with_inputs(input=child)
