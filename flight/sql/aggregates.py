"""SQL's aggregate calls in the IR: one registry entry per function DataFusion's plans name.

Each entry builds an ``agg.Agg`` from the call's translated arguments. What a call carries
beside its arguments is applied here, the same way for every function:

- ``FILTER (WHERE c)``: the argument is null where ``c`` is not true (``count(*)`` counts a
  constant there), so the aggregate skips those rows, as SQL says;
- ``ORDER BY``: ignored where the result does not depend on the order (every function here);
  a function whose result does (``string_agg``, ``array_agg``) is refused by name until the IR
  has it;
- ``DISTINCT``: only ``count``; for ``min`` and ``max`` it changes nothing and is dropped.

DataFusion's Python API gives an aggregate call's function, arguments and DISTINCT, not its
FILTER or ORDER BY: those are read from ``Expr.to_bytes`` (DataFusion's own protobuf, its
``AggregateUDFExprNode``: ``filter`` is field 3, ``order_by`` field 4), bytes this process's
own plan produced.
"""

from __future__ import annotations

import decimal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from flight.errors import PlanError
from flight.plan import agg
from flight.plan.expr import Expr, call, col, if_else, lit
from flight.sql import spark_types
from flight.sql.arithmetic import quotient
from flight.sql.errors import unsupported
from flight.sql.grouping import fields, varints
from flight.sql.rel import Scalars, constant

__all__ = ["AGGREGATES", "Derived", "aggregate_call", "aggregated"]

DFExpr = Any

_AGGREGATE_UDF = 19
_FILTER, _ORDER_BY = 3, 4


def _numeric(make: Callable[[Expr], agg.Agg]) -> Callable[[Scalars, Expr], agg.Agg]:
    return lambda t, x: make(t.as_double(x))


AGGREGATES: dict[str, Callable[[Scalars, Expr], agg.Agg]] = {
    "sum": lambda t, x: agg.sum(x),
    "min": lambda t, x: agg.min(x),
    "max": lambda t, x: agg.max(x),
    "avg": lambda t, x: agg.mean(x),
    "mean": lambda t, x: agg.mean(x),
    "count": lambda t, x: agg.count(x),
    "stddev": _numeric(agg.stddev_samp),
    "stddev_samp": _numeric(agg.stddev_samp),
    "stddev_pop": _numeric(agg.stddev_pop),
    "var": _numeric(agg.var_samp),
    "var_samp": _numeric(agg.var_samp),
    "var_pop": _numeric(agg.var_pop),
    "variance": _numeric(agg.var_samp),  # declared to DataFusion by flight.sql.library
}
"""One-argument aggregates by the name DataFusion's plans give them."""

_ORDER_FREE = frozenset(AGGREGATES)
"""Functions whose result does not depend on the order of their rows (an ORDER BY is dropped)."""


@dataclass(frozen=True)
class Derived:
    """An aggregate computed from others: ``parts`` (by a suffix of the output's name), then ``finish``
    over their columns (Spark's DECIMAL average: a sum and a count, divided as Spark divides)."""

    parts: dict[str, agg.Agg]
    finish: Callable[[dict[str, Expr]], Expr]


def aggregate_call(e: DFExpr, t: Scalars) -> agg.Agg | Derived:
    """The IR aggregate of DataFusion's aggregate expression ``e`` over the relation ``t`` reads."""
    while e.variant_name() == "Alias":
        e = e.to_variant().expr()
    if e.variant_name() != "AggregateFunction":
        raise unsupported(f"the aggregate expression {e.canonical_name()}")
    v = e.to_variant()
    name = str(v.aggregate_type()).lower()
    args = list(v.args())
    condition, ordered = _extras(e)
    if ordered and name not in _ORDER_FREE and name not in _QUANTILES and name not in _LISTED:
        raise unsupported(f"{name}() with ORDER BY ({e.canonical_name()})")
    if name in _LISTED:
        if v.is_distinct():
            raise unsupported(f"{name.upper()}(DISTINCT ...)")
        return _listed(t, name, args, e, condition)
    keep = None if condition is None else t(condition)

    def only(x: Expr) -> Expr:
        """``x`` where the FILTER holds, else null: the aggregate skips the row."""
        return x if keep is None else if_else(keep, x, lit(None, t.type_of(x)))

    if name == "count" and not v.is_distinct() and (not args or _non_null_literal(args[0])):
        return agg.count_all() if keep is None else agg.count(only(lit(1)))
    if name in _PAIRED and len(args) == 2 and not v.is_distinct():
        return _paired(name, only(t.as_double(t(args[0]))), only(t.as_double(t(args[1]))))
    if name in _QUANTILES and not v.is_distinct():
        if ordered and " DESC" in e.canonical_name().rsplit(" ORDER BY ", 1)[-1]:
            raise unsupported(f"{name}() WITHIN GROUP (ORDER BY ... DESC)")
        return _quantile(t, name, args, only)
    if len(args) != 1:
        raise unsupported(f"the aggregate {name}() with {len(args)} arguments")
    arg = only(t(args[0]))
    if v.is_distinct() and name not in ("min", "max"):
        if name != "count":
            raise unsupported(f"{name.upper()}(DISTINCT ...)")
        return agg.count_distinct(arg)
    decimal = spark_types.as_decimal(t.type_of(arg)) if t.dialect == "spark" and pa.types.is_decimal(t.type_of(arg)) else None
    if decimal is not None and name in ("sum", "avg", "mean"):
        return _spark_decimal(name, arg, decimal)
    make = AGGREGATES.get(name)
    if make is None:
        raise unsupported(f"the aggregate function {name}()")
    return make(t, arg)


