"""The 99 TPC-DS queries for the tests: data, texts, DuckDB's answers, and how an answer is compared.

The data and the texts are made at run time by DuckDB's ``tpcds`` extension (``benchmarks.tpcds``: a side
venv with the PyPI package that ships it), never pasted from elsewhere. ``SF`` is small so that all 99
run every way within CI's time; ``FLIGHT_EXEC_TPCDS_SF`` sets another. DuckDB (this project's, not the
generator's) over the same Parquet files is the oracle.
"""

from __future__ import annotations

import functools
import math
import os
import re
from decimal import Decimal
from pathlib import Path

import duckdb
import pyarrow as pa

from benchmarks import tpcds
from benchmarks.tpch_queries import duckdb_table

SF = float(os.environ.get("FLIGHT_EXEC_TPCDS_SF", "0.01"))
QUERIES = list(range(1, 100))


@functools.cache
def tables() -> dict[str, Path]:
    """Each TPC-DS table as one Parquet file (made once, cached under .bench-cache)."""
    return tpcds.generate(SF)


def data_root() -> Path:
    return next(iter(tables().values())).parent


@functools.cache
def texts() -> dict[int, str]:
    return tpcds.queries()


def catalog() -> dict[str, str]:
    return {name: str(path) for name, path in tables().items()}


@functools.cache
def answer(n: int) -> pa.Table:
    """DuckDB's answer to query ``n``."""
    return duckdb_table(_oracle(), texts()[n])


@functools.cache
def _oracle() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    for name, path in tables().items():
        con.execute(f"create view {name} as select * from read_parquet('{path}')")
    return con


def ordered(text: str) -> bool:
    """Whether the statement's own ORDER BY (after its last parenthesis, not a window's) orders the rows."""
    return re.search(r"order by [^)]*$", text.lower()) is not None


def difference(got: pa.Table, want: pa.Table, in_order: bool) -> str | None:
    """Why ``got`` is not ``want`` (None: it is): rows as a multiset, or in order; decimals digit for digit
    where DuckDB's answer is a DECIMAL, floats within 1e-9 relative."""
    if got.num_columns != want.num_columns:
        return f"{got.num_columns} columns {got.schema.names}, DuckDB has {want.num_columns} {want.schema.names}"
    exact = [pa.types.is_decimal(f.type) and f.type.scale > 0 for f in want.schema]
    rows_g = list(zip(*(c.to_pylist() for c in got.columns))) if got.num_columns else [()] * got.num_rows
    rows_w = list(zip(*(c.to_pylist() for c in want.columns))) if want.num_columns else [()] * want.num_rows
    if len(rows_g) != len(rows_w):
        return f"{len(rows_g)} rows, DuckDB has {len(rows_w)}"
    if not in_order:
        rows_g, rows_w = sorted(rows_g, key=_key), sorted(rows_w, key=_key)
    for r, (g, w) in enumerate(zip(rows_g, rows_w)):
        for c, (a, b) in enumerate(zip(g, w)):
            if not _equal(a, b, exact[c]):
                return f"row {r}, column {want.schema.names[c]!r}: {a!r} where DuckDB has {b!r}"
    return None


def _key(row: tuple[object, ...]) -> tuple[str, ...]:
    return tuple("" if v is None else f"{float(v):.9g}" if isinstance(v, (float, Decimal)) else repr(v) for v in row)


def _equal(a: object, b: object, exact: bool) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if exact:
        return isinstance(a, Decimal) and a == b
    if isinstance(a, (float, Decimal)) or isinstance(b, (float, Decimal)):
        x, y = float(a), float(b)  # type: ignore[arg-type]
        return math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12) or (math.isnan(x) and math.isnan(y))
    return a == b
