"""Detached queries: started by one process, their head outputs read by others (Spark tasks).

``DistributedExec.start_detached`` runs the query and hands out, per head task, a
worker URL and a ticket (with the query's secret inside). Read once (the default),
the query's tasks live until every head partition was read, or ``close()``.
Retained (``start_detached(retain=seconds)``), each head partition may be read any
number of times, each from the start, until ``release()`` (or ``close()``), or
``retain`` seconds at most: the backstop when nobody releases it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Self

from flight.coordinator.channel import TaskChannel
from flight.coordinator.recovery import Attempt
from flight.coordinator.run import Run
from flight.coordinator.slots import FeedProgress
from flight.errors import TaskCancelledError
from flight.plan.nodes import InputCallNode
from flight.wire._proto import protocol_pb2

__all__ = ["DetachedQuery", "HeadPartition", "InputTarget", "StageProgress", "TaskProgress", "stage_progress"]


@dataclass(frozen=True)
class HeadPartition:
    """One head task's output: read it with ``DoGet(Ticket(ticket))`` at ``url``."""

    url: str
    ticket: bytes


@dataclass(frozen=True)
class InputTarget:
    """Where one partition of an input (``InputCallNode``) goes: open an input call at ``url`` and
    send ``attach`` as its first frame (docs/protocol.md, section 16). ``attach`` holds the query's secret."""

    input_id: str
    task: int
    url: str
    attach: bytes = field(repr=False)  # holds the query's secret


@dataclass(frozen=True)
class TaskProgress:
    """One task as the coordinator sees it: where, how far, and what it made (known once it finished)."""

    worker_url: str
    state: str  # running, finished, failed, ended
    rows_out: int = 0
    bytes_out: int = 0
    seconds: float = 0.0
    bytes_spilled: int = 0
    opened: float | None = None  # seconds after the query's start: its exchange opened,
    ready: float | None = None  # the worker admitted it,
    finished: float | None = None  # it produced all its output


@dataclass(frozen=True)
class StageProgress:
    stage_id: int
    consumers: tuple[int, ...]  # none for the head
    output: str  # head, hash, gather, broadcast, round_robin
    tasks: tuple[TaskProgress, ...]
    estimated_rows: float | None = None  # the planner's estimate of its output (``explain()``'s), None: none made
    estimated_bytes: float | None = None

    @property
    def done(self) -> int:
        return sum(t.state != "running" for t in self.tasks)


