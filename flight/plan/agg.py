"""Aggregate functions for ``Query.aggregate``: ``agg.sum(col("x") * 2)``, ``agg.count_all()``, ...

Kept in their own namespace so ``sum``, ``min`` and ``max`` do not shadow Python's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flight.errors import PlanError
from flight.plan.expr import Expr, col

__all__ = [
    "DUCKDB_ONLY",
    "FUNCTIONS",
    "MERGEABLE",
    "NUMERIC",
    "Agg",
    "OrderKey",
    "array_agg",
    "call_text",
    "count",
    "count_all",
    "count_distinct",
    "max",
    "mean",
    "median",
    "min",
    "quantile_cont",
    "quantile_disc",
    "stddev_pop",
    "stddev_samp",
    "string_agg",
    "sum",
    "var_pop",
    "var_samp",
]

FUNCTIONS = (
    "count", "count_all", "count_distinct", "sum", "min", "max", "mean", "var_samp", "var_pop", "stddev_samp", "stddev_pop",
    "median", "quantile_cont", "quantile_disc", "string_agg", "array_agg",
)

DUCKDB_ONLY = frozenset({"median", "quantile_cont", "quantile_disc", "string_agg", "array_agg"})
"""Aggregates only the DuckDB engine computes (Acero has no exact grouped quantile, and no ordered string or
list aggregate): a stage that has one runs on DuckDB, as a window does (``flight.engine.select``). Their rows
move by the keys (not mergeable)."""

ORDERED = frozenset({"string_agg", "array_agg"})
"""Aggregates whose answer depends on the order of their rows: they take an ``order`` (none: any order)."""

QUANTILES = frozenset({"quantile_cont", "quantile_disc"})
"""Aggregates that take a fraction (0 to 1) beside their argument."""

MERGEABLE = frozenset({"count", "count_all", "sum", "min", "max", "mean"})
"""Aggregates with a partial form the planner merges across tasks (``mean`` as a sum and a count). The
others (``count_distinct``, the variances) move their rows by the keys and aggregate once."""

NUMERIC = frozenset({"mean", "var_samp", "var_pop", "stddev_samp", "stddev_pop"})
"""Aggregates of a number computed as float64: the argument is cast to it (a DOUBLE, as in DuckDB)."""

OF_NUMBERS = NUMERIC | {"median", "quantile_cont"}
"""Aggregates that take a number (an integer, a float or a DECIMAL): the interpolating ones keep a DECIMAL's type."""


OrderKey = tuple[Expr, bool, bool]
"""An ordered aggregate's sort key: an expression, descending, nulls first."""


@dataclass(frozen=True, eq=False)
class Agg:
    """One aggregate: a function over an expression (none for ``count_all``)."""

    function: str
    expr: Expr | None = None
    fraction: float | None = None
    """A quantile's fraction, 0 to 1 (``quantile_cont``, ``quantile_disc``); None for every other function."""
    separator: str | None = None
    """``string_agg``'s separator; None for every other function."""
    order: tuple[OrderKey, ...] = ()
    """The order ``string_agg`` and ``array_agg`` read their rows in."""
    where: Expr | None = None
    """``array_agg`` of only the rows where this is true (its FILTER: it keeps nulls, so it cannot skip rows by
    nulling them out as the others do)."""

    def __post_init__(self) -> None:
        if self.function not in FUNCTIONS:
            raise PlanError(f"unknown aggregate {self.function!r}; known: {', '.join(FUNCTIONS)}")
        if (self.expr is None) != (self.function == "count_all"):
            raise PlanError(f"aggregate {self.function!r} {'takes no' if self.function == 'count_all' else 'needs an'} argument")
        if (self.fraction is None) == (self.function in QUANTILES):
            raise PlanError(f"aggregate {self.function!r} {'needs a' if self.function in QUANTILES else 'takes no'} fraction")
        if self.fraction is not None and not 0.0 <= self.fraction <= 1.0:
            raise PlanError(f"aggregate {self.function!r}: the fraction {self.fraction!r} is not between 0 and 1")
        if (self.separator is None) == (self.function == "string_agg"):
            raise PlanError(f"aggregate {self.function!r} {'needs a' if self.function == 'string_agg' else 'takes no'} separator")
        if (self.order or self.where is not None) and self.function not in ORDERED:
            raise PlanError(f"aggregate {self.function!r} takes no order and no filter (string_agg and array_agg do)")

    def __repr__(self) -> str:
        return call_text(self)


