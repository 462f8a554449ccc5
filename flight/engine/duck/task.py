"""One task on the DuckDB engine: its cursors, its sources, and how its failures read.

Shared by ``duck`` (which runs the task's query), ``duck_units`` (the unit fragments) and
``duck_translate`` (the SQL text over the task's sources).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import duckdb
import pyarrow as pa

from flight.compute.relational import native_reader
from flight.engine.confine import DataRoots
from flight.errors import TaskCancelledError, TaskFailedError
from flight.wire._proto import plan_pb2
from flight.wire.limits import clip

UNITS = "\x00units\x00"
"""Where a unit fragment's FROM goes; a NUL never appears in translated text, so it cannot collide."""



class Statement:
    """A query's text, run when its rows are first asked for (``__arrow_c_stream__``): what
    ``cur.sql(text)`` streams, without making the relation first.

    Why: DuckDB's Python relation parses and binds its text to describe itself, then renders and
    submits it again when it runs, so every task query paid DuckDB's parse and bind twice (TPC-H at
    SF 0.1, one process: Q2 15.1 -> 11.1 ms, Q11 9.6 -> 6.8, Q14 10.8 -> 8.5; our text binds in 1 to
    4 ms). The connection's submit is the relation's own way to run (``DuckDBPyRelation._submit``),
    taken directly; a DuckDB without it gets the relation. Errors come when the rows are asked for,
    where every caller already catches the engine's errors (``ENGINE_ERRORS``)."""

    def __init__(self, cur: duckdb.DuckDBPyConnection, text: str) -> None:
        self.cur, self.text = cur, text

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object:
        submit = getattr(self.cur, "_submit", None)
        if submit is None:  # pragma: no cover - a DuckDB whose Python layer is not 2.0's
            return self.cur.sql(self.text).__arrow_c_stream__(requested_schema)
        return submit(self.text, None, "stream", _DUCKDB_BATCH_ROWS).arrow_capsule()


_DUCKDB_BATCH_ROWS = 131_072
"""The batch size DuckDB's relations stream with (its ``_seam.DEFAULT_BATCH_SIZE``)."""


