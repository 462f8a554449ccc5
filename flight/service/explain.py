"""``EXPLAIN`` and ``EXPLAIN ANALYZE`` statements, answered by the service itself.

A shell's user types ``EXPLAIN SELECT ...`` where a Python user calls ``DistributedExec.explain()``:
the SQL front end refuses ``EXPLAIN`` (it plans queries), so the service takes the word off first.

* ``EXPLAIN stmt``: the statement is planned (nothing runs) and its stages, operators, tasks and
  estimates come back as rows of one column, ``plan``, one line a row.
* ``EXPLAIN ANALYZE stmt``: the statement runs as any other (admitted, on the web page, cancellable
  by its tag or by leaving the read) when its client reads the result; the service reads and counts
  its rows, drops them, and answers with the plan and what each task measured.

The result is served by the service (an endpoint without a location, redeemed with a random handle
once, like a relayed one), so it works the same with direct and relayed endpoints. Handles not
redeemed within the result TTL are forgotten, and at most ``MAX_PENDING`` wait at once.
"""

from __future__ import annotations

import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa

from flight.plan.query import Query as PlannedQuery

__all__ = ["EXPLAIN_SCHEMA", "MAX_PENDING", "Explained", "Explains", "analyzed", "plan_rows", "split_explain"]

EXPLAIN_SCHEMA = pa.schema([pa.field("plan", pa.string(), nullable=False)])
MAX_PENDING = 256
"""Explained statements whose results wait to be read at once; the oldest is forgotten past it (each holds a plan)."""

_WORD = re.compile(r"explain(?:\s+(analyze))?\s+", re.IGNORECASE)
_COMMENT = re.compile(r"\s*(?:--[^\n]*(?:\n|$)|/\*.*?\*/)", re.DOTALL)


def split_explain(text: str) -> tuple[bool, str] | None:
    """``(analyze, statement)`` when ``text`` is ``EXPLAIN [ANALYZE] statement`` (after any leading comments), else None."""
    at = 0
    while (comment := _COMMENT.match(text, at)) is not None and comment.end() > at:
        at = comment.end()
    while at < len(text) and text[at].isspace():
        at += 1
    word = _WORD.match(text, at)
    if word is None:
        return None
    return word.group(1) is not None, text[word.end():]


def plan_rows(text: str) -> pa.Table:
    """An explanation as rows of ``EXPLAIN_SCHEMA``, one line a row."""
    return pa.table({"plan": pa.array(text.splitlines(), pa.string())}, schema=EXPLAIN_SCHEMA)


@dataclass
class Explained:
    """An explained statement waiting for its client's read: the explanation (``EXPLAIN``), or what to run (``ANALYZE``)."""

    user: str
    text: str  # the statement after EXPLAIN [ANALYZE]
    planned: PlannedQuery
    dialect: str
    tag: str
    rows: pa.Table | None = None  # EXPLAIN: made when the statement was planned


class Explains:
    """The explained statements whose results were not read yet, by handle (a capability, as a relay handle is)."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._pending: OrderedDict[bytes, tuple[float, Explained]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, explained: Explained) -> bytes:
        handle = secrets.token_bytes(16)
        now = time.monotonic()
        with self._lock:
            while self._pending and (len(self._pending) >= MAX_PENDING or next(iter(self._pending.values()))[0] < now):
                self._pending.popitem(last=False)
            self._pending[handle] = (now + self.ttl, explained)
        return handle

    def take(self, handle: bytes) -> Explained | None:
        """The statement ``handle`` names, once; None when unknown, read, or past its TTL."""
        with self._lock:
            found = self._pending.pop(handle, None)
        if found is None or found[0] < time.monotonic():
            return None
        return found[1]


def analyzed(run: Callable[[], tuple[int, str]]) -> Iterator[pa.RecordBatch]:
    """The rows of an ``EXPLAIN ANALYZE``: ``run()`` runs the statement, reads its rows, and gives their count and
    the explanation with what each task measured."""
    count, text = run()
    lines = [*text.splitlines(), f"Rows returned: {count:,} (read by the service and dropped: EXPLAIN ANALYZE returns the plan)"]
    yield from pa.table({"plan": pa.array(lines, pa.string())}, schema=EXPLAIN_SCHEMA).to_batches()
