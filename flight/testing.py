"""Readers for tests and benchmarks, loaded on a worker with ``--extension flight.testing``.

They make a unit's cost and outcome explicit in its body (JSON, not code):

* ``testing.sleep``: ``{"id": 7, "ms": 20, "rows": 3}`` sleeps ``ms`` then emits
  ``rows`` rows of ``(id, row)``; schema ``SLEEP_SCHEMA``.
* ``testing.fail``: always fails, naming the unit; for error-path tests.
* ``testing.raise``: raises a plain ``ValueError`` (a reader's own exception type).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pyarrow as pa

from flight.engine.readers import ReaderContext, UnitReadError, register_reader

__all__ = ["SLEEP_SCHEMA", "sleep_unit"]

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
