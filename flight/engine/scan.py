"""What a task's pipeline reads from: its inputs (``TaskInputs``), and its feeds' units as rows.

Apart from ``pipeline.py`` (which compiles operators) because both the pipeline and the
tagged, one-unit-at-a-time path (``tagged.py``) read feeds the same way: units taken from
the task's inboxes one by one, each read by its reader, conformed to the declared schema.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc

from flight.compute.relational import Handoffs, native_reader
from flight.engine.confine import DataRoots
from flight.engine.decode import decode_threads
from flight.engine.gate import Gate
from flight.engine.readers import PathRefused, ReaderContext, UnitReadError, conform, get_reader
from flight.errors import ProtocolError
from flight.wire._proto import plan_pb2
from flight.wire.arrow_types import UNIT_COLUMN, UNIT_TYPE, UNITS_READER, normalize_schema, unit_tag, unit_tags
from flight.wire.operators import operators
from flight.wire.protocol import decode_schema

__all__ = ["UNITS_PER_BATCH", "Env", "InboxLike", "ReceivedUnitLike", "TaskInputs", "feed_scan_reader", "scan_schema"]

UNITS_PER_BATCH = 4096

_ReadKey = tuple[tuple[tuple[str, bytes], ...], int, int]
"""A shuffle read: its producers (URL, stage key), its partition range."""


class ReceivedUnitLike(Protocol):
    @property
    def body(self) -> bytes: ...

    @property
    def id(self) -> int: ...

    def done(self) -> None: ...


class InboxLike(Protocol):
    def take(self, most: int = 1) -> Sequence[ReceivedUnitLike]: ...


class TaskInputs(Protocol):
    """What a task offers its pipeline's sources."""

    @property
    def task_number(self) -> int: ...

    def feed_partitions(self, feed_id: str) -> list[int]: ...

    def inbox(self, feed_id: str, partition: int) -> InboxLike: ...

    def input_batches(self) -> Iterable[pa.RecordBatch]: ...

    def read_partitions(self, producers: list[tuple[str, bytes]], start: int, end: int) -> Iterator[pa.RecordBatch]:
        """Partitions [start, end) of every producer task (another stage's output)."""
        ...


def scan_schema(scan: plan_pb2.FeedScan, field: str) -> pa.Schema:
    """The schema a FeedScan produces: declared, normalised, projected."""
    schema = normalize_schema(decode_schema(scan.schema, f"{field}.schema"))
    if scan.columns:
        missing = [c for c in scan.columns if c not in schema.names]
        if missing:
            raise ProtocolError(f"{field}.columns names {missing}, not in the scan's schema {schema.names}", field=f"{field}.columns")
        schema = pa.schema([schema.field(c) for c in scan.columns])
    return schema


@dataclass(frozen=True)
class Env:
    """What compiling a task's operators needs: its inputs and the worker's settings."""

    inputs: TaskInputs
    batch_rows: int
    unit_delay_s: float
    roots: DataRoots
    wide: bool = False
    """The task is its query's only one: its engine may use every core (``TaskOptions.whole_query``)."""
    schemas: dict[str, pa.Schema] = dataclasses.field(default_factory=dict)
    """Every operator's output schema by its field path, filled in by ``_compile``."""
    read_ahead: dict[_ReadKey, list[tuple[list[pa.RecordBatch], Iterator[pa.RecordBatch] | None]]] = dataclasses.field(
        default_factory=dict
    )
    """Shuffle inputs ``prefetch`` began to read: their first batches, and the rest (None: ended)."""
    gate: Gate | None = None
    """A streaming plan's backpressure from the task's reader to its sources (``engine/gate.py``)."""
    handoffs: Handoffs = dataclasses.field(default_factory=Handoffs)
    """The Python sources of the native readers made while the task's plan compiled and its engine
    started (``relational.handing_off``: at most a few per operator), let go of when the task stops
    (``select.compile_task``). Sources DuckDB's fragments open later are its task's, which closes them."""

    def delay(self, units: int) -> None:
        if self.unit_delay_s > 0:
            time.sleep(self.unit_delay_s * units)

    def read_partitions(self, producers: list[tuple[str, bytes]], start: int, end: int) -> Iterator[pa.RecordBatch]:
        """``inputs.read_partitions``, after whatever ``prefetch`` read of it (every engine reads through this)."""
        ahead = self.read_ahead.get((tuple(producers), start, end))
        if not ahead:
            yield from self.inputs.read_partitions(producers, start, end)
            return
        batches, rest = ahead.pop(0)
        yield from batches
        if rest is not None:
            yield from rest

    def prefetch(self, root: plan_pb2.Operator, most_rows: int) -> bool:
        """Whether every input of the stage at ``root`` is other stages' output (or literal rows),
        and all of it, read here, came to at most ``most_rows`` rows.

        Why: a stage above a shuffle (a final aggregate, a top-k over gathered rows) is most often
        a handful of rows, for which DuckDB's translation and binding cost more than Acero's whole
        run, and they cost while the stages below still compute on the same cores (TPC-H Q1's
        final stages: 12 ms of 170). What is read stays in ``read_ahead`` for the engine chosen;
        reading stops at the first input past ``most_rows``, and a stage that reads feeds or map
        input reads nothing here.
        """
        reads: list[plan_pb2.ShuffleRead] = []
        for op in operators(root):
            kind = op.WhichOneof("kind")
            if kind in ("feed_scan", "exchange_input") or kind is None:
                return False
            if kind == "shuffle_read":
                reads.append(op.shuffle_read)
        rows = 0
        for rd in reads:
            producers = [(p.url, p.stage_key) for p in rd.producers]
            rest: Iterator[pa.RecordBatch] | None = iter(self.inputs.read_partitions(producers, rd.partition_start, rd.partition_end))
            got: list[pa.RecordBatch] = []
            assert rest is not None
            for batch in rest:
                got.append(batch)
                rows += batch.num_rows
                if rows > most_rows:
                    break
            else:
                rest = None
            self.read_ahead.setdefault((tuple(producers), rd.partition_start, rd.partition_end), []).append((got, rest))
            if rest is not None:
                return False
        return True