class DetachedQuery:
    """A running query whose head outputs other processes read."""

    def __init__(self, run: Run, retain: float = 0.0) -> None:
        self._run = run
        self.retain = retain
        self.query_id = run.query_id
        self.schema = run.plan.head.output_schema
        self.workers = tuple(run.urls)  # where a lost head task's replacement may be (``replay.py``)
        head = run.by_stage[run.plan.head.stage_id]
        self.partitions = [HeadPartition(c.url, run.head_ticket(c)) for c in head]
        self._done = threading.Event()
        self._released = threading.Event()
        self._deadline = time.monotonic() + retain
        threading.Thread(target=self._watch, args=(head,), name=f"detached-{self.query_id}", daemon=True).start()

    def computed(self, timeout: float | None = None) -> bool:
        """Wait until every head task made all its output (the rows wait on the workers; a retained query's
        may still be read again), or the query ended; whether they did. Raises the query's error."""
        end = None if timeout is None else time.monotonic() + timeout
        head = self._run.by_stage[self._run.plan.head.stage_id]
        while not all(c.finished.is_set() for c in self._head(head)):
            if self._run.error is not None:
                raise self._run.error
            if self._done.is_set() or (end is not None and time.monotonic() >= end):
                return False
            time.sleep(0.05)
        return True

    def _head(self, head: list[TaskChannel]) -> list[TaskChannel]:
        """The head tasks now: a lost task's replacement in its place (``replay.py``)."""
        replay = self._run.replay
        return replay.head() if replay is not None else head

    def _watch(self, head: list[TaskChannel]) -> None:
        try:
            if self.retain:
                # Kept until released, or the backstop passes; a failure ends it at once.
                while not self._released.wait(0.1):
                    if self._run.failed.is_set() or time.monotonic() >= self._deadline:
                        break
                if self._run.failed.is_set():
                    return
                if not all(c.finished.is_set() for c in self._head(head)):
                    self._run.fail(TaskCancelledError("the retained query was released before its head tasks finished"))
                    return
            else:
                for channel in head:
                    while not channel.drained.wait(0.1):
                        if self._run.failed.is_set():
                            return
            if self._run.error is None:
                self._run._await_metrics()
        finally:
            self._run._finish()
            self._done.set()

    def inputs(self) -> dict[str, list[InputTarget]]:
        """Each input's targets by input id, one per task in task order: where its sender sends each partition."""
        out: dict[str, list[InputTarget]] = {}
        for stage in self._run.plan.stages:
            ids = [n.input_id for n in stage.root.walk() if isinstance(n, InputCallNode)]
            if not ids:
                continue
            for channel in self._run.by_stage[stage.stage_id]:
                key = channel.header.stage_key
                frame = protocol_pb2.CoordinatorFrame(attach=protocol_pb2.InputAttach(stage_key=key, query_secret=channel.header.query_secret))
                out.setdefault(ids[0], []).append(InputTarget(ids[0], key.task_number, channel.url, frame.SerializeToString()))
        return out

    def input_nodes(self) -> dict[str, InputCallNode]:
        """Each input as planned (its columns pruned to those the query uses), by input id."""
        return {n.input_id: n for st in self._run.plan.stages for n in st.root.walk() if isinstance(n, InputCallNode)}

    def restart_retain(self) -> None:
        """Count the ``retain`` window from now: its inputs were sent (their sending may take longer than it)."""
        self._deadline = time.monotonic() + self.retain

    def fail(self, error: BaseException) -> None:
        """End the query with ``error`` (e.g. the sender of one of its inputs failed); its tasks are freed."""
        self._run.fail(error)

    def failure(self, wait: float = 0.0) -> BaseException | None:
        """The query's own error, waiting up to ``wait`` seconds for one: a sender that met an ended task
        asks whether the query failed first, whose error is then the root of both."""
        self._run.failed.wait(wait)
        return self._run.error

    def progress(self) -> list[StageProgress]:
        """Every stage of the current attempt, children first, with its tasks' states (a live view)."""
        return stage_progress(self._run)

    def feeds(self) -> list[FeedProgress]:
        """Each work-unit feed's units found, sent and taken so far, and its lag (a live view)."""
        return self._run.dispatcher.feeds()

    @property
    def attempts(self) -> list[Attempt]:
        """The workers it lost so far, and what replaced their head tasks (``DistributedExec.attempts``)."""
        return list(self._run.context.attempts)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the query ended: every head partition read (read once), or released (retained).

        Raises the query's error if it failed.
        """
        finished = self._done.wait(timeout)
        if self._run.error is not None:
            raise self._run.error
        return finished

    def release(self) -> None:
        """A retained query: let its tasks go now (their outputs are read no more); frees them."""
        self._released.set()
        self._done.wait(self._run.options.connect_timeout)

    def close(self) -> None:
        """Cancel the query if it still runs, and free its tasks."""
        if not self._done.is_set():
            self._run.fail(TaskCancelledError("the detached query was closed"))
        self._done.wait(self._run.options.connect_timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.retain:
            self.release()
        self.close()


def stage_progress(run: Run) -> list[StageProgress]:
    """Every stage of ``run``, children first, with its tasks' states (a live view: ``DetachedQuery.progress``,
    ``DistributedExec.progress``)."""
    out = []
    for stage in run.plan.stages:
        tasks = tuple(_task(run, channel) for channel in run.by_stage.get(stage.stage_id, []))
        out.append(StageProgress(stage.stage_id, tuple(stage.consumers), stage.output_mode, tasks, stage.output_rows, stage.output_bytes))
    return out


def _task(run: Run, channel: TaskChannel) -> TaskProgress:
    m = channel.metrics
    state = "running"
    if channel.error is not None:
        state = "failed"
    elif channel.finished.is_set() or channel.done.is_set():
        state = "finished" if m is not None else "ended"
    made = (m.rows_out, m.bytes_out, m.elapsed_nanos / 1e9, m.bytes_spilled) if m is not None else (0, 0, 0.0, 0)
    since = run.started_at

    def at(t: float | None) -> float | None:
        return None if t is None else round(max(0.0, t - since), 4)

    return TaskProgress(channel.url, state, *made, opened=at(channel.opened_at), ready=at(channel.ready_at),
                        finished=at(channel.finished_at))
