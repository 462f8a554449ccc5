"""The coordinator's end of one task's DoExchange, and error translation.

A ``TaskChannel`` opens the exchange with the task's header, reads the
worker's frames on a thread of its own (ready, feed credits, errors, final
metrics) and lets the coordinator send frames (units, feed ends, cancel).
Closing the channel is what frees the task on the worker.

A map stage (``map.map_batches``) uses the same channel: it writes the task's
input batches (``write_input``) and reads the output inline, on the caller's
thread (``open(inline=True)``, ``output()``). One client for both, so both keep
the one-writer rule (docs/protocol.md §9): every write under one lock, the
release a ``Release`` frame, the writer closed only once the reader stopped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator

import pyarrow as pa
import pyarrow.flight as fl

from flight.errors import FlightExecError, ProtocolError, TaskFailedError, WorkerBusyError, WorkerError, WorkerUnavailableError
from flight.threads import every, spawn
from flight.wire._proto import protocol_pb2
from flight.wire.clients import error_from_info, translate_flight_error
from flight.wire.integrity import StreamCheck, StreamIntegrityError, Tally
from flight.wire.limits import MAX_FEED_WINDOW
from flight.wire.protocol import decode_schema, decode_worker_frame, format_stage_key, status_message

__all__ = ["TaskChannel"]

log = logging.getLogger(__name__)

_LOCK_WAIT_S = 1.0
"""How long abort/finish wait for a writer or reader before cancelling the call instead."""
_READER_EXIT_S = 5.0
"""How long a cancelled call's reader thread may take to notice."""

CreditHandler = Callable[["TaskChannel", str, int, int], None]
ErrorHandler = Callable[["TaskChannel", BaseException], None]
FinishedHandler = Callable[["TaskChannel"], None]


