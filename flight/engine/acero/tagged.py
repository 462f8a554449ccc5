"""A task whose rows say which work unit they came from (``TaskOptions.tag_units``).

Why: the coordinator's unit-level recovery (docs/architecture.md, "Losing a worker")
hands a unit's rows to the caller only once it knows the unit complete — when a row
of a later unit of the same task arrives, or the task's output ends — and replays a
lost task's incomplete units elsewhere. That needs every row of a unit to leave the
task before any row of the next. Acero's threaded plans promise no order, so here
the feed scan reads one unit at a time, and each of its batches goes through the
plan's filters and projections on its own, on the task's thread, before the next
is read. Filters and projections work row by row: the rows are the same as the
untagged plan's, plus the hidden ``UNIT_COLUMN``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.acero as ac
import pyarrow.compute as pc

from flight.compute.relational import native_reader
from flight.engine.acero.pipeline import filter_node, project_node
from flight.engine.pruning import prune_of
from flight.engine.scan import Env, feed_scan_reader
from flight.errors import ProtocolError
from flight.wire._proto import plan_pb2
from flight.wire.arrow_types import UNIT_COLUMN, UNIT_TYPE, unit_tag, unit_tags
from flight.wire.operators import unit_chain

__all__ = ["tagged_task"]


def tagged_task(plan: plan_pb2.StagePlan, env: Env) -> pa.RecordBatchReader:
    """The task's output, unit after unit, each row with its ``WorkUnit.id`` as a last column."""
    chain, below, field = unit_chain(plan.root)
    if (found := below.WhichOneof("kind")) != "feed_scan":
        raise ProtocolError(
            f"header.options.tag_units needs a plan of filters and projections over one feed scan; {field} is {found or 'empty'}",
            field="header.options.tag_units",
        )
    prune = prune_of(chain[-1][1], chain[-1][2] + ".predicate") if chain and chain[-1][0] == "filter" else None  # type: ignore[arg-type]
    source = feed_scan_reader(below.feed_scan, env, f"{field}.feed_scan", tag=True, prune=prune)
    # Two compilations of the chain: over the untagged rows (a batch of one unit: the common
    # case, the tag put back after), and carrying the ids as a plain column (many units a batch).
    untagged = pa.schema(list(source.schema)[:-1])
    plain = untagged.append(pa.field(UNIT_COLUMN, pa.uint64()))
    nodes: list[ac.Declaration] = []
    carry: list[ac.Declaration] = []
    for kind, body, here in reversed(chain):
        if kind == "filter":
            nodes.append(filter_node(body, untagged, here))  # type: ignore[arg-type]
            carry.append(filter_node(body, plain, here))  # type: ignore[arg-type]
        else:
            node, untagged = project_node(body, untagged, here)  # type: ignore[arg-type]
            nodes.append(node)
            node, plain = project_node(body, plain, here, keep=[UNIT_COLUMN])  # type: ignore[arg-type]
            carry.append(node)
    schema = untagged.append(pa.field(UNIT_COLUMN, UNIT_TYPE))
    return native_reader(schema, _ordered(source, nodes, carry, schema))


def _run(batch: pa.RecordBatch, nodes: Sequence[ac.Declaration]) -> pa.Table:
    """``nodes`` over one batch, on this thread."""
    table_source = ac.Declaration("table_source", ac.TableSourceNodeOptions(pa.Table.from_batches([batch])))
    return ac.Declaration.from_sequence([table_source, *nodes]).to_table(use_threads=False)


def _ordered(
    source: pa.RecordBatchReader, nodes: Sequence[ac.Declaration], carry: Sequence[ac.Declaration], schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    with source:
        for batch in source:
            if not batch.num_rows:
                continue
            if not nodes:
                yield batch
                continue
            tags: Any = batch.column(batch.num_columns - 1)  # a RunEndEncodedArray (pyarrow-stubs lack its methods)
            if tags.find_physical_length() == 1:  # one unit: compute untagged, tag the result
                unit = tags.values[tags.find_physical_offset()].as_py()
                out = _run(batch.select(range(batch.num_columns - 1)), nodes)
                pieces = [piece.append_column(schema.field(-1), unit_tag(unit, piece.num_rows)) for piece in out.to_batches()]
            else:  # many units: the ids ride along as a plain column, encoded again after
                decoded = pc.run_end_decode(tags)  # type: ignore[attr-defined]  # pyarrow-stubs lack it
                out = _run(batch.set_column(batch.num_columns - 1, UNIT_COLUMN, decoded), carry)
                last = out.num_columns - 1
                pieces = [p.set_column(last, schema.field(-1), unit_tags(p.column(last))) for p in out.to_batches()]
            for piece in pieces:
                if piece.num_rows:
                    yield piece if piece.schema.equals(schema) else piece.cast(schema)
