"""``DistributedExec``: plan a query, run it on workers (again, if a worker is lost), stream the result.

One execution is a sequence of attempts (``_Attempts``): each is a ``run.Run``
(size, bind, open, feed, read); an attempt that loses a worker before any row
reached the caller is followed by another on the workers that remain
(``recovery.py``).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

import pyarrow as pa

from flight.config import ExecOptions
from flight.coordinator.adaptive import run_side
from flight.coordinator.context import RunContext
from flight.coordinator.detached import DetachedQuery, HeadPartition, StageProgress, stage_progress
from flight.coordinator.explain import explain_plan
from flight.coordinator.metrics import QueryMetrics
from flight.coordinator.progress import StageBars
from flight.coordinator.recovery import PROBE_TIMEOUT_S, Attempt, may_retry, named_unreachable, probe_lost
from flight.coordinator.resolver import StaticWorkerResolver, WorkerResolver
from flight.coordinator.run import Run
from flight.errors import (
    FlightExecError,
    WorkerError,
)
from flight.plan.nodes import Node
from flight.plan.query import Query
from flight.planner.adaptive import AdaptivePoint, find_point, key_filters, prune_points
from flight.planner.adaptive import settled as settled_root
from flight.planner.composite import composite_point
from flight.planner.cut import plan_query
from flight.planner.inputs import refuse_unsent_inputs
from flight.planner.optimize import push_filters
from flight.planner.rowgroups import cut_feeds
from flight.planner.semijoin import push_semi_joins
from flight.planner.small import hands_off, many_groups, one_host, reads_twice, scan_bytes, small_note, too_many_sources
from flight.planner.stages import PlannerOptions, QueryPlan, StageSpec
from flight.sources.estimate import DefaultTaskEstimator, TaskEstimator
from flight.wire.limits import clip
from flight.wire.protocol import COMPRESSION

__all__ = ["DetachedQuery", "DistributedExec", "HeadPartition"]  # the first and last from detached.py

log = logging.getLogger(__name__)


class DistributedExec:
    """Runs a ``Query`` on the workers a ``WorkerResolver`` names.

    Planning happens here, with ``len(resolver.get_urls())`` as the most tasks
    a stage may get; URLs are bound to tasks when ``execute()`` runs. Several
    executions of one instance may run at once: each binds its own copy of the
    plan (``query_id``, ``bound``, ``metrics`` and ``attempts`` describe the latest).
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
        if self.options.retries < 0:
            raise ValueError(f"retries must be 0 or more, not {self.options.retries}")
        if self.options.compression not in COMPRESSION:
            raise ValueError(f"compression must be one of {sorted(COMPRESSION)}, not {self.options.compression!r}")
        planner_options = PlannerOptions(
            broadcast_bytes=self.options.broadcast_bytes, rows_per_task=self.options.rows_per_task,
            replicate_rows=self.options.replicate_rows, small_query_bytes=self.options.small_query_bytes,
            cut_file_rows=self.options.cut_file_rows,
        )
        urls = self.resolver.get_urls()
        self._planner_options = planner_options
        self.adaptive: AdaptivePoint | None = None  # a join side to run first (flight.planner.adaptive)
        self.prunes: list[AdaptivePoint] = []  # small sides run first for their keys' range (``prune_points``)
        self._root: Node | None = None  # the pushed plan it is a side of
        self._unrotated: Node | None = None  # the pushed plan as planned, when a composite point rotated ``_root``
        self._planned: QueryPlan | None = None  # the plan made before the side ran: what runs if it is large
        self.plan: QueryPlan = self._plan(urls, planner_options)
        self._adaptable(urls)
        self.metrics: QueryMetrics | None = None
        self.query_id: str | None = None  # of the latest execute(), known from its start
        self.query_secret: bytes | None = None  # of the latest execute(): what its tickets and a cancel must carry
        self.bound: dict[int, list[str]] = {}  # stage id -> the URL of each task, once executed
        self.attempts: list[Attempt] = []  # of the latest execute(): the attempts a lost worker failed
        self._latest: weakref.ref[_Attempts] | None = None  # the latest execute()'s attempts, while its reader lives

    def _plan(self, urls: list[str], options: PlannerOptions) -> QueryPlan:
        """The query's stages; on workers that share one host, one task on all its cores where the split would
        cost more than it saves (docs/queries.md, "Small queries"). Planned twice only for a query that
        aggregates many groups: whether its split hands rows off decides."""
        node, limit, small = self.query.node, self.options.one_host_query_bytes, self.options.small_query_bytes
        if not (limit > small > 0 and one_host(urls)):
            return plan_query(node, len(urls), options)
        # Filters pushed and scans sized once, here: planned as one task, the planner need not do either again.
        root = push_filters(node)
        read = scan_bytes(root)
        if read is None or read > limit or (read > small and reads_twice(root)) or too_many_sources(root):
            return plan_query(root, len(urls), options, pushed=True)
        if read > small and many_groups(root) and not hands_off(split := plan_query(root, len(urls), options, pushed=True)):
            return split
        whole = plan_query(root, 1, options, pushed=True)
        whole.rewrites.insert(0, small_note(read, small if read <= small else limit))
        if read > small:
            whole.rewrites.insert(0, f"its {len(urls)} workers share one host: one task on all its cores costs less "
                                     "than the split's stages (one_host_query_bytes)")
        return whole

    def _adaptable(self, urls: list[str]) -> None:
        """Find the plan's adaptive points, if it splits across hosts: a side whose size is a guess (``find_point``;
        else a join of two large tables on a composite key, rotated to be a side: ``composite_point``) and small
        sides whose keys' range prunes a cut file's row groups (``prune_points``); say so in its notes. Workers on
        one host are left alone: rows moved between them are a local copy, cheaper than the wait for the side to finish
        before the rest starts (TPC-H Q18 at SF 1 on one host: 0.25 s streamed, 0.58 s settled first)."""
        if self.options.adaptive_bytes <= 0 or max(s.task_count for s in self.plan.stages) < 2 or one_host(urls):
            return
        root, _ = push_semi_joins(push_filters(self.query.node))
        self.adaptive = find_point(root)
        self._unrotated = root
        if self.adaptive is None and (composite := composite_point(root)) is not None:
            root, self.adaptive = composite  # the rotated plan is the side's: the query runs as planned if it is large
        cut = cut_feeds(self.plan.stages)  # a feed a co-located join groups by key is not cut into runs: nothing to share
        self.prunes = [p for p in prune_points(root, self._planner_options.cut_file_rows, len(urls), self.adaptive.side if self.adaptive else None)
                       if p.pruned is not None and p.pruned[0] in cut]
        points = self._points()
        if points:
            self._root, self._planned = root, self.plan
            self.plan.rewrites[:0] = [p.text() for p in points]

    def _points(self) -> list[AdaptivePoint]:
        return ([self.adaptive] if self.adaptive is not None else []) + self.prunes

    def _adapted(self, options: ExecOptions) -> tuple[QueryPlan, ExecOptions]:
        """The plan (and options) one execution runs: with adaptive points, planned again once their sides ran
        (``flight.coordinator.adaptive``), one after the other, with what is left of the deadline."""
        points, root = self._points(), self._root
        if not points or root is None or self._planned is None:
            return self.plan, options
        notes, new = [], root
        for point in points:
            if not any(n is point.side for n in new.walk()):
                continue  # inside a side that ran first, or in a composite pair that did not fit: nothing to settle
            settled = run_side(point, self._start_side, options)
            notes.append(point.outcome(settled.table, settled.seconds, options.adaptive_bytes))
            if options.deadline is not None:
                options = replace(options, deadline=max(1e-3, options.deadline - settled.seconds))
            if settled.table is not None:
                new = settled_root(new, point.side, settled.table, point.probe)
            elif point.why is not None and self._unrotated is not None:
                new = root = self._unrotated  # the pair did not fit: the rest settles into the plan as first made
        if new is root:
            plan = QueryPlan(self._planned.stages, [*notes, *self._planned.rewrites[len(points):]])
        else:
            new, filters = key_filters(new)
            plan = plan_query(new, len(self.resolver.get_urls()), self._planner_options)  # the key filters pushed too
            plan.rewrites[:0] = [*notes, *filters]
        self.plan = plan  # explain() shows the latest execution's plan
        return plan, options

    def _start_side(self, query: Query, options: ExecOptions) -> tuple[pa.RecordBatchReader, Callable[[], None]]:
        side = DistributedExec(query, self.resolver, options, estimator=self.estimator)
        attempts = _Attempts(side)
        return pa.RecordBatchReader.from_batches(side.stage.output_schema, attempts.batches(attempts.open())), attempts.abandon

    @property
    def stage(self) -> StageSpec:
        """The head stage: the one whose output the caller reads."""
        return self.plan.head

    @property
    def stages(self) -> list[StageSpec]:
        return self.plan.stages

    def explain(self, analyze: bool = False) -> str:
        """Stages, their operators, tasks and workers; with ``analyze``, what each task measured.

        A query ``flight.sql`` made starts with the SQL front end's optimized logical plan."""
        stages = explain_plan(self, analyze)
        logical = getattr(self.query, "logical_plan", None)
        if not logical:
            return stages
        return "\n".join(["SQL logical plan (DataFusion, optimized):", *("  " + x for x in logical.splitlines()), "", stages])

    def to_table(self) -> pa.Table:
        return self.execute().read_all()

    def execute(self, progress: bool | None = None) -> pa.RecordBatchReader:
        """Start the query and return its rows as a stream.

        A worker lost before the first row reached the caller costs an attempt, not the
        query: it runs again on the workers that remain, up to ``ExecOptions.retries``
        times (``coordinator/recovery.py``); ``attempts`` lists the failed ones.
        ``progress`` (default: ``ExecOptions.progress``): a bar per stage while it runs.
        """
        refuse_unsent_inputs(self.plan.stages, "DistributedExec.execute")
        plan, options = self._adapted(self.options)
        attempts = _Attempts(self, plan, options)
        self._latest = weakref.ref(attempts)  # weak: the reader keeps them, and they keep this instance
        bars = StageBars(lambda: attempts.run).start() if (self.options.progress if progress is None else progress) else None
        try:
            first = attempts.open()
        except BaseException:
            if bars is not None:
                bars.stop()
            raise
        batches = attempts.batches(first) if bars is None else _until_done(attempts.batches(first), bars.stop)
        reader = pa.RecordBatchReader.from_batches(self.stage.output_schema, batches)
        # A reader dropped before it was read (or read to the end) must not leave the tasks running.
        weakref.finalize(reader, attempts.abandon)
        return reader

    def progress(self) -> list[StageProgress]:
        """The latest ``execute()``'s stages (its current attempt), children first, with each task's state, rows
        and bytes so far (a live view, as ``DetachedQuery.progress``); empty before it opened its tasks. Kept
        weakly: once its reader and its tasks' threads are gone, it is empty again (``metrics`` has what they did)."""
        attempts = None if self._latest is None else self._latest()
        run = None if attempts is None else attempts.run
        return [] if run is None else stage_progress(run)

    def start_detached(self, retain: float = 0.0, *, sends_inputs: bool = False) -> DetachedQuery:
        """Start the query, leaving its head outputs for others to read with DoGet.

        For consumers that are not this process (Spark tasks): each entry of
        ``partitions`` is a worker URL and a ticket. The query's tasks live until
        every head partition has been read (or ``close()``).

        A worker found lost while the tasks are opened (a dead URL among live ones) is
        left out and the launch tried again, as ``execute()`` does; once launched, rows
        may be read by anyone at any time, so a later loss fails the query.

        ``retain`` > 0: the head outputs stay readable, any number of times each from the
        start (a second Spark action, a retried or speculative task), until ``release()``
        or for ``retain`` seconds at most; the workers spill them past their output bound.
        """
        if retain < 0:
            raise ValueError(f"retain must be 0 or more seconds, not {retain}")
        if not sends_inputs:  # ``sends_inputs``: the caller sends its inputs' rows (flight.spark.read), to ``inputs()``
            refuse_unsent_inputs(self.plan.stages, "DistributedExec.start_detached")
        plan, options = self._adapted(self.options)
        return DetachedQuery(_Attempts(self, plan, options, retain=retain > 0, detached=True).launch(), retain)

