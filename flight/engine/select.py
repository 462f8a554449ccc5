"""Which engine runs a task: DuckDB where it computes the stage better, Acero otherwise.

Why apart: the selector needs both engines, and neither engine needs the other. The plan is
compiled for Acero first (that checks and types every operator before anything runs), unless the
worker typed the same plan before (``seen``: then its Acero plan is made only if it runs); DuckDB
then gets the stage if it is worth it (``duck.engine.worth_it``) and its translation binds, else
the Acero declaration runs. A stage over few rows of other stages
runs on Acero (``SMALL_INPUT_ROWS``), and a task whose rows must say their unit runs on
``acero.tagged``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.acero as ac

from flight.compute.relational import DUCKDB_AGGREGATES, handing_off, native_reader
from flight.engine import seen
from flight.engine.acero.pipeline import compile_plan
from flight.engine.acero.tagged import tagged_task
from flight.engine.confine import DataRoots, worker_roots
from flight.engine.duck.sql import Untranslatable
from flight.engine.gate import Gate, streaming
from flight.engine.readers import UnitReadError
from flight.engine.scan import Env, TaskInputs, feed_scan_reader
from flight.errors import ProtocolError
from flight.wire._proto import plan_pb2
from flight.wire.limits import clip
from flight.wire.operators import operators

__all__ = ["DUCKDB_ONLY_WORDS", "SMALL_INPUT_ROWS", "compile_task", "duckdb_only"]

DUCKDB_ONLY_WORDS = "computed by the DuckDB engine only"
"""The words of the error an Acero task gives for what only DuckDB computes (``duckdb_only``); the benchmark's
Acero engine reads them to mark such a query as one it cannot run, not as a failure."""

log = logging.getLogger(__name__)

SMALL_INPUT_ROWS = 8192
"""A stage whose inputs are other stages' output and at most this many rows runs on Acero
(``scan.Env.prefetch``). TPC-H's final stages are a few dozen rows; Q10's, 43,000 rows of
seven grouping keys, two of them long strings, took 40 ms longer on Acero than on DuckDB."""

def compile_task(
    plan: plan_pb2.StagePlan,
    inputs: TaskInputs,
    batch_rows: int,
    unit_delay_s: float = 0.0,
    roots: DataRoots | None = None,
    engine: str | None = None,
    tag_units: bool = False,
    whole_query: bool = False,
) -> pa.RecordBatchReader:
    """The task's output stream. Raises ProtocolError for a plan this worker cannot run.

    ``engine``: ``duckdb`` or ``acero``; None means the process's setting (``settings.settings()``).
    A plan DuckDB cannot run with the IR's meaning runs on Acero (``duck.Untranslatable``).

    ``unit_delay_s`` slows every work unit down on purpose (the worker's ``--unit-delay-ms``).
    ``roots`` are where the task's readers may open files; ``None`` means this process's
    (``confine.worker_roots()``: what ``flight-worker --data-root`` set, else none at all).
    ``tag_units``: the rows say their work unit, in order (``tagged.py``; Acero, one unit at a time).
    ``whole_query``: the task is its query's only one (``TaskOptions.whole_query``): DuckDB may run it on
    every core (``duck.engine``'s wide database).
    """
    # A streaming plan's gate: what Acero computes ahead of an absent reader stays bounded (engine/gate.py).
    gate = Gate() if streaming(plan.root) and plan.root.WhichOneof("kind") != "feed_scan" else None
    env = Env(inputs, batch_rows, unit_delay_s, worker_roots() if roots is None else roots, wide=whole_query, gate=gate)
    on_cancel = getattr(inputs, "on_cancel", None)
    if on_cancel is not None:
        # A worker's task: once it stops, its sources let go of it (relational._Handoff says why).
        on_cancel(env.handoffs.release)
    with handing_off(env.handoffs):
        return _compile_task(plan, env, engine, tag_units)


def _compile_task(plan: plan_pb2.StagePlan, env: Env, engine: str | None, tag_units: bool) -> pa.RecordBatchReader:
    if tag_units:
        _tell(env.inputs, "acero")
        return tagged_task(plan, env)
    from flight.engine.duck import engine as duck  # on first use: ``import flight`` does not load DuckDB

    if (engine or duck.settings().engine) == "duckdb" and duck.worth_it(plan.root):
        key = seen.plan_digest(plan)
        typed = seen.recall(key)
        if typed is not None:  # the same plan compiled here before: its types, and no Acero plan unless DuckDB declines
            seen.check_task(typed, env.inputs)
            env.schemas.update(typed.schemas)
            return native_reader(typed.schemas["plan.root"], _duck_or_acero(plan, env, None, key))
        decl, schema = compile_plan(plan.root, env, "plan.root")
        seen.remember(key, plan, env.schemas)
        # Translated when first pulled, on the task's own thread: the worker says the task is
        # ready (its schema is known) without waiting for the translation.
        return native_reader(schema, _duck_or_acero(plan, env, decl, key))
    # Checks and types every operator (nothing runs yet); the declaration is Acero's plan.
    decl, schema = compile_plan(plan.root, env, "plan.root")
    _tell(env.inputs, "acero")
    return _acero(plan, env, decl)


def _tell(inputs: TaskInputs, engine: str) -> None:
    """Let the task know which engine computes it (its metrics say so)."""
    if hasattr(inputs, "engine"):
        inputs.engine = engine


def duckdb_only(root: plan_pb2.Operator) -> str | None:
    """What in the plan only DuckDB computes (window functions, UNNEST, a median, a quantile or an ordered
    aggregate), or None."""
    for op in operators(root):
        kind = op.WhichOneof("kind")
        if kind == "window":
            return "window functions"
        if kind == "unnest":
            return "UNNEST"
        if kind == "aggregate":
            for a in op.aggregate.aggregates:
                if a.function in DUCKDB_AGGREGATES:
                    return f"the aggregate {a.function}"
    return None


def _acero(plan: plan_pb2.StagePlan, env: Env, decl: ac.Declaration) -> pa.RecordBatchReader:
    if (what := duckdb_only(plan.root)) is not None:
        raise ProtocolError(f"{what}: {DUCKDB_ONLY_WORDS} (this task was to run on Acero)", field="plan.root")
    if plan.root.WhichOneof("kind") == "feed_scan":
        # Nothing to compute: Acero would only copy batches between threads.
        return feed_scan_reader(plan.root.feed_scan, env, "plan.root.feed_scan")
    reader = decl.to_reader(use_threads=True)
    return reader if env.gate is None else env.gate.output(reader)


def _duck_or_acero(plan: plan_pb2.StagePlan, env: Env, compiled: ac.Declaration | None, key: bytes | None) -> Iterator[pa.RecordBatch]:
    """``compiled``: the plan's Acero declaration, None when it was typed before (``seen``): made only if Acero runs it.
    ``key``: the plan's digest (``seen.plan_digest``), which DuckDB's translation is remembered by."""
    from flight.engine.duck import engine as duck

    def decl() -> ac.Declaration:
        return compiled if compiled is not None else compile_plan(plan.root, env, "plan.root")[0]

    # Started here, on the task's thread: the native readers made now are the task's too (no yield in these blocks).
    if duckdb_only(plan.root) is None and env.prefetch(plan.root, SMALL_INPUT_ROWS):
        # Other stages' rows, and few: Acero's run costs less than DuckDB's start (Env.prefetch).
        _tell(env.inputs, "acero")
        with handing_off(env.handoffs):
            small = _acero(plan, env, decl())
        with small:
            yield from small
        return
    try:
        with handing_off(env.handoffs):
            reader = duck.run_duckdb(
                plan, env.inputs, env.schemas, env.roots, env.batch_rows, env.delay,
                lambda scan, field: feed_scan_reader(scan, env, field), env.read_partitions, getattr(env.inputs, "on_cancel", None),
                wide=env.wide, key=key,
            )
        _tell(env.inputs, "duckdb")
    except Untranslatable as exc:
        if (what := duckdb_only(plan.root)) is not None:  # Acero cannot run it either: say why DuckDB did not
            raise ProtocolError(f"{what}: {DUCKDB_ONLY_WORDS}, whose translation declined the plan: {clip(exc, 300)}",
                                field="plan.root") from None
        log.debug("stage plan runs on Acero: %s", clip(exc, 300))
        with handing_off(env.handoffs):
            reader = _acero(plan, env, decl())
        _tell(env.inputs, "acero")
    except (ProtocolError, UnitReadError):
        raise
    except Exception as exc:  # noqa: BLE001 - a gap in the translation (DuckDB, Arrow, recursion): Acero runs the plan
        # One clipped line, no traceback: the error may quote a huge plan, and formatting it would hold the GIL.
        log.warning("stage plan runs on Acero: the DuckDB translation failed: %s: %s", type(exc).__name__, clip(exc, 300))
        with handing_off(env.handoffs):
            reader = _acero(plan, env, decl())
        _tell(env.inputs, "acero")
    with reader:
        yield from reader


