"""A stage's operators → one streaming Acero declaration per task.

Sources are Python generators behind ``record_batch_reader_source`` nodes (feed
scans pull units from the task's inboxes; map stages pull the batches streamed
up the exchange); filter and project are Acero nodes; a limit is applied to
the stream below it. ``compile_plan`` checks everything it can before anything
runs, so a bad plan fails with a ``ProtocolError`` naming the field. Which engine runs a
task is ``flight.engine.select``'s decision.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.acero as ac
import pyarrow.compute as pc

from flight.compute.expressions import bind, to_pyarrow
from flight.compute.relational import (
    AGGREGATES,
    DUCKDB_AGGREGATES,
    JOIN_TYPES,
    aggregate_decl,
    aggregate_schema,
    join_decl,
    join_schema,
    native_reader,
    sort_decl,
    union_batches,
)
from flight.compute.window import FUNCTIONS as WINDOW_FUNCTIONS
from flight.compute.window import window_type
from flight.engine.pruning import prune_of
from flight.engine.readers import conform
from flight.engine.scan import Env, feed_scan_reader
from flight.errors import ProtocolError
from flight.wire._proto import plan_pb2
from flight.wire.arrow_types import normalize_schema
from flight.wire.ipc import read_ipc_stream
from flight.wire.limits import MAX_OUTPUT_PARTITIONS, MAX_PRODUCERS, MAX_PROJECTED, MAX_SEPARATOR_CHARS, check_count
from flight.wire.operators import operators
from flight.wire.protocol import decode_schema

__all__ = ["compile_plan", "filter_node", "limit_batches", "project_node", "source_threads"]

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


def _deferred(decl: ac.Declaration) -> Iterator[pa.RecordBatch]:
    """``decl``'s batches, its plan started only when first pulled.

    Starting a nested plan while the rest is still being compiled would let a later
    compile error unwind past a running plan whose sources wait for units: destroying
    its reader waits for those sources, which nothing would ever stop.
    """
    with decl.to_reader(use_threads=True) as reader:
        yield from reader


def _source(reader: pa.RecordBatchReader, env: Env) -> ac.Declaration:
    if env.gate is not None:  # a streaming plan: its sources wait while the task's reader is away (engine/gate.py)
        reader = pa.RecordBatchReader.from_batches(reader.schema, env.gate.source(reader))
    options = ac.RecordBatchReaderSourceNodeOptions(reader)  # type: ignore[attr-defined]  # pyarrow-stubs lack it
    return ac.Declaration("record_batch_reader_source", options)


def compile_plan(op: plan_pb2.Operator, env: Env, field: str) -> tuple[ac.Declaration, pa.Schema]:
    """An operator as a declaration, with the schema it produces (checked before anything runs)."""
    decl, schema = _compile_op(op, env, field)
    env.schemas[field] = schema
    return decl, schema


def _compile_op(op: plan_pb2.Operator, env: Env, field: str) -> tuple[ac.Declaration, pa.Schema]:
    kind = op.WhichOneof("kind")
    if kind is None:
        raise ProtocolError(f"{field} has no operator set", field=field)
    compile_kind = _COMPILERS.get(kind)
    if compile_kind is None:
        raise ProtocolError(f"{field}: operator {kind!r} is not supported by this worker", field=f"{field}.{kind}")
    return compile_kind(getattr(op, kind), env, f"{field}.{kind}")


def _feed_scan(scan: plan_pb2.FeedScan, env: Env, here: str) -> tuple[ac.Declaration, pa.Schema]:
    reader = feed_scan_reader(scan, env, here)
    return _source(reader, env), reader.schema


def _exchange_input(inp: plan_pb2.ExchangeInput, env: Env, here: str) -> tuple[ac.Declaration, pa.Schema]:
    schema = normalize_schema(decode_schema(inp.schema, f"{here}.schema"))
    batches = (conform(b, schema, "an input batch") for b in env.inputs.input_batches())
    return _source(native_reader(schema, batches), env), schema


def _values(values: plan_pb2.Values, env: Env, here: str) -> tuple[ac.Declaration, pa.Schema]:
    table = read_ipc_stream(values.ipc_stream, f"{here}.ipc_stream")
    if env.inputs.task_number != 0 and not values.every_task:
        table = table.schema.empty_table()
    return ac.Declaration("table_source", ac.TableSourceNodeOptions(table)), table.schema


def _filter(flt: plan_pb2.Filter, env: Env, here: str) -> tuple[ac.Declaration, pa.Schema]:
    below = flt.input
    if below.WhichOneof("kind") == "feed_scan":  # the readers may skip what the filter excludes
        reader = feed_scan_reader(below.feed_scan, env, f"{here}.input.feed_scan", prune=prune_of(flt, f"{here}.predicate"))
        child, schema = _source(reader, env), reader.schema
        env.schemas[f"{here}.input"] = schema
    else:
        child, schema = compile_plan(below, env, f"{here}.input")
    return ac.Declaration.from_sequence([child, filter_node(flt, schema, here)]), schema


def _project(prj: plan_pb2.Project, env: Env, here: str) -> tuple[ac.Declaration, pa.Schema]:
    child, schema = compile_plan(prj.input, env, f"{here}.input")
    project, out = project_node(prj, schema, here)
    return ac.Declaration.from_sequence([child, project]), out


def _limit(lim: plan_pb2.Limit, env: Env, here: str) -> tuple[ac.Declaration, pa.Schema]:
    if lim.count < 0 or lim.offset < 0:
        raise ProtocolError(f"{here} has a negative count or offset", field=here)
    child, schema = compile_plan(lim.input, env, f"{here}.input")
    limited = limit_batches(_deferred(child), lim.count, lim.offset)
    return _source(native_reader(schema, limited), env), schema


def _sort(srt: plan_pb2.Sort, env: Env, here: str) -> tuple[ac.Declaration, pa.Schema]:
    child, schema = compile_plan(srt.input, env, f"{here}.input")
    keys = [(k.column, k.descending) for k in srt.keys]
    _check_columns([k for k, _ in keys], schema, f"{here}.keys")
    if not keys or srt.fetch < 0:
        raise ProtocolError(f"{here} needs keys and a fetch of at least 0", field=here)
    decl = sort_decl(child, keys, srt.nulls_first)
    if not srt.fetch:
        return decl, schema
    top = limit_batches(_deferred(decl), srt.fetch, 0)
    return _source(native_reader(schema, top), env), schema


def _window(win: plan_pb2.Window, env: Env, here: str) -> tuple[ac.Declaration, pa.Schema]:
    """Checked and typed here; computed only by DuckDB (Acero has no window node): the
    declaration returned is the input's, which ``select`` never runs for a window."""
    child, schema = compile_plan(win.input, env, f"{here}.input")
    return child, window_schema(win, schema, here)


