"""SQL's arithmetic in the IR, typed as the dialect types it.

DuckDB's (``dialect="duckdb"``): a decimal sum keeps the larger scale, a product adds the scales
(precision p1 + p2, 18 when both fit in 18), and ``/`` divides as a DOUBLE. Spark's
(``dialect="spark"``, ``flight.sql.spark_types``): every result of decimals (and integers beside a
decimal) is a DECIMAL of Spark's type, ``/`` included, its value rounded HALF_UP to that type's
scale. A result Arrow's 38-digit DECIMAL cannot hold on the way is computed in 76-digit
``decimal256`` and narrowed at the end by a checked cast: an error, never a wrong value.
"""

from __future__ import annotations

import pyarrow as pa

from flight.errors import PlanError
from flight.plan.expr import Expr, call
from flight.sql import spark_types
from flight.sql.errors import unsupported
from flight.sql.rel import Scalars

__all__ = ["add", "divide", "fit", "modulo", "multiply", "quotient"]


def fit(t: Scalars, left: Expr, right: Expr, carry: int) -> tuple[Expr, Expr]:
    """Two decimals narrowed (a checked cast: an error, never a wrong value) where Arrow's
    result would need more than 38 digits: their integer digits plus the larger scale, plus
    ``carry`` (1 for a sum). DuckDB caps such a result at 38 digits and checks at run time."""
    lt, rt = t.type_of(left), t.type_of(right)
    if not (pa.types.is_decimal(lt) and pa.types.is_decimal(rt)):
        return left, right
    scale = max(lt.scale, rt.scale)
    room = 38 - carry - scale  # integer digits the result can hold
    if max(lt.precision - lt.scale, rt.precision - rt.scale) <= room:
        return left, right
    if room < 1:
        raise PlanError(f"SQL: {lt} and {rt} have no common DECIMAL type within 38 digits")
    fitted = [
        e if ty.precision - ty.scale <= room else e.cast(pa.decimal128(room + ty.scale, ty.scale))
        for e, ty in ((left, lt), (right, rt))
    ]
    return fitted[0], fitted[1]


def _spark_decimals(t: Scalars, left: Expr, right: Expr) -> tuple[pa.Decimal128Type, pa.Decimal128Type] | None:
    """Both operands as Spark's decimals, when Spark computes the operation as one (a decimal and a
    decimal or an integer); None otherwise."""
    if t.dialect != "spark":
        return None
    lt, rt = t.type_of(left), t.type_of(right)
    if not (pa.types.is_decimal(lt) or pa.types.is_decimal(rt)):
        return None
    a, b = spark_types.as_decimal(lt), spark_types.as_decimal(rt)
    return None if a is None or b is None else (a, b)


def _wide(e: Expr, d: pa.Decimal128Type, extra_scale: int = 0) -> Expr:
    return e.cast(pa.decimal256(d.precision + extra_scale, d.scale + extra_scale))


def _narrowed(e: Expr, target: pa.Decimal128Type) -> Expr:
    """A decimal value rounded HALF_UP to ``target``'s scale and cast to it (checked)."""
    return e.round(target.scale, "half_towards_infinity").cast(target)


def _within(e: Expr, d: pa.Decimal128Type, precision: int) -> tuple[Expr, pa.Decimal128Type]:
    """``e`` (of type ``d``) in a DECIMAL of at most ``precision`` digits and the same scale: a checked cast, so
    a value that needs more digits is an error. Where a result type would pass 38 digits, its operands are
    narrowed so (their values are rarely as long as their types allow); 38-digit DECIMAL runs on both engines."""
    if precision >= d.precision:
        return e.cast(d), d
    narrow = pa.decimal128(precision, d.scale)
    return e.cast(narrow), narrow


def add(t: Scalars, left: Expr, right: Expr, op: str) -> Expr:
    function = "add_checked" if op == "+" else "subtract_checked"
    spark = _spark_decimals(t, left, right)
    if spark is None:
        return call(function, *fit(t, left, right, 1))
    a, b = spark
    target = spark_types.add_type(a, b)
    scale = max(a.scale, b.scale)
    room = 37 - scale  # integer digits each operand may keep
    if room < 1:
        return _narrowed(call(function, _wide(left, a), _wide(right, b)), target)
    (x, _), (y, _) = _within(left, a, room + a.scale), _within(right, b, room + b.scale)
    return _narrowed(call(function, x, y), target)


