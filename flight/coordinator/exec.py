"""``DistributedExec``: plan a query, run its tasks on workers, stream the result.

Execution: bind task slots to the resolver's current URLs, open one
DoExchange per task (the header rides in the descriptor), wait until every
worker accepted its task, start the feed dispatcher, read each task's output
with DoGet into one bounded queue, and hand the caller a RecordBatchReader
over that queue. Any failure (a task error, a provider exception, a dead
worker) aborts every task and surfaces as one exception; closing the channels
is what frees the tasks on the workers.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import replace

import pyarrow as pa
import pyarrow.flight as fl

from flight._proto import protocol_pb2
from flight.config import ExecOptions
from flight.coordinator.channel import ClientPool, TaskChannel, translate_flight_error
from flight.coordinator.dispatch import FeedDispatcher, Source
from flight.coordinator.metrics import QueryMetrics, TaskStats
from flight.engine.pipeline import limit_batches
from flight.errors import FlightExecError, PlanError, ResolverError, TaskCancelledError, WorkerError
from flight.estimate import DefaultTaskEstimator, TaskEstimator
from flight.plan.query import Query
from flight.planner import StageSpec, plan_stage
from flight.protocol import PROTOCOL_VERSION, make_stage_key
from flight.resolver import StaticWorkerResolver, WorkerResolver

__all__ = ["DistributedExec"]

log = logging.getLogger(__name__)

_COMPRESSION = {
    "none": protocol_pb2.COMPRESSION_NONE,
    "lz4": protocol_pb2.COMPRESSION_LZ4,
    "zstd": protocol_pb2.COMPRESSION_ZSTD,
}

_DONE = object()


class DistributedExec:
    """Runs a ``Query`` on the workers a ``WorkerResolver`` names.

    Planning happens here, with ``len(resolver.get_urls())`` as the most tasks
    the stage may get; URLs are bound to tasks when ``execute()`` runs.
    """

    def __init__(
        self,
        query: Query,
        resolver: WorkerResolver | Sequence[str],
        options: ExecOptions | None = None,
        *,
        estimator: TaskEstimator | None = None,
        **overrides: object,
    ) -> None:
        self.query = query
        self.estimator = estimator or DefaultTaskEstimator()
        self.resolver = resolver if isinstance(resolver, WorkerResolver) else StaticWorkerResolver(list(resolver))
        self.options = replace(options or ExecOptions(), **overrides)  # type: ignore[arg-type]
        if self.options.compression not in _COMPRESSION:
            raise ValueError(f"compression must be one of {sorted(_COMPRESSION)}, not {self.options.compression!r}")
        self.stage: StageSpec = plan_stage(query.node, len(self.resolver.get_urls()))
        self.metrics: QueryMetrics | None = None
        self.query_id: str | None = None  # of the latest execute(), known from its start
        self._bound: list[str] | None = None

    # ---------------------------------------------------------------- explain

    def explain(self) -> str:
        """The stage, its tasks and their workers (planned slots until executed)."""
        stage = self.stage
        urls = self._bound or self.resolver.get_urls()
        state = "bound" if self._bound else "planned"
        pending = stage.sized_at_execution and stage.estimate is None
        count = f"up to {stage.max_tasks}" if pending else str(stage.task_count)
        lines = [f"Stage {stage.stage_id} (leaf, head): {count} task(s), {state} workers"]
        lines += [f"  note: {n}" for n in stage.notes]
        if stage.estimate is not None:
            lines.append(f"  estimate: {stage.estimate.describe()}")
        for t, assigned in enumerate(stage.assignments(stage.max_tasks if pending else stage.task_count)):
            url = urls[t % len(urls)] if urls else "?"
            feeds = ", ".join(f"{fid}{'[shared]' if self._is_shared(fid) else parts}" for fid, parts in assigned.items()) or "-"
            lines.append(f"  task {t} -> {url}  feeds: {feeds}")
        lines += ["  " + line for line in stage.root.explain_lines()]
        if stage.final_limit:
            lines.insert(1, f"  final limit {stage.final_limit[0]} offset {stage.final_limit[1]} on the coordinator")
        if self.metrics is not None:
            lines.append(self.metrics.describe())
        return "\n".join(lines)

    def _is_shared(self, feed_id: str) -> bool:
        return any(f.feed.feed_id == feed_id for f in self.stage.shared_feeds)

    # -------------------------------------------------------------- execution

    def to_table(self) -> pa.Table:
        return self.execute().read_all()

    def execute(self) -> pa.RecordBatchReader:
        """Start the query and return its rows as a stream."""
        run = _Run(self)
        batches = run.start()
        if self.stage.final_limit is not None:
            count, offset = self.stage.final_limit
            batches = _closing(limit_batches(batches, count, offset), batches)
        return pa.RecordBatchReader.from_batches(self.stage.output_schema, batches)


def _closing(outer: Iterator[pa.RecordBatch], inner: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``outer``, closing ``inner`` (and so the query) when it stops early."""
    try:
        yield from outer
    finally:
        close = getattr(inner, "close", None)
        if close is not None:
            close()


