"""Backpressure from a task's output to its Acero plan's sources: what a plan computes ahead stays bounded.

Why: Acero's sink queues what a plan computes until the reader takes it, and only pauses the
plan's sources past 1 GiB. A task whose output nobody reads (a head whose client never opens
its DoGet, a map stage whose client does not read) stops taking from the plan, and the plan went
on: a worker limited to 1 GB reached 2.5-4.6 GB resident under eight such map stages, while it
counted 336 MB (issue 41). pyarrow does not let the sink's threshold be set.

So the Python sources of a *streaming* plan (filters, projections, unions and limits over feed
scans, input and shuffle reads: every batch in comes out, reduced, without being held) pass a
``Gate``: a source may take its next batch while the task's reader waits on the plan, or while
less than ``bound`` bytes were taken since the reader last came back for more. A reader that is
busy elsewhere (its output buffer full, its exchange not read) so holds the plan back within
``bound``; a reader waiting on the plan (a filter that drops everything) never does. Plans with
an aggregate, a join, a sort or a window hold their input by nature and are not gated: what they
hold is the engine's (docs/engine.md).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pyarrow as pa

from flight.wire._proto import plan_pb2
from flight.wire.operators import operators

__all__ = ["DEFAULT_BOUND", "Gate", "streaming"]

DEFAULT_BOUND = 32 << 20
"""Bytes a gated plan's sources may take while its reader is away: an output buffer's worth."""

_STREAMING = {"feed_scan", "exchange_input", "shuffle_read", "values", "filter", "project", "limit", "union"}


def streaming(root: plan_pb2.Operator) -> bool:
    """Whether every operator of the plan passes its batches on without holding them (a gate cannot stall it)."""
    return all(op.WhichOneof("kind") in _STREAMING for op in operators(root))


class Gate:
    """The sources' side (``source``) and the reader's side (``output``) of one task's plan."""

    def __init__(self, bound: int = DEFAULT_BOUND) -> None:
        self.bound = max(1, bound)
        self._cond = threading.Condition()
        self._waiting = False  # the reader waits on the plan for its next batch
        self._taken = 0  # bytes the sources took since the reader last came back
        self._closed = False
        self._held = 0  # sources waiting at the gate now

    @property
    def held(self) -> int:
        """How many sources wait at the gate now (what a test waits for, rather than sleeping)."""
        with self._cond:
            return self._held

    def source(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``batches``, each taken only when the gate is open."""
        for batch in batches:
            with self._cond:
                if not (self._closed or self._waiting or self._taken < self.bound):
                    self._held += 1
                    while not (self._closed or self._waiting or self._taken < self.bound):
                        self._cond.wait(0.5)
                    self._held -= 1
                self._taken += batch.nbytes
            yield batch

    def output(self, reader: pa.RecordBatchReader) -> pa.RecordBatchReader:
        """``reader`` as the task reads it: the gate opens while it waits on the plan."""
        return pa.RecordBatchReader.from_batches(reader.schema, self._read(reader))

    def _read(self, reader: pa.RecordBatchReader) -> Iterator[pa.RecordBatch]:
        try:
            while True:
                self._set_waiting(True)
                try:
                    batch = reader.read_next_batch()
                except StopIteration:
                    return
                finally:
                    self._set_waiting(False)
                yield batch
        finally:
            with self._cond:
                self._closed = True  # first: closing the plan waits for its sources, which must not wait here
                self._cond.notify_all()
            reader.close()

    def _set_waiting(self, waiting: bool) -> None:
        with self._cond:
            self._waiting = waiting
            if waiting:
                self._taken = 0
                self._cond.notify_all()
