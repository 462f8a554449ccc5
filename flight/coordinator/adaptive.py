"""Running an adaptive point's side first and reading its rows, up to a bound (``flight.planner.adaptive``).

The side runs as a query of its own on the same workers, with the same options (its deadline is the
query's), and without adapting again: its own guesses stay guesses. Its rows are read at the coordinator
while they fit ``adaptive_bytes``; past it the side's query is abandoned (its tasks cancelled) and
``None`` says so. Any error the side raises is the query's: the answer is exact or an error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import pyarrow as pa

from flight.config import ExecOptions
from flight.plan.query import Query
from flight.planner.adaptive import AdaptivePoint

__all__ = ["Settled", "Start", "run_side"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Settled:
    """What running a side first gave: its rows (None: they passed the bound) and how long it took."""

    table: pa.Table | None
    seconds: float


Start = Callable[[Query, ExecOptions], tuple[pa.RecordBatchReader, Callable[[], None]]]
"""Executes a query with options: its rows, and what cancels its tasks (``DistributedExec`` does both)."""


def run_side(point: AdaptivePoint, start: Start, options: ExecOptions) -> Settled:
    """Run ``point.side`` with ``start`` and read at most ``options.adaptive_bytes`` of its rows."""
    began = time.monotonic()
    reader, abandon = start(Query(point.side), replace(options, adaptive_bytes=0, progress=False))
    batches: list[pa.RecordBatch] = []
    size = 0
    try:
        for batch in reader:
            size += batch.nbytes
            if size > options.adaptive_bytes:
                log.info("adaptive: the side %s passed %d bytes; the query runs as planned", point.side.label()[:80], options.adaptive_bytes)
                return Settled(None, time.monotonic() - began)
            batches.append(batch)
    finally:
        abandon()  # past the bound, or failed: its tasks are cancelled (after the end, a no-op)
    return Settled(pa.Table.from_batches(batches, reader.schema), time.monotonic() - began)
