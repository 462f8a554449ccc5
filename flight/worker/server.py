"""The worker's Flight service: thin handlers over the task registry.

``DoExchange`` runs one task for as long as its coordinator keeps the exchange
open; ``DoGet`` streams a task's output partitions; ``DoAction`` answers
health, info, cancel and drain. Errors are translated here, at the boundary:
a clean ``ErrorInfo`` frame goes to the coordinator, and the call ends with the
matching Flight status (``INVALID_ARGUMENT`` for bad input), so that neither
side sees a Python traceback as the message.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import NoReturn

import pyarrow as pa
import pyarrow.flight as fl

from flight._proto import protocol_pb2
from flight._version import __version__
from flight.config import WorkerOptions
from flight.engine.pipeline import compile_task
from flight.engine.readers import UnitReadError
from flight.errors import (
    FlightExecError,
    ProtocolError,
    TaskCancelledError,
    VersionMismatchError,
    WorkerError,
    WorkerUnavailableError,
)
from flight.protocol import (
    PROTOCOL_VERSION,
    decode_coordinator_frame,
    decode_header,
    decode_ticket,
    encode_schema,
    format_stage_key,
    ipc_options,
    status_message,
)
from flight.clients import ClientPool
from flight.worker.shuffle import read_partitions
from flight.worker.tasks import Task, TaskRegistry

__all__ = ["ACTIONS", "WorkerServer"]

log = logging.getLogger(__name__)

ACTIONS = {
    "health": "Answers b'ok' while the worker accepts tasks.",
    "info": "A WorkerInfo: version, protocol version, running tasks, buffered bytes, draining.",
    "cancel": "Body: a CancelRequest. Cancels every task of that query; answers a CancelResult.",
    "drain": "Stop accepting tasks; running ones finish or are cancelled after the grace period.",
}


class _Sender:
    """Serialises writes on one exchange: frames come from several threads.

    Once closed (the handler is returning), writes are dropped: the writer is
    only valid while the handler runs.
    """

    def __init__(self, writer: fl.MetadataRecordBatchWriter) -> None:
        self._writer = writer
        self._lock = threading.Lock()
        self._closed = False

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def frame(self, frame: protocol_pb2.WorkerFrame) -> None:
        data = pa.py_buffer(frame.SerializeToString())
        with self._lock:
            if not self._closed:
                self._writer.write_metadata(data)

    def begin(self, schema: pa.Schema, options: pa.ipc.IpcWriteOptions) -> None:
        with self._lock:
            if not self._closed:
                self._writer.begin(schema, options=options)

    def batch(self, batch: pa.RecordBatch) -> None:
        with self._lock:
            if self._closed:
                raise TaskCancelledError("the task's exchange is closed")
            self._writer.write_batch(batch)


class WorkerServer(fl.FlightServerBase):
    """A flight-exec worker. ``url`` is what coordinators dial."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, options: WorkerOptions | None = None) -> None:
        super().__init__(f"grpc://{host}:{port}")
        self.options = options or WorkerOptions()
        self.url = f"grpc://{host}:{self.port}"
        self.registry = TaskRegistry()
        self.peers = ClientPool()
        self.draining = threading.Event()

    # ------------------------------------------------------------- DoExchange

    def do_exchange(
        self,
        context: fl.ServerCallContext,
        descriptor: fl.FlightDescriptor,
        reader: fl.MetadataRecordBatchReader,
        writer: fl.MetadataRecordBatchWriter,
    ) -> None:
        sender = _Sender(writer)
        try:
            header, plan = decode_header(descriptor.command or b"")
        except ProtocolError as exc:
            self._reject(sender, exc, None)
        key = format_stage_key(header.stage_key)
        if self.draining.is_set():
            self._send_error(sender, protocol_pb2.ERROR_CODE_UNAVAILABLE, f"worker {self.url} is draining", header.stage_key)
            raise fl.FlightUnavailableError(f"worker {self.url} is draining and accepts no new tasks (task {key})")
        opts = header.options
        task = Task(
            header,
            plan,
            pa.schema([]),
            worker_url=self.url,
            feed_window=opts.feed_window or self.options.feed_window,
            output_buffer_bytes=opts.output_buffer_bytes or self.options.output_buffer_bytes,
            send_credit=lambda fid, p, n: sender.frame(
                protocol_pb2.WorkerFrame(credit=protocol_pb2.FeedCredit(feed_id=fid, partition=p, credits=n))
            ),
            read_partitions=self._read_partitions,
        )
        try:
            output = compile_task(plan, task, self.options.batch_rows, self.options.unit_delay_ms / 1000)
            task.output_schema = output.schema  # before the task is visible to DoGet
            self.registry.add(task)
        except ProtocolError as exc:
            task.cancel("rejected")
            self._reject(sender, exc, header.stage_key)
        log.debug("task %s started (%d feed partitions)", key, len(task.inboxes))
        runner = threading.Thread(target=self._run, args=(task, output, sender), name=f"task-{key}", daemon=True)
        try:
            self._send_ready(task, sender)
            runner.start()
            # This thread reads the coordinator's side until it half-closes or goes away;
            # the reader is only valid while this handler runs, so it is read nowhere else.
            _read_frames(task, reader)
            runner.join()
        finally:
            task.cancel("the task ended")
            if runner.is_alive():
                runner.join(timeout=30)
            sender.close()
            self.registry.remove(task)
            log.debug("task %s freed", key)
        if task.failure is not None:
            raise task.failure

    def _send_ready(self, task: Task, sender: _Sender) -> None:
        ready = protocol_pb2.Ready(
            worker_url=self.url, worker_version=__version__, output_schema=encode_schema(task.output_schema)
        )
        sender.frame(protocol_pb2.WorkerFrame(ready=ready))

    def _run(self, task: Task, output: pa.RecordBatchReader, sender: _Sender) -> None:
        """The task's pipeline, on its own thread; its outcome is a frame (and ``task.failure``)."""
        ipc = ipc_options(task.header.options.ipc_compression)
        try:
            task.start_feeds()
            if task.is_map:
                sender.begin(output.schema, ipc)
            for batch in output:
                if task.cancelled.is_set():
                    break
                task.record_output(batch)
                if task.output is None:
                    sender.batch(batch)
                else:
                    task.emit(batch)
            if task.error is not None or task.cancelled.is_set():
                raise task.error or TaskCancelledError(task.cancel_reason)
            if task.inputs is not None:
                task.inputs.discard()  # input may still come after the output is complete
            if task.output is not None:
                task.output.finish()
            task.finished = True
            sender.frame(protocol_pb2.WorkerFrame(finished=task.metrics()))
            if task.output is not None:
                task.output.wait_drained()
                if task.output.all_drained():
                    sender.frame(protocol_pb2.WorkerFrame(drained=protocol_pb2.Drained()))
        except (FlightExecError, UnitReadError, pa.ArrowException, OSError) as exc:
            task.failure = self._fail(task, sender, exc)
        except Exception as exc:  # noqa: BLE001 - a reader or extension raised its own type: still a task failure
            log.warning("task %s: unexpected %s", task.key, type(exc).__name__, exc_info=True)
            task.failure = self._fail(task, sender, exc)

    def _read_partitions(
        self, task: Task, producers: list[tuple[str, bytes]], start: int, end: int
    ) -> Iterator[tuple[pa.RecordBatch, bool]]:
        return read_partitions(task, self.registry, self.peers, self.url, producers, start, end, self.options.get_wait)

    # ------------------------------------------------------------------ errors

    def _send_error(
        self,
        sender: _Sender,
        code: int,
        message: str,
        stage_key: protocol_pb2.StageKey | None,
        field: str = "",
    ) -> None:
        info = protocol_pb2.ErrorInfo(code=code, message=message, worker_url=self.url, field=field)
        if stage_key is not None:
            info.stage_key.CopyFrom(stage_key)
        try:
            sender.frame(protocol_pb2.WorkerFrame(error=info))
        except (pa.ArrowException, OSError) as exc:
            log.debug("could not send an error frame (the coordinator is gone?): %s", exc)

    def _reject(self, sender: _Sender, exc: ProtocolError, stage_key: protocol_pb2.StageKey | None) -> NoReturn:
        code = (
            protocol_pb2.ERROR_CODE_VERSION_MISMATCH
            if isinstance(exc, VersionMismatchError)
            else protocol_pb2.ERROR_CODE_INVALID_ARGUMENT
        )
        log.info("rejected a task: %s", exc)
        self._send_error(sender, code, str(exc), stage_key, exc.field)
        raise pa.ArrowInvalid(f"{exc} [field: {exc.field}]") from None

    def _fail(self, task: Task, sender: _Sender, exc: BaseException) -> Exception:
        """Report a task's failure in a frame; return the Flight error its exchange ends with."""
        error = task.error or exc
        if isinstance(error, ProtocolError):
            log.info("task %s: bad frame from the coordinator: %s", task.key, error)
            self._send_error(sender, protocol_pb2.ERROR_CODE_INVALID_ARGUMENT, str(error), task.header.stage_key, error.field)
            task.cancel(str(error))
            return pa.ArrowInvalid(f"{error} [field: {error.field}]")
        if task.cancelled.is_set() and task.error is None and not isinstance(exc, UnitReadError):
            log.debug("task %s cancelled: %s", task.key, task.cancel_reason)
            self._send_error(sender, protocol_pb2.ERROR_CODE_CANCELLED, f"cancelled: {task.cancel_reason}", task.header.stage_key)
            return fl.FlightCancelledError(f"task {task.key} cancelled: {task.cancel_reason}")
        message = status_message(error)
        log.info("task %s failed: %s", task.key, message)
        code = protocol_pb2.ERROR_CODE_UNAVAILABLE if isinstance(error, WorkerUnavailableError) else protocol_pb2.ERROR_CODE_EXECUTION
        self._send_error(sender, code, message, task.header.stage_key)
        task.cancel(message, failed=True)
        return fl.FlightServerError(f"task {task.key} failed on {self.url}: {message}")

    # ------------------------------------------------------------------- DoGet

    def do_get(self, context: fl.ServerCallContext, ticket: fl.Ticket) -> fl.FlightDataStream:
        try:
            t = decode_ticket(ticket.ticket)
        except ProtocolError as exc:
            raise pa.ArrowInvalid(f"{exc} [field: {exc.field}]") from None
        key = format_stage_key(t.stage_key)
        task, why = self.registry.get(key, wait=self.options.get_wait)
        if task is None:
            raise fl.FlightServerError(f"no task {key} on worker {self.url}: {why}")
        if task.output is None:
            raise pa.ArrowInvalid(f"task {key} is a map stage: its output streams on its DoExchange [field: ticket]")
        if t.partition_end > task.output.partitions:
            raise pa.ArrowInvalid(
                f"ticket asks for partitions [{t.partition_start}, {t.partition_end}) "
                f"but task {key} has {task.output.partitions} [field: ticket.partition_end]"
            )
        ipc = ipc_options(task.header.options.ipc_compression)
        return fl.GeneratorStream(task.output_schema, _stream(task, t.partition_start, t.partition_end), options=ipc)

    # ---------------------------------------------------------------- DoAction

    def list_actions(self, context: fl.ServerCallContext) -> list[tuple[str, str]]:
        return list(ACTIONS.items())

    def do_action(self, context: fl.ServerCallContext, action: fl.Action) -> Iterator[bytes]:
        kind = action.type
        if kind == "health":
            if self.draining.is_set():
                raise fl.FlightUnavailableError(f"worker {self.url} is draining")
            return iter([b"ok"])
        if kind == "info":
            return iter([self.info().SerializeToString()])
        if kind == "cancel":
            req = protocol_pb2.CancelRequest()
            try:
                req.ParseFromString(action.body.to_pybytes() if action.body else b"")
            except Exception as exc:  # protobuf raises DecodeError, a plain Exception subclass
                raise pa.ArrowInvalid(f"the cancel action's body is not a CancelRequest: {exc} [field: body]") from None
            if not req.query_id:
                raise pa.ArrowInvalid("the cancel action needs a query_id [field: body.query_id]")
            n = self.registry.cancel_query(req.query_id, "cancelled by request")
            return iter([protocol_pb2.CancelResult(cancelled_tasks=n).SerializeToString()])
        if kind == "drain":
            threading.Thread(target=self.drain, name="drain", daemon=True).start()
            return iter([b"draining"])
        raise pa.ArrowInvalid(f"unknown action {kind!r}; known: {', '.join(ACTIONS)} [field: action.type]")

    def info(self) -> protocol_pb2.WorkerInfo:
        return protocol_pb2.WorkerInfo(
            version=__version__,
            protocol_version=PROTOCOL_VERSION,
            running_tasks=len(self.registry),
            buffered_bytes=self.registry.buffered_bytes(),
            draining=self.draining.is_set(),
            url=self.url,
        )

    def drain(self, grace: float | None = None) -> None:
        """Accept no new tasks; wait up to ``grace`` seconds for running ones, then cancel them."""
        grace = self.options.grace if grace is None else grace
        self.draining.set()
        self.registry.close()
        log.info("draining: %d running tasks, grace %.1fs", len(self.registry), grace)
        if not self.registry.wait_empty(grace):
            for task in self.registry.tasks():
                task.cancel("the worker is shutting down")
            self.registry.wait_empty(5.0)