def _unnest(un: plan_pb2.Unnest, env: Env, here: str) -> tuple[ac.Declaration, pa.Schema]:
    """Checked and typed here (a list column; a new name); computed only by DuckDB, as a window."""
    child, schema = compile_plan(un.input, env, f"{here}.input")
    _check_columns([un.column], schema, f"{here}.column")
    t = schema.field(un.column).type
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
        raise ProtocolError(f"{here}.column {un.column!r} is a {t}, not a list", field=f"{here}.column")
    if not un.name or un.name in schema.names:
        raise ProtocolError(f"{here}.name {un.name[:40]!r} is empty or already a column", field=f"{here}.name")
    return child, schema.append(pa.field(un.name, t.value_type))


def window_schema(win: plan_pb2.Window, schema: pa.Schema, here: str) -> pa.Schema:
    """The window's output schema (its input's columns, then one per call), every name and count checked."""
    check_count(len(win.calls), MAX_WINDOW_CALLS, f"{here}.calls", "window calls")
    _check_columns(list(win.partition_by), schema, f"{here}.partition_by")
    _check_columns([k.column for k in win.order_by], schema, f"{here}.order_by")
    fields = list(schema)
    for i, c in enumerate(win.calls):
        where = f"{here}.calls[{i}]"
        if c.function not in WINDOW_FUNCTIONS:
            raise ProtocolError(f"{where}.function {c.function[:40]!r} is not a window function", field=f"{where}.function")
        if c.column:
            _check_columns([c.column], schema, f"{where}.column")
        if not c.name or c.name in {f.name for f in fields}:
            raise ProtocolError(f"{where}.name must be a new column name", field=f"{where}.name")
        if not 0 <= c.offset <= MAX_WINDOW_OFFSET or not all(
            abs(x) <= MAX_WINDOW_OFFSET for x in (c.frame.start, c.frame.end)
        ):
            raise ProtocolError(f"{where}: an offset beyond {MAX_WINDOW_OFFSET}", field=where)
        if c.frame.range and (len(win.order_by) != 1 or not _number(schema.field(win.order_by[0].column).type)):
            raise ProtocolError(f"{where}.frame: a RANGE frame needs one order key, a number", field=f"{where}.frame")
        try:
            fields.append(pa.field(c.name, window_type(c.function, schema.field(c.column).type if c.column else None)))
        except ValueError as exc:
            raise ProtocolError(f"{where}: {exc}", field=where) from None
    return pa.schema(fields)


