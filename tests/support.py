"""Helpers shared by the tests (fixtures live in conftest.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pyarrow as pa
import pyarrow.flight as fl

from flight._proto import protocol_pb2

_tick = threading.Event()  # never set: its wait() is an interruptible pause


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> None:
    """Poll ``predicate`` every 10 ms until it holds; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        _tick.wait(0.01)


def make_table(n: int, offset: int = 0) -> pa.Table:
    ids = list(range(offset, offset + n))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "qty": pa.array([float(i % 50) for i in ids], pa.float64()),
            "name": pa.array([None if i % 13 == 0 else f"item-{i % 17}" for i in ids], pa.string()),
            "day": pa.array([i % 365 for i in ids], pa.int32()).cast(pa.date32()),
        }
    )


def worker_info(url: str) -> protocol_pb2.WorkerInfo:
    with fl.connect(url) as client:
        (result,) = list(client.do_action(fl.Action("info", b"")))
    info = protocol_pb2.WorkerInfo()
    info.ParseFromString(result.body.to_pybytes())
    return info


def running_tasks(urls: list[str]) -> int:
    return sum(worker_info(u).running_tasks for u in urls)


def sorted_table(table: pa.Table) -> pa.Table:
    """Row order does not matter across tasks: compare sorted by every column."""
    return table.sort_by([(name, "ascending") for name in table.column_names])


def tpch_test_files(sf: float = 0.05) -> dict[str, list]:
    """TPC-H Parquet files for tests (cached under .bench-cache); skips when tpchgen-cli is missing."""
    import pytest

    from benchmarks.tpch import ensure_tpch, tpchgen_cli
    from benchmarks.tpch_queries import TABLES, tpch_files

    try:
        tpchgen_cli()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    return tpch_files(ensure_tpch(sf, TABLES), TABLES)