class TaskChannel:
    """One task's DoExchange, seen from the coordinator."""

    _HEARTBEAT = pa.py_buffer(protocol_pb2.CoordinatorFrame(heartbeat=protocol_pb2.Heartbeat()).SerializeToString())

    def __init__(
        self,
        url: str,
        header: protocol_pb2.TaskHeader,
        *,
        on_credit: CreditHandler | None = None,
        on_error: ErrorHandler | None = None,
        on_finished: FinishedHandler | None = None,
        on_ready: FinishedHandler | None = None,
        heartbeat: float = 2.0,
        peer_timeout: float | None = 10.0,
        name: str | None = None,
    ) -> None:
        """``peer_timeout`` None: no watch for a silent worker (an inline reader may pause between batches)."""
        self.url = url
        self.heartbeat = heartbeat
        self.peer_timeout = peer_timeout
        self.last_heard = time.monotonic()  # any message from the worker, heartbeats included
        self.header = header
        # The coordinator's name for it: its stage key, unless it replaces a lost task (same key, another worker).
        self.key = name or format_stage_key(header.stage_key)
        self.ready = threading.Event()
        self.done = threading.Event()  # the worker ended the exchange (or it broke)
        self._settled = threading.Event()  # ready, failed or done: wait_ready can stop waiting
        self.finished = threading.Event()  # the final metrics arrived, or the exchange ended
        self.drained = threading.Event()  # every output partition was read (by whoever reads it)
        self.queued = threading.Event()  # the worker said the task waits for capacity
        self.load: protocol_pb2.LoadInfo | None = None  # what it said of its load then (its source threads, among others)
        self._news = threading.Event()  # settled or queued: what ready_or_queued waits for
        self.output_schema: pa.Schema | None = None
        self.metrics: protocol_pb2.TaskMetrics | None = None
        # When (monotonic) it opened, was admitted, and produced all its output: a stage's time line.
        self.opened_at: float | None = None
        self.ready_at: float | None = None
        self.finished_at: float | None = None
        self.error: WorkerError | None = None
        self._on_credit = on_credit
        self._on_error = on_error
        self._on_finished = on_finished
        self._on_ready = on_ready
        self._lock = threading.Lock()
        self._writer: fl.FlightStreamWriter | None = None
        self._reader: fl.FlightStreamReader | None = None
        self._closing = False
        self._inline = False  # the caller reads (output()), not a thread of the channel's
        self._input_begun = False

    def open(self, client: fl.FlightClient, *, inline: bool = False) -> None:
        """Open the exchange; ``inline``: the caller reads it with ``output()`` (a map stage), else a thread does."""
        descriptor = fl.FlightDescriptor.for_command(self.header.SerializeToString())
        try:
            self._writer, self._reader = client.do_exchange(descriptor)
        except (pa.ArrowException, OSError) as exc:
            raise translate_flight_error(exc, self.url, self.key) from exc
        self.last_heard = self.opened_at = time.monotonic()
        self._inline = inline
        if inline:
            every(self.heartbeat, self._beat)
            return
        # One thread started here; the reader registers the heartbeats with the process's ticker
        # thread (flight.threads.every): no thread per heartbeat.
        spawn(self._read, name=f"channel-{self.key}")

    def _beat(self) -> bool:
        """One heartbeat to the worker, and the watch for a worker that went silent (on the ticker thread).

        The silence check comes first, and nothing here waits: a writer that holds the lock
        (a write blocked on a frozen worker, or any other frame) makes the beat skip, and the
        failure is handled on a thread of its own. False ends the beats.
        """
        if self.done.is_set() or (self._inline and self._closing):
            return False
        silent = time.monotonic() - self.last_heard
        if self.peer_timeout is not None and silent > self.peer_timeout:
            spawn(self._lost, silent, name=f"lost-{self.key}")
            return False
        if not self._closing and self._lock.acquire(blocking=False):
            try:
                self._write(self._HEARTBEAT)
            finally:
                self._lock.release()
        return True

    def _lost(self, silent: float) -> None:
        self._fail(
            WorkerUnavailableError(
                f"worker {self.url} sent nothing for {silent:.0f}s (heartbeats included): "
                "it is frozen, overloaded or unreachable",
                worker_url=self.url,
                stage_key=self.key,
            )
        )
        self.cancel_call()

    def ready_or_queued(self, deadline_s: float) -> bool:
        """True once the worker accepted the task, False as soon as it says it queued it for capacity.

        Raises as ``wait_ready`` does when the task failed or the worker did not answer in time.
        """
        self._news.wait(deadline_s)
        if self.queued.is_set() and not self._settled.is_set():
            return False
        self.wait_ready(0.0, waited_s=deadline_s)
        return True

    def wait_ready(self, deadline_s: float, queued_until: float | None = None, *, waited_s: float | None = None) -> None:
        """Block until the worker accepted the task; a clear error naming the URL otherwise.

        ``waited_s``: how long the caller waited already (the error says the whole wait, not "0s").

        A worker at capacity queues the task and says so (a ``load`` frame, repeated as its
        heartbeat): then the wait goes on until ``queued_until`` (a ``time.monotonic()``).
        """
        end = time.monotonic() + deadline_s

        def limit() -> float:
            # Once the worker says the task is queued, the admission wait bounds it (shorter or longer
            # than the deadline for an answer): looked at every 0.1 s, not only when that deadline ends.
            return queued_until if self.queued.is_set() and queued_until is not None else end

        while not self._settled.wait(min(0.1, max(0.0, limit() - time.monotonic()))):
            if time.monotonic() < limit():
                continue
            error: WorkerError
            if self.queued.is_set():
                error = WorkerBusyError(
                    f"worker {self.url} kept task {self.key} waiting for capacity past the admission wait",
                    worker_url=self.url,
                    stage_key=self.key,
                )
            else:
                error = WorkerUnavailableError(
                    f"worker {self.url} did not accept task {self.key} within {deadline_s if waited_s is None else waited_s:g}s",
                    worker_url=self.url,
                    stage_key=self.key,
                )
            # The cause, recorded before the abort: the cancellation the abort brings back is its consequence,
            # and must not reach the query's error handler first.
            self._fail(error)
            self.abort("the worker did not answer")
            raise error
        if not self.ready.is_set():
            raise self.error or TaskFailedError(
                "the worker closed the exchange without accepting the task", worker_url=self.url, stage_key=self.key
            )

    def send(self, frame: protocol_pb2.CoordinatorFrame) -> None:
        data = pa.py_buffer(frame.SerializeToString())
        with self._lock:
            self._write(data)

    def write_input(self, batch: pa.RecordBatch) -> bool:
        """A map stage's input batch (the first begins the Arrow stream), under the lock.

        False once the channel let go of the task or the call ended: no more input is wanted.
        A failed write raises (the caller knows whether the worker or the input is to blame).
        """
        with self._lock:
            if self._closing or self._writer is None or self.done.is_set() or self.error is not None:
                return False
            if not self._input_begun:
                self._writer.begin(batch.schema)
                self._input_begun = True
            self._writer.write_batch(batch)
            return True

    def _write(self, data: pa.Buffer) -> None:
        """One frame, under ``_lock``: one writer at a time, and none once the call ended or failed
        or was let go (the release is the last write: docs/protocol.md §9, "One writer")."""
        if self._closing or self._writer is None or self.done.is_set() or self.error is not None:
            return
        try:
            self._writer.write_metadata(data)
        except (pa.ArrowException, OSError) as exc:
            # The reader thread sees the same broken stream and reports the worker's error.
            log.debug("task %s: sending a frame failed: %s", self.key, exc)

    def close(self) -> None:
        """Let go of the task: a ``Release`` frame; the worker frees it and ends the call.

        Never a half-close (``done_writing``): the reader thread half-closes the call itself
        when the worker ends it (pyarrow finishes a call whose read side ended), and two
        half-closes at once abort the process (docs/protocol.md §9, "One writer").
        """
        self._send_last(protocol_pb2.CoordinatorFrame(release=protocol_pb2.Release()))

    def abort(self, reason: str, *, lost_worker: str = "") -> None:
        """Cancel the task: tell the worker why and let it go, then cut the exchange.

        ``lost_worker``: the task runs again elsewhere because that worker was lost; the worker
        answers a DoGet of it UNAVAILABLE, so a reader holding its ticket looks elsewhere.
        The lock is only tried for a moment: a write blocked on a frozen worker holds it,
        and cancelling the call (thread-safe in gRPC) is what unblocks that write.
        """
        cancel = protocol_pb2.CoordinatorFrame(cancel=protocol_pb2.Cancel(reason=reason[:200], lost_worker=lost_worker))
        self._send_last(cancel, protocol_pb2.CoordinatorFrame(release=protocol_pb2.Release()), wait=_LOCK_WAIT_S)
        self.cancel_call()

    def _send_last(self, *frames: protocol_pb2.CoordinatorFrame, wait: float = -1) -> None:
        """Write ``frames`` as the channel's last writes: nothing is written after them."""
        if not self._lock.acquire(timeout=wait):
            return
        try:
            if self._closing or self._writer is None or self.done.is_set():
                return
            self._closing = True
            for frame in frames:
                self._writer.write_metadata(pa.py_buffer(frame.SerializeToString()))
        except (pa.ArrowException, OSError) as exc:
            log.debug("task %s: sending the release failed: %s", self.key, exc)
        finally:
            self._lock.release()

    def detach(self) -> None:
        """Stop reporting errors: the caller let this task go on purpose (a refused attempt)."""
        self._on_error = None
        self._on_credit = None
        self._on_finished = None
        self._on_ready = None

    def cancel_call(self) -> None:
        """Cut the call (thread-safe in gRPC): the reader raises, and a write blocked on flow control returns."""
        if self._reader is not None and not self.done.is_set():
            try:
                self._reader.cancel()
            except (pa.ArrowException, OSError) as exc:
                log.debug("task %s: cancelling the call failed: %s", self.key, exc)

    def finish(self) -> None:
        """Let go of the task and release the stream once its reader has stopped.

        Closing a Flight writer finishes the call (a half-close, then reading the status),
        which must not overlap the reader thread: wait for the reader to end (cancelling
        the call if the worker does not end it), and leave the writer to the garbage
        collector if the reader never ends. An inline reader is the caller, which
        stopped reading when it calls this.
        """
        self.close()
        if self._reader is not None and not self._inline and not self.done.wait(_LOCK_WAIT_S):
            self.cancel_call()
            if not self.done.wait(_READER_EXIT_S):
                log.warning("task %s: the exchange's reader did not stop; leaving the stream open", self.key)
                return
        with self._lock:
            writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()
            except (pa.ArrowException, OSError) as exc:
                log.debug("task %s: closing the exchange: %s", self.key, status_message(exc))
        if self._inline:
            self.done.set()  # the heartbeats end

    # ---------------------------------------------------------------- reading

    def _fail(self, error: WorkerError) -> None:
        if self.error is None:
            self.error = error
            self._settled.set()
            self._news.set()
            if self._on_error is not None:
                self._on_error(self, error)

    def _read(self) -> None:
        every(self.heartbeat, self._beat)
        for _ in self._chunks():
            pass

    def output(self) -> Iterator[pa.RecordBatch]:
        """A map stage's output batches, read on the caller's thread (``open(inline=True)``).

        Frames are handled as they come; the task's first error is raised (a worker's error
        frame at once: the worker keeps the call open until it is let go, ``finish()``).
        """
        chunks = self._chunks()
        arrived, checked = Tally(), False
        try:
            for data in chunks:
                if self.error is not None:
                    break
                if data is not None and data.num_rows:
                    arrived.add(data)
                    yield data
                if not checked and self.metrics is not None:  # the worker's batches all come before its `finished`
                    checked = True
                    self._check_sent(arrived)
        finally:
            chunks.close()
        if self.error is not None:
            raise self.error

    def _check_sent(self, arrived: Tally) -> None:
        """A map stage's output as it arrived against what the worker says it sent (protocol §17)."""
        assert self.metrics is not None
        if not self.metrics.HasField("sent"):
            self._fail(StreamIntegrityError("the worker's `finished` does not say what the map stage sent", worker_url=self.url, stage_key=self.key))
            return
        check = StreamCheck(0, 1, self.key, self.url)
        check.tally = arrived
        try:
            check.close(self.metrics.sent)
        except StreamIntegrityError as exc:
            self._fail(exc)

    def _chunks(self) -> Generator[pa.RecordBatch | None, None, None]:
        """Every message of the call, its frame handled, its record batch (if any) yielded, until the call ends.

        Errors are recorded (``_fail``), not raised. ``done`` is set when the call ended, not when
        an inline reader stopped early: then the call is still open, to be let go (``finish()``).
        """
        assert self._reader is not None
        stopped_early = False
        try:
            while True:
                try:
                    chunk = self._reader.read_chunk()
                except StopIteration:
                    break
                self.last_heard = time.monotonic()
                if chunk.app_metadata is not None and chunk.app_metadata.size:
                    self._handle(decode_worker_frame(chunk.app_metadata))
                yield chunk.data
            if self.metrics is None and self.error is None and not self._closing and not self._inline:
                self._fail(TaskFailedError("the worker ended the task's exchange before it finished", worker_url=self.url, stage_key=self.key))
        except GeneratorExit:
            stopped_early = True
            raise
        except ProtocolError as exc:
            self._fail(TaskFailedError(f"the worker sent a malformed frame: {exc}", worker_url=self.url, stage_key=self.key))
        except FlightExecError as exc:
            self._fail(exc if isinstance(exc, WorkerError) else TaskFailedError(str(exc), worker_url=self.url, stage_key=self.key))
        except (pa.ArrowException, OSError) as exc:
            if not self._closing or self.metrics is None:
                self._fail(translate_flight_error(exc, self.url, self.key))
        finally:
            if not stopped_early:
                for event in (self.done, self._settled, self._news, self.finished, self.drained):
                    event.set()

    def _first_windows(self, credits: Iterable[protocol_pb2.FeedCredit]) -> list[tuple[str, int, int]]:
        """A Ready frame's credits, as the receiver takes them: one per partition the header assigned (the first of
        each; others, and partitions never assigned, dropped with one warning), each clamped to ``MAX_FEED_WINDOW``,
        the most any worker grants: a peer's numbers, and a hostile Ready could hold millions of entries."""
        assigned = {(a.feed_id, p) for a in self.header.feeds for p in a.partitions}
        kept: dict[tuple[str, int], int] = {}
        dropped = 0
        for credit in credits:
            where = (credit.feed_id, credit.partition)
            if where in assigned and where not in kept:
                kept[where] = min(credit.credits, MAX_FEED_WINDOW)
            else:
                dropped += 1
        if dropped:
            log.warning("task %s on %s: its Ready frame granted %d credit(s) for feed partitions the task was not given, "
                        "or twice; ignored", self.key, self.url, dropped)
        return [(fid, p, n) for (fid, p), n in kept.items()]

    def _handle(self, frame: protocol_pb2.WorkerFrame) -> None:
        kind = frame.WhichOneof("frame")
        if kind == "ready":
            self.output_schema = decode_schema(frame.ready.output_schema, "ready.output_schema")
            self.ready_at = time.monotonic()
            self.ready.set()
            self._settled.set()
            self._news.set()
            if self._on_ready is not None:
                self._on_ready(self)
            on_credit = self._on_credit  # read once: detach() may clear it from another thread meanwhile
            if on_credit is not None:  # each feed partition's first window (protocol version 12)
                for feed_id, partition, credits in self._first_windows(frame.ready.credits):
                    on_credit(self, feed_id, partition, credits)
        elif kind == "credit":
            if (on_credit := self._on_credit) is not None:
                on_credit(self, frame.credit.feed_id, frame.credit.partition, frame.credit.credits)
        elif kind == "error":
            self._fail(error_from_info(frame.error, self.url, self.key))
        elif kind == "finished":
            self.metrics = frame.finished
            self.finished_at = time.monotonic()
            self.finished.set()
            if self._on_finished is not None:
                self._on_finished(self)
        elif kind == "drained":
            self.drained.set()
        elif kind == "load":
            self.load = frame.load
            self.queued.set()
            self._news.set()
