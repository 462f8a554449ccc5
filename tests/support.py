"""Helpers shared by the tests (fixtures live in conftest.py)."""

from __future__ import annotations

import math
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb
import pyarrow as pa
import pyarrow.flight as fl
import pyarrow.parquet as pq
import pytest

import flight
from flight.wire._proto import plan_pb2, protocol_pb2
from flight.wire.plan_codec import encode_plan
from flight.wire.protocol import PROTOCOL_VERSION, encode_schema

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

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


# -- raw exchanges with a worker, for tests of what it does with bad input


def healthy(url: str) -> bool:
    with fl.connect(url) as client:
        return [r.body.to_pybytes() for r in client.do_action(fl.Action("health", b""))] == [b"ok"]


def raw_exchange(url: str, command: bytes, frames: list[bytes] = ()) -> tuple[list[protocol_pb2.WorkerFrame], BaseException | None]:
    """Drive a worker by hand; return the frames it sent and the error that ended the call."""
    got: list[protocol_pb2.WorkerFrame] = []
    with fl.connect(url) as client:
        writer, reader = client.do_exchange(fl.FlightDescriptor.for_command(command))
        for data in frames:
            writer.write_metadata(pa.py_buffer(data))
        try:
            while True:
                chunk = reader.read_chunk()
                if chunk.app_metadata is not None:
                    frame = protocol_pb2.WorkerFrame()
                    frame.ParseFromString(chunk.app_metadata.to_pybytes())
                    got.append(frame)
                    if frame.WhichOneof("frame") == "error":
                        writer.done_writing()
        except StopIteration:
            return got, None
        except pa.ArrowException as exc:
            return got, exc
        finally:
            try:
                writer.close()
            except pa.ArrowException:
                pass  # closing repeats the call's final status, already returned above


def header(plan: plan_pb2.StagePlan, feeds: dict[str, list[int]] | None = None, **kw: object) -> protocol_pb2.TaskHeader:
    h = protocol_pb2.TaskHeader(
        protocol_version=PROTOCOL_VERSION,
        stage_key=protocol_pb2.StageKey(query_id=f"q-{uuid.uuid4().hex[:8]}", stage_id=0, task_number=0),
        task_count=1,
        plan=encode_plan(plan),
        query_secret=b"s" * 16,
        feeds=[protocol_pb2.FeedAssignment(feed_id=f, partitions=p) for f, p in (feeds or {}).items()],
    )
    for k, v in kw.items():
        setattr(h, k, v)
    return h


def units_plan(feed_id: str = "f") -> plan_pb2.StagePlan:
    return plan_pb2.StagePlan(
        root=plan_pb2.Operator(
            feed_scan=plan_pb2.FeedScan(
                feed=plan_pb2.WorkUnitFeed(feed_id=feed_id),
                reader="units",
                schema=encode_schema(pa.schema([("unit", pa.binary())])),
            )
        )
    )


def error_of(frames: list[protocol_pb2.WorkerFrame]) -> protocol_pb2.ErrorInfo:
    errors = [f.error for f in frames if f.WhichOneof("frame") == "error"]
    assert errors, f"no error frame among {frames}"
    return errors[0]


@dataclass
class Data:
    """Parquet files of named tables, and a DuckDB connection over the same tables (the oracle)."""

    paths: dict[str, list[Path]]
    duck: duckdb.DuckDBPyConnection

    def read(self, name: str) -> flight.Query:
        return flight.read_parquet(self.paths[name])

    def sql(self, query: str) -> list[tuple]:
        return self.duck.execute(query).fetchall()


