"""What a window call produces: its functions and their result types, shared by the builder and the engines.

Types follow DuckDB's (the engine that computes windows): ranks and counts are BIGINT, a mean
is DOUBLE, a sum of integers BIGINT and of DECIMAL(p, s) DECIMAL(38, s); the others keep their
argument's type.
"""

from __future__ import annotations

import pyarrow as pa

__all__ = ["FUNCTIONS", "NO_ARGUMENT", "window_type"]

NO_ARGUMENT = ("row_number", "rank", "dense_rank", "count_all")
FUNCTIONS = (*NO_ARGUMENT, "lag", "lead", "first_value", "last_value", "sum", "min", "max", "mean", "count")


def window_type(function: str, arg: pa.DataType | None) -> pa.DataType:
    """The type ``function`` over an argument of type ``arg`` produces; ``ValueError`` when it has none."""
    if function in NO_ARGUMENT or function == "count":
        return pa.int64()
    if arg is None:
        raise ValueError(f"window function {function} needs an argument column")
    if function == "mean":
        return pa.float64()
    if function == "sum":
        if pa.types.is_integer(arg):
            return pa.int64()
        if pa.types.is_decimal(arg):
            return pa.decimal128(38, arg.scale)
        if pa.types.is_floating(arg):
            return pa.float64()
        raise ValueError(f"window sum of {arg}: not a number")
    return arg