def _spark_decimal(name: str, arg: Expr, d: pa.Decimal128Type) -> Derived:
    """Spark's SUM of DECIMAL(p, s) is DECIMAL(p + 10, s); its AVG, DECIMAL(p + 4, s + 4): the sum divided
    by the count as Spark divides (HALF_UP), null for no rows."""
    total = spark_types.sum_type(d)
    if name == "sum":
        return Derived({"": agg.sum(arg)}, lambda c: c[""].cast(total))
    count_type = pa.decimal128(10, 0)

    def average(c: dict[str, Expr]) -> Expr:
        n = if_else(c["n"] == lit(0, pa.int64()), lit(None, pa.int64()), c["n"])  # no zero divisor: both branches run
        # A BIGINT becomes a DECIMAL(19, 0) first: Arrow refuses a cast of an int64 to fewer digits outright.
        count = n.cast(pa.decimal128(19, 0)).cast(count_type)
        return quotient(c["s"].cast(total), count, total, count_type, spark_types.avg_type(d))

    return Derived({"s": agg.sum(arg), "n": agg.count(arg)}, average)


_LISTED = frozenset({"string_agg", "array_agg"})


def _listed(t: Scalars, name: str, args: list[DFExpr], e: DFExpr, condition: DFExpr | None) -> agg.Agg:
    """string_agg (text joined by a separator, nulls skipped) or array_agg (a list, nulls kept), in the call's
    ORDER BY (DuckDB's: none is any order). A FILTER skips rows; for string_agg as for every aggregate (the value
    nulled out), for array_agg by name (``Agg.where``: a null is one of its values)."""
    order = [(t(x), not asc, nulls_first) for x, asc, nulls_first in _order_keys(e)]
    keep = None if condition is None else t(condition)
    x = t(args[0])
    if name == "array_agg":
        return agg.array_agg(x, order_by=order, where=keep)
    separator = constant(args, 1, "STRING_AGG's separator") if len(args) > 1 else ","
    if separator is None:
        raise unsupported("string_agg() with a NULL separator")
    text = t.as_text(x)
    if keep is not None:
        text = if_else(keep, text, lit(None, pa.string()))
    return agg.string_agg(text, str(separator), order_by=order)


def _order_keys(e: DFExpr) -> list[tuple[DFExpr, bool, bool]]:
    """The aggregate call's ORDER BY keys: (expression, ascending, nulls first), from DataFusion's protobuf of the
    call (``SortExprNode``: the expression is field 1, ``asc`` field 2, ``nulls_first`` field 3)."""
    from datafusion import Expr as DFExprType

    keys = []
    for number, body in fields(e.to_bytes()):
        if number != _AGGREGATE_UDF:
            continue
        for inner, value in fields(body):
            if inner == _ORDER_BY:
                expr = next(b for n, b in fields(value) if n == 1)
                flags = varints(value)
                keys.append((DFExprType.from_bytes(expr), bool(flags.get(2, 0)), bool(flags.get(3, 0))))
    return keys


def _extras(e: DFExpr) -> tuple[DFExpr | None, bool]:
    """The call's FILTER condition (or None) and whether it has an ORDER BY."""
    from datafusion import Expr as DFExprType

    condition, ordered = None, False
    for number, body in fields(e.to_bytes()):
        if number != _AGGREGATE_UDF:
            continue
        for inner, value in fields(body):
            if inner == _FILTER:
                condition = DFExprType.from_bytes(value)
            elif inner == _ORDER_BY:
                ordered = True
    return condition, ordered


def _non_null_literal(e: DFExpr) -> bool:
    while e.variant_name() == "Alias":
        e = e.to_variant().expr()
    return bool(e.variant_name() == "Literal" and e.python_value().is_valid)