def write_parts(table: pa.Table, root: Path, name: str, files: int) -> list[Path]:
    """``table`` as ``files`` Parquet files ``root/name-i.parquet`` of about equal rows."""
    step = -(-table.num_rows // files)
    paths = []
    for i in range(files):
        path = root / f"{name}-{i}.parquet"
        pq.write_table(table.slice(i * step, step), path)
        paths.append(path)
    return paths


def run_setup(cluster: flight.LocalCluster, setup: tuple, query: flight.Query) -> tuple[pa.Table, flight.DistributedExec]:
    """Run ``query`` on the first ``k`` workers with the planner ``options`` of ``setup = (name, k, options)``;
    the result's schema must be the query's."""
    _, k, options = setup
    ex = flight.DistributedExec(query, cluster.urls[:k], **options)
    table = ex.to_table()
    assert table.schema.equals(query.schema), f"result schema {table.schema} differs from the query's {query.schema}"
    return table, ex


def table_rows(table: pa.Table) -> list[tuple]:
    """The rows of ``table`` as tuples."""
    columns = [table[c].to_pylist() for c in table.column_names]
    return list(zip(*columns)) if columns else []


@contextmanager
def spark_session(tmp: Path, master: str = "local[2]") -> Iterator[SparkSession]:
    """Start a local SparkSession (``local[2]``: no task retries) whose Python workers run this
    interpreter; stop it on exit."""
    pyspark = pytest.importorskip("pyspark", reason="the Spark tests need the spark extra: pip install -e '.[dev,spark]'")
    del pyspark
    from pyspark.sql import SparkSession

    with pytest.MonkeyPatch.context() as mp:
        # Spark's Python workers (and the data source planner) must import flight-exec: this venv.
        mp.setenv("PYSPARK_PYTHON", sys.executable)
        mp.setenv("PYSPARK_DRIVER_PYTHON", sys.executable)
        spark = (
            SparkSession.builder.master(master)
            .appName("flight-exec tests")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.default.parallelism", "2")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.sql.warehouse.dir", str(tmp / "warehouse"))
            .config("spark.local.dir", str(tmp / "local"))
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        try:
            yield spark
        finally:
            spark.stop()


def difference(got: pa.Table, want: pa.Table, ordered: bool) -> str | None:
    """Why ``got`` is not ``want`` (None: it is): rows as a multiset, or in order; decimals digit for digit
    where DuckDB's answer is a DECIMAL, floats within 1e-9 relative."""
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
    if isinstance(a, list) or isinstance(b, list):  # a list's elements, a struct's fields: each compared as a value
        return isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and all(_equal(x, y, exact) for x, y in zip(a, b))
    if isinstance(a, dict) or isinstance(b, dict):
        return isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k], exact) for k in a)
    if exact:
        return isinstance(a, Decimal) and a == b
    if isinstance(a, (float, Decimal)) or isinstance(b, (float, Decimal)):
        x, y = float(a), float(b)  # type: ignore[arg-type]
        return math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12) or (math.isnan(x) and math.isnan(y))
    return a == b


def read_in_thread(reader: pa.RecordBatchReader) -> tuple[threading.Thread, dict[str, object]]:
    """``reader`` read to its end on a thread of its own: ``out["table"]`` or ``out["error"]``, so a test can wait
    for it with a deadline (a read that hangs is then seen, not waited for)."""
    out: dict[str, object] = {}

    def read() -> None:
        try:
            out["table"] = reader.read_all()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread, out


def write_halves(root: Path, tables: dict[str, pa.Table], row_group_size: int | None = 2500) -> dict[str, Path]:
    """Each table as a directory of two Parquet files (halves), so scans have two units and rows move
    (``row_group_size`` None: pyarrow's default)."""
    out = {}
    for name, table in tables.items():
        out[name] = root / name
        out[name].mkdir()
        half = table.num_rows // 2
        for part in range(2):
            pq.write_table(table.slice(part * half, half), out[name] / f"p{part}.parquet", row_group_size=row_group_size)
    return out


def listed_catalog(paths: dict[str, Path]) -> flight.Catalog:
    """Listed files (a directory's size is unknown until it is listed: nothing would be estimated)."""
    return flight.Catalog({name: flight.read_parquet(sorted(str(f) for f in p.glob("*.parquet"))) for name, p in paths.items()})


@contextmanager
def duckdb_views(paths: dict[str, Path]) -> Iterator[duckdb.DuckDBPyConnection]:
    """A DuckDB connection with a view of each directory's Parquet files: the oracle over the same files."""
    c = duckdb.connect()
    for name, p in paths.items():
        c.execute(f"create view {name} as select * from read_parquet('{p}/*.parquet')")
    try:
        yield c
    finally:
        c.close()


def file_catalog(paths: dict[str, Path]) -> flight.Catalog:
    """One Parquet file per table, by name."""
    return flight.Catalog({name: flight.read_parquet([str(path)]) for name, path in paths.items()})


def file_views(paths: dict[str, Path]) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with a view of each table's one Parquet file: the oracle over the same files."""
    con = duckdb.connect()
    for name, path in paths.items():
        con.sql(f"create view {name} as select * from read_parquet('{path}')")
    return con