def _read_frames(task: Task, reader: fl.MetadataRecordBatchReader) -> None:
    """The exchange's inbound side: units, feed ends, cancels and (map stages) input batches."""
    try:
        while True:
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                break
            if chunk.data is not None:
                if task.inputs is None:
                    raise ProtocolError(f"task {task.key} is not a map stage but received a record batch", field="data")
                task.inputs.put(chunk.data)
            if chunk.app_metadata is not None and chunk.app_metadata.size:
                _dispatch(task, decode_coordinator_frame(chunk.app_metadata))
    except ProtocolError as exc:
        task.fail(exc)
        return
    except FlightExecError:
        return  # the task already stopped (cancelled or failed); its runner reports why
    except (pa.ArrowException, OSError) as exc:
        task.cancel(f"the coordinator's exchange broke: {status_message(exc)}")
        return
    if task.inputs is not None:
        task.inputs.end()
    elif not task.finished:
        task.cancel("the coordinator closed the task's exchange before it finished")
    else:
        # Finished, and the coordinator lets go: output nobody read any more (below a limit) is dropped.
        task.cancel("released by the coordinator")


def _dispatch(task: Task, frame: protocol_pb2.CoordinatorFrame) -> None:
    kind = frame.WhichOneof("frame")
    if kind == "units":
        task.inbox(frame.units.feed_id, frame.units.partition).deliver(list(frame.units.units))
    elif kind == "feed_end":
        task.inbox(frame.feed_end.feed_id, frame.feed_end.partition).end()
    elif kind == "cancel":
        task.cancel(frame.cancel.reason or "cancelled by the coordinator")


def _stream(task: Task, start: int, end: int) -> Iterator[tuple[pa.RecordBatch, bytes]]:
    assert task.output is not None
    try:
        for partition in range(start, end):
            meta = protocol_pb2.BatchMetadata(partition=partition).SerializeToString()
            for batch in task.output.read(partition):
                yield batch, meta
    except TaskCancelledError as exc:
        raise fl.FlightCancelledError(f"task {task.key} on {task.worker_url}: {exc.cause}") from None
    except FlightExecError as exc:
        cause = exc.cause if isinstance(exc, WorkerError) else str(exc)
        raise fl.FlightServerError(f"task {task.key} failed on {task.worker_url}: {cause}") from None