def aggregated(query: Any, keys: list[str], made: dict[str, agg.Agg | Derived], aggregate: Callable[[Any, dict[str, agg.Agg]], Any]) -> Any:
    """``aggregate(query, calls)`` of every aggregate ``made`` needs, then, where some are derived, their
    values computed from their parts (the other columns as they are): the output has ``made``'s names."""
    calls: dict[str, agg.Agg] = {}
    for name, m in made.items():
        calls.update({name: m} if isinstance(m, agg.Agg) else {f"{name}__{k}": a for k, a in m.parts.items()})
    out = aggregate(query, calls)
    if all(isinstance(m, agg.Agg) for m in made.values()):
        return out
    items: dict[str, Expr] = {n: col(n) for n in out.schema.names if n not in calls}
    for name, m in made.items():
        items[name] = col(name) if isinstance(m, agg.Agg) else m.finish({k: col(f"{name}__{k}") for k in m.parts})
    return out.select(**items)


_QUANTILES = {"median": "median", "percentile_cont": "quantile_cont", "quantile_disc": "quantile_disc", "quantile": "quantile_disc"}
"""DataFusion's names (and those ``flight.sql.library`` declares) of the IR's quantiles; ``quantile`` is DuckDB's
``quantile_disc``, ``percentile_cont`` DataFusion's (and ``quantile_cont``'s, and ``median``'s in Spark's text)."""


def _quantile(t: Scalars, name: str, args: list[DFExpr], only: Callable[[Expr], Expr]) -> agg.Agg:
    """A median or a quantile: computed by the DuckDB engine (``agg.DUCKDB_ONLY``), its rows moved by the keys.

    A declared function's argument arrives cast to its declared DOUBLE: the cast is left out, so a DECIMAL or
    an integer keeps its type (DuckDB's answer has it). Spark's answer is a DOUBLE."""
    x = only(t(args[0]))
    arg = args[0]
    while arg.variant_name() == "Cast":  # DataFusion's coercion to DOUBLE (a user's own CAST is taken for one too)
        arg = arg.to_variant().expr()
    if arg is not args[0] and (name in ("quantile_disc", "quantile") or pa.types.is_decimal(t.type_of(t(arg)))):
        x = only(t(arg))
    xt = t.type_of(x)
    if _QUANTILES[name] != "quantile_disc" and not (pa.types.is_integer(xt) or pa.types.is_floating(xt) or pa.types.is_decimal(xt)):
        raise unsupported(f"{name}() of a {xt}")
    if t.dialect == "spark":
        x = t.as_double(x)
    if name == "median":
        return agg.median(x)
    if len(args) != 2:
        raise unsupported(f"{name}() with {len(args)} arguments")
    fraction = args[1]
    while fraction.variant_name() == "Cast":
        fraction = fraction.to_variant().expr()
    if fraction.variant_name() != "Literal" or not isinstance(fraction.python_value().as_py(), (int, float, decimal.Decimal)):
        raise unsupported(f"{name}() of a fraction that is not a constant number")
    q = float(fraction.python_value().as_py())
    if not 0.0 <= q <= 1.0:
        raise PlanError(f"SQL: {name}()'s fraction {q} is not between 0 and 1")
    return agg.quantile_cont(x, q) if _QUANTILES[name] == "quantile_cont" else agg.quantile_disc(x, q)


_PAIRED = frozenset({"corr", "covar_pop", "covar_samp"})


def _paired(name: str, x: Expr, y: Expr) -> Derived:
    """corr, covar_pop and covar_samp over the rows where both values are there, from their sums as DOUBLEs:
    a sum of products less the product of sums, over n (or n - 1); corr over both deviations (NaN where one
    is constant, as DuckDB's). Sums lose digits where the values' spread is tiny beside their size."""
    both = x.is_not_null() & y.is_not_null()
    x, y = if_else(both, x, lit(None, pa.float64())), if_else(both, y, lit(None, pa.float64()))
    parts = {"n": agg.count(x), "x": agg.sum(x), "y": agg.sum(y), "xy": agg.sum(x * y)}
    if name == "corr":
        parts.update(xx=agg.sum(x * x), yy=agg.sum(y * y))

    def finish(c: dict[str, Expr]) -> Expr:
        n = c["n"].cast(pa.float64())
        none = lit(None, pa.float64())
        if name == "corr":
            top = call("subtract", call("multiply", n, c["xy"]), call("multiply", c["x"], c["y"]))
            vx = call("subtract", call("multiply", n, c["xx"]), call("multiply", c["x"], c["x"]))
            vy = call("subtract", call("multiply", n, c["yy"]), call("multiply", c["y"], c["y"]))
            value = call("divide", top, call("sqrt", call("multiply", vx, vy)))
            return if_else(c["n"] == lit(0, pa.int64()), none, value)
        co = call("subtract", c["xy"], call("divide", call("multiply", c["x"], c["y"]), n))
        if name == "covar_pop":
            return if_else(c["n"] == lit(0, pa.int64()), none, call("divide", co, n))
        return if_else(c["n"] < lit(2, pa.int64()), none, call("divide", co, call("subtract", n, lit(1.0))))

    return Derived(parts, finish)
