"""DuckDB as the per-task engine: a checked stage plan becomes one SQL query per task.

Why DuckDB, with the measurements, is in docs/engine.md. How a task runs:

* ``pipeline.compile_task`` checks and types the plan exactly as before (Acero binds
  every expression over empty inputs), so what reaches this module is a plan the
  worker accepted; the schema of every operator comes from that pass, and the
  task's output is conformed to it, so both engines produce the same types.
* **Work units are read by DuckDB itself.** Above each Parquet feed scan, the longest
  chain of filters and projects (and a ``partial`` aggregate on top of it, which a
  later aggregate merges) is a *unit fragment*: it runs as one DuckDB query per
  work unit, ``... FROM read_parquet('<file>')``, so decoding, filtering and partial
  aggregation happen in DuckDB's threads with filter pushdown into the reader, and
  Python sees one batch per ~100k result rows, never a batch per input batch.
  Units with row groups, or whose file name DuckDB would read as a glob, go through
  the pyarrow reader and the same query.
* Everything else of the stage (joins, final aggregates, sorts, limits, unions) is one
  query over *sources*: the unit fragments' output, shuffle reads from other workers,
  map input and values, each a ``RecordBatchReader`` registered on the task's cursor.
* Text: ``flight.engine.sql`` quotes every identifier and renders every literal; a
  plan it cannot express with the IR's meaning raises ``Untranslatable`` and the
  task runs on Acero instead (so does a query DuckDB refuses to bind).
* One database per worker process (``configure``): its ``memory_limit`` is the worker's
  ``--memory-limit``; joins, aggregates and sorts past it spill to ``--spill-dir``.
  File access is limited to the worker's data roots inside DuckDB too (defence in
  depth: every path was already checked by ``ReaderContext.open_path``), extensions
  never load, and the configuration is locked.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa

from flight._proto import plan_pb2
from flight.engine.confine import DataRoots
from flight.engine.readers import (
    PathRefused,
    ReaderContext,
    UnitReadError,
    conform,
    read_parquet,
)
from flight.engine.sql import (
    Untranslatable,
    column_list,
    expression_sql,
    ident,
    sql_type,
)
from flight.errors import TaskCancelledError, TaskFailedError
from flight.ipc import read_ipc_stream

__all__ = ["EngineSettings", "Untranslatable", "configure", "run_duckdb", "settings", "worth_it"]

log = logging.getLogger(__name__)

_UNITS = "\x00units\x00"
"""Where a unit fragment's FROM goes; a NUL never appears in translated text, so it cannot collide."""
_GLOB = frozenset("*?[{")


@dataclass(frozen=True)
class EngineSettings:
    """The process's engine settings; ``flight-worker`` sets them from its flags."""

    engine: str = "duckdb"
    """``duckdb``, or ``acero`` to run every task on the Acero pipeline."""
    memory_limit: int | None = None
    """Bytes DuckDB may hold before it spills (None: DuckDB's default, 80% of RAM)."""
    spill_dir: str | None = None
    threads: int | None = None


_settings = EngineSettings()
_dbs: dict[tuple[bool, tuple[str, ...]], duckdb.DuckDBPyConnection] = {}
_lock = threading.Lock()


def configure(new: EngineSettings) -> None:
    """Set this process's engine settings (before the first task; later databases use them)."""
    global _settings
    with _lock:
        _settings = new
    close_databases()


@atexit.register
def close_databases() -> None:
    """Close the process's databases (at exit too: DuckDB objects alive then make its bindings complain)."""
    with _lock:
        for con in _dbs.values():
            con.close()
        _dbs.clear()


def settings() -> EngineSettings:
    return _settings


def _database(roots: DataRoots) -> duckdb.DuckDBPyConnection:
    """The process's DuckDB database for tasks confined to ``roots`` (one per distinct roots)."""
    key = (roots.unrestricted, roots.paths)
    with _lock:
        con = _dbs.get(key)
        if con is not None:
            return con
        # Tasks run on cursors, which never print DuckDB's progress bar.
        config: dict[str, str | int | bool] = {
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
            # Give memory back once queries end, so an idle worker does not sit on its peak.
            "allocator_flush_threshold": "16MiB",
            "allocator_background_threads": True,
            # Rows are unordered unless a Sort says otherwise: not keeping input order lets DuckDB
            # stream and spill with less memory (a sort's order is kept either way).
            "preserve_insertion_order": False,
        }
        if _settings.memory_limit:
            config["memory_limit"] = f"{_settings.memory_limit // (1 << 20)}MiB"
        if _settings.threads:
            config["threads"] = _settings.threads
        if _settings.spill_dir:
            config["temp_directory"] = _settings.spill_dir
        con = duckdb.connect(":memory:", config=config)
        if not roots.unrestricted:
            dirs = [p.rstrip("/") + "/" for p in roots.paths]
            if dirs:
                con.execute("SET allowed_directories = $1", [dirs])
            con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
        _dbs[key] = con
        return con


