"""Functions the SQL front end knows beyond DataFusion's own: declared to its planner by name and type.

DataFusion plans only; a function it does not know fails the text before any translation. Each
entry here is registered in every planning session as a function that never runs (its body
raises): the plan names it, and the translation (``flight.sql.aggregates``, ``flight.sql.functions``)
turns it into the IR like any other. So DuckDB's spellings that DataFusion lacks plan too.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

__all__ = ["AGGREGATE_ALIASES", "SCALAR_ALIASES", "declare"]

AGGREGATE_ALIASES: dict[str, tuple[list[pa.DataType], pa.DataType]] = {
    "variance": ([pa.float64()], pa.float64()),  # DuckDB's (and Spark's) name for var_samp
    "quantile_disc": ([pa.float64(), pa.float64()], pa.float64()),  # DuckDB's (the argument keeps its type: aggregates.py)
    "quantile": ([pa.float64(), pa.float64()], pa.float64()),  # DuckDB's name for quantile_disc
}
"""Aggregates by name: their argument types (DataFusion coerces to them) and result type."""

SCALAR_ALIASES: dict[str, tuple[list[pa.DataType], pa.DataType]] = {
    "sign": ([pa.float64()], pa.int8()),  # DuckDB's name for signum, a TINYINT
    "strftime": ([pa.string(), pa.string()], pa.string()),  # DuckDB's date formatting (DataFusion's to_char)
    "strptime": ([pa.string(), pa.string()], pa.timestamp("us")),  # DuckDB's parsing with a format
    "mod": ([pa.int64(), pa.int64()], pa.int64()),  # DuckDB's a % b (of integers: flight.sql.functions)
    "regexp_extract": ([pa.string(), pa.string(), pa.int64()], pa.string()),  # the group is given (one signature)
    "regexp_matches": ([pa.string(), pa.string()], pa.bool_()),  # DuckDB's name for regexp_like
    "regexp_full_match": ([pa.string(), pa.string()], pa.bool_()),
    "add_months": ([pa.date32(), pa.int64()], pa.date32()),  # Spark's
    "last_day": ([pa.date32()], pa.date32()),  # DuckDB's and Spark's
}
"""Scalar functions by name, as ``AGGREGATE_ALIASES``."""


def _never(*args: Any) -> Any:
    raise RuntimeError("a function declared for planning ran")


def declare(ctx: Any) -> None:
    """Register every declared function in DataFusion session ``ctx``."""
    from datafusion import Accumulator, udaf, udf

    never = type("Never", (Accumulator,), {"state": _never, "update": _never, "merge": _never, "evaluate": _never})
    for name, (args, result) in AGGREGATE_ALIASES.items():
        ctx.register_udaf(udaf(never, args, result, [result], "immutable", name=name))
    for name, (args, result) in SCALAR_ALIASES.items():
        ctx.register_udf(udf(_never, args, result, "immutable", name=name))
