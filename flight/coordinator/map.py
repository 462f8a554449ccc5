"""Map stages: stream batches through a worker on one DoExchange.

The client sends the header in the descriptor, then its input batches; the
worker runs the stage over them and streams the output back on the same
exchange while input still flows. The client's half-close ends the input (and,
after the worker's ``finished`` frame, releases the task). This is what
``flight.spark.flight_map`` calls from inside Spark tasks; docs/protocol.md,
"A map stage", has the sequence.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator

import pyarrow as pa
import pyarrow.flight as fl

from flight.coordinator.headers import task_header
from flight.errors import PlanError, TaskFailedError, WorkerUnavailableError
from flight.plan.nodes import ExchangeInputNode
from flight.plan.query import Query
from flight.security import Security, connect
from flight.threads import Job, spawn
from flight.wire._proto import plan_pb2, protocol_pb2
from flight.wire.clients import error_from_info, translate_flight_error
from flight.wire.protocol import decode_worker_frame, format_stage_key, new_secret

__all__ = ["map_batches"]

log = logging.getLogger(__name__)

_JOIN_S = 10.0


def map_batches(
    stage: Query | plan_pb2.StagePlan | bytes,
    batches: Iterable[pa.RecordBatch],
    worker_url: str,
    *,
    query_id: str | None = None,
    task_number: int = 0,
    connect_timeout: float = 10.0,
    heartbeat: float = 2.0,
    security: Security | None = None,
) -> Iterator[pa.RecordBatch]:
    """Run a map stage over ``batches`` on ``worker_url``; yield its output batches as they come.

    Input is read on a thread of its own, so input and output overlap. Stopping
    early (the caller's error, a limit, a worker's error frame) tells the upload
    to stop, cancels the call (thread-safe in gRPC; it unblocks a blocked write),
    waits for the upload thread, and only then closes the writer: a Flight
    writer used from two threads at once aborts the process (every write takes
    one lock). After the last batch the upload sends ``InputEnd`` with its counts;
    heartbeats keep the task alive until the worker's ``finished``, which the
    reading side answers with the half-close that releases the task.
    """
    plan = _plan_bytes(stage)
    url = worker_url
    header = task_header(
        query_id=query_id or uuid.uuid4().hex[:16],
        stage_id=0,
        task=task_number,
        task_count=task_number + 1,
        plan=plan,
        url=url,
        secret=new_secret(),
        options=protocol_pb2.TaskOptions(heartbeat_ms=int(heartbeat * 1000)),
    )
    label = format_stage_key(header.stage_key)
    client = None
    try:
        client = connect(url, security)
        writer, reader = client.do_exchange(fl.FlightDescriptor.for_command(header.SerializeToString()))
    except (pa.ArrowException, OSError) as exc:
        if client is not None:
            client.close()
        raise translate_flight_error(exc, url, label) from exc

    ready = threading.Event()
    queued = threading.Event()  # the worker is at capacity and queued the task: its own wait bounds ours
    stop = threading.Event()  # finished, failed or abandoned: send no more input
    upload_error: list[BaseException] = []
    wlock = threading.Lock()  # every use of the writer
    half_closed = [False]

    def write(action: Callable[[], object]) -> None:
        with wlock:
            if not half_closed[0]:
                action()

    def half_close() -> None:
        with wlock:
            if not half_closed[0]:
                half_closed[0] = True
                try:
                    writer.done_writing()
                except (pa.ArrowException, OSError) as exc:
                    log.debug("task %s: half-close: %s", label, exc)

    def beat() -> None:
        frame = pa.py_buffer(protocol_pb2.CoordinatorFrame(heartbeat=protocol_pb2.Heartbeat()).SerializeToString())
        while not stop.wait(heartbeat):
            try:
                write(lambda: writer.write_metadata(frame))
            except (pa.ArrowException, OSError):
                return

    def fail_upload(exc: BaseException) -> None:
        upload_error.append(exc)
        try:
            reader.cancel()  # the consumer's read_chunk raises, and it reports ``exc``
        except (pa.ArrowException, OSError) as cancel_exc:
            log.debug("task %s: cancelling after an upload error: %s", label, cancel_exc)

    def upload() -> None:
        deadline = time.monotonic() + connect_timeout
        while not ready.wait(0.05):
            if stop.is_set():
                return  # the consumer sees the worker's error
            if time.monotonic() > deadline and not queued.is_set():
                fail_upload(
                    WorkerUnavailableError(
                        f"worker {url} did not accept map task {label} within {connect_timeout:g}s",
                        worker_url=url,
                        stage_key=label,
                    )
                )
                return
        source = iter(batches)
        started = False
        rows = sent = 0
        while not stop.is_set():
            try:
                batch = next(source)
            except StopIteration:
                break
            except BaseException as exc:  # noqa: BLE001 - the input failed: reported by the consumer
                if not stop.is_set():
                    fail_upload(exc)
                return
            try:
                if not started:
                    write(functools.partial(writer.begin, batch.schema))
                    started = True
                write(functools.partial(writer.write_batch, batch))
                rows, sent = rows + batch.num_rows, sent + 1
            except (pa.ArrowException, OSError) as exc:
                # Usually the worker ended the call (its error frame is on the way to the consumer);
                # if nothing ends the exchange soon, the error was ours (e.g. a batch of another schema).
                if not stop.wait(2.0):
                    fail_upload(exc)
                return
        if stop.is_set():
            return  # finished early (e.g. a limit) or failed: the input's end does not matter
        end = protocol_pb2.CoordinatorFrame(input_end=protocol_pb2.InputEnd(rows=rows, batches=sent))
        try:
            write(lambda: writer.write_metadata(pa.py_buffer(end.SerializeToString())))
        except (pa.ArrowException, OSError) as exc:
            log.debug("task %s: sending InputEnd: %s", label, exc)

    thread = spawn(upload, name=f"map-upload-{label}")
    beating = spawn(beat, name=f"map-beat-{label}")
    finished = False
    try:
        while True:
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                break
            except (pa.ArrowException, OSError) as exc:
                if upload_error:  # the input failed (e.g. Spark's iterator): that is the cause
                    raise _own(upload_error[0], url, label) from exc
                raise translate_flight_error(exc, url, label) from exc
            if chunk.app_metadata is not None and chunk.app_metadata.size:
                frame = decode_worker_frame(chunk.app_metadata)
                kind = frame.WhichOneof("frame")
                if kind == "ready":
                    ready.set()
                elif kind == "load":
                    queued.set()
                elif kind == "error":
                    raise error_from_info(frame.error, url, label)
                elif kind == "finished":
                    finished = True
                    stop.set()  # e.g. a satisfied limit: the rest of the input is not needed
                    half_close()  # the release: the worker ends the exchange once its output is sent
            if chunk.data is not None and chunk.data.num_rows:
                yield chunk.data
        if upload_error:
            raise _own(upload_error[0], url, label)
        if not finished:
            raise TaskFailedError("the worker ended the map stage before it finished", worker_url=url, stage_key=label)
    finally:
        _close(writer, reader, client, (thread, beating), stop, label)


def _own(exc: BaseException, url: str, label: str) -> BaseException:
    """A Flight error of the upload as a WorkerError; anything else (the input's own error) as it is."""
    return translate_flight_error(exc, url, label) if isinstance(exc, (pa.ArrowException, OSError)) else exc


def _close(
    writer: fl.FlightStreamWriter,
    reader: fl.FlightStreamReader,
    client: fl.FlightClient,
    threads: tuple[Job, Job],
    stop: threading.Event,
    label: str,
) -> None:
    """End the exchange without ever using the writer from two threads at once."""
    stop.set()
    thread, beating = threads
    if thread.is_alive():
        try:
            reader.cancel()  # unblocks a write waiting for flow control; the call is over anyway
        except (pa.ArrowException, OSError) as exc:
            log.debug("task %s: cancel: %s", label, exc)
        thread.join(_JOIN_S)
    beating.join(_JOIN_S)
    if thread.is_alive() or beating.is_alive():
        # Still inside the caller's input iterator: leave the writer to it (the call is cancelled).
        log.warning("task %s: the input iterator did not return within %.0fs; leaving it behind", label, _JOIN_S)
        return
    try:
        writer.close()
    except (pa.ArrowException, OSError) as exc:
        log.debug("task %s: closing the exchange: %s", label, exc)
    client.close()


def _plan_bytes(stage: Query | plan_pb2.StagePlan | bytes) -> bytes:
    if isinstance(stage, bytes):
        return stage
    if isinstance(stage, Query):
        if not any(isinstance(n, ExchangeInputNode) for n in stage.node.walk()):
            raise PlanError("map_batches needs a map stage: build it from flight.map_input(schema)")
        return stage.stage_plan().SerializeToString()
    return stage.SerializeToString()
