"""Readers for tests and benchmarks, loaded on a worker with ``--extension flight.dev.testing``.

They make a unit's cost and outcome explicit in its body (JSON, not code):

* ``testing.sleep``: ``{"id": 7, "ms": 20, "rows": 3}`` sleeps ``ms`` then emits
  ``rows`` rows of ``(id, row)``; schema ``SLEEP_SCHEMA``.
* ``testing.fail``: always fails, naming the unit; for error-path tests.
* ``testing.raise``: raises a plain ``ValueError`` (a reader's own exception type).

And a query that never ends by itself (``waiting_query``: its feed discovers nothing
until the query is cancelled), for tests of capacity and silent peers;
``python -m flight.dev.testing URL`` runs it against a worker, printing ``started`` once
its tasks were admitted (a coordinator process to freeze with SIGSTOP).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator

import pyarrow as pa

from flight.engine.readers import ReaderContext, UnitReadError, register_reader
from flight.plan.expr import col
from flight.plan.query import Query, from_feed
from flight.sources.feed import FeedContext, WorkUnitFeedProvider

__all__ = ["SLEEP_SCHEMA", "WaitForever", "sleep_unit", "waiting_query"]


class WaitForever(WorkUnitFeedProvider):
    """Discovery that finds nothing and never ends, until the query does (or ``seconds`` pass)."""

    def __init__(self, seconds: float = 600.0) -> None:
        self.seconds = seconds

    def feed(self, partition: int, ctx: FeedContext) -> Iterator[bytes]:
        ctx.cancelled.wait(self.seconds)
        return iter(())


def waiting_query() -> Query:
    """A one-stage query whose task waits for units, holding one source thread (a filter keeps Acero in)."""
    return from_feed(WaitForever(), "units", pa.schema([("unit", pa.binary())])).filter(col("unit") != b"")

SLEEP_SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("row", pa.int64())])


def sleep_unit(unit_id: int, ms: float = 0.0, rows: int = 1) -> bytes:
    """The body of a ``testing.sleep`` unit."""
    return json.dumps({"id": unit_id, "ms": ms, "rows": rows}).encode()


def _sleep(body: bytes, ctx: ReaderContext) -> Iterator[pa.RecordBatch]:
    try:
        spec = json.loads(body)
        unit_id, ms, rows = int(spec["id"]), float(spec.get("ms", 0)), int(spec.get("rows", 1))
    except (ValueError, KeyError, TypeError) as exc:
        raise UnitReadError(f"a testing.sleep unit must be JSON with id/ms/rows, got {body[:60]!r}") from exc
    if ms > 0:
        time.sleep(ms / 1000)
    yield pa.record_batch([pa.array([unit_id] * rows, pa.int64()), pa.array(range(rows), pa.int64())], schema=SLEEP_SCHEMA)


def _fail(body: bytes, ctx: ReaderContext) -> Iterator[pa.RecordBatch]:
    raise UnitReadError(f"cannot read unit {body[:60]!r}: the testing.fail reader always fails")
    yield  # pragma: no cover - makes this a generator


def _raise(body: bytes, ctx: ReaderContext) -> Iterator[pa.RecordBatch]:
    raise ValueError(f"odd unit {body[:60]!r}: the testing.raise reader raises a plain ValueError")
    yield  # pragma: no cover - makes this a generator


register_reader("testing.sleep", _sleep)
register_reader("testing.fail", _fail)
register_reader("testing.raise", _raise)


def _main(url: str) -> None:
    from flight.coordinator.exec import DistributedExec

    reader = DistributedExec(waiting_query(), [url]).execute()
    print("started", flush=True)
    reader.read_all()


if __name__ == "__main__":
    _main(sys.argv[1])
