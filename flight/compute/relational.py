"""Acero declarations for the relational operators: aggregate, hash join, sort, union.

One place builds them, for two users: the worker's pipeline, and the plan
builder, which runs the same declarations over empty tables to learn exact
output types (so the coordinator's schemas are the workers' schemas).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.acero as ac
import pyarrow.compute as pc

__all__ = [
    "JOIN_TYPES",
    "aggregate_decl",
    "empty_source",
    "join_decl",
    "native_reader",
    "output_schema",
    "sort_decl",
    "union_batches",
]

JOIN_TYPES = ("inner", "left outer", "right outer", "full outer", "left semi", "left anti")

_ONLY_VALID = pc.CountOptions(mode="only_valid")


def aggregate_decl(child: ac.Declaration, keys: Sequence[str], calls: Sequence[tuple[str, str, str]]) -> ac.Declaration:
    """Group ``child`` by ``keys`` (none: one global row); ``calls`` are (function, column, name)."""
    prefix = "hash_" if keys else ""
    aggregates: list[tuple[Any, str, Any, str]] = []  # (columns, function, options, name): Acero's own shape
    for function, column, name in calls:
        if function == "count_all":
            aggregates.append(([], prefix + "count_all", None, name))
        elif function in ("count", "count_distinct"):
            aggregates.append((column, prefix + function, _ONLY_VALID, name))
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
) -> ac.Declaration:
    options = ac.HashJoinNodeOptions(
        join_type,  # type: ignore[arg-type]  # one of JOIN_TYPES, checked by the callers
        list(left_keys), list(right_keys), output_suffix_for_right=right_suffix
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
    """
    return pa.RecordBatchReader.from_batches(schema, _thin_errors(batches))


def _thin_errors(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    try:
        yield from batches
    except GeneratorExit:
        raise
    except Exception as exc:  # noqa: BLE001 - re-raised, only lighter
        exc.__cause__ = exc.__context__ = None
        exc.__suppress_context__ = True
        raise exc.with_traceback(None) from None


def empty_source(schema: pa.Schema) -> ac.Declaration:
    return ac.Declaration("table_source", ac.TableSourceNodeOptions(schema.empty_table()))


def output_schema(decl: ac.Declaration) -> pa.Schema:
    """What ``decl`` produces, found by running it (over empty sources)."""
    return decl.to_table(use_threads=False).schema
