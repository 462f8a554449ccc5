"""Acero declarations for the relational operators: aggregate, hash join, sort, union.

One place builds them, for two users: the worker's pipeline, and the plan
builder, which runs the same declarations over empty tables to learn exact
output types (so the coordinator's schemas are the workers' schemas).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.acero as ac
import pyarrow.compute as pc

from flight.errors import TaskCancelledError, light_copy

__all__ = [
    "AGGREGATES",
    "DUCKDB_AGGREGATES",
    "JOIN_TYPES",
    "Handoffs",
    "aggregate_decl",
    "aggregate_schema",
    "empty_source",
    "handing_off",
    "join_decl",
    "join_schema",
    "native_reader",
    "output_schema",
    "sort_decl",
    "union_batches",
]

JOIN_TYPES = ("inner", "left outer", "right outer", "full outer", "left semi", "left anti")

_ONLY_VALID = pc.CountOptions(mode="only_valid")
_VARIANCES = {"var_samp": ("variance", 1), "var_pop": ("variance", 0), "stddev_samp": ("stddev", 1), "stddev_pop": ("stddev", 0)}
"""The IR's variances as Acero's kernels and their delta degrees of freedom (null below ddof + 1 values, as SQL)."""

_STAND_INS = {"median": "mean", "quantile_cont": "mean", "quantile_disc": "min", "string_agg": "min", "array_agg": "min"}
"""The aggregates only DuckDB computes (``flight.plan.agg.DUCKDB_ONLY``), each with the Acero aggregate whose
result type is DuckDB's for it (an interpolated quantile: a DOUBLE, or the DECIMAL's own type; a discrete one,
and string_agg's text: the argument's type; ``array_agg``: a list of it, ``_LISTS``). Used for types only:
``aggregate_decl`` refuses them."""

_LISTS = frozenset({"array_agg"})

DUCKDB_AGGREGATES = frozenset(_STAND_INS)

AGGREGATES = frozenset({"count", "count_all", "count_distinct", "sum", "min", "max", "mean", *_VARIANCES, *_STAND_INS})
"""Every aggregate function an ``Aggregate`` operator may name (``flight.plan.agg`` builds them)."""


def aggregate_decl(child: ac.Declaration, keys: Sequence[str], calls: Sequence[tuple[str, str, str]]) -> ac.Declaration:
    """Group ``child`` by ``keys`` (none: one global row); ``calls`` are (function, column, name)."""
    prefix = "hash_" if keys else ""
    aggregates: list[tuple[Any, str, Any, str]] = []  # (columns, function, options, name): Acero's own shape
    for function, column, name in calls:
        if function in _STAND_INS:
            raise pa.ArrowNotImplementedError(f"the aggregate {function} runs on the DuckDB engine only")
        if function == "count_all":
            aggregates.append(([], prefix + "count_all", None, name))
        elif function in ("count", "count_distinct"):
            aggregates.append((column, prefix + function, _ONLY_VALID, name))
        elif function in _VARIANCES:
            kernel, ddof = _VARIANCES[function]
            aggregates.append((column, prefix + kernel, pc.VarianceOptions(ddof=ddof), name))
        else:
            aggregates.append((column, prefix + function, None, name))
    options = ac.AggregateNodeOptions(aggregates, keys=list(keys) or None)
    return ac.Declaration.from_sequence([child, ac.Declaration("aggregate", options)])


def join_decl(
    left: ac.Declaration,
    right: ac.Declaration,
    join_type: str,
    left_keys: Sequence[str],
    right_keys: Sequence[str],
    right_suffix: str,
    filter: pc.Expression | None = None,
) -> ac.Declaration:
    """Acero's hash join; ``filter``: a condition on the joined row beside the key equalities."""
    options = ac.HashJoinNodeOptions(  # type: ignore[call-arg]  # the stubs lack filter_expression (pyarrow has it)
        join_type,  # type: ignore[arg-type]  # one of JOIN_TYPES, checked by the callers
        list(left_keys), list(right_keys), output_suffix_for_right=right_suffix, filter_expression=filter
    )
    return ac.Declaration("hashjoin", options, inputs=[left, right])