def call_text(c: Agg | Any) -> str:
    """An aggregate call as text (an ``Agg``, or a plan's ``AggCall``, which has the same fields)."""
    more = "" if c.fraction is None else f", {c.fraction!r}"
    more += "" if c.separator is None else f", {c.separator!r}"
    if c.order:
        more += " ORDER BY " + ", ".join(f"{e!r}{' DESC' if d else ''}{' NULLS FIRST' if n else ''}" for e, d, n in c.order)
    more += "" if c.where is None else f" FILTER ({c.where!r})"
    return f"{c.function}({'' if c.expr is None else repr(c.expr)}{more})"


def _arg(value: Expr | str) -> Expr:
    if isinstance(value, str):
        return col(value)
    if isinstance(value, Expr):
        return value
    raise PlanError(f"an aggregate's argument is a column name or an expression, not {value!r}")


def count(value: Expr | str) -> Agg:
    """Non-null values."""
    return Agg("count", _arg(value))


def count_all() -> Agg:
    """Rows, like SQL's ``count(*)``."""
    return Agg("count_all")


def count_distinct(value: Expr | str) -> Agg:
    """Distinct non-null values."""
    return Agg("count_distinct", _arg(value))


def sum(value: Expr | str) -> Agg:
    return Agg("sum", _arg(value))


def min(value: Expr | str) -> Agg:
    return Agg("min", _arg(value))


def max(value: Expr | str) -> Agg:
    return Agg("max", _arg(value))


def mean(value: Expr | str) -> Agg:
    """The average as float64 (of non-null values)."""
    return Agg("mean", _arg(value))


def var_samp(value: Expr | str) -> Agg:
    """The sample variance (n - 1 in the denominator) as float64; null for fewer than two values."""
    return Agg("var_samp", _arg(value))


def var_pop(value: Expr | str) -> Agg:
    """The population variance (n in the denominator) as float64."""
    return Agg("var_pop", _arg(value))


def stddev_samp(value: Expr | str) -> Agg:
    """The sample standard deviation as float64; null for fewer than two values."""
    return Agg("stddev_samp", _arg(value))


def stddev_pop(value: Expr | str) -> Agg:
    """The population standard deviation as float64."""
    return Agg("stddev_pop", _arg(value))


def median(value: Expr | str) -> Agg:
    """The middle value, or the mean of the two middle ones (a DOUBLE of integers, a DECIMAL's own type).

    Computed by the DuckDB engine only (``DUCKDB_ONLY``)."""
    return Agg("median", _arg(value))


def quantile_cont(value: Expr | str, fraction: float) -> Agg:
    """The value at ``fraction`` of the sorted values, interpolated between neighbours (DuckDB's
    ``quantile_cont``, SQL's ``percentile_cont``). DuckDB engine only."""
    return Agg("quantile_cont", _arg(value), float(fraction))


def quantile_disc(value: Expr | str, fraction: float) -> Agg:
    """The first sorted value at or past ``fraction`` of them: a value of the column (DuckDB's ``quantile_disc``).
    DuckDB engine only."""
    return Agg("quantile_disc", _arg(value), float(fraction))


def _order(order_by: object) -> tuple[OrderKey, ...]:
    """Sort keys from names or expressions (ascending, nulls last) or (expression, descending, nulls first) triples."""
    items = [order_by] if isinstance(order_by, (str, Expr)) else list(order_by)  # type: ignore[call-overload]
    out: list[OrderKey] = []
    for item in items:
        if isinstance(item, tuple) and len(item) == 3:
            out.append((_arg(item[0]), bool(item[1]), bool(item[2])))
        elif isinstance(item, (str, Expr)):
            out.append((_arg(item), False, False))
        else:
            raise PlanError(f"an order key is a column name, an expression or (expression, descending, nulls first), not {item!r}")
    return tuple(out)


def string_agg(value: Expr | str, separator: str = ",", order_by: object = (), where: Expr | None = None) -> Agg:
    """The values (text; nulls skipped) joined by ``separator``, in ``order_by``'s order (none: any order).

    ``order_by``: names or expressions (ascending, nulls last), or (expression, descending, nulls first) triples.
    DuckDB engine only."""
    return Agg("string_agg", _arg(value), separator=str(separator), order=_order(order_by), where=where)


def array_agg(value: Expr | str, order_by: object = (), where: Expr | None = None) -> Agg:
    """The values as a list (nulls kept), in ``order_by``'s order; only the rows where ``where`` is true.
    DuckDB engine only."""
    return Agg("array_agg", _arg(value), order=_order(order_by), where=where)
