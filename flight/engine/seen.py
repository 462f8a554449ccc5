"""What a worker worked out of a stage plan it saw before: the type of every operator, and (``duck.engine``) the SQL.

Why: a task's start on the worker was about 8 ms of the interpreter for a TPC-DS query (geomean over the 99 at
SF 1, in process): 3.5 ms checking and typing every operator for Acero (``acero.pipeline.compile_plan``, which
binds each expression over empty inputs) and 3.5 ms translating the plan to DuckDB's SQL, both before DuckDB
starts; with DuckDB's own run at 25-75 ms, a tenth of a small query. Both are functions of the plan's bytes
alone, and a client that runs a query again sends the same bytes: the coordinator plans the same text into
the same operators (a second read of a source is named after the first, ``WorkUnitFeed.again``), and the files
and the tasks' URLs travel in units and headers, not in the plan. So the answers are remembered by the plan's
digest, as the expression-level memos (``flight.wire.memo``) remember an expression's types.

What is not remembered: a plan that did not compile (it is examined, and refused, each time); one of more than
``MAX_PLAN_BYTES`` or ``MAX_FIELDS``; and what depends on the task rather than the plan: that the task was given each feed the
plan scans, and that this worker has each reader it names (``check_task``, every time). Entries are bounded
(``Memo``), and cleared when the engine's settings change (``duck.engine.configure``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa

from flight.engine.readers import get_reader
from flight.engine.scan import TaskInputs
from flight.errors import ProtocolError
from flight.wire._proto import plan_pb2
from flight.wire.arrow_types import UNITS_READER
from flight.wire.memo import Memo
from flight.wire.operators import operators

__all__ = ["ENTRIES", "MAX_FIELDS", "MAX_PLAN_BYTES", "Typed", "check_task", "forget", "plan_digest", "recall", "remember"]

MAX_PLAN_BYTES = 1 << 20
"""The largest plan whose answers are kept."""
MAX_FIELDS = 4096
"""The most columns, summed over a plan's operators, of a plan whose types are kept (TPC-DS at SF 1: median 205,
nine in ten under 800, q14 7,179): with ``ENTRIES``, what a peer's plans can make a worker hold stays near 100 MB
at worst, a few MB for real queries."""
ENTRIES = 128


@dataclass(frozen=True)
class Typed:
    """A plan's operators' schemas by field path (``Env.schemas``), and its scans' feeds and readers."""

    schemas: Mapping[str, pa.Schema]
    scans: tuple[tuple[str, str], ...]
    """(feed id, reader) of every feed scan."""


_TYPED: Memo[bytes, Typed] = Memo(ENTRIES)


def plan_digest(plan: plan_pb2.StagePlan) -> bytes | None:
    """The plan's key (SHA-256 of its deterministic bytes), or None for a plan too large to keep answers of."""
    data = plan.SerializeToString(deterministic=True)
    return hashlib.sha256(data).digest() if len(data) <= MAX_PLAN_BYTES else None


def recall(key: bytes | None) -> Typed | None:
    return None if key is None else _TYPED.get(key)


def remember(key: bytes | None, plan: plan_pb2.StagePlan, schemas: Mapping[str, pa.Schema]) -> None:
    """Keep what compiling ``plan`` (of digest ``key``) typed: ``schemas``, each operator's by its path."""
    if key is None or sum(len(schema) for schema in schemas.values()) > MAX_FIELDS:
        return
    scans = tuple(
        (op.feed_scan.feed.feed_id, op.feed_scan.reader) for op in operators(plan.root) if op.WhichOneof("kind") == "feed_scan"
    )
    _TYPED.put(key, Typed(dict(schemas), scans))


def check_task(typed: Typed, inputs: TaskInputs) -> None:
    """What compiling checks of the task, not of the plan: each scanned feed is the task's, each reader this worker's."""
    for feed_id, reader in typed.scans:
        inputs.feed_partitions(feed_id)  # ProtocolError naming header.feeds when the task was not given it
        if reader != UNITS_READER and get_reader(reader) is None:
            raise ProtocolError(f"plan.root: a scan of feed {feed_id!r} names reader {reader!r}, not on this worker", field="plan.root")


def forget() -> None:
    """Drop every remembered answer (the engine's settings changed)."""
    _TYPED.clear()
