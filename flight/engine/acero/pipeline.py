"""A stage's operators → one streaming Acero declaration per task.

Sources are Python generators behind ``record_batch_reader_source`` nodes (feed
scans pull units from the task's inboxes; map stages pull the batches streamed
up the exchange); filter and project are Acero nodes; a limit is applied to
the stream below it. ``compile_task`` checks everything it can before anything
runs, so a bad plan fails with a ``ProtocolError`` naming the field.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence

import pyarrow as pa
import pyarrow.acero as ac
import pyarrow.compute as pc

from flight.compute.expressions import bind, to_pyarrow
from flight.compute.relational import (
    JOIN_TYPES,
    aggregate_decl,
    aggregate_schema,
    handing_off,
    join_decl,
    join_schema,
    native_reader,
    sort_decl,
    union_batches,
)
from flight.engine.confine import DataRoots, worker_roots
from flight.engine.duck.sql import Untranslatable
from flight.engine.readers import UnitReadError, conform
from flight.engine.scan import Env, TaskInputs, feed_scan_reader, operators
from flight.errors import ProtocolError
from flight.wire._proto import plan_pb2
from flight.wire.arrow_types import normalize_schema
from flight.wire.ipc import read_ipc_stream
from flight.wire.limits import MAX_OUTPUT_PARTITIONS, MAX_PRODUCERS, check_count, clip
from flight.wire.protocol import decode_schema

__all__ = ["compile_task", "filter_node", "limit_batches", "project_node", "prune_of", "source_threads"]

log = logging.getLogger(__name__)


def limit_batches(batches: Iterable[pa.RecordBatch], count: int, offset: int) -> Iterator[pa.RecordBatch]:
    """Skip ``offset`` rows, then pass at most ``count`` rows; stop reading once done."""
    to_skip, left = offset, count
    for batch in batches:
        if left <= 0:
            break
        if to_skip:
            if batch.num_rows <= to_skip:
                to_skip -= batch.num_rows
                continue
            batch = batch.slice(to_skip)
            to_skip = 0
        if batch.num_rows > left:
            batch = batch.slice(0, left)
        left -= batch.num_rows
        yield batch
    _close_early(batches)


def _close_early(batches: Iterable[pa.RecordBatch]) -> None:
    """Stop the producer of ``batches``; Acero reports its own early cancellation, which is expected."""
    close = getattr(batches, "close", None)
    if close is not None:
        try:
            close()
        except pa.ArrowCancelled:
            pass


SMALL_INPUT_ROWS = 8192
"""A stage whose inputs are other stages' output and at most this many rows runs on Acero
(``scan.Env.prefetch``). TPC-H's final stages are a few dozen rows; Q10's, 43,000 rows of
seven grouping keys, two of them long strings, took 40 ms longer on Acero than on DuckDB."""

_BLOCKING = {"feed_scan", "exchange_input", "limit", "union", "shuffle_read"}
"""Operators that ``_compile`` turns into a ``record_batch_reader_source`` over a Python reader:
each may hold one thread of the I/O pool while it waits (for units, input, producers, or a
nested plan). A sort holds one only with a fetch."""


def source_threads(plan: plan_pb2.StagePlan) -> int:
    """Threads the task's pipeline may hold while waiting: what admission reserves for it.

    Mirrors ``_compile`` (a test checks they agree): one per blocking source; a root
    feed scan runs on the task's own thread without Acero, so it needs none.
    """
    if plan.root.WhichOneof("kind") == "feed_scan":
        return 0
    return sum(
        1 for op in operators(plan.root) if op.WhichOneof("kind") in _BLOCKING or (op.WhichOneof("kind") == "sort" and op.sort.fetch > 0)
    )


def compile_task(
    plan: plan_pb2.StagePlan,
    inputs: TaskInputs,
    batch_rows: int,
    unit_delay_s: float = 0.0,
    roots: DataRoots | None = None,
    engine: str | None = None,
    tag_units: bool = False,
) -> pa.RecordBatchReader:
    """The task's output stream. Raises ProtocolError for a plan this worker cannot run.

    ``engine``: ``duckdb`` or ``acero``; None means the process's setting (``duck.settings()``).
    A plan DuckDB cannot run with the IR's meaning runs on Acero (``duck.Untranslatable``).

    ``unit_delay_s`` slows every work unit down on purpose (the worker's ``--unit-delay-ms``).
    ``roots`` are where the task's readers may open files; ``None`` means this process's
    (``confine.worker_roots()``: what ``flight-worker --data-root`` set, else none at all).
    ``tag_units``: the rows say their work unit, in order (``tagged.py``; Acero, one unit at a time).
    """
    env = Env(inputs, batch_rows, unit_delay_s, worker_roots() if roots is None else roots)
    on_cancel = getattr(inputs, "on_cancel", None)
    if on_cancel is not None:
        # A worker's task: once it stops, its sources let go of it (relational._Handoff says why).
        on_cancel(env.handoffs.release)
    with handing_off(env.handoffs):
        return _compile_task(plan, env, engine, tag_units)


def _compile_task(plan: plan_pb2.StagePlan, env: Env, engine: str | None, tag_units: bool) -> pa.RecordBatchReader:
    if tag_units:
        from flight.engine.acero.tagged import tagged_task  # it builds on this module

        _tell(env.inputs, "acero")
        return tagged_task(plan, env)
    # Checks and types every operator (nothing runs yet); the declaration is Acero's plan.
    decl, schema = _compile(plan.root, env, "plan.root")
    from flight.engine.duck import engine as duck  # imported on first use: ``import flight`` stays light

    if (engine or duck.settings().engine) == "duckdb" and duck.worth_it(plan.root):
        # Translated when first pulled, on the task's own thread: the worker says the task is
        # ready (its schema is known) without waiting for the translation.
        return native_reader(schema, _duck_or_acero(plan, env, decl))
    _tell(env.inputs, "acero")
    return _acero(plan, env, decl)


def _tell(inputs: TaskInputs, engine: str) -> None:
    """Let the task know which engine computes it (its metrics say so)."""
    if hasattr(inputs, "engine"):
        inputs.engine = engine


def _acero(plan: plan_pb2.StagePlan, env: Env, decl: ac.Declaration) -> pa.RecordBatchReader:
    if plan.root.WhichOneof("kind") == "feed_scan":
        # Nothing to compute: Acero would only copy batches between threads.
        return feed_scan_reader(plan.root.feed_scan, env, "plan.root.feed_scan")
    return decl.to_reader(use_threads=True)


def _duck_or_acero(plan: plan_pb2.StagePlan, env: Env, decl: ac.Declaration) -> Iterator[pa.RecordBatch]:
    from flight.engine.duck import engine as duck

    # Started here, on the task's thread: the native readers made now are the task's too (no yield in these blocks).
    if env.prefetch(plan.root, SMALL_INPUT_ROWS):
        # Other stages' rows, and few: Acero's run costs less than DuckDB's start (Env.prefetch).
        _tell(env.inputs, "acero")
        with handing_off(env.handoffs):
            small = _acero(plan, env, decl)
        with small:
            yield from small
        return
    try:
        with handing_off(env.handoffs):
            reader = duck.run_duckdb(
                plan, env.inputs, env.schemas, env.roots, env.batch_rows, env.delay,
                lambda scan, field: feed_scan_reader(scan, env, field), env.read_partitions, getattr(env.inputs, "on_cancel", None),
            )
        _tell(env.inputs, "duckdb")
    except Untranslatable as exc:
        log.debug("stage plan runs on Acero: %s", clip(exc, 300))
        with handing_off(env.handoffs):
            reader = _acero(plan, env, decl)
        _tell(env.inputs, "acero")
    except (ProtocolError, UnitReadError):
        raise
    except Exception as exc:  # noqa: BLE001 - a gap in the translation (DuckDB, Arrow, recursion): Acero runs the plan
        # One clipped line, no traceback: the error may quote a huge plan, and formatting it would hold the GIL.
        log.warning("stage plan runs on Acero: the DuckDB translation failed: %s: %s", type(exc).__name__, clip(exc, 300))
        with handing_off(env.handoffs):
            reader = _acero(plan, env, decl)
        _tell(env.inputs, "acero")
    with reader:
        yield from reader


def _deferred(decl: ac.Declaration) -> Iterator[pa.RecordBatch]:
    """``decl``'s batches, its plan started only when first pulled.

    Starting a nested plan while the rest is still being compiled would let a later
    compile error unwind past a running plan whose sources wait for units: destroying
    its reader waits for those sources, which nothing would ever stop.
    """
    with decl.to_reader(use_threads=True) as reader:
        yield from reader


def _source(reader: pa.RecordBatchReader) -> ac.Declaration:
    options = ac.RecordBatchReaderSourceNodeOptions(reader)  # type: ignore[attr-defined]  # pyarrow-stubs lack it
    return ac.Declaration("record_batch_reader_source", options)


def _compile(op: plan_pb2.Operator, env: Env, field: str) -> tuple[ac.Declaration, pa.Schema]:
    """An operator as a declaration, with the schema it produces (checked before anything runs)."""
    decl, schema = _compile_op(op, env, field)
    env.schemas[field] = schema
    return decl, schema


def _compile_op(op: plan_pb2.Operator, env: Env, field: str) -> tuple[ac.Declaration, pa.Schema]:
    kind = op.WhichOneof("kind")
    if kind is None:
        raise ProtocolError(f"{field} has no operator set", field=field)
    here = f"{field}.{kind}"
    if kind == "feed_scan":
        reader = feed_scan_reader(op.feed_scan, env, here)
        return _source(reader), reader.schema
    if kind == "exchange_input":
        schema = normalize_schema(decode_schema(op.exchange_input.schema, f"{here}.schema"))
        batches = (conform(b, schema, "an input batch") for b in env.inputs.input_batches())
        return _source(native_reader(schema, batches)), schema
    if kind == "values":
        table = read_ipc_stream(op.values.ipc_stream, f"{here}.ipc_stream")
        if env.inputs.task_number != 0:
            table = table.schema.empty_table()
        return ac.Declaration("table_source", ac.TableSourceNodeOptions(table)), table.schema
    if kind == "filter":
        below = op.filter.input
        if below.WhichOneof("kind") == "feed_scan":  # the readers may skip what the filter excludes
            reader = feed_scan_reader(below.feed_scan, env, f"{here}.input.feed_scan", prune=prune_of(op.filter, f"{here}.predicate"))
            child, schema = _source(reader), reader.schema
            env.schemas[f"{here}.input"] = schema
        else:
            child, schema = _compile(below, env, f"{here}.input")
        return ac.Declaration.from_sequence([child, filter_node(op.filter, schema, here)]), schema
    if kind == "project":
        child, schema = _compile(op.project.input, env, f"{here}.input")
        project, out = project_node(op.project, schema, here)
        return ac.Declaration.from_sequence([child, project]), out
    if kind == "limit":
        lim = op.limit
        if lim.count < 0 or lim.offset < 0:
            raise ProtocolError(f"{here} has a negative count or offset", field=here)
        child, schema = _compile(lim.input, env, f"{here}.input")
        limited = limit_batches(_deferred(child), lim.count, lim.offset)
        return _source(native_reader(schema, limited)), schema
    if kind == "aggregate":
        return _aggregate(op.aggregate, env, here)
    if kind == "hash_join":
        return _hash_join(op.hash_join, env, here)
    if kind == "sort":
        srt = op.sort
        child, schema = _compile(srt.input, env, f"{here}.input")
        keys = [(k.column, k.descending) for k in srt.keys]
        _check_columns([k for k, _ in keys], schema, f"{here}.keys")
        if not keys or srt.fetch < 0:
            raise ProtocolError(f"{here} needs keys and a fetch of at least 0", field=here)
        decl = sort_decl(child, keys, srt.nulls_first)
        if not srt.fetch:
            return decl, schema
        top = limit_batches(_deferred(decl), srt.fetch, 0)
        return _source(native_reader(schema, top)), schema
    if kind == "union":
        if not op.union.inputs:
            raise ProtocolError(f"{here}.inputs is empty", field=f"{here}.inputs")
        parts = [_compile(child, env, f"{here}.inputs[{i}]") for i, child in enumerate(op.union.inputs)]
        schema = parts[0][1]
        for i, (_, other) in enumerate(parts[1:], 1):
            if not other.equals(schema):
                raise ProtocolError(f"{here}.inputs[{i}] has another schema than inputs[0]", field=f"{here}.inputs[{i}]")
        readers = (decl.to_reader(use_threads=True) for decl, _ in parts)
        return _source(native_reader(schema, union_batches(readers, schema))), schema
    if kind == "shuffle_read":
        rd = op.shuffle_read
        schema = normalize_schema(decode_schema(rd.schema, f"{here}.schema"))
        if rd.partition_end <= rd.partition_start:
            raise ProtocolError(f"{here} has an empty partition range", field=f"{here}.partition_end")
        check_count(len(rd.producers), MAX_PRODUCERS, f"{here}.producers", "producer tasks")
        check_count(rd.partition_end, MAX_OUTPUT_PARTITIONS, f"{here}.partition_end", "partitions")
        producers = [(p.url, p.stage_key) for p in rd.producers]
        rows = env.read_partitions(producers, rd.partition_start, rd.partition_end)
        batches = (conform(b, schema, f"stage {rd.stage_id} output") for b in rows)
        return _source(native_reader(schema, batches)), schema
    raise ProtocolError(f"{field}: operator {kind!r} is not supported by this worker", field=here)


def prune_of(flt: plan_pb2.Filter, field: str) -> pc.Expression | None:
    """A filter's predicate for the scan below it to skip data with (None if it cannot be had)."""
    try:
        return to_pyarrow(flt.predicate, field)
    except ProtocolError:
        return None  # the filter node reports it


def filter_node(flt: plan_pb2.Filter, schema: pa.Schema, here: str) -> ac.Declaration:
    """Acero's filter for ``flt`` over ``schema`` (checked: the predicate binds and is a bool)."""
    predicate = to_pyarrow(flt.predicate, f"{here}.predicate")
    t = bind(flt.predicate, predicate, schema, f"{here}.predicate")
    if t != pa.bool_():
        raise ProtocolError(f"{here}.predicate is of type {t}, not bool", field=f"{here}.predicate")
    return ac.Declaration("filter", ac.FilterNodeOptions(predicate))


def project_node(prj: plan_pb2.Project, schema: pa.Schema, here: str, keep: Sequence[str] = ()) -> tuple[ac.Declaration, pa.Schema]:
    """Acero's project for ``prj`` over ``schema``, with the schema it makes; ``keep``: columns
    of ``schema`` passed through after the projected ones (a hidden column, say)."""
    exprs, fields = [], []
    for i, ne in enumerate(prj.exprs):
        where = f"{here}.exprs[{i}].expr"
        expr = to_pyarrow(ne.expr, where)
        fields.append(pa.field(ne.name, bind(ne.expr, expr, schema, where)))
        exprs.append(expr)
    if not exprs:
        raise ProtocolError(f"{here}.exprs is empty", field=f"{here}.exprs")
    for name in keep:
        if name in {f.name for f in fields}:
            raise ProtocolError(f"{here} makes a column named {name!r}, which is reserved", field=f"{here}.exprs")
        exprs.append(pc.field(name))
        fields.append(schema.field(name))
    return ac.Declaration("project", ac.ProjectNodeOptions(exprs, [f.name for f in fields])), pa.schema(fields)


def _check_columns(names: Iterable[str], schema: pa.Schema, field: str) -> None:
    for n in names:
        if n not in schema.names:
            raise ProtocolError(f"{field}: column {n!r} is not in the input ({schema.names})", field=field)


_AGG_FUNCTIONS = {"count", "count_all", "count_distinct", "sum", "min", "max", "mean"}


def _aggregate(agg: plan_pb2.Aggregate, env: Env, here: str) -> tuple[ac.Declaration, pa.Schema]:
    child, schema = _compile(agg.input, env, f"{here}.input")
    _check_columns(agg.keys, schema, f"{here}.keys")
    calls = []
    for i, a in enumerate(agg.aggregates):
        where = f"{here}.aggregates[{i}]"
        if a.function not in _AGG_FUNCTIONS:
            raise ProtocolError(f"{where}: aggregate {a.function!r} is not one of {sorted(_AGG_FUNCTIONS)}", field=f"{where}.function")
        if a.function != "count_all":
            _check_columns([a.column], schema, f"{where}.column")
        calls.append((a.function, a.column, a.name))
    try:
        out = aggregate_schema(schema, agg.keys, calls)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise ProtocolError(f"{here} does not fit its input: {exc}", field=here) from exc
    return aggregate_decl(child, agg.keys, calls), out


def _hash_join(join: plan_pb2.HashJoin, env: Env, here: str) -> tuple[ac.Declaration, pa.Schema]:
    if join.join_type not in JOIN_TYPES:
        raise ProtocolError(f"{here}.join_type {join.join_type!r} is not one of {JOIN_TYPES}", field=f"{here}.join_type")
    if not join.left_keys or len(join.left_keys) != len(join.right_keys):
        raise ProtocolError(f"{here} needs as many left keys as right keys", field=f"{here}.left_keys")
    left, ls = _compile(join.left, env, f"{here}.left")
    right, rs = _compile(join.right, env, f"{here}.right")
    _check_columns(join.left_keys, ls, f"{here}.left_keys")
    _check_columns(join.right_keys, rs, f"{here}.right_keys")
    args = (join.join_type, join.left_keys, join.right_keys, join.right_suffix)
    try:
        out = join_schema(ls, rs, *args)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise ProtocolError(f"{here} does not fit its inputs: {exc}", field=here) from exc
    return join_decl(left, right, *args), out