def _number(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t))


MAX_WINDOW_CALLS = 1024
MAX_WINDOW_OFFSET = 1 << 31


def _union(union: plan_pb2.Union, env: Env, here: str) -> tuple[ac.Declaration, pa.Schema]:
    if not union.inputs:
        raise ProtocolError(f"{here}.inputs is empty", field=f"{here}.inputs")
    parts = [compile_plan(child, env, f"{here}.inputs[{i}]") for i, child in enumerate(union.inputs)]
    schema = parts[0][1]
    for i, (_, other) in enumerate(parts[1:], 1):
        if not other.equals(schema):
            raise ProtocolError(f"{here}.inputs[{i}] has another schema than inputs[0]", field=f"{here}.inputs[{i}]")
    readers = (decl.to_reader(use_threads=True) for decl, _ in parts)
    return _source(native_reader(schema, union_batches(readers, schema)), env), schema


def _shuffle_read(rd: plan_pb2.ShuffleRead, env: Env, here: str) -> tuple[ac.Declaration, pa.Schema]:
    schema = normalize_schema(decode_schema(rd.schema, f"{here}.schema"))
    if rd.partition_end <= rd.partition_start:
        raise ProtocolError(f"{here} has an empty partition range", field=f"{here}.partition_end")
    check_count(len(rd.producers), MAX_PRODUCERS, f"{here}.producers", "producer tasks")
    check_count(rd.partition_end, MAX_OUTPUT_PARTITIONS, f"{here}.partition_end", "partitions")
    producers = [(p.url, p.stage_key) for p in rd.producers]
    rows = env.read_partitions(producers, rd.partition_start, rd.partition_end)
    batches = (conform(b, schema, f"stage {rd.stage_id} output") for b in rows)
    return _source(native_reader(schema, batches), env), schema


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


_AGG_FUNCTIONS = AGGREGATES


def _aggregate(agg: plan_pb2.Aggregate, env: Env, here: str) -> tuple[ac.Declaration, pa.Schema]:
    child, schema = compile_plan(agg.input, env, f"{here}.input")
    _check_columns(agg.keys, schema, f"{here}.keys")
    calls = []
    for i, a in enumerate(agg.aggregates):
        where = f"{here}.aggregates[{i}]"
        if a.function not in _AGG_FUNCTIONS:
            raise ProtocolError(f"{where}: aggregate {a.function!r} is not one of {sorted(_AGG_FUNCTIONS)}", field=f"{where}.function")
        if a.function != "count_all":
            _check_columns([a.column], schema, f"{where}.column")
        if a.function in DUCKDB_AGGREGATES:
            _check_duckdb_call(a, agg.partial, schema, where)
        elif a.order or a.filter or a.separator:
            raise ProtocolError(f"{where}: {a.function} takes no order, filter or separator", field=f"{where}.function")
        calls.append((a.function, a.column, a.name))
    try:
        out = aggregate_schema(schema, agg.keys, calls)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise ProtocolError(f"{here} does not fit its input: {exc}", field=here) from exc
    if any(f in DUCKDB_AGGREGATES for f, _, _ in calls):
        # Checked and typed here; computed only by DuckDB (``select`` never runs this declaration), as a window.
        return child, out
    return aggregate_decl(child, agg.keys, calls), out


