"""A join of two large tables on a composite key, run first: ``(A ⋈ B) ⋈ C`` as ``A ⋈ (B ⋈ C)`` with ``B ⋈ C`` settled.

Why: TPC-DS q25, q17 and q29 join store_sales with its returns on (customer, item, ticket) and then catalog_sales
with those returns on (customer, item): the same customer bought the item again from the catalog. At SF 10 the
returns ⋈ catalog pair keeps a few thousand rows of millions (~14 once the query's dates filter them), a
correlation no estimate sees: the planner sizes a join by its larger side. DuckDB finds it by its own estimates,
builds that pair first and probes store_sales with the few keys it gave, whose row groups its zone maps skip (store
sales are written in ticket order). The SQL front end hands the joins over in the text's order, so store_sales
met its returns first, and across hosts all of it was scanned and shuffled (q25 at 0.30 of one-core DuckDB's speed
on two one-core hosts).

The rule, a decision apart from I/O (``flight.coordinator.exec`` runs the side, as for any adaptive point):

* an inner join ``J2`` of a join ``J1 = A ⋈ B`` (inner, under a column selection at most) and a side ``C`` on two or
  more key pairs, whose keys on ``J1``'s side all come from ``B`` (so ``B ⋈ C`` is a join of its own);
* ``B`` and ``C`` each estimated at ``COMPOSITE_SIDE_ROWS`` or more (two large tables: the size of their join on a
  composite key is the guess), ``A`` at ``PARTNER_BYTES`` or more (what the settled rows can spare moving);
* ``B ⋈ C`` reads repeatable sources only, no input a caller sends; no output name twice (none is suffixed);
* ``B`` and ``C`` each keep only the rows the small filtered sides that inner joins above join them with keep
  (left semi joins with those sides: q25's dates of returns and of catalog sales), so that the pair reads no more.

The plan rotated that way is only the side's: if its rows pass ``ExecOptions.adaptive_bytes``, the query runs as
first planned (the side's work lost, the answer the same); if they fit, they are literal rows that ``A`` builds a
broadcast join with, and each task's DuckDB filters ``A``'s scan by their keys as it reads it.
"""

from __future__ import annotations

from flight.plan.nodes import FilterNode, Node, ProjectNode
from flight.plan.relnodes import JoinNode
from flight.planner.adaptive import PARTNER_BYTES, PRUNE_SIDE_ROWS, AdaptivePoint, rebuilt, settleable, size_of
from flight.planner.notes import join_text
from flight.planner.place import rotated, rotation_sides

__all__ = ["COMPOSITE_SIDE_ROWS", "composite_point"]

COMPOSITE_SIDE_ROWS = 1_000_000
"""Each of the pair's tables must be estimated at this many rows or more: below, running the pair first as a query
of its own (tens of milliseconds, and the plan made again) costs more than what its few rows could spare."""


def composite_point(root: Node) -> tuple[Node, AdaptivePoint] | None:
    """``root`` with the first such join (top down) rotated, and the point that settles its ``B ⋈ C``; or None.
    ``root``: filters and semi joins already pushed (``find_point``'s)."""
    stack: list[tuple[Node, tuple[Node, ...]]] = [(root, ())]
    while stack:
        node, above = stack.pop()
        if isinstance(node, JoinNode):
            found = _rotated(node, above)
            if found is not None:
                rotated, point = found
                return _replaced(root, node, rotated), point
        stack.extend((child, (*above, node)) for child in reversed(list(node.children())))
    return None


def _rotated(outer: JoinNode, above: tuple[Node, ...]) -> tuple[Node, AdaptivePoint] | None:
    sides = rotation_sides(outer) if len(outer.left_keys) >= 2 else None
    if sides is None:
        return None
    inner, a, b, c = sides
    b_rows, _ = size_of(b)
    c_rows, _ = size_of(c)
    _, partner = size_of(a)
    if (b_rows is None or c_rows is None or partner is None or min(b_rows, c_rows) < COMPOSITE_SIDE_ROWS
            or partner < PARTNER_BYTES):
        return None
    pair = JoinNode(_kept(b, outer, above), _kept(c, outer, above), outer.left_keys, outer.right_keys, "inner", outer.right_suffix)
    if not settleable(pair):
        return None
    joined = rotated(outer, inner, a, b, pair)
    rows, size = size_of(pair)
    why = (f"{join_text(outer)} over {join_text(inner)}: joins reordered, {join_text(pair)} first, and it runs first "
           f"as a query of its own (~{b_rows:,.0f} and ~{c_rows:,.0f} rows on a composite key: its size is a guess); "
           f"the rest is planned from its actual rows if they fit adaptive_bytes (the other side, "
           f"~{partner / (1 << 20):,.1f} MiB, is then filtered by their keys where it is read)")
    join = joined.input if isinstance(joined, ProjectNode) else joined  # the rotated join under its column order
    if not isinstance(join, JoinNode):
        return None
    return joined, AdaptivePoint(pair, join, rows, size, partner, why=why)


def _kept(side: Node, outer: JoinNode, above: tuple[Node, ...]) -> Node:
    """``side`` under a left semi join with each small side (a filtered dimension) that an inner join above ``outer``
    joins on ``side``'s columns alone: the rows the query keeps of it, so that the pair run first reads no more.

    Why: TPC-DS q25 filters returns and catalog sales by their dates through joins with date_dim above the pair;
    run without them, the pair joined 14 million catalog sales with every return (2.7 s at SF 10 on two one-core
    hosts, where the whole query took 1.6). A semi join keeps exactly the rows the inner join above will not drop,
    as long as the path up to it holds only inner joins, filters and column selections, no name is met twice (a
    join's colliding name is renamed, and the key would then be another column), and the key is a column of the side
    all the way up (one a selection dropped may come back as another table's: found by a review, a key ``k`` of the
    pair dropped above it and ``days.k`` joined later semi-joined the returns on their own ``k``)."""
    names = set(side.schema.names) & set(outer.schema.names)  # the side's columns the chain still has
    chain: Node = outer
    for node in reversed(above):
        if (isinstance(node, ProjectNode) and not node.selects()) or not isinstance(node, (ProjectNode, FilterNode, JoinNode)):
            break
        if isinstance(node, JoinNode):
            if node.join_type != "inner" or node.filter is not None:
                break
            mine, theirs, other = ((node.left_keys, node.right_keys, node.right) if node.left is chain
                                   else (node.right_keys, node.left_keys, node.left))
            if set(other.schema.names) & set(chain.schema.names):
                break
            rows, _ = size_of(other)
            if set(mine) <= names and rows is not None and rows <= PRUNE_SIDE_ROWS:
                side = JoinNode(side, other, list(mine), list(theirs), "left semi")
        chain = node
        names &= set(node.schema.names)  # a column dropped on the way is never the side's again (a join may bring the name back)
    return side


def _replaced(root: Node, old: Node, new: Node) -> Node:
    def visit(node: Node) -> Node:
        return new if node is old else rebuilt(node, visit)

    return visit(root)
