"""DuckDB as the per-task engine: a checked stage plan becomes one SQL query per task.

Why DuckDB, with the measurements, is in docs/engine.md. How a task runs:

* ``select.compile_task`` checks and types the plan exactly as before (Acero binds
  every expression over empty inputs), so what reaches this module is a plan the
  worker accepted; the schema of every operator comes from that pass, and the
  task's output is conformed to it, so both engines produce the same types.
* **Work units are read by DuckDB itself.** Above each Parquet feed scan, the longest
  chain of filters, projects, broadcast joins and a ``partial`` aggregate (which a
  later aggregate merges) is a *unit fragment* (``duck_units``): one DuckDB query per
  batch of arrived units, ``... FROM read_parquet([...])``, so decoding, filtering and
  partial aggregation happen in DuckDB with filter pushdown into the reader, and Python
  sees result batches only. Units with row groups, or whose file name DuckDB would
  read as a glob, go through the pyarrow reader and the same query.
* Everything else of the stage (joins, final aggregates, sorts, limits, unions) is one
  query over *sources*: the unit fragments' output, shuffle reads from other workers,
  map input and values, each a ``RecordBatchReader`` registered on the task's cursor.
* The SQL of a stage is written by ``duck_translate``; a task's cursors, sources and
  error wording live in ``duck_task``.
* Text: ``flight.engine.duck.sql`` quotes every identifier and renders every literal; a
  plan it cannot express with the IR's meaning raises ``Untranslatable`` and the
  task runs on Acero instead (so does a query DuckDB refuses to bind).
* One database per worker process (``configure``): its ``memory_limit`` is the worker's
  ``--memory-limit``; joins, aggregates and sorts past it spill to ``--spill-dir``. Where a task's
  share of the cores (``--engine-threads``) is less than the machine's (workers that share it), a
  second, *wide* database runs the tasks that are their query's only one (``TaskOptions.whole_query``)
  on every core; DuckDB's thread count is its database's, not a query's. The memory limit is then
  split, half to the wide one (``_memory_split``).
  File access is limited to the worker's data roots inside DuckDB too (defence in
  depth: every path was already checked by ``ReaderContext.open_path``), extensions
  never load, and the configuration is locked.
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import itertools
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import duckdb
import pyarrow as pa

from flight.engine import seen
from flight.engine.confine import DataRoots
from flight.engine.duck.alike import Alike
from flight.engine.duck.keyfilter import KeyFilter
from flight.engine.duck.sql import Untranslatable
from flight.engine.duck.task import ENGINE_ERRORS, DuckTask, stream
from flight.engine.duck.translate import Translator
from flight.engine.duck.units import WholeFeed, whole_feeds
from flight.engine.readers import conform
from flight.engine.settings import EngineSettings, set_settings, settings
from flight.wire._proto import plan_pb2
from flight.wire.limits import clip
from flight.wire.memo import Memo
from flight.wire.operators import operators

__all__ = ["EngineSettings", "Untranslatable", "configure", "run_duckdb", "settings", "worth_it"]

log = logging.getLogger(__name__)



_dbs: dict[tuple[bool, tuple[str, ...], bool], duckdb.DuckDBPyConnection] = {}
_lock = threading.Lock()


def configure(new: EngineSettings) -> None:
    """Set this process's engine settings (before the first task; later databases use them)."""
    with _lock:
        set_settings(new)
    close_databases()
    seen.forget()  # what was worked out under the old settings
    _TRANSLATED.clear()


@atexit.register
def close_databases() -> None:
    """Close the process's databases (at exit too: DuckDB objects alive then make its bindings complain)."""
    with _lock:
        for con in _dbs.values():
            con.close()
        _dbs.clear()


WIDE_MIN_MEMORY = 256 << 20
"""A quarter of the worker's memory limit at least this, or it has no wide database (a hash
join spilling within 16 MiB ran out of memory: the 64 MB worker of tests/engine/test_engine.py)."""


