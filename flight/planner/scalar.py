"""A comparison with a scalar subquery filters the table its column comes from, before the joins above it.

Why: ``d_month_seq BETWEEN (SELECT ... + 1) AND (SELECT ... + 3)`` reaches the planner as two joins on a
constant with the one-row subquery, each carrying its comparison as the join's condition (a cross join
has no keys to push), above every other join of the query. TPC-DS q54 so joined 2.9 million store_sales
rows with customers, addresses, stores and every date before a date was compared: the three months'
rows were known only at the top. Moved below those joins, onto the subplan the compared column comes
from (date_dim, 73 thousand rows), the comparison keeps 90 dates, and the join with them keeps the sales
of those months before anything else joins them. TPC-H Q22 compares customers' balances with their average
above the anti join that keeps those without orders: below it, the anti join's probe side is 190,000
customers instead of 420,000, small enough that its orders are first cut to those customers
(``flight.planner.semibuild``). Trino and DuckDB push such comparisons likewise.

Exact: an inner join with a one-row side on a constant keeps a row of the other side where the condition
holds (with that row's values), and inner joins, filters and projections commute with such a filter.
Applied where the one-row side is an aggregate without keys (under projections and filters), the
condition reads that side and columns of one subplan below the join (through filters, projections that
pass the columns on, and the sides of joins whose rows reach their output whole: both of an inner join, the
kept side of a semi or anti join, the preserved side of an outer join), and the projection above the join reads none of the one-row
side's columns. The one-row side's columns are renamed apart, so nothing below can clash with them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import replace

from flight.plan.expr import col, lit
from flight.plan.nodes import FilterNode, Node, ProjectNode
from flight.plan.relnodes import AggregateNode, JoinNode
from flight.planner.eager import map_children
from flight.planner.notes import join_text
from flight.planner.optimize import PUSHABLE_SIDES, join_sides, rename_fields

__all__ = ["push_scalar_comparisons"]


def push_scalar_comparisons(root: Node, notes: list[str]) -> Node:
    """``root`` with each comparison with a scalar subquery moved onto the subplan it compares (module doc),
    saying so in ``notes``."""
    fresh = itertools.count()

    def walk(node: Node) -> Node:
        node = map_children(node, walk)
        if isinstance(node, ProjectNode) and isinstance(node.input, JoinNode):
            moved = _moved(node, node.input, fresh, notes)
            if moved is not None:
                return moved
        return node

    return walk(root)


def _moved(project: ProjectNode, join: JoinNode, fresh: Iterator[int], notes: list[str]) -> Node | None:
    """``project`` without ``join``, its comparison moved below (None: not such a join)."""
    if join.join_type != "inner" or join.filter is None or len(join.left_keys) != 1 or not _one_row(join.right):
        return None
    left, right = join.left, join.right
    if not (_constant(left, join.left_keys[0]) and _constant(right, join.right_keys[0])):
        return None
    assert isinstance(left, ProjectNode)
    right_names = set(right.schema.names)
    if any(f in right_names and f not in left.schema.names for _, e in project.exprs for f in e.referenced_fields()):
        return None  # the projection reads the one-row side
    sides = join_sides(join)
    refs = join.filter.referenced_fields()
    if not refs or any(r not in sides for r in refs):
        return None
    mine = {sides[r][1]: r for r in refs if sides[r][0] == "left"}  # the left input's name -> the name in the condition
    theirs = {sides[r][1]: r for r in refs if sides[r][0] == "right"}
    below = _names_below(left, set(mine))
    if below is None or not mine:
        return None
    n = next(fresh)
    renamed = {name: f"__scalar{n}_{name}" for name in right.schema.names}
    key = f"__scalar{n}_one"
    one_row = ProjectNode(right, [(new, col(old)) for old, new in renamed.items()])
    condition = {theirs_name: renamed[theirs_name_in] for theirs_name_in, theirs_name in theirs.items()}

    def attach(node: Node, names: dict[str, str]) -> Node:
        """``node`` (whose columns ``names`` maps the left input's to) joined with the one-row side."""
        cond = rename_fields(join.filter, {**{c: names[m] for m, c in mine.items()}, **condition})  # type: ignore[arg-type]
        keyed = ProjectNode(node, [*((c, col(c)) for c in node.schema.names), (key, lit(1))])
        joined = JoinNode(keyed, one_row, [key], [renamed[join.right_keys[0]]], "inner", filter=cond)
        return ProjectNode(joined, [(c, col(c)) for c in node.schema.names])

    where, placed = _place(left.input, below, attach)
    if where is left.input or not _below_a_join(left.input, where):
        return None  # it would stay above every join: nothing is kept sooner
    notes.append(f"{join_text(join)}'s comparison with a one-row subquery moved below the joins above it, onto "
                 f"{where.label().split('[')[0]}: it keeps that subplan's rows before they are joined")
    return ProjectNode(replace(left, input=placed), project.exprs)


def _place(node: Node, names: dict[str, str], attach: Callable[[Node, dict[str, str]], Node]) -> tuple[Node, Node]:
    """``node`` with the comparison attached as deep as the columns (``names``: the left input's name ->
    ``node``'s) reach through filters, projections and the sides of joins whose rows reach the output whole
    (``PUSHABLE_SIDES``: both of an inner join, the kept side of a semi or anti join, the preserved side of an
    outer join); (the subplan it landed on, the new node)."""
    if isinstance(node, ProjectNode):
        passed = {m: _through(node, c) for m, c in names.items()}
        inner = {m: c for m, c in passed.items() if c is not None}
        if len(inner) == len(passed):
            where, placed = _place(node.input, inner, attach)
            return where, replace(node, input=placed)
    elif isinstance(node, FilterNode):
        where, placed = _place(node.input, names, attach)
        return where, replace(node, input=placed)
    elif isinstance(node, JoinNode):
        sides = join_sides(node)
        found = [sides.get(c) for c in names.values()]
        one_side = {f[0] for f in found if f}
        if all(f is not None for f in found) and len(one_side) == 1 and one_side <= set(PUSHABLE_SIDES[node.join_type]):
            side = one_side.pop()
            inner = {m: sides[c][1] for m, c in names.items()}
            if side == "left":
                where, placed = _place(node.left, inner, attach)
                return where, replace(node, left=placed)
            where, placed = _place(node.right, inner, attach)
            return where, replace(node, right=placed)
    return node, attach(node, names)


def _below_a_join(top: Node, target: Node) -> bool:
    """Whether ``target`` is beneath a join of ``top`` (through projections and filters only: no)."""
    node = top
    while isinstance(node, (ProjectNode, FilterNode)):
        if node is target:
            return False
        node = node.input
    return node is not target


def _through(project: ProjectNode, name: str) -> str | None:
    """The input column ``project``'s column ``name`` passes on as it is (None: computed, or not there)."""
    expr = dict(project.exprs).get(name)
    return None if expr is None else expr.column_name()


def _names_below(left: ProjectNode, names: set[str]) -> dict[str, str] | None:
    found = {n: _through(left, n) for n in names}
    return None if any(v is None for v in found.values()) else found  # type: ignore[return-value]


def _constant(node: Node, key: str) -> bool:
    """Whether ``node`` is a projection making ``key`` a constant."""
    if not isinstance(node, ProjectNode):
        return False
    expr = dict(node.exprs).get(key)
    return expr is not None and not expr.referenced_fields() and expr.column_name() is None


def _one_row(node: Node) -> bool:
    """Whether ``node`` gives at most one row: an aggregate without keys, under projections and filters."""
    while isinstance(node, (ProjectNode, FilterNode)):
        node = node.input
    return isinstance(node, AggregateNode) and not node.keys