def _until_done(batches: Iterator[pa.RecordBatch], done: Callable[[], None]) -> Iterator[pa.RecordBatch]:
    """``batches``, calling ``done`` when they end, fail, or are dropped unread."""
    try:
        yield from batches
    finally:
        done()


class _Attempts:
    """The attempts of one ``execute()``: a new ``Run`` after each lost worker, while no row was delivered."""

    def __init__(
        self, ex: DistributedExec, plan: QueryPlan | None = None, options: ExecOptions | None = None, *,
        retain: bool = False, detached: bool = False,
    ) -> None:
        self.ex = ex
        self.retain = retain
        self.excluded: set[str] = set()
        self.run: Run | None = None
        ex.attempts = []
        # Rows tagged with their work unit are for this process's own reader (``replay.py``): a
        # detached query's head outputs are read by others, as the plan's schema says. Read once by
        # others, a lost head task cannot be read again from where they were: only a retained one is.
        options = options or ex.options
        if detached:
            options = replace(options, unit_recovery=False, stage_recovery=options.stage_recovery and retain)
        self.context = RunContext(plan or ex.plan, options, ex.estimator, ex.resolver, ex.attempts, sink=self)

    def named(self, query_id: str, secret: bytes, bound: dict[int, list[str]]) -> None:
        """The latest attempt's id, secret and bound tasks: what ``DistributedExec`` shows (``RunSink``)."""
        self.ex.query_id, self.ex.query_secret, self.ex.bound = query_id, secret, bound

    def finished(self, metrics: QueryMetrics) -> None:
        self.ex.metrics = metrics

    def open(self) -> Iterator[pa.RecordBatch]:
        """A launched attempt's batches; lost workers during the launch are retried around here."""
        while True:
            run = self.run = Run(self.context, self.excluded)
            try:
                return run.start()
            except FlightExecError as exc:
                if not self._retry(run, exc, delivered=False):
                    raise

    def launch(self) -> Run:
        """A launched attempt whose head outputs nobody reads here (``start_detached``)."""
        while True:
            run = self.run = Run(self.context, self.excluded, retain=self.retain, detached=True)
            try:
                run.launch()
                return run
            except FlightExecError as exc:
                if not self._retry(run, exc, delivered=False):
                    raise

    def batches(self, first: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        current, delivered = first, 0
        while True:
            try:
                for batch in current:
                    delivered += batch.num_rows
                    yield batch
                return
            except FlightExecError as exc:
                assert self.run is not None
                if delivered:
                    raise self._too_late(self.run, exc, delivered) from exc
                if not self._retry(self.run, exc, delivered=False):
                    raise
            current = self.open()

    def _probe(self, run: Run) -> list[str]:
        options = self.ex.options
        return probe_lost(run.urls, options.security, min(PROBE_TIMEOUT_S, options.connect_timeout))

    def _too_late(self, run: Run, error: FlightExecError, rows: int) -> FlightExecError:
        """The error to raise when a worker was lost after rows reached the caller: it says so."""
        if not isinstance(error, WorkerError) or self.ex.options.retries <= 0 or not (lost := self._probe(run)):
            return error
        # The same type (a cancel stays a cancel), saying why it was not retried.
        return type(error)(
            f"worker {', '.join(lost)} was lost after {rows} rows had reached the caller: the query cannot run "
            f"again without repeating them ({clip(error, 300)})",
            worker_url=lost[0],
            stage_key=error.stage_key,
        )

    def _retry(self, run: Run, error: FlightExecError, delivered: bool) -> bool:
        """Whether to run again: a worker of ``run`` is lost, others remain, and nothing reached the caller."""
        options = self.ex.options
        if not may_retry(error, delivered, len(self.ex.attempts), options.retries):
            return False
        lost = self._probe(run) or named_unreachable(error, run.urls)
        remaining = [u for u in self.ex.resolver.get_urls() if u not in self.excluded and u not in lost]
        if not lost or not remaining:
            return False
        self.ex.attempts.append(Attempt(run.query_id, tuple(lost), clip(error, 300)))
        self.excluded.update(lost)
        log.warning("query %s: lost %s (%s); running it again on the other workers", run.query_id, ", ".join(lost), clip(error, 200))
        return True

    def abandon(self) -> None:
        if self.run is not None:
            self.run.abandon()
