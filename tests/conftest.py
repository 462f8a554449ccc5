"""Shared fixtures: one real LocalCluster, Parquet files, a module's tables with their DuckDB oracle, and one SparkSession."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
from support import duckdb_views, listed_catalog, make_table, spark_session

import flight
from benchmarks.tpch import REPO_ROOT


@pytest.fixture(scope="session")
def data_roots(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """What test workers may read (``--data-root``): pytest's temporary directories and the TPC-H cache."""
    tpch = REPO_ROOT / ".bench-cache" / "tpch"
    tpch.mkdir(parents=True, exist_ok=True)  # a root must exist when the workers start
    return [tmp_path_factory.getbasetemp(), tpch]


@pytest.fixture(scope="session")
def cluster(data_roots: list[Path]) -> Iterator[flight.LocalCluster]:
    """Two real flight-worker processes, with the testing readers loaded, reading under ``data_roots``."""
    with flight.LocalCluster(2, extensions=["flight.dev.testing"], data_roots=data_roots) as c:
        yield c


@pytest.fixture(scope="module")
def catalog(paths: dict[str, Path]) -> flight.Catalog:
    """The module's tables (its ``paths`` fixture: a directory of Parquet files each) as listed files."""
    return listed_catalog(paths)


@pytest.fixture(scope="module")
def con(paths: dict[str, Path]) -> Iterator[duckdb.DuckDBPyConnection]:
    """DuckDB over the module's ``paths``: the oracle reading the same files."""
    with duckdb_views(paths) as c:
        yield c


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One SparkSession (one JVM: starting one takes seconds) for every module that asks: ``local[2,3]``,
    two task threads and a failed task tried up to three times, as on a cluster."""
    with spark_session(tmp_path_factory.mktemp("spark"), master="local[2,3]") as session:
        yield session


@pytest.fixture(scope="session")
def parquet_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Six Parquet files of 2,000 rows, 4 row groups each."""
    root = tmp_path_factory.mktemp("parquet")
    paths = []
    for i in range(6):
        path = root / f"part-{i}.parquet"
        pq.write_table(make_table(2000, i * 2000), path, row_group_size=500)
        paths.append(path)
    return paths


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A ``required`` test that skipped fails when ``FLIGHT_EXEC_REQUIRE_ALL=1`` (CI): CI must run it."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.skipped and item.get_closest_marker("required") and os.environ.get("FLIGHT_EXEC_REQUIRE_ALL") == "1":
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"a required test was skipped (FLIGHT_EXEC_REQUIRE_ALL=1): {reason}"
