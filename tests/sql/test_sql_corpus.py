"""A corpus of focused SQL statements (``corpus.py``), each run by flight-exec and by DuckDB.

Every construct docs/sql.md lists has statements here, over tables the test makes (nulls,
decimals of two scales, dates, unicode, an empty table), written to Parquet and read by both
engines. flight-exec runs each with ``run_local`` on both of its engines (DuckDB per task, and
Acero). The answers must be equal: rows as a multiset (in order where the statement orders
them), decimals digit for digit where DuckDB's answer is a DECIMAL, floats within 1e-9
relative. A statement the front end refuses fails here too: refusals are tested by their text
in ``test_sql_errors.py``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from corpus import CORPUS, tables

import flight
from benchmarks.tpch_queries import duckdb_table
from flight.sql.frontend import split_statements

CASES = [(group, i, text) for group, texts in CORPUS.items() for i, text in enumerate(texts)]


def test_the_corpus_is_large() -> None:
    assert len(CASES) >= 250, f"{len(CASES)} statements"


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sql-corpus")
    out = {}
    for name, table in tables().items():
        out[name] = root / f"{name}.parquet"
        pq.write_table(table, out[name], row_group_size=16)
    return out


@pytest.fixture(scope="module")
def catalog(paths: dict[str, Path]) -> flight.Catalog:
    return flight.Catalog({name: str(path) for name, path in paths.items()})


@pytest.fixture(scope="module")
def con(paths: dict[str, Path]) -> Iterator[duckdb.DuckDBPyConnection]:
    c = duckdb.connect()
    for name, path in paths.items():
        c.execute(f"create view {name} as select * from read_parquet('{path}')")
    yield c
    c.close()


def same(got: pa.Table, want: pa.Table, ordered: bool) -> str | None:
    """Why ``got`` is not ``want`` (None: it is)."""
    if got.num_columns != want.num_columns:
        return f"{got.num_columns} columns {got.schema.names}, DuckDB has {want.num_columns} {want.schema.names}"
    exact = [pa.types.is_decimal(f.type) and f.type.scale > 0 for f in want.schema]
    rows_g = list(zip(*(c.to_pylist() for c in got.columns))) if got.num_columns else [()] * got.num_rows
    rows_w = list(zip(*(c.to_pylist() for c in want.columns))) if want.num_columns else [()] * want.num_rows
    if len(rows_g) != len(rows_w):
        return f"{len(rows_g)} rows, DuckDB has {len(rows_w)}"
    if not ordered:
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


@pytest.mark.parametrize("engine", ["duckdb", "acero"])
@pytest.mark.parametrize(("group", "i", "text"), CASES, ids=[f"{g.split()[0]}-{i}" for g, i, _ in CASES])
def test_statement_matches_duckdb(
    group: str, i: int, text: str, engine: str, catalog: flight.Catalog, con: duckdb.DuckDBPyConnection
) -> None:
    want = duckdb_table(con, text)
    got = flight.run_local(flight.sql(text, catalog), engine=engine).read_all()
    ordered = "order by" in split_statements(text)[-1].text.lower() and "select" in text.lower()
    difference = same(got, want, ordered)
    assert difference is None, f"{text}\n{difference}"
