"""DataFusion's window expressions (``WindowAggr``) as ``WindowNode``s, one per expression.

Partition keys, order keys and arguments that are expressions become hidden columns first
(dropped after); an order key with NULLS FIRST is preceded by its null flag, as in ORDER BY.
A frame is SQL's default, or ROWS between offsets; a RANGE frame with offsets is refused.
"""

from __future__ import annotations

import re
from typing import Any

import pyarrow as pa

from flight.plan.expr import Expr, col, if_else, lit
from flight.plan.query import Query
from flight.plan.window import WindowCall, WindowNode
from flight.sql import spark_types
from flight.sql.arithmetic import quotient
from flight.sql.errors import unsupported
from flight.sql.exprs import DFExpr, ExprTranslator
from flight.sql.rel import DFPlan, Rel, Relations, fields_of, handles

__all__ = ["window"]

_FUNCTIONS = {
    "row_number": "row_number", "rank": "rank", "dense_rank": "dense_rank", "lag": "lag", "lead": "lead",
    "first_value": "first_value", "last_value": "last_value", "sum": "sum", "min": "min", "max": "max",
    "avg": "mean", "mean": "mean", "count": "count",
}


@handles("WindowExpr")
def window(tr: Relations, v: Any, plan: DFPlan) -> Rel:
    rel = tr.relation(plan.inputs()[0])
    t = ExprTranslator(rel.columns(), rel.query.schema, tr.dialect)
    query = rel.query
    outputs: list[str] = []
    for e in v.get_window_expr():
        hidden: dict[str, Expr] = {}

        def column(expr: Expr, hidden: dict[str, Expr] = hidden) -> str:
            name = expr.column_name()
            if name is None:
                name = tr.fresh("w")
                hidden[name] = expr
            return name

        name = str(v.window_func_name(e)).lower()
        function = _FUNCTIONS.get(name)
        if function is None:
            raise unsupported(f"the window function {name}()")
        args = list(v.get_args(e))
        offset = 0
        if function in ("lag", "lead"):
            if len(args) > 2:
                raise unsupported(f"{name}() with a default value")
            offset = _count(args[1], f"{name}'s offset") if len(args) > 1 else 1
            args = args[:1]
        if function == "count" and (not args or _literal(args[0])):
            function, args = "count_all", []
        argument = column(t(args[0])) if args else ""
        partition = [column(t(p)) for p in v.get_partition_exprs(e)]
        order: list[tuple[str, bool]] = []
        for s in v.get_sort_exprs(e):
            key = t(s.expr())
            if bool(s.nulls_first()):
                order.append((column(key.is_null()), True))
            order.append((column(key), not s.ascending()))
        out = tr.fresh("win")
        frame, ranged = _frame(v.get_frame(e), bool(order), e.canonical_name())
        if ranged and len(order) != 1:
            raise unsupported("a RANGE frame with offsets over an order of NULLS FIRST or of several keys")
        base = query.with_columns(**hidden) if hidden else query
        decimal = function == "mean" and tr.dialect == "spark" and pa.types.is_decimal(base.schema.field(argument).type)
        if decimal:  # Spark's average of a DECIMAL is one: the window's sum and count, divided as Spark divides
            parts = (tr.fresh("wsum"), tr.fresh("wcount"))
            calls = [WindowCall("sum", argument, parts[0], 0, frame, ranged), WindowCall("count", argument, parts[1], 0, frame, ranged)]
        else:
            calls = [WindowCall(function, argument, out, offset, frame, ranged)]
        query = Query(WindowNode(base.node, partition, order, calls))
        if decimal:
            query = query.with_columns(**{out: _spark_average(col(parts[0]), col(parts[1]), base.schema.field(argument).type)})
            hidden.update(dict.fromkeys(parts, col(parts[0])))
        elif tr.dialect == "spark" and (spark_type := _spark_window_type(function, base.schema, argument)) is not None:
            query = query.with_columns(**{out: col(out).cast(spark_type)})
        if hidden:
            query = query.select(*[n for n in query.schema.names if n not in hidden])
        outputs.append(out)
        t = ExprTranslator({**rel.columns()}, query.schema, tr.dialect)
    return Rel(query, fields_of(plan))


def _literal(e: DFExpr) -> bool:
    while e.variant_name() == "Alias":
        e = e.to_variant().expr()
    return bool(e.variant_name() == "Literal")


def _count(e: DFExpr, what: str) -> int:
    while e.variant_name() in ("Alias", "Cast"):
        e = e.to_variant().expr()
    value = e.python_value().as_py() if e.variant_name() == "Literal" else None
    if not isinstance(value, int) or value < 0:
        raise unsupported(f"{what} that is not a constant count")
    return value


def _frame(frame: Any, ordered: bool, text: str) -> tuple[tuple[int | None, int | None] | None, bool]:
    """The frame as offsets (ROWS, or RANGE: distances in the order key's values) and whether it is RANGE; None
    for SQL's default (what DataFusion writes out for it). ``text``: the call as DataFusion prints it, whose
    bounds are read where its Python API cannot give a typed offset (``get_offset`` fails for an INT key's)."""
    if frame is None:
        return None, False
    units = str(frame.get_frame_units()).upper()
    found = re.findall(r"(?:ROWS|RANGE|GROUPS) BETWEEN (CURRENT ROW|\S+ \S+) AND (CURRENT ROW|\S+ \S+)", text)
    printed = found[-1] if found else None

    def offset(bound: Any, which: int) -> int | None:
        if bound.is_unbounded():
            return None
        if bound.is_current_row():
            return 0
        try:
            n = int(bound.get_offset())
        except Exception:  # noqa: BLE001 - DataFusion's "Unexpected window frame bound": read the printed bound
            value = printed[which - 1].rsplit(" ", 1)[0] if printed else ""
            if not re.fullmatch(r"\d+(\.0*)?", value):
                raise unsupported(f"a {units} frame bound of {value or 'this kind'} (a whole number is taken)") from None
            n = int(value.split(".")[0])
        return -n if bound.is_preceding() else n

    start, end = offset(frame.get_lower_bound(), 1), offset(frame.get_upper_bound(), 2)
    if units == "RANGE":
        if start is None and end == 0:
            return None, False  # the default with an order: up to the current row's last peer
        if start is None and end is None:
            return (None, None), False
        return (start, end), True
    if units != "ROWS":
        raise unsupported(f"a {units} frame")
    if not ordered and start is None and end is None:
        return None, False
    return (start, end), False


def _spark_average(total: Expr, count: Expr, d: pa.Decimal128Type) -> Expr:
    """Spark's AVG of DECIMAL(p, s): DECIMAL(p + 4, s + 4), the sum over the count rounded HALF_UP; null over no value."""
    n = if_else(count == lit(0, pa.int64()), lit(None, pa.int64()), count)
    total_type = spark_types.sum_type(d)
    count_type = pa.decimal128(10, 0)  # reached through DECIMAL(19, 0): Arrow refuses an int64 cast to fewer digits
    return quotient(total.cast(total_type), n.cast(pa.decimal128(19, 0)).cast(count_type), total_type, count_type, spark_types.avg_type(d))


def _spark_window_type(function: str, schema: pa.Schema, argument: str) -> pa.DataType | None:
    """Spark's type of a window function's result where it is not the IR's: an INT rank, a DECIMAL(p + 10, s) sum."""
    if function in ("row_number", "rank", "dense_rank"):
        return pa.int32()
    if function == "sum" and argument and pa.types.is_decimal(t := schema.field(argument).type):
        return spark_types.sum_type(pa.decimal128(t.precision, t.scale))
    return None