def multiply(t: Scalars, left: Expr, right: Expr) -> Expr:
    spark = _spark_decimals(t, left, right)
    if spark is not None:
        a, b = spark
        target = spark_types.multiply_type(a, b)
        if a.precision + b.precision + 1 <= 38:  # Arrow's product type is Spark's
            return call("multiply_checked", left.cast(a), right.cast(b))
        if a.scale > 18 or b.scale > 18:
            return _narrowed(call("multiply_checked", _wide(left, a), _wide(right, b)), target)
        (x, _), (y, _) = _within(left, a, 18), _within(right, b, 18)
        return _narrowed(call("multiply_checked", x, y), target)
    lt, rt = t.type_of(left), t.type_of(right)
    if not (pa.types.is_decimal(lt) and pa.types.is_decimal(rt)):
        return call("multiply_checked", left, right)
    scale = lt.scale + rt.scale
    if scale > 38:
        raise PlanError(f"SQL: the product of {lt} and {rt} has {scale} digits after the point; DECIMAL holds 38")
    precision = lt.precision + rt.precision  # DuckDB's type for the product
    if precision > 18 and lt.precision <= 18 and rt.precision <= 18 and scale <= 18:
        precision = 18
    precision = min(precision, 38)
    if lt.precision + rt.precision + 1 > 38:  # Arrow's product type would not fit: narrow the wider factor
        wide, narrow = (left, lt), (right, rt)
        if rt.precision > lt.precision:
            wide, narrow = narrow, wide
        digits = 37 - narrow[1].precision
        if digits < wide[1].scale + 1:
            raise PlanError(f"SQL: the product of {lt} and {rt} does not fit DECIMAL's 38 digits")
        narrowed = wide[0].cast(pa.decimal128(digits, wide[1].scale))
        left, right = (narrowed, narrow[0]) if wide[0] is left else (narrow[0], narrowed)
    return call("multiply_checked", left, right).cast(pa.decimal128(precision, scale))


def divide(t: Scalars, left: Expr, right: Expr) -> Expr:
    """DuckDB's ``/`` is a DOUBLE; Spark's, of decimals, a DECIMAL of its type, rounded HALF_UP."""
    spark = _spark_decimals(t, left, right)
    if spark is None:  # Spark (ANSI) fails on a zero divisor where DuckDB's DOUBLE is inf or NaN
        return call("divide_checked" if t.dialect == "spark" else "divide", t.as_double(left), t.as_double(right))
    a, b = spark
    return quotient(left, right, a, b, spark_types.divide_type(a, b))


def quotient(left: Expr, right: Expr, a: pa.Decimal128Type, b: pa.Decimal128Type, target: pa.Decimal128Type) -> Expr:
    """``left / right`` (decimals of types ``a`` and ``b``) rounded HALF_UP to ``target``'s scale.

    Arrow's decimal quotient has scale s1 + p2 - s2 + 1, truncated: the dividend's scale is raised
    until that is at least one digit more than the target's, so the rounding sees the true next
    digit (a truncated quotient rounds HALF_UP as the exact one does). Arrow needs p1 + p2 + 1 digits
    (p1 with the raised scale) within 38: longer operands are narrowed (``_within``). A zero divisor
    is an error."""
    pb = b.precision

    def extra(pb: int) -> int:
        return max(0, target.scale + 1 - (a.scale + pb - b.scale + 1))

    if a.precision + extra(pb) + pb + 1 > 38:
        pb = min(pb, max(b.scale + 1, 18))
    pa_ = min(a.precision, 37 - extra(pb) - pb)
    if pa_ < a.scale + 1:
        up = extra(b.precision)
        if a.precision + up + b.precision + 1 > 76:
            raise PlanError(f"SQL: the quotient of {a} and {b} needs more than 76 digits on the way to {target}")
        return _narrowed(call("divide_checked", _wide(left, a, up), _wide(right, b)), target)
    up = extra(pb)
    x, _ = _within(left, a, pa_)
    y, _ = _within(right, b, pb)
    raised = x.cast(pa.decimal128(pa_ + up, a.scale + up)) if up else x
    return _narrowed(call("divide_checked", raised, y), target)


def modulo(t: Scalars, left: Expr, right: Expr, text: str) -> Expr:
    """``a % b`` of integers, signed as the dividend (C's and DuckDB's rule): a - trunc(a / b) * b."""
    lt, rt = t.type_of(left), t.type_of(right)
    if not (pa.types.is_integer(lt) and pa.types.is_integer(rt)):
        raise unsupported(f"% of {lt} and {rt} ({text}); it takes integers")
    a, b = left.cast(pa.int64()), right.cast(pa.int64())
    return a - call("divide_checked", a, b) * b
