"""The 99 TPC-DS queries for the tests: data, texts and DuckDB's answers (``difference`` compares).

The data and the texts are made at run time by DuckDB's ``tpcds`` extension (``benchmarks.tpcds``: a side
venv with the PyPI package that ships it), never pasted from elsewhere. ``SF`` is small so that all 99
run every way within CI's time; ``FLIGHT_EXEC_TPCDS_SF`` sets another. DuckDB (this project's, not the
generator's) over the same Parquet files is the oracle.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import duckdb
import pyarrow as pa
from support import difference  # noqa: F401 - the comparison these tests use, re-exported

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