def feed_scan_reader(
    scan: plan_pb2.FeedScan, env: Env, field: str, *, tag: bool = False, prune: pc.Expression | None = None
) -> pa.RecordBatchReader:
    """The rows of a feed scan's units, unit after unit; ``tag``: with a last column
    ``UNIT_COLUMN`` saying each row's ``WorkUnit.id`` (``TaskOptions.tag_units``); ``prune``:
    the filter above the scan, which readers may use to skip data (Parquet row groups)."""
    if not scan.feed.feed_id:
        raise ProtocolError(f"{field}.feed.feed_id is empty", field=f"{field}.feed.feed_id")
    feed_id = scan.feed.feed_id
    schema = scan_schema(scan, field)
    inputs = env.inputs
    partitions = inputs.feed_partitions(feed_id)
    out_schema = schema
    if tag:
        if UNIT_COLUMN in schema.names:
            raise ProtocolError(f"{field}.schema has a column named {UNIT_COLUMN!r}, which is reserved", field=f"{field}.schema")
        out_schema = schema.append(pa.field(UNIT_COLUMN, UNIT_TYPE))
    if scan.reader == UNITS_READER:
        expected = pa.schema([pa.field("unit", pa.binary())])
        if not schema.equals(expected):
            raise ProtocolError(f"{field}: the 'units' reader produces {expected}, not {schema}", field=f"{field}.schema")
        return native_reader(out_schema, _unit_rows(env, feed_id, partitions, tag))
    reader = get_reader(scan.reader)
    if reader is None:
        raise ProtocolError(f"{field}.reader: no reader named {scan.reader!r} on this worker", field=f"{field}.reader")
    ctx = ReaderContext(
        schema=schema, columns=list(scan.columns) or None, options=dict(scan.reader_options), batch_rows=env.batch_rows,
        roots=env.roots, prune=prune, decode_threads=decode_threads(), scan=getattr(inputs, "scan_stats", None),
    )

    def batches() -> Iterator[pa.RecordBatch]:
        for partition in partitions:
            inbox = inputs.inbox(feed_id, partition)
            for n in itertools.count():
                got = inbox.take(1)
                if not got:
                    break
                unit = got[0]
                where = f"work unit {n} of feed {feed_id!r} partition {partition}"
                try:
                    for batch in reader(unit.body, ctx):
                        batch = conform(batch, schema, where)
                        if tag:
                            batch = batch.append_column(out_schema.field(-1), unit_tag(unit.id, batch.num_rows))
                        yield batch
                except PathRefused as exc:  # keeps its type: the worker reports it as a permission error
                    raise PathRefused(f"{where}: {exc}") from None
                except UnitReadError as exc:
                    raise type(exc)(f"{where}: {exc}") from exc  # keeps PathRefused a PathRefused
                env.delay(1)
                unit.done()

    return native_reader(out_schema, batches())


def _unit_rows(env: Env, feed_id: str, partitions: list[int], tag: bool = False) -> Iterator[pa.RecordBatch]:
    """The ``units`` reader: unit bodies as rows, many units per batch (``tag``: and their ids)."""
    for partition in partitions:
        inbox = env.inputs.inbox(feed_id, partition)
        while units := inbox.take(UNITS_PER_BATCH):
            env.delay(len(units))
            columns: list[pa.Array] = [pa.array([u.body for u in units], pa.binary())]
            if tag:
                columns.append(unit_tags(pa.array([u.id for u in units], pa.uint64())))
            yield pa.record_batch(columns, names=["unit", UNIT_COLUMN][: len(columns)])
            for u in units:
                u.done()