class _Run:
    """One execution of a DistributedExec: its channels, feeds and result queue."""

    def __init__(self, ex: DistributedExec) -> None:
        self.ex = ex
        self.options = ex.options
        self.stage = ex.stage
        self.query_id = ex.query_id = uuid.uuid4().hex[:16]
        self.clients = ClientPool()
        self.results: queue.Queue[object] = queue.Queue(maxsize=max(1, self.options.result_queue_batches))
        self.error: BaseException | None = None
        self.failed = threading.Event()
        self._lock = threading.Lock()
        self.channels: list[TaskChannel] = []
        self.dispatcher = FeedDispatcher(
            self.query_id,
            discovery_buffer=self.options.discovery_buffer,
            max_units_per_frame=self.options.max_units_per_frame,
            affinity_wait_s=self.options.affinity_wait,
            on_error=self.fail,
        )
        self.started = time.perf_counter()
        self.first_batch_s: float | None = None

    def fail(self, error: BaseException) -> None:
        """Record the first failure and stop everything; later errors are consequences."""
        with self._lock:
            if self.error is not None:
                return
            self.error = error
        self.failed.set()
        self.dispatcher.stop()
        for channel in self.channels:
            channel.abort(f"query {self.query_id} failed: {error}")
        _offer(self.results, _DONE)

    def _bind(self, task_count: int) -> list[str]:
        urls = self.ex.resolver.get_urls()
        if not urls:
            raise ResolverError("the resolver returned no worker URLs at execution time")
        self.ex._bound = [urls[t % len(urls)] for t in range(task_count)]
        return self.ex._bound

    def _header(self, task: int, url: str, assigned: dict[str, list[int]]) -> protocol_pb2.TaskHeader:
        stage, opts = self.stage, self.options
        shared = {f.feed.feed_id for f in stage.shared_feeds}
        return protocol_pb2.TaskHeader(
            protocol_version=PROTOCOL_VERSION,
            stage_key=make_stage_key(self.query_id, stage.stage_id, task),
            task_count=len(self.ex._bound or ()),
            plan=self._plan_bytes,
            feeds=[
                protocol_pb2.FeedAssignment(feed_id=f, partitions=p, window=opts.shared_window if f in shared else 0)
                for f, p in assigned.items()
            ],
            target_worker_url=url,
            query_start_unix_nanos=time.time_ns(),
            options=protocol_pb2.TaskOptions(
                ipc_compression=_COMPRESSION[opts.compression],
                feed_window=opts.feed_window,
                output_buffer_bytes=opts.output_buffer_bytes,
            ),
        )

    def _size(self) -> int:
        """The stage's task count: planned, or estimated now from a shared feed's first units."""
        stage = self.stage
        if not stage.sized_at_execution:
            return stage.task_count
        estimator = self.ex.estimator
        source = self.sources[stage.shared_feeds[0].feed.feed_id][0]
        sample = self.dispatcher.sample(source, estimator.sample_units, estimator.sample_ms / 1000)
        workers = min(stage.max_tasks, len(self.ex.resolver.get_urls()) or 1)
        estimate = estimator.estimate(sample, workers)
        if not 1 <= estimate.tasks <= workers:
            raise PlanError(f"the task estimator chose {estimate.tasks} tasks; it must choose between 1 and {workers}")
        stage.estimate, stage.task_count = estimate, estimate.tasks
        log.debug("query %s: %s", self.query_id, estimate.describe())
        return estimate.tasks

    def start(self) -> Iterator[pa.RecordBatch]:
        self._plan_bytes = self.stage.stage_plan().SerializeToString()
        try:
            # Discovery starts first: it overlaps sizing, connecting and the tasks' start.
            self.sources: dict[str, list[Source]] = {}
            for f in self.stage.feeds:
                self.sources[f.feed.feed_id] = [
                    self.dispatcher.add_source(f.feed, p, f.partitions, shared=f.shared) for p in range(f.partitions)
                ]
            self.dispatcher.start_discovery()
            task_count = self._size()
            urls = self._bind(task_count)
            for task, assigned in enumerate(self.stage.assignments(task_count)):
                channel = TaskChannel(
                    urls[task],
                    self._header(task, urls[task], assigned),
                    on_credit=self.dispatcher.on_credit,
                    on_error=lambda ch, err: self.fail(err),
                )
                self.channels.append(channel)
                # Slots exist before any channel opens: credits may arrive at once.
                for feed_id, partitions in assigned.items():
                    feed_sources = self.sources[feed_id]
                    for p in partitions:
                        source = feed_sources[0] if feed_sources[0].shared else feed_sources[p]
                        self.dispatcher.add_slot(source, p, channel)
            for channel in self.channels:
                channel.open(self.clients.get(channel.url))
            deadline = time.monotonic() + self.options.connect_timeout
            for channel in self.channels:
                channel.wait_ready(max(0.0, deadline - time.monotonic()))
                self._check_schema(channel)
        except BaseException as exc:
            self.fail(exc)
            self._finish()
            raise
        self.dispatcher.start_sending()
        for channel in self.channels:
            threading.Thread(target=self._read_output, args=(channel,), name=f"doget-{channel.key}", daemon=True).start()
        return self._batches()

    def _check_schema(self, channel: TaskChannel) -> None:
        if channel.output_schema is not None and not channel.output_schema.equals(self.stage.output_schema):
            raise WorkerError(
                f"the worker's output schema {channel.output_schema} differs from the planned {self.stage.output_schema}",
                worker_url=channel.url,
                stage_key=channel.key,
            )

    def _read_output(self, channel: TaskChannel) -> None:
        ticket = protocol_pb2.Ticket(stage_key=channel.header.stage_key, partition_start=0, partition_end=1)
        try:
            reader = self.clients.get(channel.url).do_get(fl.Ticket(ticket.SerializeToString()))
            while not self.failed.is_set():
                try:
                    chunk = reader.read_chunk()
                except StopIteration:
                    break
                if chunk.data is not None and chunk.data.num_rows:
                    if not _offer(self.results, chunk.data, self.failed):
                        return
            if not self.failed.is_set():
                _offer(self.results, (_DONE, channel), self.failed)
        except (pa.ArrowException, OSError) as exc:
            # The task's own error frame says more than the broken stream: give it a moment.
            channel.done.wait(2.0)
            self.fail(channel.error or translate_flight_error(exc, channel.url, channel.key))

    def _batches(self) -> Iterator[pa.RecordBatch]:
        pending = len(self.channels)
        try:
            while pending:
                item = self.results.get()
                if self.error is not None:
                    break
                if isinstance(item, tuple) and item[0] is _DONE:
                    pending -= 1
                    continue
                if self.first_batch_s is None:
                    self.first_batch_s = time.perf_counter() - self.started
                yield item  # type: ignore[misc]
            if self.error is None:
                self._await_metrics()
            if self.error is not None:
                raise self.error
        finally:
            if self.error is None and pending:
                self.fail(TaskCancelledError("the caller stopped reading the result"))
            self._finish()

    def _await_metrics(self) -> None:
        """All outputs are read: collect each task's final frame (bounded wait)."""
        deadline = time.monotonic() + self.options.connect_timeout
        for channel in self.channels:
            channel.close()
        for channel in self.channels:
            if not channel.done.wait(max(0.0, deadline - time.monotonic())):
                self.fail(WorkerError("the worker did not end the task after its output was read", worker_url=channel.url, stage_key=channel.key))
                return
            if channel.error is not None and not isinstance(channel.error, TaskCancelledError):
                self.fail(channel.error)
                return

    def _finish(self) -> None:
        self.dispatcher.stop()
        for channel in self.channels:
            channel.finish()
        self.clients.close()
        self.ex.metrics = QueryMetrics(
            query_id=self.query_id,
            elapsed_s=time.perf_counter() - self.started,
            first_batch_s=self.first_batch_s,
            tasks=[TaskStats.from_proto(c.metrics, c.url) for c in self.channels if c.metrics is not None],
            feeds=self.dispatcher.stats,
        )
        if self.error is not None and not isinstance(self.error, FlightExecError):
            log.debug("query %s failed in user code: %r", self.query_id, self.error)


def _offer(q: queue.Queue[object], item: object, stop: threading.Event | None = None) -> bool:
    """Put with back-pressure that gives up once ``stop`` is set; False if it gave up."""
    while True:
        try:
            q.put(item, timeout=0.1)
            return True
        except queue.Full:
            if stop is None:
                try:
                    q.get_nowait()  # make room for the wake-up sentinel: the query is over anyway
                except queue.Empty:
                    pass
            elif stop.is_set():
                return False
