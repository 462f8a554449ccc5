"""How many rows a filter keeps, from the column ranges a source knows (Parquet footers' min and max).

Why: the textbook default of 1/3 per comparison (``cost.selectivity``) says a one-month range of
seven years of dates keeps 1/9 of the rows; it keeps 1/84. Join sides and broadcasts are picked
from these estimates (TPC-H Q14's filtered lineitem is smaller than part, not three times larger).

The bounds a conjunction puts on each column (``col < lit``, ``lit >= col``, ...) are intersected,
and the kept fraction of each column is the overlap of that interval with the column's range,
as if values were spread evenly between min and max. Terms it cannot read keep their textbook
selectivity. Only numbers, decimals, dates and timestamps are compared (strings are not: their
order says little about how many values lie between two of them).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pyarrow as pa

from flight.compute.expressions import literal_value
from flight.plan.expr import Expr
from flight.plan.expr_nodes import CallNode, FieldNode, LiteralNode
from flight.plan.nodes import FeedScanNode, FilterNode
from flight.planner.cost import selectivity
from flight.planner.optimize import conjuncts
from flight.sources.statistics import as_number

__all__ = ["MIN_FRACTION", "column_bounds", "filter_selectivity", "range_selectivity"]

MIN_FRACTION = 0.001
"""The least a range is estimated to keep (an estimate of no rows would size nothing)."""

ColumnRange = Callable[[str], "tuple[float, float] | None"]

_FLIPPED = {"less": "greater", "less_equal": "greater_equal", "greater": "less", "greater_equal": "less_equal"}


def _comparison(term: Expr, schema: pa.Schema | None = None) -> tuple[str, str, float] | None:
    """``(column, function, value)`` for ``column <op> literal`` (either order), else None; with ``schema``, only
    where the literal is of the column's kind (a date compared with a timestamp is on another number line)."""
    node = term._node
    if not isinstance(node, CallNode) or node.function not in _FLIPPED or node.options is not None or len(node.args) != 2:
        return None
    a, b = node.args
    function = node.function
    if isinstance(a, LiteralNode) and isinstance(b, FieldNode):
        a, b, function = b, a, _FLIPPED[function]
    if not (isinstance(a, FieldNode) and isinstance(b, LiteralNode)):
        return None
    try:
        scalar = literal_value(b.literal, "literal")
        value = as_number(scalar.as_py())
    except Exception:  # noqa: BLE001 - a literal the estimate cannot read: the default applies
        return None
    if schema is not None and not _same_line(schema.field(a.name).type if a.name in schema.names else None, scalar.type):
        return None
    return None if value is None else (a.name, function, value)


def _same_line(column: pa.DataType | None, literal: pa.DataType) -> bool:
    """Whether values of the two types are on one number line of ``as_number``: numbers with numbers, dates with dates."""
    def number(t: pa.DataType) -> bool:
        return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)
    return column is not None and ((number(column) and number(literal)) or (pa.types.is_date(column) and pa.types.is_date(literal)))


def range_selectivity(predicate: Expr, column_range: ColumnRange) -> float:
    """The fraction of rows ``predicate`` keeps, using ``column_range(name) -> (min, max) | None``."""
    bounds: dict[str, list[float]] = {}
    fraction = 1.0
    for term in conjuncts(predicate):
        parsed = _comparison(term)
        known = None if parsed is None else column_range(parsed[0])
        if parsed is None or known is None:
            fraction *= selectivity(term.to_proto())
            continue
        column, function, value = parsed
        lo, hi = bounds.setdefault(column, [known[0], known[1]])
        if function in ("greater", "greater_equal"):
            bounds[column][0] = max(lo, value)
        else:
            bounds[column][1] = min(hi, value)
    for column, (lo, hi) in bounds.items():
        low, high = column_range(column) or (lo, hi)
        width = high - low
        kept = (1.0 if hi >= lo else 0.0) if width <= 0 else max(0.0, hi - lo) / width
        fraction *= max(MIN_FRACTION, min(1.0, kept))
    return fraction


def column_bounds(predicate: Expr, schema: pa.Schema) -> dict[str, tuple[float, float]]:
    """The closed interval each column of ``schema`` must lie in for a row to pass ``predicate``, from its
    ``column <op> literal`` conjuncts with a literal of the column's kind (``between`` is two of them); a column no
    such term bounds is not listed. A null fails them all."""
    bounds: dict[str, tuple[float, float]] = {}
    for term in conjuncts(predicate):
        parsed = _comparison(term, schema)
        if parsed is None:
            continue
        column, function, value = parsed
        lo, hi = bounds.get(column, (-math.inf, math.inf))
        bounds[column] = (max(lo, value), hi) if function in ("greater", "greater_equal") else (lo, min(hi, value))
    return bounds


def filter_selectivity(node: FilterNode) -> float:
    """The fraction of rows ``node`` keeps: from its source's column ranges when it filters a scan
    whose provider knows them (``column_range``, Parquet footers), else by the textbook defaults."""
    if isinstance(node.input, FeedScanNode):
        column_range = getattr(node.input.feed.inner(), "column_range", None)
        if column_range is not None:
            return range_selectivity(node.predicate, column_range)
    return selectivity(node.predicate.to_proto())