def _check_duckdb_call(a: plan_pb2.AggregateCall, partial: bool, schema: pa.Schema, where: str) -> None:
    """A quantile's fraction is a number from 0 to 1; a separator is short, order keys and a filter are columns of
    the input (a bool, the filter); an aggregate DuckDB alone computes is never a partial one (nothing merges a median)."""
    if partial:
        raise ProtocolError(f"{where}: {a.function} cannot be a partial aggregate", field=f"{where}.function")
    if a.function in ("quantile_cont", "quantile_disc") and not (math.isfinite(a.fraction) and 0.0 <= a.fraction <= 1.0):
        raise ProtocolError(f"{where}.fraction {a.fraction!r} is not between 0 and 1", field=f"{where}.fraction")
    if len(a.separator) > MAX_SEPARATOR_CHARS:
        raise ProtocolError(f"{where}.separator has {len(a.separator)} characters, more than {MAX_SEPARATOR_CHARS}", field=f"{where}.separator")
    check_count(len(a.order), MAX_PROJECTED, f"{where}.order", "order keys")
    _check_columns([o.column for o in a.order], schema, f"{where}.order")
    if a.filter:
        _check_columns([a.filter], schema, f"{where}.filter")
        if schema.field(a.filter).type != pa.bool_():
            raise ProtocolError(f"{where}.filter {a.filter!r} is not a bool column", field=f"{where}.filter")


def _hash_join(join: plan_pb2.HashJoin, env: Env, here: str) -> tuple[ac.Declaration, pa.Schema]:
    if join.join_type not in JOIN_TYPES:
        raise ProtocolError(f"{here}.join_type {join.join_type!r} is not one of {JOIN_TYPES}", field=f"{here}.join_type")
    if not join.left_keys or len(join.left_keys) != len(join.right_keys):
        raise ProtocolError(f"{here} needs as many left keys as right keys", field=f"{here}.left_keys")
    left, ls = compile_plan(join.left, env, f"{here}.left")
    right, rs = compile_plan(join.right, env, f"{here}.right")
    _check_columns(join.left_keys, ls, f"{here}.left_keys")
    _check_columns(join.right_keys, rs, f"{here}.right_keys")
    args = (join.join_type, join.left_keys, join.right_keys, join.right_suffix)
    try:
        out = join_schema(ls, rs, *args)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise ProtocolError(f"{here} does not fit its inputs: {exc}", field=here) from exc
    return join_decl(left, right, *args, filter=join_filter(join, ls, rs, here)), out


def join_filter(join: plan_pb2.HashJoin, ls: pa.Schema, rs: pa.Schema, here: str) -> pc.Expression | None:
    """The join's condition beside its keys, checked: over both sides' columns (no name shared), a bool."""
    if not join.HasField("filter"):
        return None
    where = f"{here}.filter"
    if set(ls.names) & set(rs.names):
        raise ProtocolError(f"{where} is set, but the join's sides share column names", field=where)
    predicate = to_pyarrow(join.filter, where)
    if bind(join.filter, predicate, pa.schema([*ls, *rs]), where) != pa.bool_():
        raise ProtocolError(f"{where} is not of type bool", field=where)
    return predicate


_COMPILERS: dict[str, Callable[[Any, Env, str], tuple[ac.Declaration, pa.Schema]]] = {
    "feed_scan": _feed_scan,
    "exchange_input": _exchange_input,
    "values": _values,
    "filter": _filter,
    "project": _project,
    "limit": _limit,
    "aggregate": _aggregate,
    "hash_join": _hash_join,
    "sort": _sort,
    "union": _union,
    "shuffle_read": _shuffle_read,
    "window": _window,
    "unnest": lambda un, env, here: _unnest(un, env, here),
}
"""How each operator kind becomes a declaration (with the schema it produces), checked as it is built."""
