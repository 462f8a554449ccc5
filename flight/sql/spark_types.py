"""Spark SQL's result types for DECIMAL arithmetic and aggregates (``dialect="spark"``).

Spark types a decimal result by its own rules (Catalyst's ``DecimalPrecision``, with
``spark.sql.decimalOperations.allowPrecisionLoss`` on, the default), and rounds a value that has
more digits than its type HALF_UP (away from zero at a tie). An integer operand counts as the
DECIMAL that holds it (an INT as DECIMAL(10, 0)). Where DuckDB divides as a DOUBLE and averages as
a DOUBLE, Spark divides and averages as a DECIMAL; TPC-H Q1's ``avg(l_discount)`` is DECIMAL(19, 6)
in Spark, where DuckDB's is a DOUBLE. Pure functions of types: the translation
(``flight.sql.exprs``) computes values to these types.
"""

from __future__ import annotations

import pyarrow as pa

__all__ = ["MAX_PRECISION", "add_type", "as_decimal", "avg_type", "divide_type", "multiply_type", "sum_type"]

MAX_PRECISION = 38
MIN_ADJUSTED_SCALE = 6
"""Spark keeps at least this many digits after the point when a result's type must lose some."""

_INT_DIGITS = {8: 3, 16: 5, 32: 10, 64: 20}  # Spark's DecimalType.forType: a LONG is DECIMAL(20, 0)


def as_decimal(t: pa.DataType) -> pa.Decimal128Type | None:
    """The DECIMAL Spark reads type ``t`` as in decimal arithmetic (None: not a decimal or an integer)."""
    if pa.types.is_decimal(t):
        return pa.decimal128(t.precision, t.scale)
    if pa.types.is_integer(t):
        return pa.decimal128(_INT_DIGITS[t.bit_width], 0)
    return None


def _bounded(precision: int, scale: int) -> pa.Decimal128Type:
    return pa.decimal128(min(precision, MAX_PRECISION), min(scale, MAX_PRECISION))


def _adjusted(precision: int, scale: int) -> pa.Decimal128Type:
    """A result type past 38 digits keeps its integer digits and gives up scale, down to
    ``MIN_ADJUSTED_SCALE`` (or its own scale if smaller)."""
    if precision <= MAX_PRECISION:
        return pa.decimal128(precision, scale)
    integer_digits = precision - scale
    return pa.decimal128(MAX_PRECISION, max(MAX_PRECISION - integer_digits, min(scale, MIN_ADJUSTED_SCALE)))


def add_type(a: pa.Decimal128Type, b: pa.Decimal128Type) -> pa.Decimal128Type:
    """``a + b`` and ``a - b``."""
    scale = max(a.scale, b.scale)
    return _adjusted(max(a.precision - a.scale, b.precision - b.scale) + scale + 1, scale)


def multiply_type(a: pa.Decimal128Type, b: pa.Decimal128Type) -> pa.Decimal128Type:
    return _adjusted(a.precision + b.precision + 1, a.scale + b.scale)


def divide_type(a: pa.Decimal128Type, b: pa.Decimal128Type) -> pa.Decimal128Type:
    scale = max(MIN_ADJUSTED_SCALE, a.scale + b.precision + 1)
    return _adjusted(a.precision - a.scale + b.scale + scale, scale)


def sum_type(t: pa.Decimal128Type) -> pa.Decimal128Type:
    return _bounded(t.precision + 10, t.scale)


def avg_type(t: pa.Decimal128Type) -> pa.Decimal128Type:
    return _bounded(t.precision + 4, t.scale + 4)
