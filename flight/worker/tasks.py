"""The worker's task bookkeeping as plain objects, apart from Flight I/O.

A ``Task`` holds everything one running task owns: its feed inboxes (units the
coordinator streamed in, with the credit window that bounds them), its input
queue (map stages), its output buffer and its metrics. The ``TaskRegistry``
is the worker's table of tasks. The Flight handlers in ``server.py`` only move
bytes in and out of these objects, so tests can drive them without sockets.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator

import pyarrow as pa

from flight.engine.partition import split_by_hash
from flight.engine.pruning import ScanStats
from flight.errors import ProtocolError, TaskCancelledError, TaskFailedError, light_copy
from flight.wire._proto import plan_pb2, protocol_pb2
from flight.wire.integrity import Tally
from flight.wire.ipc import check_batch
from flight.wire.operators import operators
from flight.wire.protocol import decode_schema, format_stage_key
from flight.worker.auth import same_secret
from flight.worker.buffers import OutputBuffer
from flight.worker.capacity import INPUT_RESERVE_BYTES
from flight.worker.inputs import FeedInbox, InputQueue, UnitBytes

__all__ = ["Task", "TaskRegistry"]

_QUEUED_POLL_S = 0.25
_CANCELLING = threading.Lock()  # a task is stopped once, whoever stops it first
"""How often a reader waiting for a queued task checks that it still waits (a refusal sends no notice)."""

log = logging.getLogger(__name__)


class Task:
    """One task on this worker; lives exactly as long as its DoExchange."""

    def __init__(
        self,
        header: protocol_pb2.TaskHeader,
        plan: plan_pb2.StagePlan,
        output_schema: pa.Schema,
        *,
        worker_url: str,
        feed_window: int,
        output_buffer_bytes: int,
        spill_dir: str = "",
        send_credit: Callable[[str, int, int], None],
        read_partitions: Callable[[Task, list[tuple[str, bytes]], int, int], Iterator[tuple[pa.RecordBatch, bool]]] | None = None,
    ) -> None:
        self.header = header
        self.plan = plan
        self.output_schema = output_schema
        self.key = format_stage_key(header.stage_key)
        self.query_id = header.stage_key.query_id
        self.worker_url = worker_url
        self.client = "anonymous"  # who asked: the caller's authenticated identity (admission, budgets)
        self.started = time.perf_counter()
        self.last_heard = time.monotonic()  # of the coordinator: any message on the exchange
        self.half_closed = False  # the coordinator's side of the exchange ended cleanly
        self.cancelled = threading.Event()
        self.cancel_reason = ""
        self.called_off = False  # a Cancel frame or the cancel action stopped it (not a release): the call ends CANCELLED
        self.unavailable: tuple[str, str] | None = None  # (worker, why) when a worker it needs is gone: DoGet says UNAVAILABLE
        self._on_cancel: list[Callable[[], None]] = []
        self.engine = ""  # what computes the task, set by the pipeline once it starts (metrics)
        self.notes: list[str] = []  # what its engine decided at run time (flight.engine.duck.keyfilter), for explain()
        self.scan_stats = ScanStats()  # its Parquet readers' row groups read and skipped (metrics)
        self.error: BaseException | None = None  # what stopped the task from outside (bad frame)
        self.failure: Exception | None = None  # the Flight error the exchange ends with
        self.finished = False
        takes = [op.exchange_input for op in operators(plan.root) if op.WhichOneof("kind") == "exchange_input"]
        self.separate_input = any(i.separate_input for i in takes)  # input on an input call (inputcall.py), output buffered
        self._input_schema = takes[0].schema if takes else b""
        self.input_attached = False  # an input call took it (one per task)
        self.is_map = bool(takes) and not self.separate_input  # input and output both on the task's exchange
        self.inputs = InputQueue(max_bytes=INPUT_RESERVE_BYTES) if takes else None
        partitions = plan.output.partitions or 1
        self.hash_keys = list(plan.output.hash_keys)
        self.output = None if self.is_map else OutputBuffer(
            partitions, output_buffer_bytes, plan.output.readers or 1, retain=header.options.retain_output, spill_dir=spill_dir
        )
        self._read_partitions = read_partitions
        self._next_partition = 0
        self.inboxes: dict[tuple[str, int], FeedInbox] = {}
        self.assigned_feeds = {a.feed_id for a in header.feeds}
        self.unit_bytes = UnitBytes(INPUT_RESERVE_BYTES)  # unread units, all partitions: within the input reservation
        for assignment in header.feeds:
            window = assignment.window or feed_window
            for p in assignment.partitions:
                fid = assignment.feed_id
                self.inboxes[(fid, p)] = FeedInbox(fid, p, window, functools.partial(send_credit, fid, p), self.unit_bytes)
        self.rows_out = self.batches_out = self.bytes_out = 0
        self.rows_in = self.bytes_in = self.bytes_in_local = 0
        self.sent = Tally(not header.options.no_checksum)  # a map stage's output on its exchange (protocol §17)
        self.read_from: dict[int, list[int]] = {}  # stage id -> [rows, batches] read from it (TaskMetrics.inputs)

    # -- what the engine sees
    def feed_partitions(self, feed_id: str) -> list[int]:
        if feed_id not in self.assigned_feeds:
            raise ProtocolError(
                f"the plan scans feed {feed_id!r}, which header.feeds does not assign to task {self.key}",
                field="header.feeds",
            )
        return sorted(p for (fid, p) in self.inboxes if fid == feed_id)

    def inbox(self, feed_id: str, partition: int) -> FeedInbox:
        try:
            return self.inboxes[(feed_id, partition)]
        except KeyError:
            raise ProtocolError(
                f"task {self.key} was not assigned partition {partition} of feed {feed_id!r}",
                field="header.feeds",
            ) from None

    def read_partitions(self, producers: list[tuple[str, bytes]], start: int, end: int) -> Iterator[pa.RecordBatch]:
        if self._read_partitions is None:
            raise ProtocolError(f"task {self.key} cannot read other stages here", field="plan")
        counted = self._counter(producers)
        for batch, local in self._read_partitions(self, producers, start, end):
            if not local:  # another worker's bytes: checked before any kernel sees them
                check_batch(batch, f"a batch of partitions [{start}, {end}) read from another worker")
            counted[0] += batch.num_rows
            counted[1] += 1
            self.rows_in += batch.num_rows
            self.bytes_in += batch.nbytes
            self.bytes_in_local += batch.nbytes if local else 0
            yield batch

    def _counter(self, producers: list[tuple[str, bytes]]) -> list[int]:
        """[rows, batches] read from the stage of ``producers`` (all of one stage), for ``TaskMetrics.inputs``."""
        try:
            stage = protocol_pb2.StageKey.FromString(producers[0][1]).stage_id if producers else 0
        except Exception:  # noqa: BLE001 - a malformed key fails the read itself, with its field named
            stage = 0
        return self.read_from.setdefault(stage, [0, 0])

    def emit(self, batch: pa.RecordBatch) -> None:
        """Put an output batch in its partition(s): by key hash, or round-robin without keys."""
        assert self.output is not None
        n = self.output.partitions
        if n == 1:
            self.output.put(0, batch)
        elif self.hash_keys:
            for p, piece in split_by_hash(batch, self.hash_keys, n):
                self.output.put(p, piece)
        else:
            self.output.put(self._next_partition, batch)
            self._next_partition = (self._next_partition + 1) % n

    @property
    def task_number(self) -> int:
        return self.header.stage_key.task_number

    def input_batches(self) -> Iterator[pa.RecordBatch]:
        if self.inputs is None:
            raise ProtocolError(f"task {self.key} has no exchange input", field="plan")
        return iter(self.inputs)

    # -- lifecycle
    def open_feeds(self) -> list[protocol_pb2.FeedCredit]:
        """Each feed partition's first window, granted: what the Ready frame carries (docs/protocol.md, section 7)."""
        return [protocol_pb2.FeedCredit(feed_id=fid, partition=p, credits=inbox.open()) for (fid, p), inbox in self.inboxes.items()]

    @functools.cached_property
    def input_schema(self) -> pa.Schema | None:
        """The schema its input batches must have (checked on the input call)."""
        return decode_schema(self._input_schema, "plan.root.exchange_input.schema") if self._input_schema else None

    def on_cancel(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when the task is stopped (the engine interrupts its running query)."""
        self._on_cancel.append(callback)
        if self.cancelled.is_set():
            callback()

    def cancel(self, reason: str, *, failed: bool = False) -> None:
        """Stop the task wherever it waits: feeds, input, output.

        ``failed`` says the task broke (rather than being called off): readers
        of its output then see the failure itself, not a cancellation.
        """
        with _CANCELLING:  # the runner, the exchange's reader, an input call and the watchdog may all stop it
            if self.cancelled.is_set():
                return
            self.cancel_reason = reason
            self.cancelled.set()
        kind = TaskFailedError if failed else TaskCancelledError
        error = kind(reason if failed else f"task cancelled: {reason}", stage_key=self.key, worker_url=self.worker_url)
        for inbox in self.inboxes.values():
            inbox.fail(error)
        if self.inputs is not None:
            self.inputs.fail(error)
        if self.output is not None:
            self.output.fail(error)
        for callback in self._on_cancel:
            callback()

    def call_off(self, reason: str, *, lost_worker: str = "") -> None:
        """The coordinator (a ``Cancel`` frame) or the ``cancel`` action stops the task, even after it finished.

        ``lost_worker``: the coordinator runs the task again elsewhere because that worker was lost."""
        self.called_off = True
        if lost_worker and self.unavailable is None:
            why = f"task {self.key} on {self.worker_url} ended because worker {lost_worker} was lost; it runs again elsewhere"
            self.unavailable = lost_worker, why
        self.cancel(reason)

    def fail(self, error: BaseException, *, failed: bool = False) -> None:
        """Stop the task because of ``error`` (e.g. a malformed frame), which the handler reports.

        ``failed``: readers of its output see the failure (an input call's bad input), not a cancellation."""
        if self.error is None:
            self.error = light_copy(error)  # kept past the raise: no frames (they hold this task)
        self.cancel(str(error), failed=failed)

    def record_output(self, batch: pa.RecordBatch) -> None:
        self.rows_out += batch.num_rows
        self.batches_out += 1
        self.bytes_out += batch.nbytes

    def metrics(self) -> protocol_pb2.TaskMetrics:
        return protocol_pb2.TaskMetrics(
            stage_key=self.header.stage_key,
            worker_url=self.worker_url,
            rows_out=self.rows_out,
            batches_out=self.batches_out,
            bytes_out=self.bytes_out,
            rows_in=self.rows_in + (self.inputs.rows if self.inputs is not None else 0),
            bytes_in=self.bytes_in,
            bytes_in_local=self.bytes_in_local,
            elapsed_nanos=int((time.perf_counter() - self.started) * 1e9),
            feeds=[inbox.metrics() for inbox in self.inboxes.values()],
            engine=self.engine,
            notes=self.notes,
            scan=self.scan_stats.to_proto(),
            bytes_spilled=self.output.spilled_bytes if self.output is not None else 0,
            inputs=[protocol_pb2.StageRows(stage_id=s, rows=r, batches=b) for s, (r, b) in sorted(self.read_from.items())],
            sent=self.sent.trailer() if self.is_map else None,
        )

    @property
    def buffered_bytes(self) -> int:
        return self.output.buffered_bytes if self.output is not None else 0

    @property
    def held_bytes(self) -> int:
        """What the client makes this worker hold for the task: unread output, units and map input."""
        return self.buffered_bytes + self.unit_bytes.held + (self.inputs.queued_bytes if self.inputs is not None else 0)


class TaskRegistry:
    """The worker's running tasks by stage key.

    It also remembers how recently ended tasks ended, so a DoGet that arrives
    late gets a clear answer at once instead of waiting for a task that is gone.
    """

    REMEMBERED = 4096

    def __init__(self, queued: Callable[[str], bool] = lambda key: False) -> None:
        self.queued = queued
        """Whether a task of that key waits for capacity on this worker (``Admission.is_waiting``)."""
        self._tasks: dict[str, Task] = {}
        self._ended: OrderedDict[str, tuple[str, tuple[str, str] | None]] = OrderedDict()  # key -> (how it ended, Task.unavailable)
        self.ended_count: dict[str, int] = {"finished": 0, "ended early": 0}
        """Tasks ended since the worker started, by how (the ``--metrics-port`` counters)."""
        self.rows_out = 0
        self.bytes_out = 0
        """What the ended tasks made (their output, as counted when it was made)."""
        self._closed = False
        self._cond = threading.Condition()

    def add(self, task: Task) -> None:
        with self._cond:
            if task.key in self._tasks or task.key in self._ended:
                raise ProtocolError(f"task {task.key} already ran or runs on this worker", field="header.stage_key")
            self._tasks[task.key] = task
            self._cond.notify_all()

    def remove(self, task: Task) -> None:
        with self._cond:
            if self._tasks.get(task.key) is task:
                del self._tasks[task.key]
                finished = task.finished and task.failure is None
                how = "finished" if finished else f"ended early: {task.cancel_reason or task.failure}"
                self._ended[task.key] = how, task.unavailable
                self.ended_count["finished" if finished else "ended early"] += 1
                self.rows_out += task.rows_out
                self.bytes_out += task.bytes_out
                while len(self._ended) > self.REMEMBERED:
                    self._ended.popitem(last=False)
            self._cond.notify_all()

    def get(self, key: str, wait: float = 0.0, stop: Callable[[], bool] | None = None) -> tuple[Task | None, str]:
        """The task, or None and why: it ended (how), or never appeared within ``wait`` seconds.

        A task that waits for capacity here (``queued``) is waited for as long as it waits: it
        will be registered or refused, and admission bounds that wait (``--queue-wait``). A
        consumer admitted before its producer (the producer's worker was full) used to give up
        after ``wait`` seconds while the producer still waited its turn. ``stop``: the waiter no
        longer needs it (a consumer task cancelled): the wait ends within ``_QUEUED_POLL_S``.
        """
        found = lambda: key in self._tasks or key in self._ended or self._closed  # noqa: E731
        stopped = stop or (lambda: False)
        end = time.monotonic() + wait
        with self._cond:
            while not found() and not stopped() and (left := end - time.monotonic()) > 0:
                self._cond.wait_for(found, timeout=min(left, _QUEUED_POLL_S))
            while not found() and not stopped() and self.queued(key):
                self._cond.wait_for(found, timeout=_QUEUED_POLL_S)
            if key in self._tasks:
                return self._tasks[key], ""
            if key in self._ended:
                return None, f"it {self._ended[key][0]}"
            return None, "it is not running here" + (" (the worker is draining)" if self._closed else "")

    def never_here(self, key: str) -> bool:
        """Whether this worker has no record of task ``key``: not running, not ended (as far as it remembers)."""
        with self._cond:
            return key not in self._tasks and key not in self._ended

    def unavailable(self, key: str) -> tuple[str, str] | None:
        """For a remembered task that ended because a worker it needed is gone, that worker and why."""
        with self._cond:
            ended = self._ended.get(key)
            return ended[1] if ended is not None else None

    def close(self) -> None:
        """Wake everyone waiting for a task: the worker is shutting down."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def reopen(self) -> None:
        with self._cond:
            self._closed = False

    def tasks(self) -> list[Task]:
        with self._cond:
            return list(self._tasks.values())

    def __len__(self) -> int:
        with self._cond:
            return len(self._tasks)

    def wait_empty(self, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: not self._tasks, timeout=timeout)

    def cancel_query(self, query_id: str, secret: bytes, reason: str) -> int:
        """Cancel the tasks of ``query_id`` whose query secret is ``secret``; how many."""
        victims = [t for t in self.tasks() if t.query_id == query_id and same_secret(secret, t.header.query_secret)]
        for task in victims:
            task.call_off(reason)
        return len(victims)

    def buffered_bytes(self) -> int:
        return sum(t.buffered_bytes for t in self.tasks())
