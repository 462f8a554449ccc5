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

import pyarrow as pa
import pyarrow.acero as ac

from flight._proto import plan_pb2
from flight.arrow_types import UNIT_COLUMN
from flight.compute.relational import native_reader
from flight.engine.pipeline import filter_node, project_node
from flight.engine.scan import Env, feed_scan_reader
from flight.errors import ProtocolError
from flight.protocol import unit_chain

__all__ = ["tagged_task"]


def tagged_task(plan: plan_pb2.StagePlan, env: Env) -> pa.RecordBatchReader:
    """The task's output, unit after unit, each row with its ``WorkUnit.id`` as a last column."""
    chain, below, field = unit_chain(plan.root)
    if (found := below.WhichOneof("kind")) != "feed_scan":
        raise ProtocolError(
            f"header.options.tag_units needs a plan of filters and projections over one feed scan; {field} is {found or 'empty'}",
            field="header.options.tag_units",
        )
    source = feed_scan_reader(below.feed_scan, env, f"{field}.feed_scan", tag=True)
    schema = source.schema
    nodes: list[ac.Declaration] = []
    for kind, body, here in reversed(chain):
        if kind == "filter":
            nodes.append(filter_node(body, schema, here))  # type: ignore[arg-type]
        else:
            node, schema = project_node(body, schema, here, keep=[UNIT_COLUMN])  # type: ignore[arg-type]
            nodes.append(node)
    return native_reader(schema, _ordered(source, nodes, schema))


def _ordered(source: pa.RecordBatchReader, nodes: Sequence[ac.Declaration], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    with source:
        for batch in source:
            if not nodes:
                if batch.num_rows:
                    yield batch
                continue
            table_source = ac.Declaration("table_source", ac.TableSourceNodeOptions(pa.Table.from_batches([batch])))
            out = ac.Declaration.from_sequence([table_source, *nodes]).to_table(use_threads=False)
            for piece in out.to_batches():
                if piece.num_rows:
                    yield piece.cast(schema) if not piece.schema.equals(schema) else piece
