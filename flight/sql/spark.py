"""Spark SQL's spellings (``dialect="spark"``): sqlglot reads the Spark text and writes the
PostgreSQL spelling that DataFusion's parser takes, with the date-part functions DataFusion
lacks written as ``EXTRACT``.

Why sqlglot: it already knows Spark's grammar and functions (backtick identifiers, ``date_add``,
``datediff``, ``nvl``, ``nvl2``, ``if``, ``rlike``, ``lcase``, ``instr``, ...) and how each is spelled
elsewhere; a rewrite by hand would be a second, worse parser. It is part of the ``sql`` extra and
imported only for this dialect. Spark's semantics are the translation's (``flight.sql.arithmetic``,
``flight.sql.spark_types``; docs/sql.md lists what is Spark's and what is not yet).
"""

from __future__ import annotations

from typing import Any

from flight.errors import PlanError

__all__ = ["FUNCTIONS", "to_postgres"]

FUNCTIONS = (
    "abs", "avg", "cast", "ceil", "char_length", "coalesce", "concat", "count", "current_date", "date_add",
    "date_sub", "datediff", "dayofmonth", "dayofweek", "extract", "floor", "hour", "if", "ifnull", "lcase", "left",
    "length", "lower", "max", "min", "minute", "month", "nullif", "nvl", "nvl2", "pow", "quarter", "rlike", "round",
    "second", "sqrt", "startswith", "substr", "substring", "sum", "to_date", "to_timestamp", "trim", "ucase",
    "upper", "year",
)
"""The Spark SQL functions ``dialect="spark"`` takes (tests/sql/test_sql_spark.py runs each against DuckDB)."""

_PARTS: dict[str, str] = {"DayOfMonth": "DAY", "Quarter": "QUARTER", "Hour": "HOUR", "Minute": "MINUTE", "Second": "SECOND"}


_TYPED_BY_OPERANDS = ("Add", "Sub", "Mul", "Div", "Mod", "If", "Case", "Coalesce", "Nvl2", "Greatest", "Least")


def _int_operand(node: Any) -> bool:
    """Whether ``node`` is an integer literal within an INT whose type sets its expression's (an operand of
    arithmetic, a result of a CASE or IF, an argument of COALESCE): Spark types it INT, so ``INT * 50`` is an INT
    and ``DECIMAL(7, 2) + 0`` a DECIMAL(11, 2) (TPC-DS q40, q54, q77, q78, q80)."""
    if node.is_string or not node.is_int or not -(2**31) <= int(node.this) < 2**31:
        return False
    parent = node.parent
    if type(parent).__name__ in ("If", "Case") and node.arg_key == "this":  # a condition or a CASE's operand
        return False
    if type(parent).__name__ not in _TYPED_BY_OPERANDS:
        return False
    up = parent
    while up is not None:  # a count of days or months: DataFusion multiplies an INTERVAL by a BIGINT only
        if type(up).__name__ in ("TsOrDsAdd", "DateAdd", "DateSub", "AddMonths", "Interval"):
            return False
        up = up.parent
    return True


def to_postgres(text: str) -> str:
    """``text`` (one Spark SQL statement) as PostgreSQL text for DataFusion's parser."""
    try:
        import sqlglot
        from sqlglot import exp
    except ImportError:
        raise PlanError("dialect='spark' needs sqlglot: pip install 'flight-exec[sql]'") from None
    try:
        tree = sqlglot.parse_one(text, read="spark")
    except sqlglot.errors.SqlglotError as exc:  # a ParseError, or a TokenError (an unclosed quote)
        raise PlanError(f"SQL syntax error (Spark dialect): {str(exc).splitlines()[0]}") from None

    def rewrite(node: Any) -> Any:
        part = _PARTS.get(type(node).__name__)
        if part is not None:
            return exp.Extract(this=exp.Var(this=part), expression=node.this)
        if isinstance(node, exp.DateDiff) and node.args.get("unit") is None:  # days: end - start, as dates
            end, start = (exp.Cast(this=x, to=exp.DataType.build("date")) for x in (node.this, node.expression))
            return exp.Sub(this=end, expression=start)
        if isinstance(node, exp.Quantile):  # Spark's percentile(x, q) interpolates (sqlglot writes QUANTILE, DuckDB's discrete one)
            return exp.Anonymous(this="percentile_cont", expressions=[node.this, node.args["quantile"]])
        if isinstance(node, exp.AddMonths):  # Spark's add_months takes a timestamp's date too
            node.set("this", exp.Cast(this=node.this, to=exp.DataType.build("date")))
            return node
        if isinstance(node, exp.RegexpExtract) and node.args.get("group") is None:  # Spark's default group is 1
            node.set("group", exp.Literal.number(1))
            return node
        if isinstance(node, exp.Literal) and _int_operand(node):  # Spark's INT, where DataFusion would type a BIGINT
            return exp.Cast(this=node.copy(), to=exp.DataType.build("int"))
        if isinstance(node, exp.Div):  # plain '/': its type (a DECIMAL of decimals) and its zero divisor are the translation's
            node.set("typed", True)  # set on the node itself: a new node's own divisions would not be visited
            node.set("safe", False)
            return node
        if isinstance(node, exp.Extract) and node.this.name.upper() in ("DOW", "DAYOFWEEK"):  # Spark's Sunday is 1
            return exp.Add(this=exp.Extract(this=exp.Var(this="DOW"), expression=node.expression), expression=exp.Literal.number(1))
        if isinstance(node, exp.DayOfWeek):  # Spark's Sunday is 1, EXTRACT's DOW 0
            return exp.Add(this=exp.Extract(this=exp.Var(this="DOW"), expression=node.this), expression=exp.Literal.number(1))
        return node

    return str(tree.transform(rewrite).sql(dialect="postgres"))
