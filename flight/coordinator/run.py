"""One execution (attempt) of a query: size, bind and open its tasks, feed them, read the head.

Size every stage (a shared-queue leaf from its first discovered units), bind task
slots to the attempt's workers, give every consumer task the URLs and keys of the
producer tasks it reads (in its own copy of the plan), open one DoExchange per
task of every stage (all stages run at once, rows stream between them; in turns
when together they need more source threads than their workers have:
``opening.py``), start the feed dispatcher, and read the head stage's output
with DoGet into one bounded queue behind the caller's reader. Any failure (a task error, a provider
exception, a dead worker) aborts every task and surfaces as one exception;
closing the channels is what frees the tasks on the workers. Whether a failed
attempt runs again is ``exec._Attempts``'s decision (``recovery.py``).

A streaming scan (``ExecOptions.unit_recovery``: one stage of filters and
projections over one feed) survives a lost worker within the attempt: its tasks
tag their rows with their work unit, each head stream goes through a
``units.UnitGate`` (a unit's rows reach the caller once the unit is complete),
and a lost task is replaced on another worker, which the state machine sends the
lost task's undelivered units (``_lost``, ``_replace``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pyarrow as pa

from flight.coordinator.binding import bound_header
from flight.coordinator.channel import TaskChannel
from flight.coordinator.context import RunContext
from flight.coordinator.dispatch import FeedDispatcher, Source
from flight.coordinator.metrics import QueryMetrics, TaskStats
from flight.coordinator.opening import Opening
from flight.coordinator.placement import PLACEMENT, plan_key
from flight.coordinator.replay import Replay, replay_mode
from flight.coordinator.resolver import normalize_url
from flight.coordinator.results import DONE as _DONE
from flight.coordinator.results import offer as _offer
from flight.coordinator.stagereplay import StageReplay
from flight.errors import (
    FlightExecError,
    PlanError,
    QueryTimeoutError,
    ResolverError,
    TaskCancelledError,
    TaskFailedError,
    WorkerBusyError,
    WorkerError,
    WorkerUnavailableError,
)
from flight.heap import busy, idle
from flight.plan.nodes import InputCallNode
from flight.planner.stages import StageSpec
from flight.threads import spawn
from flight.wire._proto import protocol_pb2
from flight.wire.arrow_types import UNIT_COLUMN, UNIT_TYPE
from flight.wire.clients import read_stream, shared_pool, translate_flight_error
from flight.wire.integrity import StreamIntegrityError
from flight.wire.protocol import new_secret

__all__ = ["Run"]

log = logging.getLogger("flight.coordinator.exec")


class Run:
    """One execution (attempt) of a DistributedExec: its channels, feeds and result queue."""

    def __init__(self, context: RunContext, excluded: set[str] | None = None, *, retain: bool = False, detached: bool = False) -> None:
        self.context = context
        self.excluded = excluded or set()
        self.retain = retain  # head outputs kept for any number of reads (a detached query's, for Spark)
        self.detached = detached  # its head outputs are read by others (``start_detached``)
        self.urls: list[str] = []  # the workers this attempt bound tasks to
        self.options = context.options
        self.plan = context.plan
        self.base_id = self.query_id = uuid.uuid4().hex[:16]
        self.admitted = False  # every task accepted: from then on any error fails the query
        self.secret = new_secret()  # in every header and ticket: the query id alone opens nothing
        self.retries = 0
        self.clients = shared_pool(self.options.security)
        self.results: queue.Queue[object] = queue.Queue(maxsize=max(1, self.options.result_queue_batches))
        self.error: BaseException | None = None
        self.failed = threading.Event()
        self.lock = threading.Lock()  # the first error, the end, and a replacement's bookkeeping
        self._finished = False
        self.channels: list[TaskChannel] = []
        self.by_stage: dict[int, list[TaskChannel]] = {}
        self.sources: dict[str, list[Source]] = {}
        # Losing a worker after the tasks started: replayed within the attempt (replay.py), if it can be.
        mode = replay_mode(self.plan, self.options, retain)
        self.staged = mode == "stages"  # a multi-stage attempt: lost tasks run again (stagereplay.py)
        # Rows sent by another process (a Spark DataFrame's tasks): every stage keeps its output (memory,
        # then spill), so a sender never waits for a reader that waits for the sender's cores.
        self.fed = any(isinstance(n, InputCallNode) for st in self.plan.stages for n in st.root.walk())
        self.replay = StageReplay(self) if self.staged else Replay(self, mode) if mode is not None else None
        # Outputs kept (memory, then spill) for re-reads: below the head (a lost task's readers run again), the head's for others.
        self.keep_outputs = self.staged or self.fed
        self.keep_head = retain
        self.opening_notes: list[str] = []  # how its tasks were opened, when not all at once as asked (explain(analyze=True))
        self.opening = Opening(self)  # all at once, in the global order, or in turns (opening.py)
        self.tagged = mode == "units"
        self.counts: dict[int, int] = {}
        self._assigned: dict[tuple[int, int], list[dict[str, list[int]]]] = {}  # (stage id, tasks) -> each task's feed partitions
        self.heads: list[TaskChannel] = []  # the head tasks as launched (replacements take their places)
        self.dispatcher = FeedDispatcher(
            self.query_id,
            discovery_buffer=self.options.discovery_buffer,
            max_units_per_frame=self.options.max_units_per_frame,
            affinity_wait_s=self.options.affinity_wait,
            on_error=self.fail,
            on_replace=self.replay.replace if self.replay is not None else None,
        )
        self.started = time.perf_counter()
        self.started_at = time.monotonic()  # the zero of its tasks' time line (``TaskChannel.opened_at``)
        self._release: Callable[[], None] | None = None  # its count in ``PLACEMENT``, once its tasks are bound
        self.first_batch_s: float | None = None
        self.bound: dict[int, list[str]] = {}  # this attempt's: stage id -> the URL of each task
        context.sink.named(self.query_id, self.secret, self.bound)  # explain() shows the latest execution's
        self._timer: threading.Timer | None = None
        left = context.deadline_left()  # the execution's: an attempt after a lost worker gets what is left of it
        if left is not None:
            self._timer = threading.Timer(left, self._expire)
            self._timer.daemon = True
            self._timer.start()
        if not detached:  # its results are read here: glibc keeps the freed receive buffers until _finish (flight/heap.py)
            busy(self)

    def _expire(self) -> None:
        self.fail(QueryTimeoutError(f"query {self.base_id} ran past its deadline of {self.options.deadline:g}s; every task was cancelled"))

    def fail(self, error: BaseException) -> None:
        """Record the first failure and stop everything; later errors are consequences."""
        if isinstance(error, WorkerUnavailableError) and error.worker_url:
            self.clients.forget(error.worker_url)  # a restarted worker gets a fresh connection
        with self.lock:
            if self.error is not None:
                return
            self.error = error
        self.failed.set()
        # The feed state machine cancels every task still open (each once), and nothing is sent after.
        self.dispatcher.stop(f"query {self.query_id} failed: {error}")
        _offer(self.results, _DONE)

    # ------------------------------------------------------------ set-up

    def _size(self, stage: StageSpec, workers: int) -> int:
        """A stage's task count: planned, or estimated now from a shared feed's first units."""
        if stage.task_roots is not None:
            return len(stage.task_roots)  # co-located: task t reads key range t, on whichever worker
        if not stage.sized_at_execution:
            return max(1, min(stage.task_count, workers))
        estimator = self.context.estimator
        source = self.sources[stage.shared_feeds[0].feed.feed_id][0]
        sample = self.dispatcher.sample(source, estimator.sample_units, estimator.sample_ms / 1000)
        limit = min(stage.max_tasks, workers)
        estimate = estimator.estimate(sample, limit)
        if not 1 <= estimate.tasks <= limit:
            raise PlanError(f"the task estimator chose {estimate.tasks} tasks; it must choose between 1 and {limit}")
        stage.estimate, stage.task_count = estimate, estimate.tasks
        log.debug("query %s stage %d: %s", self.query_id, stage.stage_id, estimate.describe())
        return estimate.tasks

    def start(self) -> Iterator[pa.RecordBatch]:
        self.launch()
        for channel in self.heads:  # a head task replaced meanwhile is read by its replacement's own thread
            if self.replay is None or channel.key not in self.replay.gone:
                spawn(self._read_output, channel, name=f"doget-{channel.key}")
        return self._batches()

    def launch(self) -> None:
        """Size, bind and open every task, and start the feeds; the head's output is left unread."""
        try:
            # Discovery starts first: it overlaps sizing, connecting and the tasks' start.
            for stage in self.plan.stages:
                for f in stage.feeds:
                    self.sources[f.feed.feed_id] = [
                        self.dispatcher.add_source(f.feed, p, f.partitions, shared=f.shared) for p in range(f.partitions)
                    ]
            self.dispatcher.start_discovery()
            urls = [u for u in self.context.resolver.get_urls() if normalize_url(u) not in self.excluded and u not in self.excluded]
            if not urls:
                lost = f" (lost this query: {', '.join(sorted(self.excluded))})" if self.excluded else ""
                raise ResolverError(f"the resolver returned no worker URLs at execution time{lost}")
            self.urls = urls
            counts = {s.stage_id: self._size(s, len(urls)) for s in self.plan.stages}
            start = PLACEMENT.start(plan_key(self.plan.stages), urls)  # the plan's own workers, unless busier (placement.py)
            for stage in self.plan.stages:
                # Stages start at different workers, so a small stage does not always land on the first.
                offset = (stage.stage_id + start) % len(urls)
                self.bound[stage.stage_id] = [urls[(offset + t) % len(urls)] for t in range(counts[stage.stage_id])]
            self._release = PLACEMENT.hold(u for bound in self.bound.values() for u in bound)
            self.counts = counts
            if isinstance(self.replay, StageReplay):
                self.replay.bind()
            self.opening.admit(counts)
            for channel in self.by_stage[self.plan.head.stage_id]:
                self.check_schema(channel)
        except BaseException as exc:
            self.fail(exc)
            self._finish()
            # The first failure is the cause; later ones (cancellations) are its consequences.
            if self.error is not None and self.error is not exc:
                raise self.error from None
            raise
        self.heads = list(self.by_stage[self.plan.head.stage_id])  # one result end (``_DONE``) each, whoever reads it
        self.admitted = True
        if not self.opening.turned:  # opened in turns, units flow already (``opening.turns`` is cleared by now)
            self.dispatcher.start_sending()

    def reset_replay(self) -> None:
        """The attempt's tasks were let go before anything was sent: the replay starts again from the binding."""
        if self.replay is not None:
            self.replay.reset()
            if isinstance(self.replay, StageReplay):
                self.replay.bind()

    def channel_error(self, channel: TaskChannel, error: BaseException) -> None:
        """A task's error fails the query, except a busy refusal of a task the opening still waits for
        (``Opening.refused_while_opening``: not one admitted in turns) and a lost worker under a task
        that can be run again (``replay.py``, ``stagereplay.py``)."""
        turns = self.opening.turns
        if turns is not None:
            turns.wake()
        if isinstance(error, WorkerBusyError) and not self.admitted:
            if self.opening.refused_while_opening(channel):
                return  # wait_ready raises it (or the turns see it), and the opening retries
            error = TaskFailedError(
                f"the worker refused the task as busy after it admitted it, while the query's tasks were opened in turns: {error.cause}",
                worker_url=channel.url,
                stage_key=channel.key,
            )
        if self.replay is not None and self.admitted and self.replay.watches(channel):
            if isinstance(error, WorkerUnavailableError):
                self.clients.forget(channel.url)
            self.replay.lost(channel, error)
            return
        self.fail(error)

    def stage_channels(self, stage: StageSpec, counts: dict[int, int]) -> None:
        """Every task of ``stage``: its channel (not open), its feed slots."""
        self.by_stage[stage.stage_id] = []
        for task in range(counts[stage.stage_id]):
            self.add_task(stage, task, counts)

    def add_task(self, stage: StageSpec, task: int, counts: dict[int, int], *, late: bool = False) -> TaskChannel:
        """Task ``task`` of ``stage``: its channel (not open) and its feed slots; ``late``: units flow already,
        and none goes to it before it is admitted (``FeedDispatcher.task_ready``)."""
        assigned = self._assignments(stage, counts[stage.stage_id])[task]
        header = bound_header(
            stage, task, counts, assigned, query_id=self.query_id, secret=self.secret, bound=self.bound,
            options=self.options, retain=self.keep_head, tagged=self.tagged, recoverable=self.keep_outputs,
        )
        channel = self.make_channel(header)
        self.by_stage.setdefault(stage.stage_id, []).append(channel)
        self.channels.append(channel)
        exclusive = (self.retain or self.staged) and self.replay is not None
        self.dispatcher.add_task(channel, recoverable=self.tagged, exclusive=exclusive, late=late)
        # Slots exist before the channel opens: credits may arrive at once.
        for feed_id, partitions in assigned.items():
            feed_sources = self.sources[feed_id]
            for p in partitions:
                source = feed_sources[0] if feed_sources[0].shared else feed_sources[p]
                self.dispatcher.add_slot(source, p, channel)
        return channel

    def _assignments(self, stage: StageSpec, count: int) -> list[dict[str, list[int]]]:
        """``stage.assignments(count)``, made once per stage and count, each task taking its own entry: made
        for every task, a stage of n tasks over p feed partitions cost n × (n + p)."""
        key = (stage.stage_id, count)
        if key not in self._assigned:
            self._assigned[key] = stage.assignments(count)
        return self._assigned[key]

    def make_channel(self, header: protocol_pb2.TaskHeader, name: str | None = None) -> TaskChannel:
        """A task's channel (not open); a head task of a replayable execution is watched for loss."""
        channel = TaskChannel(
            header.target_worker_url,
            header,
            on_credit=self.dispatcher.on_credit,
            on_error=self.channel_error,
            on_finished=self._task_finished,
            on_ready=self._task_ready,
            heartbeat=self.options.heartbeat,
            peer_timeout=self.options.peer_timeout,
            name=name,
        )
        if self.replay is not None:
            self.replay.track(channel)
        return channel

    def _task_finished(self, channel: TaskChannel) -> None:
        if isinstance(self.replay, StageReplay):
            self.replay.finished(channel)
        turns = self.opening.turns  # read once: cleared once every task was opened
        if turns is not None:
            turns.finished(channel)
        self.dispatcher.on_finished(channel)

    def _task_ready(self, channel: TaskChannel) -> None:
        turns = self.opening.turns
        if turns is not None:
            turns.wake()

    def check_schema(self, channel: TaskChannel) -> None:
        planned = self.plan.head.output_schema
        if self.tagged:
            planned = planned.append(pa.field(UNIT_COLUMN, UNIT_TYPE))
        if channel.output_schema is not None and not channel.output_schema.equals(planned):
            raise WorkerError(
                f"the worker's output schema {channel.output_schema} differs from the planned {planned}",
                worker_url=channel.url,
                stage_key=channel.key,
            )

    # ------------------------------------------------------------ results

    def head_ticket(self, channel: TaskChannel) -> bytes:
        """The DoGet ticket of a head task's one output partition (the query's secret inside)."""
        return protocol_pb2.Ticket(
            stage_key=channel.header.stage_key, partition_start=0, partition_end=1, query_secret=self.secret
        ).SerializeToString()

    def _read_output(self, channel: TaskChannel) -> None:
        if self.replay is not None and (self.tagged or self.staged):
            self.replay.read(channel)
            return
        ticket = self.head_ticket(channel)
        try:
            for batch in read_stream(self.clients.get(channel.url), ticket, stall=self.options.peer_timeout, url=channel.url,
                                     checksums=self.options.stream_checksums):
                if not _offer(self.results, batch, self.failed):
                    return
            if not self.failed.is_set():
                _offer(self.results, (_DONE, channel), self.failed)
        except StreamIntegrityError as exc:  # the stream broke its trailer: a lost stream, not a hang (the chaos run)
            self.fail(exc)
        except (pa.ArrowException, OSError) as exc:
            # The task's own error frame says more than the broken stream: give it a moment.
            channel.done.wait(2.0)
            self.fail(channel.error or translate_flight_error(exc, channel.url, channel.key))

    def _batches(self) -> Iterator[pa.RecordBatch]:
        pending = len(self.heads)
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
        # The result is complete. Upstream tasks report their final metrics as their consumers
        # drain them; the dispatcher half-closes each once it finished, and one still running
        # after a moment is not needed (e.g. below a limit): it is half-closed then.
        self.dispatcher.result_complete()
        deadline = time.monotonic() + self.options.connect_timeout
        for channel in self.channels:
            if self.replay is not None and channel.key in self.replay.gone:
                continue  # lost, and replaced (or its output was all read first)
            ended = channel.done.wait(max(0.0, deadline - time.monotonic()))
            if self.replay is not None and channel.key in self.replay.gone:
                continue  # lost while the result was being completed, and handled
            if not ended:
                self.fail(WorkerError("the worker did not end the task after its output was read", worker_url=channel.url, stage_key=channel.key))
                return
            if channel.error is not None and not isinstance(channel.error, TaskCancelledError):
                self.fail(channel.error)
                return

    def abandon(self) -> None:
        """The caller's reader is gone: cancel whatever still runs."""
        if not self._finished:
            self.fail(TaskCancelledError("the result reader was dropped before it was read to the end"))
            self._finish()

    def _finish(self) -> None:
        with self.lock:
            if self._finished:
                return
            self._finished = True
        idle(self)
        if self._release is not None:
            self._release()
        self.dispatcher.stop()
        if self._timer is not None:
            self._timer.cancel()
        for channel in self.channels:
            channel.finish()
        self.context.sink.finished(QueryMetrics(
            query_id=self.query_id,
            elapsed_s=time.perf_counter() - self.started,
            first_batch_s=self.first_batch_s,
            tasks=[TaskStats.from_proto(c.metrics, c.url) for c in self.channels if c.metrics is not None],
            feeds=self.dispatcher.stats,
            notes=tuple(self.opening_notes),
        ))
        if self.error is not None and not isinstance(self.error, FlightExecError):
            log.debug("query %s failed in user code: %r", self.query_id, self.error)
