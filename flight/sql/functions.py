"""SQL's scalar functions and types in the IR: DataFusion's names for them, and Arrow's.

``FUNCTIONS`` maps the function names DataFusion's plans use to what builds the IR for them;
a name not there is refused by name. ``arrow_type`` reads a type as DataFusion prints it (its
Python API gives a CAST's target type no other way).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from flight.plan.expr import Expr, call, coalesce, if_else, lit
from flight.sql import dates, nested, strings
from flight.sql.arithmetic import modulo
from flight.sql.errors import unsupported
from flight.sql.rel import Scalars, constant

__all__ = ["FUNCTIONS", "arrow_type", "cast_target"]

DFExpr = Any

_SIMPLE_TYPES: dict[str, pa.DataType] = {
    "Boolean": pa.bool_(), "Int8": pa.int8(), "Int16": pa.int16(), "Int32": pa.int32(), "Int64": pa.int64(),
    "UInt8": pa.uint8(), "UInt16": pa.uint16(), "UInt32": pa.uint32(), "UInt64": pa.uint64(),
    "Float16": pa.float16(), "Float32": pa.float32(), "Float64": pa.float64(), "Utf8": pa.string(),
    "LargeUtf8": pa.large_string(), "Utf8View": pa.string(), "Binary": pa.binary(), "LargeBinary": pa.large_binary(),
    "BinaryView": pa.binary(), "Date32": pa.date32(), "Date64": pa.date64(), "Null": pa.null(),
}


def arrow_type(text: str) -> pa.DataType:
    """The Arrow type DataFusion prints as ``text`` (``Decimal128(15, 2)``, ``Timestamp(ns)``, ...)."""
    text = text.strip()
    simple = _SIMPLE_TYPES.get(text)
    if simple is not None:
        return simple
    m = re.fullmatch(r"Decimal(?:128|256)\((\d+),\s*(-?\d+)\)", text)
    if m:
        return pa.decimal128(int(m.group(1)), int(m.group(2)))
    m = re.fullmatch(r"Timestamp\((\w+)(?:,\s*(?:Some\()?\"?([^\")]*)\"?\)?)?\)", text)
    if m:
        unit = {"Second": "s", "Millisecond": "ms", "Microsecond": "us", "Nanosecond": "ns"}.get(m.group(1), m.group(1))
        tz = m.group(2) if m.group(2) not in (None, "None", "") else None
        if unit not in ("s", "ms", "us", "ns"):
            raise unsupported(f"the type {text}")
        return pa.timestamp(unit, tz)  # type: ignore[call-overload]
    raise unsupported(f"the type {text}")


def cast_target(e: DFExpr) -> str:
    """The target type of a CAST as DataFusion prints it (its Python API gives no other way)."""
    match = re.search(r" AS ([^()]+(?:\([^()]*\))?)\)\)?$", str(e))
    if match is None:
        text = e.canonical_name() if hasattr(e, "canonical_name") else str(e)
        raise unsupported(f"a CAST whose target type cannot be read ({text[:120]})")
    return match.group(1)


def _substr(t: Scalars, args: list[DFExpr], e: DFExpr) -> Expr:
    start = int(constant(args, 1, "a SUBSTRING start"))
    length = int(constant(args, 2, "a SUBSTRING length")) if len(args) > 2 else None
    begin = max(start, 1) - 1
    stop = None if length is None else max(start + length - 1, 0)
    return t(args[0]).substr(begin, stop if stop is None or stop > begin else begin)


def _date_part(t: Scalars, args: list[DFExpr], e: DFExpr) -> Expr:
    part = str(constant(args, 0, "a date part")).lower()
    functions = {
        "year": "year", "month": "month", "day": "day", "quarter": "quarter", "hour": "hour",
        "minute": "minute", "second": "second", "doy": "day_of_year", "isoyear": "iso_year",
    }
    if part == "dow":  # SQL's Sunday = 0; Arrow's Monday = 0
        weekday = call("day_of_week", t(args[1]))
        return call("add_checked", weekday, lit(1)) - (call("add_checked", weekday, lit(1)) >= lit(7)).cast(pa.int64()) * 7
    if part not in functions:
        raise unsupported(f"EXTRACT({part.upper()} ...)")
    return call(functions[part], t(args[1]))


def _nullif(t: Scalars, args: list[DFExpr], e: DFExpr) -> Expr:
    a, b = t(args[0]), t(args[1])
    return if_else(coalesce(a == b, lit(False)), lit(None, t.type_of(a)), a)


def _concat(t: Scalars, args: list[DFExpr], e: DFExpr) -> Expr:
    parts = [coalesce(t.as_text(t(a)), lit("")) for a in args]
    return call("binary_join_element_wise", *parts, lit(""))


def _round(t: Scalars, args: list[DFExpr], e: DFExpr) -> Expr:
    digits = int(constant(args, 1, "ROUND's digits")) if len(args) > 1 else 0
    x = t(args[0])
    rounded = x.round(digits, "half_towards_infinity")  # SQL's (DuckDB's and Spark's) rounding
    d = t.type_of(x)
    if t.dialect == "spark" and pa.types.is_decimal(d) and 0 <= digits < d.scale:  # Spark: DECIMAL(p - s + 1 + d, d)
        return rounded.cast(pa.decimal128(min(38, d.precision - d.scale + 1 + digits), digits))
    return rounded


def _unary(function: str) -> Callable[[Scalars, list[DFExpr], DFExpr], Expr]:
    def make(t: Scalars, args: list[DFExpr], e: DFExpr) -> Expr:
        if len(args) != 1:
            raise unsupported(f"{function} with {len(args)} arguments")
        return call(function, t(args[0]))

    return make


def _left(t: Scalars, args: list[DFExpr], e: DFExpr) -> Expr:
    n = int(constant(args, 1, "LEFT's length"))
    return t(args[0]).substr(0, max(n, 0))


def _coalesce(t: Scalars, args: list[DFExpr], e: DFExpr) -> Expr:
    return coalesce(*t.common([t(a) for a in args]))


def _starts_with(t: Scalars, args: list[DFExpr], e: DFExpr) -> Expr:
    return t(args[0]).startswith(str(constant(args, 1, "STARTS_WITH's prefix")))


def _ends_with(t: Scalars, args: list[DFExpr], e: DFExpr) -> Expr:
    return t(args[0]).endswith(str(constant(args, 1, "ENDS_WITH's suffix")))


def _power(t: Scalars, args: list[DFExpr], e: DFExpr) -> Expr:
    return call("power", t.as_double(t(args[0])), t.as_double(t(args[1])))


def _extreme(function: str) -> Callable[[Scalars, list[DFExpr], DFExpr], Expr]:
    """greatest / least: the arguments in one type, nulls skipped (null only when all are)."""
    return lambda t, args, e: call(function, *t.common([t(a) for a in args]))


def _double(function: str) -> Callable[[Scalars, list[DFExpr], DFExpr], Expr]:
    """A function of one number computed as a DOUBLE (ln, exp, ...)."""
    def make(t: Scalars, args: list[DFExpr], e: DFExpr) -> Expr:
        if len(args) != 1:
            raise unsupported(f"{function} with {len(args)} arguments")
        return _logarithm(t, function, t.as_double(t(args[0])))

    return make


def _logarithm(t: Scalars, function: str, x: Expr, *more: Expr) -> Expr:
    """A logarithm of ``x`` (others pass through): Spark's is null for x <= 0, DuckDB's -inf or NaN (as pyarrow's)."""
    value = call(function, x, *more)
    if t.dialect != "spark" or function not in ("ln", "log10", "log2", "logb"):
        return value
    return if_else(x > lit(0.0), value, lit(None, pa.float64()))


def _log(t: Scalars, args: list[DFExpr], e: DFExpr) -> Expr:
    """log(x) is the base-10 logarithm; log(b, x) the base-b one (DuckDB's and DataFusion's order)."""
    if len(args) == 1:
        return _logarithm(t, "log10", t.as_double(t(args[0])))
    return _logarithm(t, "logb", t.as_double(t(args[1])), t.as_double(t(args[0])))


def _sign(t: Scalars, args: list[DFExpr], e: DFExpr) -> Expr:
    """-1, 0 or 1 as a TINYINT (DuckDB's type), whatever the number's type."""
    x = t.as_double(t(args[0]))
    return if_else(call("is_nan", x), lit(0.0), call("sign", x)).cast(pa.int8())  # NaN's sign is 0 in DuckDB


def _repeat(t: Scalars, args: list[DFExpr], e: DFExpr) -> Expr:
    """The text repeated n times; n below zero repeats it none (DuckDB's ''), where pyarrow would fail."""
    count = t(args[1]).cast(pa.int64())
    n = if_else(count < lit(0, pa.int64()), lit(0, pa.int64()), count)
    return call("binary_repeat", t.as_text(t(args[0])), n)


def _right(t: Scalars, args: list[DFExpr], e: DFExpr) -> Expr:
    """The last n characters (DuckDB: all but the first -n when n is negative)."""
    n = int(constant(args, 1, "RIGHT's length"))
    if n == 0 or (n < 0 and t.dialect == "spark"):  # Spark: nothing for n <= 0
        return t(args[0]).substr(0, 0)
    return t(args[0]).substr(-n)


def _contains(t: Scalars, args: list[DFExpr], e: DFExpr) -> Expr:
    return call("match_substring", t(args[0]), pattern=str(constant(args, 1, "CONTAINS's text")))


def _pad(function: str) -> Callable[[Scalars, list[DFExpr], DFExpr], Expr]:
    """lpad / rpad: to exactly n characters, a longer text cut to its first n (SQL's, DuckDB's and Spark's)."""
    def make(t: Scalars, args: list[DFExpr], e: DFExpr) -> Expr:
        n = int(constant(args, 1, f"{function.upper()}'s length"))
        fill = str(constant(args, 2, f"{function.upper()}'s padding")) if len(args) > 2 else " "
        if len(fill) != 1:
            raise unsupported(f"{function}() with a padding of {len(fill)} characters (one is taken)")
        text = t.as_text(t(args[0]))
        if n <= 0:
            return text.substr(0, 0)
        return call(f"utf8_{function}", text, width=n, padding=fill).substr(0, n)

    return make


def _trim(side: str) -> Callable[[Scalars, list[DFExpr], DFExpr], Expr]:
    """trim / ltrim / rtrim: whitespace, or the characters given."""
    def make(t: Scalars, args: list[DFExpr], e: DFExpr) -> Expr:
        text = t.as_text(t(args[0]))
        if len(args) == 1:
            return call(f"utf8_{side}trim_whitespace", text)
        return call(f"utf8_{side}trim", text, characters=str(constant(args, 1, "TRIM's characters")))

    return make


def _replace(t: Scalars, args: list[DFExpr], e: DFExpr) -> Expr:
    return call("replace_substring", t.as_text(t(args[0])), pattern=str(constant(args, 1, "REPLACE's text")),
                replacement=str(constant(args, 2, "REPLACE's replacement")))


def _regexp_replace(t: Scalars, args: list[DFExpr], e: DFExpr) -> Expr:
    """The first match replaced, or every one with the flag 'g'; 'i' ignores case (RE2 in both engines)."""
    flags = str(constant(args, 3, "REGEXP_REPLACE's flags")) if len(args) > 3 else ""
    if set(flags) - {"g", "i"}:
        raise unsupported(f"regexp_replace() with the flags {flags!r} (g and i are taken)")
    pattern = str(constant(args, 1, "REGEXP_REPLACE's pattern"))
    options: dict[str, object] = {"pattern": f"(?i){pattern}" if "i" in flags else pattern,
                                  "replacement": str(constant(args, 2, "REGEXP_REPLACE's replacement"))}
    if "g" not in flags:
        options["max_replacements"] = 1
    return call("replace_substring_regex", t.as_text(t(args[0])), **options)


def _concat_ws(t: Scalars, args: list[DFExpr], e: DFExpr) -> Expr:
    """The parts joined by the separator, null parts left out (null only when the separator is).

    Each part that is not null becomes the separator and the part; their join, less its first separator,
    is the answer. (pyarrow's own ``null_handling="skip"`` drops the rows whose parts are all null: 26.0.1.)"""
    sep = constant(args, 0, "CONCAT_WS's separator")
    if sep is None:
        return lit(None, pa.string())
    parts = [coalesce(call("binary_join_element_wise", lit(str(sep)), t.as_text(t(a)), lit("")), lit("")) for a in args[1:]]
    return call("binary_join_element_wise", *parts, lit("")).substr(len(str(sep)))


_TRUNC_UNITS = ("year", "quarter", "month", "week", "day", "hour", "minute", "second")


def _date_trunc(t: Scalars, args: list[DFExpr], e: DFExpr) -> Expr:
    """The start of the period holding each value (a week starts on Monday, as in DuckDB and Spark)."""
    unit = str(constant(args, 0, "DATE_TRUNC's unit")).lower()
    if unit not in _TRUNC_UNITS:
        raise unsupported(f"date_trunc('{unit}', ...) (the units taken: {', '.join(_TRUNC_UNITS)})")
    floor = call("floor_temporal", t(args[1]), unit=unit, week_starts_monday=True)
    return floor.cast(pa.timestamp("us")) if t.type_of(floor) == pa.timestamp("ns") else floor  # DuckDB's TIMESTAMP


def _strftime(t: Scalars, args: list[DFExpr], e: DFExpr) -> Expr:
    """A date or timestamp as text, by C's strftime directives (%Y, %m, %d, %H, ...).

    DuckDB's ``strftime`` is declared to DataFusion as taking text (``flight.sql.library``: a declaration
    has one signature), so DataFusion casts a date or timestamp to text first: that cast is left out."""
    value = args[0]
    while value.variant_name() == "Cast" and arrow_type(cast_target(value)) == pa.string():
        value = value.to_variant().expr()
    return call("strftime", t(value), format=str(constant(args, 1, "the format")))


def _strptime(t: Scalars, args: list[DFExpr], e: DFExpr) -> Expr:
    """Text read as a timestamp by C's strptime directives; text that does not match is an error."""
    return call("strptime", t.as_text(t(args[0])), format=str(constant(args, 1, "the format")), unit="us")


def _mod(t: Scalars, args: list[DFExpr], e: DFExpr) -> Expr:
    """DuckDB's ``mod(a, b)``, as ``a % b``; declared to DataFusion over BIGINTs, so a coercion cast of
    anything but an integer is refused here (``%`` takes integers)."""
    parts = []
    for a in args:
        inner = a.to_variant().expr() if a.variant_name() == "Cast" else a
        x = t(inner)
        if not pa.types.is_integer(t.type_of(x)):
            raise unsupported(f"mod() of {t.type_of(x)} (it takes integers)")
        parts.append(x)
    return modulo(t, parts[0], parts[1], "mod()")


FUNCTIONS: dict[str, Callable[[Scalars, list[DFExpr], DFExpr], Expr]] = {
    **strings.FUNCTIONS,
    **dates.FUNCTIONS,
    **nested.FUNCTIONS,
    "mod": _mod,
    "substr": _substr,
    "substring": _substr,
    "date_part": _date_part,
    "datepart": _date_part,
    "nullif": _nullif,
    "concat": _concat,
    "round": _round,
    "coalesce": _coalesce,
    "left": _left,
    "starts_with": _starts_with,
    "ends_with": _ends_with,
    "power": _power,
    "pow": _power,
    "upper": _unary("utf8_upper"),
    "lower": _unary("utf8_lower"),
    "length": _unary("utf8_length"),
    "char_length": _unary("utf8_length"),
    "character_length": _unary("utf8_length"),
    "btrim": _trim(""),
    "trim": _trim(""),
    "abs": _unary("abs_checked"),
    "floor": _unary("floor"),
    "ceil": _unary("ceil"),
    "sqrt": _unary("sqrt"),
    "greatest": _extreme("max_element_wise"),
    "least": _extreme("min_element_wise"),
    "ln": _double("ln"),
    "log10": _double("log10"),
    "log2": _double("log2"),
    "exp": _double("exp"),
    "log": _log,
    "sign": _sign,
    "signum": _sign,
    "trunc": _double("trunc"),
    "reverse": _unary("utf8_reverse"),
    "repeat": _repeat,
    "right": _right,
    "contains": _contains,
    "ltrim": _trim("l"),
    "rtrim": _trim("r"),
    "lpad": _pad("lpad"),
    "rpad": _pad("rpad"),
    "replace": _replace,
    "regexp_replace": _regexp_replace,
    "concat_ws": _concat_ws,
    "date_trunc": _date_trunc,
    "datetrunc": _date_trunc,
    "strftime": _strftime,
    "to_char": _strftime,
    "strptime": _strptime,
    "octet_length": _unary("binary_length"),
}
"""DataFusion's scalar functions (by the name its plans give them) that have an IR form."""
