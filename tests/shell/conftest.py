"""What the shell's tests share: TPC-H data at SF 0.1, and DuckDB over it as the oracle."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from support import tpch_test_files

from benchmarks.tpch_queries import duckdb_connection


@pytest.fixture(scope="module")
def files() -> dict[str, list[Path]]:
    return tpch_test_files(0.1)


@pytest.fixture(scope="module")
def con(files: dict[str, list[Path]]) -> Iterator[duckdb.DuckDBPyConnection]:
    c = duckdb_connection(files)
    yield c
    c.close()
