"""Run a query in this process: the same engine (one Acero plan), no workers, no network.

The baseline "what one process does with pyarrow Acero" that benchmarks
compare distributed execution with, and a quick way to try a plan. Feeds run
in place: each partition's provider is drained as the scan asks for units.

Data confinement: by default the readers open any path (``confine.ANY_PATH``): this
runs in the caller's own process, with the caller's permissions, on units the caller's
own providers discovered, so a check would protect nothing. Pass ``data_roots`` to
check paths as a worker started with those ``--data-root`` directories would.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
from collections.abc import Iterable, Iterator, Sequence

import pyarrow as pa

from flight.engine.acero.pipeline import source_threads
from flight.engine.confine import ANY_PATH, DataRoots
from flight.engine.select import compile_task
from flight.errors import PlanError, ProtocolError
from flight.plan.query import Query
from flight.planner.cut import plan_query
from flight.planner.stages import PlannerOptions
from flight.sources.feed import FeedContext, WorkUnitFeed, unit_bytes
from flight.wire._proto import plan_pb2

__all__ = ["run_local"]

_IO_MARGIN = 8
"""I/O threads beyond the plan's blocking sources, for readers that use the pool themselves."""


class _Unit:
    __slots__ = ("body",)

    def __init__(self, body: bytes) -> None:
        self.body = body

    @property
    def id(self) -> int:
        return 0  # run_local never tags rows with their unit

    def done(self) -> None:
        pass


class _Inbox:
    """A partition's units straight from its provider (async providers are drained first)."""

    def __init__(self, feed: WorkUnitFeed, partition: int, partitions: int, cancelled: threading.Event) -> None:
        ctx = FeedContext("local", feed.feed_id, partition, partitions, cancelled)
        stream = feed.feed(partition, ctx)
        if inspect.isasyncgen(stream) or hasattr(stream, "__anext__"):
            self._units: Iterator[object] = iter(asyncio.run(_collect(stream)))
        else:
            self._units = iter(stream)

    def take(self, most: int = 1) -> list[_Unit]:
        out = []
        for unit in self._units:
            out.append(_Unit(unit_bytes(unit)))  # type: ignore[arg-type]
            if len(out) >= most:
                break
        return out


async def _collect(stream: object) -> list[object]:
    return [u async for u in stream]  # type: ignore[attr-defined]


class _LocalInputs:
    task_number = 0

    def __init__(self, feeds: dict[str, tuple[WorkUnitFeed, int]]) -> None:
        self._feeds = feeds
        self.cancelled = threading.Event()

    def feed_partitions(self, feed_id: str) -> list[int]:
        if feed_id not in self._feeds:  # as a worker's task says it (``worker.tasks.Task``)
            raise ProtocolError(f"the plan scans feed {feed_id!r}, which the task was not given", field="header.feeds")
        return list(range(self._feeds[feed_id][1]))

    def inbox(self, feed_id: str, partition: int) -> _Inbox:
        feed, partitions = self._feeds[feed_id]
        return _Inbox(feed, partition, partitions, self.cancelled)

    def input_batches(self) -> Iterable[pa.RecordBatch]:
        raise PlanError("run_local cannot run a map stage; use flight.map_batches with a worker")

    def read_partitions(self, producers: list[tuple[str, bytes]], start: int, end: int) -> Iterator[pa.RecordBatch]:
        raise PlanError("run_local plans one stage; it never reads another stage")


def run_local(
    query: Query,
    batch_rows: int = 64 * 1024,
    *,
    data_roots: Sequence[str | os.PathLike[str]] | None = None,
    engine: str | None = None,
) -> pa.RecordBatchReader:
    """The query's rows, computed in this process as one task: the plan a one-worker cluster runs.

    ``engine``: ``"duckdb"`` (the default, as on workers) or ``"acero"`` (every operator on one
    streaming Acero plan, as workers started with ``--engine acero`` run it).

    ``data_roots``: ``None`` (the default) reads any path this process can; directories confine
    the file readers to them, exactly as on a worker (``ValueError`` if one is not a directory).
    """
    roots = ANY_PATH if data_roots is None else DataRoots.of(data_roots)
    plan = plan_query(query.node, max_tasks=1, options=PlannerOptions(one_stage=True))
    if len(plan.stages) != 1:  # pragma: no cover - one task never needs a network boundary
        raise PlanError("a one-task plan should be a single stage")
    stage = plan.head
    feeds = {f.feed.feed_id: (f.feed, f.partitions) for f in stage.feeds}
    inputs = _LocalInputs(feeds)
    stage_plan = plan_pb2.StagePlan()
    stage_plan.root.CopyFrom(stage.root.to_proto())
    # Every blocking source of the plan may hold an I/O thread while it waits (a worker admits
    # tasks against the same count): a pool smaller than that deadlocks, so grow it (never shrink).
    need = source_threads(stage_plan) + _IO_MARGIN
    if pa.io_thread_count() < need:
        pa.set_io_thread_count(need)
    if engine not in (None, "duckdb", "acero"):
        raise ValueError(f"engine must be 'duckdb' or 'acero', not {engine!r}")
    return compile_task(stage_plan, inputs, batch_rows, roots=roots, engine=engine)