def sort_decl(child: ac.Declaration, keys: Sequence[tuple[str, bool]], nulls_first: bool) -> ac.Declaration:
    placement = "at_start" if nulls_first else "at_end"
    sort_keys = [(name, "descending" if desc else "ascending", placement) for name, desc in keys]
    options = ac.OrderByNodeOptions(sort_keys)  # type: ignore[arg-type]  # stubs: no per-key null placement
    return ac.Declaration.from_sequence([child, ac.Declaration("order_by", options)])


def union_batches(readers: Iterable[pa.RecordBatchReader], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Every input's batches, one input after the other."""
    for reader in readers:
        for batch in reader:
            yield batch if batch.schema.equals(schema) else pa.RecordBatch.from_arrays(batch.columns, schema=schema)


def native_reader(schema: pa.Schema, batches: Iterable[pa.RecordBatch]) -> pa.RecordBatchReader:
    """A reader over Python batches, for native code (Acero, DuckDB) to pull on its own threads.

    Why not ``RecordBatchReader.from_batches`` alone: when the Python side raises, native code
    may format the exception, its whole traceback and chain included (pyarrow's Python error
    detail), on a thread of its own; a deep traceback (a nested plan, a recursion) then keeps
    the GIL busy for seconds while a native thread may wait on it. The exception crosses with
    its type and message; its traceback and chain stay behind.

    Inside ``handing_off(into)``, the reader's Python side is also added to ``into``, which lets
    go of it when the task stops (see ``_Handoff``).
    """
    handoff = _Handoff(iter(batches))
    scope = _handoffs.get()
    if scope is not None:
        scope.add(handoff)
    return pa.RecordBatchReader.from_batches(schema, handoff)


class _Handoff:
    """The iterator native code pulls a Python source through.

    Native code holds what it pulls, and the error it got (pyarrow's Python error detail),
    with references the garbage collector cannot see. A source holds its task (its feeds, map
    input); a task holds its native reader (its stored errors' tracebacks keep the frame that
    ran it): a cycle through native code that no collection frees. Every task stopped
    mid-stream (a bad frame, a cancel, a failure) kept its units, buffers, errors' frames and a
    Parquet unit's decode threads for the process's life: 1,000 hostile fuzz cases left a
    worker with 121 dead tasks, 20,000 work units and 44 idle threads, +230 MB. So the edges
    out of native code are cut: ``release`` (when the task stops) lets go of the source, which
    is closed by whichever thread drops it last, and an error crosses as a copy whose
    traceback holds no frame with a reference to the source. A pull after ``release`` raises
    ``TaskCancelledError``.
    """

    __slots__ = ("_batches",)

    def __init__(self, batches: Iterator[pa.RecordBatch]) -> None:
        self._batches: Iterator[pa.RecordBatch] | None = batches

    def __iter__(self) -> _Handoff:
        return self

    def __next__(self) -> pa.RecordBatch:
        batches = self._batches  # a pull already running keeps its source alive until it returns
        if batches is None:
            raise TaskCancelledError("the task's source was released: the task stopped")
        try:
            return next(batches)
        except StopIteration:
            raise
        except Exception as exc:  # noqa: BLE001 - re-raised, as a light copy
            error = light_copy(exc)
            exc.__traceback__ = None  # it may be a nested reader's error, kept by native code: not with the source's frames
        del batches, self  # the frame the error's traceback keeps holds neither the source nor this
        raise error

    def release(self) -> None:
        self._batches = None


class Handoffs:
    """The sources of one task's native readers, let go of together when the task stops (``_Handoff``)."""

    def __init__(self) -> None:
        self._items: list[_Handoff] = []
        self._released = False
        self._lock = threading.Lock()

    def add(self, handoff: _Handoff) -> None:
        with self._lock:
            if not self._released:
                self._items.append(handoff)
                return
        handoff.release()  # made after the task stopped: nothing will pull it

    def release(self) -> None:
        with self._lock:
            self._released = True
            items, self._items = self._items, []
        for handoff in items:
            handoff.release()


_handoffs: contextvars.ContextVar[Handoffs | None] = contextvars.ContextVar("handoffs", default=None)


@contextlib.contextmanager
def handing_off(into: Handoffs) -> Iterator[None]:
    """Add to ``into`` the sources of the native readers made in this block (this thread's context only)."""
    token = _handoffs.set(into)
    try:
        yield
    finally:
        _handoffs.reset(token)


def empty_source(schema: pa.Schema) -> ac.Declaration:
    return ac.Declaration("table_source", ac.TableSourceNodeOptions(schema.empty_table()))


def output_schema(decl: ac.Declaration) -> pa.Schema:
    """What ``decl`` produces, found by running it (over empty sources)."""
    return decl.to_table(use_threads=False).schema


def join_schema(
    left: pa.Schema, right: pa.Schema, join_type: str, left_keys: Sequence[str], right_keys: Sequence[str], right_suffix: str
) -> pa.Schema:
    """What a hash join of ``left`` and ``right`` produces: Acero's own answer over empty inputs,
    remembered per process (``_remembered``)."""
    lk, rk = _key(left), _key(right)
    if len(lk) + len(rk) > _MAX_KEY_BYTES:
        return output_schema(join_decl(empty_source(left), empty_source(right), join_type, left_keys, right_keys, right_suffix))
    return _join_schema(lk, rk, join_type, tuple(left_keys), tuple(right_keys), right_suffix)


def aggregate_schema(schema: pa.Schema, keys: Sequence[str], calls: Sequence[tuple[str, str, str]]) -> pa.Schema:
    """What ``aggregate_decl`` over ``schema`` produces, remembered the same way (DuckDB's own aggregates
    typed by their stand-ins)."""
    lists = {n for f, _, n in calls if f in _LISTS}
    calls = [(_STAND_INS.get(f, f), c, n) for f, c, n in calls]
    key = _key(schema)
    if len(key) > _MAX_KEY_BYTES:
        out = output_schema(aggregate_decl(empty_source(schema), keys, calls))
    else:
        out = _aggregate_schema(key, tuple(keys), tuple((f, c, n) for f, c, n in calls))
    if lists:
        out = pa.schema([pa.field(f.name, pa.list_(f.type)) if f.name in lists else f for f in out])
    return out


# Why remembered: every task of a stage, and every query of the same shape, asks the same
# question, and running even an empty Acero plan costs milliseconds on a worker whose other
# tasks hold the GIL and its thread pools (profiled: 6 ms per join on TPC-H Q3's workers).
# Errors are not remembered (``lru_cache`` keeps only results); keys are the schemas' IPC bytes,
# metadata included, so a remembered schema is exactly what Acero returned for the same input.
# Schemas a peer chose may be large: only small ones are remembered, so the memory is bounded.
_MAX_KEY_BYTES = 16 << 10


def _key(schema: pa.Schema) -> bytes:
    return schema.serialize().to_pybytes()


@functools.lru_cache(maxsize=1024)
def _join_schema(
    left: bytes, right: bytes, join_type: str, left_keys: tuple[str, ...], right_keys: tuple[str, ...], right_suffix: str
) -> pa.Schema:
    decl = join_decl(empty_source(_schema(left)), empty_source(_schema(right)), join_type, left_keys, right_keys, right_suffix)
    return output_schema(decl)


@functools.lru_cache(maxsize=1024)
def _aggregate_schema(schema: bytes, keys: tuple[str, ...], calls: tuple[tuple[str, str, str], ...]) -> pa.Schema:
    return output_schema(aggregate_decl(empty_source(_schema(schema)), keys, calls))


def _schema(data: bytes) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(data))