def stream(relation: duckdb.DuckDBPyRelation | Statement, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """``relation``'s result through the Arrow C stream interface, in batches of at most ``batch_rows``.

    Why not ``relation.to_arrow_reader``: it holds the GIL for much of the query. Measured with a
    thread that only sleeps 0.5 ms at a time beside three TPC-H Q1 partial aggregates on one
    engine thread: 24 stalls over 3 ms, 133 ms in all, with ``to_arrow_reader``; 3 stalls, 12 ms,
    through the C stream, which was also a little faster. On a worker those stalls are its other
    tasks' starts, its gRPC handlers and its shuffle reads waiting.
    """
    with pa.RecordBatchReader.from_stream(relation) as reader:
        for batch in reader:
            if batch.num_rows <= batch_rows:
                yield batch
            else:  # DuckDB's batches are 131,072 rows: zero-copy slices of the size asked
                for start in range(0, batch.num_rows, batch_rows):
                    yield batch.slice(start, batch_rows)


def _first_error(errors: list[BaseException], batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    try:
        yield from batches
    except Exception as exc:
        if not errors:
            errors.append(exc)
        raise


class _Inputs(Protocol):
    """What a task offers (``scan.TaskInputs``), typed loosely to avoid an import cycle."""

    task_number: int

    def feed_partitions(self, feed_id: str) -> list[int]: ...  # pragma: no cover
    def inbox(self, feed_id: str, partition: int) -> object: ...  # pragma: no cover
    def input_batches(self) -> object: ...  # pragma: no cover
    def read_partitions(self, producers: list[tuple[str, bytes]], start: int, end: int) -> Iterator[pa.RecordBatch]: ...  # pragma: no cover


@dataclass
class DuckTask:
    inputs: _Inputs
    schemas: Mapping[str, pa.Schema]
    """Every operator's output schema, by its field path (``plan.root.filter.input`` ...)."""
    roots: DataRoots
    batch_rows: int
    delay: Callable[[int], None]
    scan_reader: Callable[[plan_pb2.FeedScan, str], pa.RecordBatchReader]
    """The pyarrow reader of a feed scan this module does not fuse (CSV, IPC, extensions, ``units``)."""
    read_partitions: Callable[[list[tuple[str, bytes]], int, int], Iterator[pa.RecordBatch]]
    """Other stages' output (``scan.Env.read_partitions``: after what was read ahead)."""
    db: duckdb.DuckDBPyConnection
    """The worker's database (``duck._database``): the task's cursors are its connections."""
    cursors: list[duckdb.DuckDBPyConnection] = field(default_factory=list)
    sources: dict[str, pa.RecordBatchReader] = field(default_factory=dict)
    errors: list[BaseException] = field(default_factory=list)
    """Where sources put their error: a list the sources share, not the task itself, so that
    no source holds the task (a cycle would leave its cursors to the garbage collector, which
    may run on any thread, at any time)."""
    names: Iterator[int] = field(default_factory=itertools.count)


    def cursor(self) -> duckdb.DuckDBPyConnection:
        cur = self.db.cursor()
        self.cursors.append(cur)
        return cur

    def interrupt(self) -> None:
        for cur in list(self.cursors):
            try:
                cur.interrupt()
            except duckdb.Error:
                pass

    def close(self) -> None:
        """Stop and close the task's queries, on the thread that ran them (see docs/engine.md)."""
        self.interrupt()
        for cur in self.cursors:
            try:
                cur.close()
            except duckdb.Error:
                pass
        self.cursors.clear()
        self.sources.clear()

    def guarded(self, schema: pa.Schema, batches: Iterator[pa.RecordBatch]) -> pa.RecordBatchReader:
        """``batches`` for DuckDB to pull; the first error they raise becomes the task's."""
        return native_reader(schema, _first_error(self.errors, batches))

    @property
    def error(self) -> BaseException | None:
        """The first error a source raised: DuckDB reports it as its own, the task reports this one."""
        return self.errors[0] if self.errors else None

    def source(self, schema: pa.Schema, batches: Iterator[pa.RecordBatch]) -> str:
        """Register a stream as a relation of the task's query; its name."""
        name = f"__flight_source_{next(self.names)}"
        self.sources[name] = self.guarded(schema, batches)
        return name

    def failure(self, exc: Exception) -> BaseException:
        if self.error is not None:
            return self.error
        kind = error_kind(exc)
        if kind == "interrupt":
            return TaskCancelledError("task cancelled while the engine ran")
        first = clip(str(exc).split("\n", 1)[0], 500)  # DuckDB may quote the whole query
        if kind == "memory":
            return TaskFailedError(f"the query needs more memory than the worker's --memory-limit allows, even spilling to --spill-dir: {first}")
        return TaskFailedError(f"the engine failed: {first}")


_KINDS = (
    (duckdb.InterruptException, "INTERRUPT", "interrupt"),
    (duckdb.OutOfMemoryException, "Out of Memory Error", "memory"),
    (duckdb.BinderException, "Binder Error", "binder"),
    (duckdb.ConversionException, "Conversion Error", "conversion"),
    (duckdb.PermissionException, "Permission Error", "permission"),
    (duckdb.IOException, "IO Error", "io"),
)

ENGINE_ERRORS = (duckdb.Error, pa.ArrowException, OSError)
"""What a DuckDB query raises: its own errors when it starts; from its result stream, the Arrow error or
OSError pyarrow makes of DuckDB's (with DuckDB's text)."""


def error_kind(exc: BaseException) -> str:
    """What went wrong in DuckDB, from its exception type or, through an Arrow stream, its message."""
    text = str(exc)
    for cls, prefix, kind in _KINDS:
        if isinstance(exc, cls) or text.startswith(prefix):
            return kind
    return "other"