# ---------------------------------------------------------------- the task


class _Inputs:
    """What a task offers (``pipeline.TaskInputs``), typed loosely to avoid an import cycle."""

    task_number: int

    def feed_partitions(self, feed_id: str) -> list[int]: ...  # pragma: no cover
    def inbox(self, feed_id: str, partition: int) -> object: ...  # pragma: no cover
    def input_batches(self) -> object: ...  # pragma: no cover
    def read_partitions(self, producers: list[tuple[str, bytes]], start: int, end: int) -> Iterator[pa.RecordBatch]: ...  # pragma: no cover


@dataclass
class _Task:
    inputs: _Inputs
    schemas: Mapping[str, pa.Schema]
    """Every operator's output schema, by its field path (``plan.root.filter.input`` ...)."""
    roots: DataRoots
    batch_rows: int
    delay: Callable[[int], None]
    scan_reader: Callable[[plan_pb2.FeedScan, str], pa.RecordBatchReader]
    """The pyarrow reader of a feed scan this module does not fuse (CSV, IPC, extensions, ``units``)."""
    db: duckdb.DuckDBPyConnection = field(init=False)
    cursors: list[duckdb.DuckDBPyConnection] = field(default_factory=list)
    sources: dict[str, pa.RecordBatchReader] = field(default_factory=dict)
    error: BaseException | None = None
    """The first error a source raised: DuckDB reports it as its own, the task reports this one."""
    names: Iterator[int] = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        self.db = _database(self.roots)

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
        for cur in self.cursors:
            try:
                cur.close()
            except duckdb.Error:
                pass
        self.cursors.clear()

    def guarded(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        try:
            yield from batches
        except BaseException as exc:
            if self.error is None:
                self.error = exc
            raise

    def source(self, schema: pa.Schema, batches: Iterator[pa.RecordBatch]) -> str:
        """Register a stream as a relation of the task's query; its name."""
        name = f"__flight_source_{next(self.names)}"
        self.sources[name] = pa.RecordBatchReader.from_batches(schema, self.guarded(batches))
        return name

    def failure(self, exc: Exception) -> BaseException:
        if self.error is not None:
            return self.error
        kind = _kind(exc)
        if kind == "interrupt":
            return TaskCancelledError("task cancelled while the engine ran")
        first = str(exc).split("\n", 1)[0]
        if kind == "memory":
            return TaskFailedError(f"the query needs more memory than the worker's --memory-limit allows, even spilling to --spill-dir: {first}")
        return TaskFailedError(f"the engine failed: {first}")


def run_duckdb(
    plan: plan_pb2.StagePlan,
    inputs: object,
    schemas: Mapping[str, pa.Schema],
    roots: DataRoots,
    batch_rows: int,
    delay: Callable[[int], None],
    scan_reader: Callable[[plan_pb2.FeedScan, str], pa.RecordBatchReader],
    on_cancel: Callable[[Callable[[], None]], None] | None = None,
) -> pa.RecordBatchReader:
    """The task's output stream, computed by DuckDB; ``Untranslatable`` if it cannot be (use Acero)."""
    if not worth_it(plan.root):
        raise Untranslatable("nothing to compute that DuckDB does better: Acero streams it batch by batch")
    task = _Task(inputs, schemas, roots, batch_rows, delay, scan_reader)  # type: ignore[arg-type]
    try:
        translator = _Translator(task)
        text = translator.relation(plan.root, "plan.root")
        out_schema = schemas["plan.root"]
        if translator.root_fragment is not None:  # the whole stage is one unit fragment: its output is the task's
            reader = pa.RecordBatchReader.from_batches(out_schema, _closing(task, translator.root_fragment))
        else:
            cur = task.cursor()
            for name, source in task.sources.items():
                cur.register(name, source)
            try:
                relation = cur.sql(text)  # parses and binds: a refusal here is a translation gap, not a task failure
            except duckdb.Error as exc:
                raise Untranslatable(f"DuckDB does not bind the translated plan: {str(exc).splitlines()[0]}") from None
            reader = pa.RecordBatchReader.from_batches(out_schema, _closing(task, _results(task, relation, out_schema)))
    except BaseException:
        task.close()
        raise
    if on_cancel is not None:
        on_cancel(task.interrupt)
    return reader


def worth_it(root: plan_pb2.Operator) -> bool:
    """Whether the stage reads Parquet units or joins, aggregates or sorts: what DuckDB speeds up.

    Filters and projects over streamed input (map stages, custom readers, shuffle reads) stay
    on Acero, which passes each batch on as it comes (DuckDB gathers ``batch_rows`` rows first).
    """
    stack = [root]
    while stack:
        op = stack.pop()
        kind = op.WhichOneof("kind")
        if kind in ("aggregate", "hash_join", "sort") or (kind == "feed_scan" and op.feed_scan.reader == "parquet"):
            return True
        if kind == "union":
            stack.extend(op.union.inputs)
        elif kind is not None and hasattr(getattr(op, kind), "input"):
            stack.append(getattr(op, kind).input)
    return False


def _results(task: _Task, relation: duckdb.DuckDBPyRelation, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    try:
        for batch in relation.to_arrow_reader(task.batch_rows):
            if batch.num_rows:
                yield conform(batch, schema, "the engine's output")
    except _ENGINE_ERRORS as exc:
        raise task.failure(exc) from None


def _closing(task: _Task, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    try:
        yield from batches
    finally:
        task.close()


# ------------------------------------------------------------ unit fragments


_PER_UNIT_JOINS = ("inner", "left outer", "left semi", "left anti")
"""Joins that distribute over a union of left pieces: (L1 ∪ L2) ⋈ R = (L1 ⋈ R) ∪ (L2 ⋈ R)."""


def _chain(op: plan_pb2.Operator, path: str) -> tuple[plan_pb2.FeedScan, str] | None:
    """The Parquet feed scan (and its path) under a chain of filters, projects and joins that may run
    per work unit (the scan on the left, a side built once on the right), if ``op`` is such a chain."""
    while True:
        kind = op.WhichOneof("kind")
        if kind == "feed_scan":
            return (op.feed_scan, path) if op.feed_scan.reader == "parquet" else None
        if kind == "hash_join" and op.hash_join.join_type in _PER_UNIT_JOINS and not _scans(op.hash_join.right):
            op, path = op.hash_join.left, f"{path}.hash_join.left"
        elif kind in ("filter", "project"):
            op, path = getattr(op, kind).input, f"{path}.{kind}.input"
        else:
            return None


def _scans(op: plan_pb2.Operator) -> bool:
    """Whether ``op`` reads a feed. A join's right side that does not is another stage's output (in a
    leaf stage: a broadcast, small by the planner's estimate), worth building once per work unit;
    one that does is read once, as a source, and joined with the fragment's stream."""
    stack = [op]
    while stack:
        node = stack.pop()
        kind = node.WhichOneof("kind")
        if kind == "feed_scan":
            return True
        if kind == "union":
            stack.extend(node.union.inputs)
        elif kind == "hash_join":
            stack.extend((node.hash_join.left, node.hash_join.right))
        elif kind is not None and hasattr(getattr(node, kind), "input"):
            stack.append(getattr(node, kind).input)
    return False


def _fragment_scan(op: plan_pb2.Operator, path: str) -> tuple[plan_pb2.FeedScan, str] | None:
    """The scan of the unit fragment rooted at ``op`` (and its path), or None when ``op`` roots none."""
    if op.WhichOneof("kind") == "aggregate" and op.aggregate.partial:
        return _chain(op.aggregate.input, f"{path}.aggregate.input")
    return _chain(op, path)


def _fragment(
    task: _Task, op: plan_pb2.Operator, path: str, text: str, builds: list[tuple[str, str]], schema: pa.Schema | None = None
) -> Iterator[pa.RecordBatch]:
    """The fragment at ``path`` run once per work unit, every unit's rows (of ``schema``, by default
    the operator's) in turn.

    ``builds`` are the (table, query) pairs of its joins' right sides: each is computed
    once, into a temporary table of the fragment's cursor, before the first unit.
    """
    found = _fragment_scan(op, path)
    assert found is not None
    scan, scan_path = found
    schema = schema if schema is not None else task.schemas[path]
    ctx = ReaderContext(schema=task.schemas[scan_path], columns=list(scan.columns) or None, roots=task.roots,
                        batch_rows=task.batch_rows, options=dict(scan.reader_options))
    feed_id = scan.feed.feed_id
    cur = task.cursor()
    if builds:
        for name, source in task.sources.items():
            cur.register(name, source)
        for table, query in builds:
            try:
                cur.execute(f"CREATE TEMP TABLE {table} AS {query}")
            except _ENGINE_ERRORS as exc:
                raise task.failure(exc) from None
    count = itertools.count()
    for got in _unit_batches(task, feed_id):
        files: list[tuple[str, str, str]] = []
        for partition, unit in got:
            where = f"work unit {next(count)} of feed {feed_id!r} partition {partition}"
            try:
                path, real = _plain_file(unit.body, ctx)
            except PathRefused as exc:
                raise PathRefused(f"{where}: {exc}") from None
            if real:
                files.append((where, path, real))
                continue
            try:  # row groups (or an odd file name): pyarrow reads the unit, DuckDB runs the fragment
                yield from _pyarrow_unit(task, cur, unit.body, ctx, text, schema, where)
            except UnitReadError as exc:
                raise type(exc)(f"{where}: {exc}") from None
        if files:
            yield from _files(task, cur, files, text, schema)
        task.delay(len(got))
        for _, unit in got:
            unit.done()


def _unit_batches(task: _Task, feed_id: str) -> Iterator[list[tuple[int, Any]]]:
    """The task's units of ``feed_id``, in batches of those already here, from all its partitions.

    Every unit that has arrived joins one query (DuckDB reads the files in parallel, and each
    query has a fixed cost): each round takes what each partition has (waiting for at least one
    unit there, or its end) and the batch runs once all partitions were asked.
    """
    inboxes = [(p, task.inputs.inbox(feed_id, p)) for p in task.inputs.feed_partitions(feed_id)]
    while inboxes:
        batch: list[tuple[int, Any]] = []
        for partition, inbox in list(inboxes):
            got = inbox.take(UNITS_PER_QUERY)  # type: ignore[attr-defined]
            if not got:
                inboxes.remove((partition, inbox))
            batch += [(partition, unit) for unit in got]
            if len(batch) >= UNITS_PER_QUERY:
                break
        if batch:
            yield batch


UNITS_PER_QUERY = 64
"""Most work units one fragment query reads."""


def _plain_file(body: bytes, ctx: ReaderContext) -> tuple[str, str]:
    """The unit's path and the real path DuckDB may read it at; ``""`` as the real path when pyarrow
    must read it (row groups, a glob character, or not a FileUnit: its reader says so in its words)."""
    unit = plan_pb2.FileUnit()
    try:
        unit.ParseFromString(body)
    except Exception:  # noqa: BLE001 - DecodeError
        return "", ""
    if not unit.path:
        return "", ""
    real = ctx.open_path(unit.path)
    if unit.row_groups or _GLOB & set(real) or "\x00" in real:
        return unit.path, ""
    return unit.path, real


def _files(
    task: _Task, cur: duckdb.DuckDBPyConnection, files: list[tuple[str, str, str]], text: str, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """The fragment over whole Parquet files, one query; a failure names the file that causes it."""
    source = "read_parquet([" + ", ".join("'" + real.replace("'", "''") + "'" for _, _, real in files) + "])"
    try:
        for batch in cur.sql(text.replace(_UNITS, source)).to_arrow_reader(task.batch_rows):
            if batch.num_rows:
                yield conform(batch, schema, files[0][0] if len(files) == 1 else "a fragment's output")
    except _ENGINE_ERRORS as exc:
        if task.error is not None or _kind(exc) in ("interrupt", "memory"):
            raise task.failure(exc) from None
        for where, path, real in files:  # which file? (the task fails either way: nothing is read twice)
            try:
                cur.execute(f"SELECT count(*) FROM ({text.replace(_UNITS, 'read_parquet(' + chr(39) + real.replace(chr(39), chr(39) * 2) + chr(39) + ')')})")
            except _ENGINE_ERRORS as one:
                raise UnitReadError(f"{where}: cannot read Parquet file {path!r}: {_why(one, real)}") from None
        raise UnitReadError(f"cannot read Parquet files {[p for _, p, _ in files]}: {_why(exc, files[0][2])}") from None


def _pyarrow_unit(
    task: _Task, cur: duckdb.DuckDBPyConnection, body: bytes, ctx: ReaderContext, text: str, schema: pa.Schema, where: str
) -> Iterator[pa.RecordBatch]:
    name = "__flight_unit"
    cur.register(name, pa.RecordBatchReader.from_batches(ctx.schema, task.guarded(
        conform(b, ctx.schema, where) for b in read_parquet(body, ctx))))
    try:
        for batch in cur.sql(text.replace(_UNITS, name)).to_arrow_reader(task.batch_rows):
            if batch.num_rows:
                yield conform(batch, schema, where)
    except _ENGINE_ERRORS as exc:
        raise task.failure(exc) from None
    finally:
        cur.unregister(name)


_KINDS = (
    (duckdb.InterruptException, "INTERRUPT", "interrupt"),
    (duckdb.OutOfMemoryException, "Out of Memory Error", "memory"),
    (duckdb.BinderException, "Binder Error", "binder"),
    (duckdb.ConversionException, "Conversion Error", "conversion"),
    (duckdb.PermissionException, "Permission Error", "permission"),
    (duckdb.IOException, "IO Error", "io"),
)

_ENGINE_ERRORS = (duckdb.Error, pa.ArrowException, OSError)
"""What a DuckDB query raises: its own errors when it starts; from its result stream, the Arrow error or
OSError pyarrow makes of DuckDB's (with DuckDB's text)."""


def _kind(exc: BaseException) -> str:
    """What went wrong in DuckDB, from its exception type or, through an Arrow stream, its message."""
    text = str(exc)
    for cls, prefix, kind in _KINDS:
        if isinstance(exc, cls) or text.startswith(prefix):
            return kind
    return "other"


def _why(exc: BaseException, real: str) -> str:
    """DuckDB's failure in fixed words: its messages quote resolved paths and file contents."""
    kind = _kind(exc)
    fixed = {
        "interrupt": "the task was cancelled",
        "memory": "the worker's memory limit was reached",
        "binder": "its columns are not the scan's (a column is missing or of another type)",
        "conversion": "a value does not convert to the scan's type",
        "permission": "outside the worker's data roots",
    }
    if kind in fixed:
        return fixed[kind]
    if not os.path.exists(real):
        return "no such file"
    if os.path.isdir(real):
        return "it is a directory"
    if kind == "io" and not os.access(real, os.R_OK):
        return "permission denied"
    return "not a valid Parquet file, or a damaged one"


# --------------------------------------------------------------- translation


class _Translator:
    """Operators → SQL text over the task's sources (see the module docstring)."""

    def __init__(self, task: _Task) -> None:
        self.task = task
        self.aliases = itertools.count()
        self.root_fragment: Iterator[pa.RecordBatch] | None = None

    def sub(self, op: plan_pb2.Operator, path: str) -> str:
        """``op`` as a FROM item: a parenthesised query with an alias."""
        return f"({self.relation(op, path)}) AS t{next(self.aliases)}"

    def relation(self, op: plan_pb2.Operator, path: str) -> str:
        if _fragment_scan(op, path) is None:
            if op.WhichOneof("kind") == "aggregate":
                merged = self.local_partial(op, path)
                if merged is not None:
                    return merged
            return self.operator(op, path)
        fragment = _FragmentTranslator(self.task)
        text = fragment.relation(op, path)
        batches = _fragment(self.task, op, path, text, fragment.builds)
        if path == "plan.root":
            self.root_fragment = batches  # the whole stage is one fragment: its output is the task's
            return text
        # A unit fragment below other operators: its per-unit output is a source of this query.
        return f"SELECT * FROM {self.task.source(self.task.schemas[path], batches)}"

    def operator(self, op: plan_pb2.Operator, path: str) -> str:
        kind = op.WhichOneof("kind")
        here = f"{path}.{kind}"
        task = self.task
        schema = task.schemas[path]
        if kind == "feed_scan":  # not Parquet: the scan's own reader is a source
            return f"SELECT * FROM {task.source(schema, iter(task.scan_reader(op.feed_scan, here)))}"
        if kind == "values":
            table = read_ipc_stream(op.values.ipc_stream, f"{here}.ipc_stream")
            rows = table.to_batches() if task.inputs.task_number == 0 else []
            return f"SELECT * FROM {task.source(schema, iter(rows))}"
        if kind == "exchange_input":
            batches = (conform(b, schema, "an input batch") for b in task.inputs.input_batches())  # type: ignore[attr-defined]
            return f"SELECT * FROM {task.source(schema, batches)}"
        if kind == "shuffle_read":
            rd = op.shuffle_read
            producers = [(p.url, p.stage_key) for p in rd.producers]
            where = f"stage {rd.stage_id} output"
            read = task.inputs.read_partitions(producers, rd.partition_start, rd.partition_end)
            return f"SELECT * FROM {task.source(schema, (conform(b, schema, where) for b in read))}"
        if kind == "filter":
            child_schema = task.schemas[f"{here}.input"]
            predicate = expression_sql(op.filter.predicate, child_schema, f"{here}.predicate")
            return f"SELECT * FROM {self.sub(op.filter.input, f'{here}.input')} WHERE {predicate}"
        if kind == "project":
            child_schema = task.schemas[f"{here}.input"]
            items = []
            for i, ne in enumerate(op.project.exprs):
                text = expression_sql(ne.expr, child_schema, f"{here}.exprs[{i}].expr")
                items.append(f"CAST({text} AS {sql_type(schema.field(i).type)}) AS {ident(ne.name)}")
            return f"SELECT {', '.join(items)} FROM {self.sub(op.project.input, f'{here}.input')}"
        if kind == "limit":
            lim = op.limit
            return f"SELECT * FROM {self.sub(lim.input, f'{here}.input')} LIMIT {int(lim.count)} OFFSET {int(lim.offset)}"
        if kind == "sort":
            srt = op.sort
            nulls = "NULLS FIRST" if srt.nulls_first else "NULLS LAST"
            keys = ", ".join(f"{ident(k.column)} {'DESC' if k.descending else 'ASC'} {nulls}" for k in srt.keys)
            fetch = f" LIMIT {int(srt.fetch)}" if srt.fetch else ""
            return f"SELECT * FROM {self.sub(srt.input, f'{here}.input')} ORDER BY {keys}{fetch}"
        if kind == "union":
            parts = [f"SELECT * FROM {self.sub(child, f'{here}.inputs[{i}]')}" for i, child in enumerate(op.union.inputs)]
            return " UNION ALL ".join(parts)
        if kind == "aggregate":
            return self.aggregate(op.aggregate, here, schema)
        if kind == "hash_join":
            return self.join(op.hash_join, here, schema)
        raise Untranslatable(f"operator {kind}")

    def local_partial(self, op: plan_pb2.Operator, path: str) -> str | None:
        """An aggregate over a unit fragment, split here as the planner splits one across stages:
        a partial aggregate per work unit (inside the fragment's query), merged by this query.

        The units' rows then never cross into Python; only each unit's groups do. None when the
        aggregate does not split (``count_distinct``, or a mean that is not a float).
        """
        agg = op.aggregate
        in_path = f"{path}.aggregate.input"
        if agg.partial or _fragment_scan(agg.input, in_path) is None:
            return None
        task = self.task
        out, source = task.schemas[path], task.schemas[in_path]
        parts: list[str] = [ident(k) for k in agg.keys]
        fields: list[pa.Field] = [source.field(k) for k in agg.keys]
        merged: dict[str, str] = {}
        for i, a in enumerate(agg.aggregates):
            t = out.field(a.name).type
            p, arg = f"__part{i}", ident(a.column) if a.column else ""
            if a.function in ("count", "count_all"):
                parts.append(f"count({arg or '*'}) AS {p}")
                fields.append(pa.field(p, pa.int64()))
                merged[a.name] = f"coalesce(sum({p}), 0)"
            elif a.function in ("sum", "min", "max"):
                parts.append(f"CAST({a.function}({arg}) AS {sql_type(t)}) AS {p}")
                fields.append(pa.field(p, t))
                merged[a.name] = f"{a.function}({p})"
            elif a.function == "mean" and pa.types.is_floating(t):
                parts.append(f"CAST(sum({arg}) AS DOUBLE) AS {p}s, count({arg}) AS {p}c")
                fields += [pa.field(f"{p}s", pa.float64()), pa.field(f"{p}c", pa.int64())]
                merged[a.name] = f"(CASE WHEN sum({p}c) = 0 THEN NULL ELSE sum({p}s) / sum({p}c) END)"
            else:
                return None
        fragment = _FragmentTranslator(task)
        group = f" GROUP BY {column_list(agg.keys)}" if agg.keys else ""
        text = f"SELECT {', '.join(parts)} FROM ({fragment.relation(agg.input, in_path)}) AS t{group}"
        schema = pa.schema(fields)
        name = task.source(schema, _fragment(task, agg.input, in_path, text, fragment.builds, schema))
        items = [f"CAST({merged.get(f.name, ident(f.name))} AS {sql_type(f.type)}) AS {ident(f.name)}" for f in out]
        return f"SELECT {', '.join(items)} FROM {name}{group}"

    def aggregate(self, agg: plan_pb2.Aggregate, here: str, schema: pa.Schema) -> str:
        calls = {}
        for a in agg.aggregates:
            arg = ident(a.column) if a.column else ""
            calls[a.name] = {
                "count_all": "count(*)",
                "count": f"count({arg})",
                "count_distinct": f"count(DISTINCT {arg})",
                "sum": f"sum({arg})",
                "min": f"min({arg})",
                "max": f"max({arg})",
                "mean": f"avg({arg})",
            }[a.function]
        items = []
        for f in schema:
            text = calls.get(f.name, ident(f.name))
            items.append(f"CAST({text} AS {sql_type(f.type)}) AS {ident(f.name)}")
        group = f" GROUP BY {column_list(agg.keys)}" if agg.keys else ""
        return f"SELECT {', '.join(items)} FROM {self.sub(agg.input, f'{here}.input')}{group}"

    def right_side(self, join: plan_pb2.HashJoin, here: str) -> str:
        return f"({self.relation(join.right, f'{here}.right')})"

    def join(self, join: plan_pb2.HashJoin, here: str, schema: pa.Schema) -> str:
        left = self.task.schemas[f"{here}.left"]
        right = self.task.schemas[f"{here}.right"]
        kind = {
            "inner": "JOIN", "left outer": "LEFT JOIN", "right outer": "RIGHT JOIN", "full outer": "FULL JOIN",
            "left semi": "SEMI JOIN", "left anti": "ANTI JOIN",
        }[join.join_type]
        on = " AND ".join(f"l.{ident(a)} = r.{ident(b)}" for a, b in zip(join.left_keys, join.right_keys))
        sides = [("l", n) for n in left.names]
        if join.join_type not in ("left semi", "left anti"):
            sides += [("r", n) for n in right.names]
        if len(sides) != len(schema):
            raise Untranslatable("a join whose output is not its inputs' columns")
        items = [f"{q}.{ident(n)} AS {ident(out)}" for (q, n), out in zip(sides, schema.names)]
        lsub = f"({self.relation(join.left, f'{here}.left')}) AS l"
        rsub = f"{self.right_side(join, here)} AS r"
        return f"SELECT {', '.join(items)} FROM {lsub} {kind} {rsub} ON {on}"


class _FragmentTranslator(_Translator):
    """A unit fragment's query: the scan reads ``_UNITS`` (one unit's file, filled in per unit), and
    a join's right side is a table built once (``builds``) by a query over the task's sources."""

    def __init__(self, task: _Task) -> None:
        super().__init__(task)
        self.builds: list[tuple[str, str]] = []

    def right_side(self, join: plan_pb2.HashJoin, here: str) -> str:
        table = f"__flight_build_{next(self.task.names)}"
        self.builds.append((table, _Translator(self.task).relation(join.right, f"{here}.right")))
        return table

    def relation(self, op: plan_pb2.Operator, path: str) -> str:
        if op.WhichOneof("kind") == "feed_scan":
            schema = self.task.schemas[path]
            items = ", ".join(f"CAST({ident(f.name)} AS {sql_type(f.type)}) AS {ident(f.name)}" for f in schema)
            return f"SELECT {items} FROM {_UNITS}"
        return self.operator(op, path)
