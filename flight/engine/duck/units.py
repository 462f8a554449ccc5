"""Unit fragments: the part of a stage above a Parquet scan, run by DuckDB per batch of work units.

Above each Parquet feed scan, the longest chain of filters and projects, joins whose right side
is built once per task (another stage's output), and a ``partial`` aggregate on top, is a *unit
fragment*: one DuckDB query per batch of the units that have arrived, reading the files itself
(``read_parquet([...])``). See docs/engine.md.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from flight.engine.decode import decode_threads
from flight.engine.duck.alike import Alike, share_alike_builds
from flight.engine.duck.keyfilter import KeyFilter
from flight.engine.duck.keyfilter import resolve as resolve_key_filters
from flight.engine.duck.pieces import Plain, duck_source, plain_file
from flight.engine.duck.shared import shared_text
from flight.engine.duck.sqltext import string_literal
from flight.engine.duck.task import ENGINE_ERRORS, UNITS, DuckTask, Statement, error_kind, stream
from flight.engine.pruning import prune_of
from flight.engine.readers import PathRefused, ReaderContext, UnitReadError, conform, read_parquet
from flight.wire._proto import plan_pb2
from flight.wire.operators import operators

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
    return any(node.WhichOneof("kind") == "feed_scan" for node in operators(op))


def fragment_scan(op: plan_pb2.Operator, path: str) -> tuple[plan_pb2.FeedScan, str] | None:
    """The scan of the unit fragment rooted at ``op`` (and its path), or None when ``op`` roots none."""
    if op.WhichOneof("kind") == "aggregate" and op.aggregate.partial:
        return _chain(op.aggregate.input, f"{path}.aggregate.input")
    return _chain(op, path)


def _prune(op: plan_pb2.Operator, path: str, scan_path: str) -> pc.Expression | None:
    """The predicate of the filter right above the fragment's scan (``…filter.input`` is the scan),
    for the pyarrow reader to skip row groups with; DuckDB prunes the files it reads itself."""
    if not scan_path.endswith(".filter.input"):
        return None
    node, rest = op, scan_path[len(path):].removesuffix(".input").split(".")[1:]
    try:
        for name in rest:
            node = getattr(node, name)
        return prune_of(node, f"{scan_path.removesuffix('.input')}.predicate")  # type: ignore[arg-type]
    except AttributeError:
        return None


def unit_fragment(
    task: DuckTask, op: plan_pb2.Operator, path: str, text: str, builds: list[tuple[str, str]], schema: pa.Schema | None = None
) -> Iterator[pa.RecordBatch]:
    """The fragment at ``path`` run once per work unit, every unit's rows (of ``schema``, by default
    the operator's) in turn.

    ``builds`` are the (table, query) pairs of its joins' right sides: each is computed
    once, into a temporary table of the fragment's cursor, before the first unit.
    """
    found = fragment_scan(op, path)
    assert found is not None
    scan, scan_path = found
    schema = schema if schema is not None else task.schemas[path]
    ctx = ReaderContext(schema=task.schemas[scan_path], columns=list(scan.columns) or None, roots=task.roots,
                        batch_rows=task.batch_rows, options=dict(scan.reader_options),
                        prune=_prune(op, path, scan_path), scan=getattr(task.inputs, "scan_stats", None), decode_threads=decode_threads())
    feed_id = scan.feed.feed_id
    cur = task.cursor()
    if builds:
        for name, source in task.sources.items():
            cur.register(name, source)
        for table, query in builds:
            try:
                cur.execute(f"CREATE TEMP TABLE {table} AS {query}")
            except ENGINE_ERRORS as exc:
                raise task.failure(exc) from None
    count = itertools.count()
    for got in _unit_batches(task, feed_id):
        files: list[Plain] = []
        others: list[tuple[str, bytes]] = []
        for partition, unit in got:
            where = f"work unit {next(count)} of feed {feed_id!r} partition {partition}"
            path, real, rows = _unit_file(unit.body, ctx, where)
            if real:
                files.append(Plain(where, path, real, rows, unit.body))
            else:  # row groups not in one run (or an odd file name): pyarrow reads the unit, DuckDB runs the fragment
                others.append((where, unit.body))
        listed = duck_source(files) if files else None
        if files and listed is None:  # runs of too many files for one query
            others += [(f.where, f.body) for f in files]
        for where, body in others:
            try:
                yield from _pyarrow_unit(task, cur, body, ctx, text, schema, where)
            except UnitReadError as exc:
                raise type(exc)(f"{where}: {exc}") from None
        if listed is not None:
            yield from _files(task, cur, files, listed, text, schema)
        task.delay(len(got))
        for _, unit in got:
            unit.done()


@dataclass(frozen=True)
class WholeFeed:
    """A Parquet scan of a stage run as one query: ``token`` in the query's text stands for the scan's
    files until its units are all here."""

    scan: plan_pb2.FeedScan
    path: str
    token: str
    above: tuple[plan_pb2.Filter, str] | None = None
    """The filter right above the scan and its field: its predicate is what pyarrow skips row groups with when
    it reads the units (row groups, a store's URIs), made only then (``pyarrow_prune``); DuckDB prunes the files
    it reads itself. Made for every scan, it was a twelfth of a TPC-DS task's translation."""

    def pyarrow_prune(self) -> pc.Expression | None:
        return None if self.above is None else prune_of(*self.above)


def whole_feeds(
    task: DuckTask,
    cur: duckdb.DuckDBPyConnection,
    feeds: list[WholeFeed],
    builds: list[tuple[str, str]],
    text: str,
    schema: pa.Schema,
    alike: Mapping[str, Alike] | None = None,
    kept: Sequence[KeyFilter] = (),
) -> Iterator[pa.RecordBatch]:
    """The stage's query once every scan's units have arrived, each scan reading all its files.

    Plain local files are read by DuckDB (``read_parquet([...])``, in parallel, pruned by the
    query's filters); a scan with other units (row groups, a store's URIs) is read by pyarrow
    through a stream. Units are credited as they are taken, so a window smaller than a task's
    files does not hold the feed back.
    """
    taken: list[Any] = []
    files: list[Plain] = []
    sources: dict[str, str] = {}
    text, builds = _tables_of_sources(task, cur, text, builds)
    scan_files: dict[str, list[str]] = {}
    for feed in feeds:
        before = len(files)
        source = _feed_source(task, cur, feed, taken, files)
        scan_files[feed.path] = [f.real for f in files[before:]]
        text = text.replace(feed.token, source)
        builds = [(n, b.replace(feed.token, source)) for n, b in builds]
        sources[feed.token] = source
    if kept:
        try:
            text, builds, notes = resolve_key_filters(cur, kept, scan_files, text, builds)
            getattr(task.inputs, "notes", []).extend(notes)
        except ENGINE_ERRORS as exc:
            raise task.failure(exc) from None
    builds, text = share_alike_builds(builds, text, alike or {}, sources)  # a CTE's uses under other names, built once
    text = shared_text(text, cur)  # the copies of a CTE's input, a grouping set's, a selective scan's: computed once
    try:
        for name, build in builds:  # inner ones first
            cur.execute(f"CREATE TEMP TABLE {name} AS {build}")
        for batch in stream(Statement(cur, text), task.batch_rows):
            if batch.num_rows:
                yield conform(batch, schema, "the stage's output")
    except ENGINE_ERRORS as exc:
        if task.error is not None or error_kind(exc) in ("interrupt", "memory") or not files:
            raise task.failure(exc) from None
        _blame(cur, files, exc)
        raise task.failure(exc) from None
    task.delay(len(taken))
    for unit in taken:
        unit.done()


def _feed_source(task: DuckTask, cur: duckdb.DuckDBPyConnection, feed: WholeFeed, taken: list[Any],
                 files: list[Plain]) -> str:
    """What the query reads for ``feed`` once its units are all here (each appended to ``taken``): its plain
    local files and runs of row groups as DuckDB reads them (``duck_source``; appended to ``files``), else a
    stream pyarrow reads."""
    ctx = ReaderContext(schema=task.schemas[feed.path], columns=list(feed.scan.columns) or None, roots=task.roots,
                        batch_rows=task.batch_rows, options=dict(feed.scan.reader_options),
                        scan=getattr(task.inputs, "scan_stats", None), decode_threads=decode_threads())
    feed_id = feed.scan.feed.feed_id
    plain: list[Plain] = []
    others: list[tuple[str, bytes]] = []
    count = itertools.count()
    for got in _unit_batches(task, feed_id):
        for partition, unit in got:
            where = f"work unit {next(count)} of feed {feed_id!r} partition {partition}"
            path, real, rows = _unit_file(unit.body, ctx, where)
            if real:
                plain.append(Plain(where, path, real, rows, unit.body))
            else:
                others.append((where, unit.body))
            taken.append(unit)
    source = duck_source(plain) if plain and not others else None
    if source is not None:
        files += plain
        return source
    units = [(f.where, f.body) for f in plain] + others  # pyarrow reads every unit of this scan (or there are none)
    name = task.source(ctx.schema, _pyarrow_units(units, replace(ctx, prune=feed.pyarrow_prune())))
    cur.register(name, task.sources[name])
    return name


def _tables_of_sources(
    task: DuckTask, cur: duckdb.DuckDBPyConnection, text: str, builds: list[tuple[str, str]]
) -> tuple[str, list[tuple[str, str]]]:
    """The query and its builds with the sources they read (other stages' rows, broadcasts) made
    temporary tables first: DuckDB then orders the joins by their true sizes."""
    for name in list(task.sources):
        pattern = re.compile(re.escape(name) + r"(?![0-9A-Za-z_])")
        if not any(pattern.search(t) for t in [text, *(b for _, b in builds)]):
            continue
        table = f"{name}_table"
        try:
            cur.execute(f"CREATE TEMP TABLE {table} AS SELECT * FROM {name}")
        except ENGINE_ERRORS as exc:
            raise task.failure(exc) from None
        text = pattern.sub(table, text)
        builds = [(n, pattern.sub(table, b)) for n, b in builds]
    return text, builds


def _pyarrow_units(units: list[tuple[str, bytes]], ctx: ReaderContext) -> Iterator[pa.RecordBatch]:
    for where, body in units:
        try:
            for batch in read_parquet(body, ctx):
                yield conform(batch, ctx.schema, where)
        except UnitReadError as exc:
            raise type(exc)(f"{where}: {exc}") from None


def _blame(cur: duckdb.DuckDBPyConnection, files: list[Plain], exc: BaseException) -> None:
    """Raise ``UnitReadError`` naming the first of ``files`` DuckDB cannot read, if one is."""
    for f in files:
        quoted = string_literal(f.real)  # a plain file's name holds no NUL
        try:
            cur.execute(f"SELECT count(*) FROM read_parquet({quoted})")
        except ENGINE_ERRORS as one:
            raise UnitReadError(f"{f.where}: cannot read Parquet file {f.path!r}: {_why(one, f.real)}") from None


def _unit_batches(task: DuckTask, feed_id: str) -> Iterator[list[tuple[int, Any]]]:
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


def _unit_file(body: bytes, ctx: ReaderContext, where: str) -> tuple[str, str, tuple[int, int] | None]:
    """``plain_file``, a refused path named by the unit it came in (``where``)."""
    try:
        return plain_file(body, ctx)
    except PathRefused as exc:
        raise PathRefused(f"{where}: {exc}") from None


def _files(
    task: DuckTask, cur: duckdb.DuckDBPyConnection, files: list[Plain], source: str, text: str, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """The fragment over ``files`` (whole Parquet files and runs of row groups, read as ``source``), one query; a
    failure names the file that causes it."""
    try:
        for batch in stream(Statement(cur, text.replace(UNITS, source)), task.batch_rows):
            if batch.num_rows:
                yield conform(batch, schema, files[0].where if len(files) == 1 else "a fragment's output")
    except ENGINE_ERRORS as exc:
        if task.error is not None or error_kind(exc) in ("interrupt", "memory"):
            raise task.failure(exc) from None
        for f in files:  # which file? (the task fails either way: nothing is read twice)
            try:
                quoted = string_literal(f.real)  # a plain file's name holds no NUL
                cur.execute(f"SELECT count(*) FROM ({text.replace(UNITS, f'read_parquet({quoted})')})")
            except ENGINE_ERRORS as one:
                raise UnitReadError(f"{f.where}: cannot read Parquet file {f.path!r}: {_why(one, f.real)}") from None
        raise UnitReadError(f"cannot read Parquet files {[f.path for f in files]}: {_why(exc, files[0].real)}") from None


def _pyarrow_unit(
    task: DuckTask, cur: duckdb.DuckDBPyConnection, body: bytes, ctx: ReaderContext, text: str, schema: pa.Schema, where: str
) -> Iterator[pa.RecordBatch]:
    name = "__flight_unit"
    cur.register(name, task.guarded(ctx.schema, (conform(b, ctx.schema, where) for b in read_parquet(body, ctx))))
    try:
        for batch in stream(Statement(cur, text.replace(UNITS, name)), task.batch_rows):
            if batch.num_rows:
                yield conform(batch, schema, where)
    except ENGINE_ERRORS as exc:
        raise task.failure(exc) from None
    finally:
        cur.unregister(name)



def _why(exc: BaseException, real: str) -> str:
    """DuckDB's failure in fixed words: its messages quote resolved paths and file contents."""
    kind = error_kind(exc)
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


