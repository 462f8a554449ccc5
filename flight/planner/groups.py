"""At most how many groups an aggregate makes: a bound from the values its keys can hold.

Why: the planner estimated an aggregate's groups as a tenth of its input rows, whatever it grouped by, so
grouping TPC-H's joined lineitem by nation name (25 values) counted ~600,000 groups at SF 1, and the one-host
rule (``flight.coordinator.exec``) planned such a query twice to learn whether its split hands rows off. A
key column holds at most as many values as the table it comes from has rows, and an integer or date column at
most the width of its Parquet footers' range; a deterministic function of one column has at most as many
values as that column; the keys' bounds multiply. What the estimate keeps is the least of the old guess and
this bound: a bound is never an estimate of its own (25 nations bound 25 groups; 6 million order keys do not
say how many a filtered input keeps).
"""

from __future__ import annotations

import pyarrow as pa

from flight.errors import PlanError
from flight.plan.expr import Expr
from flight.plan.expr_nodes import CallNode
from flight.plan.nodes import FeedScanNode, FilterNode, LimitNode, Node, ProjectNode
from flight.plan.relnodes import AggregateNode, JoinNode, SortNode, UnionNode
from flight.plan.typecheck import output_type
from flight.planner.optimize import join_sides

__all__ = ["GUESS", "aggregate_rows", "distinct_bound", "exact_mean_input", "group_bound"]

VOLATILE = frozenset({"random", "uuid"})
"""Functions whose value is not one per input value: an expression calling one is bounded by nothing."""


GUESS = 0.1
"""The textbook guess of an aggregate's groups, as a share of its input's rows, where nothing better is known."""


def aggregate_rows(node: AggregateNode, input_rows: float | None, tasks: int = 1, partial: bool = False) -> float | None:
    """The rows ``node`` gives from ``input_rows``: the least of ``GUESS`` of them and its keys' bound; with
    ``partial`` (the split's pre-aggregate, run by each of ``tasks`` on its own rows) its input's rows, or each
    task's groups if fewer. None when neither is known. (An aggregate sunk below a join, ``node.partial``, is
    guessed as a whole one is: it groups by the join's keys too.)"""
    if not node.keys:
        return float(tasks) if partial else 1.0
    bound = group_bound(node)
    if bound is not None and partial:
        bound *= tasks
    guess = input_rows if partial or input_rows is None else max(1.0, input_rows * GUESS)
    known = [r for r in (guess, bound) if r is not None]
    return min(known) if known else None


def group_bound(node: AggregateNode) -> float | None:
    """At most how many groups ``node`` makes (None: nothing bounds them); 1 for a global aggregate."""
    bound = 1.0
    for key in node.keys:
        values = distinct_bound(node.input, key)
        if values is None:
            return None
        bound *= values
    return bound


def distinct_bound(node: Node, column: str) -> float | None:
    """At most how many distinct values (a null counted as one) ``column`` of ``node`` holds; None: unknown."""
    while True:
        if isinstance(node, (FilterNode, SortNode, LimitNode)):
            node = node.input
        elif isinstance(node, ProjectNode):
            expr = dict(node.exprs).get(column)
            source = None if expr is None else _one_column(expr)
            if source is None:
                return None
            node, column = node.input, source
        elif isinstance(node, AggregateNode):
            if column not in node.keys:
                return None
            node = node.input
        elif isinstance(node, JoinNode):
            return _join_bound(node, column)
        elif isinstance(node, UnionNode):
            at = node.schema.names.index(column)
            parts = [distinct_bound(n, n.schema.names[at]) for n in node.inputs]
            return None if any(p is None for p in parts) else sum(p or 0.0 for p in parts)
        elif isinstance(node, FeedScanNode):
            return _scan_bound(node, column)
        else:
            return None


def _one_column(expr: Expr) -> str | None:
    """The one column ``expr`` is a deterministic function of (itself, renamed, or computed), else None."""
    name = expr.column_name()
    if name is not None:
        return name
    fields = expr.referenced_fields()
    if len(fields) != 1 or any(n.call.function in VOLATILE for n in expr.to_proto().nodes if n.HasField("call")):
        return None
    return next(iter(fields))


def _join_bound(node: JoinNode, column: str) -> float | None:
    """A join adds no value to a column; an outer join's null-extended side adds the null."""
    where = join_sides(node).get(column)
    if where is None:
        return None
    side, name = where
    found = distinct_bound(node.left if side == "left" else node.right, name)
    nulls = (side == "right" and node.join_type in ("left outer", "full outer")) or (
        side == "left" and node.join_type in ("right outer", "full outer")
    )
    return None if found is None else found + (1.0 if nulls else 0.0)


def _scan_bound(node: FeedScanNode, column: str) -> float | None:
    """The scan's rows (and a null), and for an integer or date column the width of its footers' range if smaller."""
    provider = node.feed.inner()
    rows = provider.estimated_rows()
    if rows is None or column not in node.schema.names:
        return None
    bound = float(rows) + 1.0
    kind = node.schema.field(column).type
    column_range = getattr(provider, "column_range", None)
    if column_range is not None and (pa.types.is_integer(kind) or pa.types.is_date(kind)):
        known = column_range(column)
        if known is not None:
            bound = min(bound, known[1] - known[0] + 2.0)  # the range's values and a null
    return bound



def exact_mean_input(expr: Expr | None, schema: pa.Schema) -> Expr | None:
    """What a split mean's partial sum and count read: the DECIMAL under a DOUBLE cast (``avg(x)`` as the SQL front end
    writes it), else ``expr``. Summed as the DECIMAL, the partial sum is exact, as DuckDB's own ``avg`` of a DECIMAL
    sums it, and it is the partial a ``sum(x)`` beside it computes already: TPC-H Q1's three averages were six more
    partial aggregates over DOUBLE casts of columns it also sums (its leaf tasks at SF 10 ran 1.8 s where their share
    of DuckDB's one core is 1.4). A count of the DECIMAL counts what a count of its cast does (a DECIMAL's cast to
    DOUBLE is null only where it is). Integers keep their cast: their exact sum may pass 64 bits where a DOUBLE's
    does not fail."""
    node = None if expr is None else expr._node
    if expr is None or not isinstance(node, CallNode) or node.function != "cast" or len(node.args) != 1:
        return expr
    inner = Expr._of(node.args[0])
    try:
        if output_type(expr, schema) != pa.float64() or not pa.types.is_decimal(output_type(inner, schema)):
            return expr
    except PlanError:
        return expr
    return inner
