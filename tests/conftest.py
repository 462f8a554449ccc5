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


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the groups (xdist/remote.py)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Which tests share a process under ``pytest -n 2`` (the README's test command; ``--dist loadgroup``
    and ``--no-loadscope-reorder`` are in pyproject's ``addopts``), and in what order the groups start.

    A module's tests run in one process, in their order, so its module-scoped clusters and tables are made
    once; every Spark test runs in one process too: one JVM, and the Spark fleet tests count the workers
    Spark started machine-wide (``spark_support.fleet_pids``), which a second Spark process would change.
    The groups with a ``slow`` test start first, in the order collected: xdist's own order (most tests
    first) left the fuzzer's 130 s and the chaos minute, modules of one to five tests, to run last, alone."""
    def group(item: pytest.Item) -> str:
        module = item.nodeid.split("::", 1)[0]
        return "spark" if module.startswith("tests/spark/") else module

    slow = {group(item) for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: group(item) not in slow)  # stable: each group stays whole and in order
    for item in items:
        item.add_marker(pytest.mark.xdist_group(group(item)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A ``required`` test that skipped fails when ``FLIGHT_EXEC_REQUIRE_ALL=1`` (CI): CI must run it."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.skipped and item.get_closest_marker("required") and os.environ.get("FLIGHT_EXEC_REQUIRE_ALL") == "1":
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"a required test was skipped (FLIGHT_EXEC_REQUIRE_ALL=1): {reason}"