def wide_threads() -> int | None:
    """The wide database's threads: every core this process may use, when a task's share
    (``--engine-threads``) is fewer; None: there is no wide database (whole queries run on the one),
    also when a quarter of the memory limit is less than ``WIDE_MIN_MEMORY`` (split in two, neither half would be much)."""
    s = settings()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if not s.threads or s.threads >= cores or (s.memory_limit is not None and s.memory_limit // 4 < WIDE_MIN_MEMORY):
        return None
    return cores


def _memory_split(limit: int, wide: bool) -> int:
    """A database's share of the worker's memory limit: half for the wide one, half for the other, when there is a
    wide one. Why half: its queries read up to ``ExecOptions.one_host_query_bytes`` (1 GiB) of columns on one host,
    and DuckDB's joins over that much need more than a quarter of a 4 GB worker even spilling (TPC-DS q78 at SF 10
    failed to pin a block in 1 GiB and ran in 2); the other's split tasks each hold a share of a larger query. TPC-H
    SF 10 on two workers limited to 4 GB, Q11, Q13, Q16 and Q22 one task each, peaked at 1.3 GB."""
    if wide_threads() is None:
        return limit
    return limit // 2 if wide else limit - limit // 2


def _database(roots: DataRoots, wide: bool = False) -> duckdb.DuckDBPyConnection:
    """The process's DuckDB database for tasks confined to ``roots`` (one per distinct roots), or the wide one
    for tasks that are their query's only one (``wide``; the same database when no core is to spare)."""
    wide = wide and wide_threads() is not None
    key = (roots.unrestricted, roots.paths, wide)
    with _lock:
        con = _dbs.get(key)
        if con is not None:
            return con
        # Tasks run on cursors, which never print DuckDB's progress bar.
        config: dict[str, str | bool | int | float | list[str]] = {
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
            # Give memory back once queries end, so an idle worker does not sit on its peak.
            "allocator_flush_threshold": "16MiB",
            "allocator_background_threads": True,
            # Rows are unordered unless a Sort says otherwise: not keeping input order lets DuckDB
            # stream and spill with less memory (a sort's order is kept either way).
            "preserve_insertion_order": False,
            # DuckDB 2.0 pushes a partial aggregate below a join on its group key; over a stage's
            # broadcast build (a temporary table) that aggregates the probe side into ~400k
            # groups before the join drops most of them. Off, TPC-H Q3's lineitem stage runs in
            # 0.12 s instead of 0.24 s on one thread (docs/engine.md, "DuckDB's settings").
            "disabled_optimizers": "partial_aggregate_pushdown",
        }
        _settings = settings()
        if _settings.memory_limit:
            config["memory_limit"] = f"{_memory_split(_settings.memory_limit, wide) // (1 << 20)}MiB"
        threads = wide_threads() if wide else _settings.threads
        if threads:
            config["threads"] = threads
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



def run_duckdb(
    plan: plan_pb2.StagePlan,
    inputs: object,
    schemas: Mapping[str, pa.Schema],
    roots: DataRoots,
    batch_rows: int,
    delay: Callable[[int], None],
    scan_reader: Callable[[plan_pb2.FeedScan, str], pa.RecordBatchReader],
    read_partitions: Callable[[list[tuple[str, bytes]], int, int], Iterator[pa.RecordBatch]],
    on_cancel: Callable[[Callable[[], None]], None] | None = None,
    wide: bool = False,
    key: bytes | None = None,
) -> pa.RecordBatchReader:
    """The task's output stream, computed by DuckDB; ``Untranslatable`` if it cannot be (use Acero).
    ``wide``: the task is its query's only one (the wide database's, where there is one). ``key``: the plan's
    digest (``flight.engine.seen``): a translation that made no source of the task is remembered by it."""
    if not worth_it(plan.root):
        raise Untranslatable("nothing to compute that DuckDB does better: Acero streams it batch by batch")
    task = DuckTask(inputs, schemas, roots, batch_rows, delay, scan_reader, read_partitions, _database(roots, wide))  # type: ignore[arg-type]
    try:
        translator = _translated(task, plan, wide, key)
        text = translator.text
        out_schema = schemas["plan.root"]
        if translator.root_fragment is not None:  # the whole stage is one unit fragment: its output is the task's
            reader = pa.RecordBatchReader.from_batches(out_schema, _closing(task, translator.root_fragment))
        else:
            bound = text
            for name, build in reversed(translator.builds):  # outer builds first: their text names inner ones
                bound = bound.replace(name, f"({build})")
            for kept in translator.kept:  # a broadcast's keys a scan keeps: decided once the broadcast is here
                bound = bound.replace(kept.placeholder, "TRUE")
            stand_ins: dict[str, pa.Schema] = {}  # bound over empty stand-ins; the files are known when the units are
            for feed in translator.feeds:
                name = f"__flight_source_{next(task.names)}"
                stand_ins[name] = schemas[feed.path]
                bound = bound.replace(feed.token, name)
            cur = task.cursor()
            for name, source in task.sources.items():
                cur.register(name, source)
            if translator.feeds:
                _check_binds(task, cur, bound, stand_ins)
                batches = whole_feeds(task, cur, translator.feeds, translator.builds, text, out_schema, translator.alike, translator.kept)
            else:
                batches = _results(task, _bind(cur, bound), out_schema)
            reader = pa.RecordBatchReader.from_batches(out_schema, _closing(task, batches))
    except BaseException:
        task.close()
        raise
    if on_cancel is not None:
        on_cancel(task.interrupt)
    return reader


@dataclass(frozen=True)
class _Translation:
    """What a translation made: the text, its builds, whole scans and builds' keys (``Translator``), how many
    names of the task it took; ``root_fragment``: the stage's output when it is one unit fragment (never kept)."""

    text: str
    builds: list[tuple[str, str]]
    feeds: list[WholeFeed]
    alike: dict[str, Alike]
    names: int
    root_fragment: Iterator[pa.RecordBatch] | None = None
    kept: list[KeyFilter] = dataclasses.field(default_factory=list)
    """Scans that may keep a broadcast build's keys (``flight.engine.duck.keyfilter``); never kept (they read a source)."""


_TRANSLATED: Memo[tuple[bytes, bool], _Translation] = Memo(seen.ENTRIES)
"""Translations by plan digest and ``wide`` (``flight.engine.seen`` says why): only those that made no source of
their task (a reader of its own: rows of other stages, map input, a unit fragment's), which are the text alone."""
_TEXT_KEPT = 256 << 10
"""The longest text (builds included) kept (TPC-DS q66's is 30 KiB)."""


def _translated(task: DuckTask, plan: plan_pb2.StagePlan, wide: bool, key: bytes | None) -> _Translation:
    known = None if key is None else _TRANSLATED.get((key, wide))
    if known is not None:
        task.names = itertools.count(known.names + 1)  # as after the translation: the names it took are the text's
        return dataclasses.replace(known, builds=list(known.builds), feeds=list(known.feeds), alike=dict(known.alike))
    # Joined scans (a co-located join's sides) are one query over all of each side's files:
    # DuckDB then picks the build side and reads every file itself. So is a whole aggregate (``merges_units``).
    translator = Translator(task, whole=wide or parquet_scans(plan.root) > 1 or merges_units(plan.root), query=wide)
    text = translator.relation(plan.root, "plan.root")
    made = _Translation(text, translator.builds, translator.feeds, translator.alike, next(task.names), translator.root_fragment,
                        list(translator.key_filters.values()))
    if key is not None and made.root_fragment is None and not task.sources and len(text) + sum(len(b) for _, b in made.builds) <= _TEXT_KEPT:
        _TRANSLATED.put((key, wide), dataclasses.replace(made, builds=list(made.builds), feeds=list(made.feeds), alike=dict(made.alike)))
    return made


def _bind(cur: duckdb.DuckDBPyConnection, text: str) -> duckdb.DuckDBPyRelation:
    """``text`` parsed and bound: a refusal here is a translation gap (the task runs on Acero), not a task failure."""
    try:
        return cur.sql(text)
    except duckdb.Error as exc:
        raise Untranslatable(f"DuckDB does not bind the translated plan: {clip(str(exc).split(chr(10), 1)[0], 300)}") from None


def _check_binds(task: DuckTask, cur: duckdb.DuckDBPyConnection, bound: str, stand_ins: Mapping[str, pa.Schema]) -> None:
    """Bind a whole-feed stage's query over empty stand-ins (``stand_ins``: their names in ``bound``, and
    schemas) before any unit is taken (after, Acero could not take over), unless the same text over
    sources of the same schemas bound on this worker before.

    Why remembered: the bind costs a stage's task 1.5-2 ms of the interpreter (TPC-H Q11's four leaf tasks,
    a tenth of their time), and a client that runs the same query again sends the same plan: its text is
    the same (sources and units are named by their order in the task), only the files differ, which the
    stand-ins stand for anyway. The stand-ins are registered only to bind (a registration costs about
    0.3 ms: a small query's task has one per scan).
    """
    schemas = {**{n: s.schema for n, s in task.sources.items()}, **stand_ins}
    digest = hashlib.sha256(bound.encode())
    for name, schema in sorted(schemas.items()):  # IPC bytes: formatting a schema as text costs ten times more
        digest.update(b"\x00" + name.encode() + b"\x00" + schema.serialize().to_pybytes())
    key = digest.digest()
    with _lock:
        if key in _BOUND:
            _BOUND.move_to_end(key)
            return
    for name, schema in stand_ins.items():
        cur.register(name, task.guarded(schema, iter([])))
    _bind(cur, bound)
    with _lock:
        _BOUND[key] = None
        if len(_BOUND) > _BOUND_MAX:
            _BOUND.popitem(last=False)


_BOUND: OrderedDict[bytes, None] = OrderedDict()
"""Digests of whole-feed queries that bound (``_check_binds``), least recently used first."""
_BOUND_MAX = 4096


def parquet_scans(root: plan_pb2.Operator) -> int:
    """How many Parquet feed scans the stage has."""
    return sum(1 for op in operators(root) if op.WhichOneof("kind") == "feed_scan" and op.feed_scan.reader == "parquet")


def merges_units(root: plan_pb2.Operator) -> bool:
    """Whether the stage has a whole (not partial) aggregate and a Parquet scan: it then reads the task's files as one
    query, which aggregates once, instead of a partial aggregate per work unit merged after (``local_partial``).

    Why: an aggregate runs whole in a task when its rows are all there (one task, or each task a key range of the
    files), and it gives no row before its last unit either way. Where units hold different keys, as key ranges
    do, the per-unit partials reduce nothing across units, and every group crossed into Arrow to be hashed again:
    TPC-H Q18's ``l_orderkey`` groups with ``sum(l_quantity) > 300`` at SF 10, 7.5 million groups a task on two
    one-core hosts, took 2.3 to 2.9 s a task, against 1.4 to 1.9 s for DuckDB's own query over the same files."""
    return parquet_scans(root) > 0 and any(op.WhichOneof("kind") == "aggregate" and not op.aggregate.partial for op in operators(root))


def worth_it(root: plan_pb2.Operator) -> bool:
    """Whether the stage reads Parquet units or joins, aggregates or sorts: what DuckDB speeds up.

    Filters and projects over streamed input (map stages, custom readers, shuffle reads) stay
    on Acero, which passes each batch on as it comes (DuckDB gathers ``batch_rows`` rows first).
    """
    heavy = ("aggregate", "hash_join", "sort", "window", "unnest")
    return any(
        op.WhichOneof("kind") in heavy or (op.WhichOneof("kind") == "feed_scan" and op.feed_scan.reader == "parquet")
        for op in operators(root)
    )


def _results(task: DuckTask, relation: duckdb.DuckDBPyRelation, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    try:
        for batch in stream(relation, task.batch_rows):
            if batch.num_rows:
                yield conform(batch, schema, "the engine's output")
    except ENGINE_ERRORS as exc:
        raise task.failure(exc) from None


def _closing(task: DuckTask, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    try:
        yield from batches
    finally:
        task.close()


