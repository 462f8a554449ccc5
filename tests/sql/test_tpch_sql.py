"""The 22 TPC-H queries from the standard text, through ``flight.sql``, against DuckDB.

Each query (the specification's validation parameters, ``benchmarks/tpch_sql.py``) is planned
from its SQL text and run with ``run_local`` and on 1, 2 and 3 real workers, at SF 0.1. The
answers must equal DuckDB's running the same text over the same Parquet files; where DuckDB's
answer is a DECIMAL, ours must be a DECIMAL of the same value, digit for digit (DuckDB's and
our engine agree on the type rules, docs/sql.md). A float is compared with a relative
tolerance of 1e-9, as the benchmark harness does; DuckDB's HUGEINT sums of integers (DECIMAL(38, 0)
in Arrow) are compared with our BIGINT ones as integers.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
from support import tpch_test_files

import flight
from benchmarks.tpch_queries import TABLES, compare, decimals_as_numbers, duckdb_connection, duckdb_table
from benchmarks.tpch_sql import ALL_QUERIES, ORDERED, SQL

pytestmark = pytest.mark.slow

SF = 0.1


@pytest.fixture(scope="module")
def files() -> dict[str, list[Path]]:
    return tpch_test_files(SF)


@pytest.fixture(scope="module")
def catalog(files: dict[str, list[Path]]) -> flight.Catalog:
    return flight.Catalog({t: flight.read_parquet([str(p.resolve()) for p in files[t]]) for t in TABLES})


@pytest.fixture(scope="module")
def duckdb_answers(files: dict[str, list[Path]]) -> Iterator[dict[int, pa.Table]]:
    """DuckDB's answer to each query's text, decimals as DuckDB typed them."""
    con = duckdb_connection(files)
    try:
        yield {n: duckdb_table(con, SQL[n]) for n in ALL_QUERIES}
    finally:
        con.close()


@pytest.fixture(scope="module")
def sql_cluster(data_roots: list[Path]) -> Iterator[flight.LocalCluster]:
    with flight.LocalCluster(3, data_roots=data_roots) as c:
        yield c


def exact_decimals(got: pa.Table, want: pa.Table, ordered: list[str] | None) -> str | None:
    """Where DuckDB's column is a DECIMAL, ours holds the same decimals (rows matched by order or sorted)."""
    columns = [i for i, f in enumerate(want.schema) if pa.types.is_decimal(f.type)]
    if not columns:
        return None
    for i in columns:
        ours, theirs = got.schema.field(i).type, want.schema.field(i).type
        if pa.types.is_integer(ours) and theirs.scale == 0:
            continue  # DuckDB's SUM of integers is a HUGEINT, which Arrow carries as DECIMAL(38, 0)
        if not pa.types.is_decimal(ours):
            return f"column {want.schema.names[i]!r} is {got.schema.field(i).type}, DuckDB's is {want.schema.field(i).type}"

    def rows(t: pa.Table) -> list[tuple[object, ...]]:
        out = list(zip(*(c.to_pylist() for c in t.columns)))
        return out if ordered else sorted(out, key=repr)

    for g, w in zip(rows(got), rows(want)):
        for i in columns:
            a, b = g[i], w[i]
            if (a is None) != (b is None) or (a is not None and Decimal(a) != Decimal(b)):  # type: ignore[arg-type]
                return f"column {want.schema.names[i]!r}: {a} where DuckDB has {b}"
    return None


def check(n: int, got: pa.Table, want: pa.Table, where: str) -> None:
    difference = compare(got, decimals_as_numbers(want), ORDERED.get(n))
    assert difference is None, f"TPC-H Q{n} ({where}) differs from DuckDB: {difference}"
    inexact = exact_decimals(got, want, ORDERED.get(n))
    assert inexact is None, f"TPC-H Q{n} ({where}): decimals differ from DuckDB's: {inexact}"


@pytest.mark.parametrize("n", ALL_QUERIES, ids=lambda n: f"q{n}")
def test_tpch_sql_with_run_local(n: int, catalog: flight.Catalog, duckdb_answers: dict[int, pa.Table]) -> None:
    got = flight.run_local(flight.sql(SQL[n], catalog)).read_all()
    check(n, got, duckdb_answers[n], "run_local")


@pytest.mark.parametrize("workers", (1, 2, 3), ids=lambda k: f"w{k}")
@pytest.mark.parametrize("n", ALL_QUERIES, ids=lambda n: f"q{n}")
def test_tpch_sql_on_workers(
    n: int, workers: int, catalog: flight.Catalog, duckdb_answers: dict[int, pa.Table], sql_cluster: flight.LocalCluster
) -> None:
    ex = flight.DistributedExec(flight.sql(SQL[n], catalog), sql_cluster.urls[:workers])
    check(n, ex.to_table(), duckdb_answers[n], f"{workers} worker(s)")
