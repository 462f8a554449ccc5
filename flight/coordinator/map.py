"""Map stages: stream batches through a worker on one DoExchange.

The client sends the header in the descriptor, then its input batches; the
worker runs the stage over them and streams the output back on the same
exchange while input still flows. ``InputEnd`` ends the input; after the
worker's ``finished`` frame a ``Release`` frame lets the task go. This is what
``flight.spark.flight_map`` calls from inside Spark tasks; docs/protocol.md,
"A map stage", has the sequence.

The exchange is a ``channel.TaskChannel``, the client every task of a query
uses: its heartbeats, its one lock for every write, and its release. Here only
the upload is added: a thread that writes the input while the caller reads.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterable, Iterator

import pyarrow as pa
import pyarrow.flight as fl

from flight.coordinator.channel import TaskChannel
from flight.coordinator.headers import task_header
from flight.errors import FlightExecError, PlanError, TaskFailedError, WorkerUnavailableError
from flight.plan.nodes import ExchangeInputNode
from flight.plan.query import Query
from flight.security import Security, connect
from flight.threads import Job, spawn
from flight.wire._proto import plan_pb2, protocol_pb2
from flight.wire.clients import translate_flight_error
from flight.wire.plan_codec import encode_plan
from flight.wire.protocol import new_secret

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

    ``stage``: a query built from ``flight.map_input``, its plan, or that plan as ``TaskHeader.plan``
    carries it (``flight.wire.plan_codec.encode_plan``: the operators as a flat list), sent as it is.

    Input is read on a thread of its own, so input and output overlap. Stopping
    early (the caller's error, a limit, a worker's error frame) tells the upload
    to stop, cancels the call if it still writes (thread-safe in gRPC; it unblocks
    a blocked write), waits for the upload thread, and only then lets the task go
    and closes the writer: a Flight writer used from two threads at once aborts
    the process. After the last batch the upload sends ``InputEnd`` with its
    counts; heartbeats keep the task alive until the worker's ``finished``, which
    the reading side answers with the ``Release`` that lets the task go.
    """
    header = task_header(
        query_id=query_id or uuid.uuid4().hex[:16],
        stage_id=0,
        task=task_number,
        task_count=task_number + 1,
        plan=_plan_bytes(stage),
        url=worker_url,
        secret=new_secret(),
        options=protocol_pb2.TaskOptions(heartbeat_ms=int(heartbeat * 1000)),
    )
    upload = _Upload(batches, connect_timeout)
    # No watch for a silent worker: the reader is the caller's, which may pause between batches.
    channel = TaskChannel(worker_url, header, on_finished=upload.finished, heartbeat=heartbeat, peer_timeout=None)
    client = _open(channel, security)
    upload.start(channel)
    try:
        try:
            yield from channel.output()
        except FlightExecError as exc:
            if upload.error is not None:  # the input failed (e.g. Spark's iterator): that is the cause
                raise _own(upload.error, channel) from exc
            raise
        if upload.error is not None:
            raise _own(upload.error, channel)
        if channel.metrics is None:
            raise TaskFailedError("the worker ended the map stage before it finished", worker_url=worker_url, stage_key=channel.key)
    finally:
        upload.end(channel, client)


def _open(channel: TaskChannel, security: Security | None) -> fl.FlightClient:
    """A client of its own for the task (a Spark task's process has no pool), and the exchange open on it."""
    try:
        client = connect(channel.url, security)
    except (pa.ArrowException, OSError) as exc:
        raise translate_flight_error(exc, channel.url, channel.key) from exc
    try:
        channel.open(client, inline=True)
    except BaseException:
        client.close()
        raise
    return client


class _Upload:
    """A map stage's input, written on a thread of its own while the caller reads the output."""

    def __init__(self, batches: Iterable[pa.RecordBatch], connect_timeout: float) -> None:
        self.batches = batches
        self.connect_timeout = connect_timeout
        self.stop = threading.Event()  # finished, failed or abandoned: send no more input
        self.error: BaseException | None = None
        self.job: Job | None = None

    def start(self, channel: TaskChannel) -> None:
        self.job = spawn(self._run, channel, name=f"map-upload-{channel.key}")

    def finished(self, channel: TaskChannel) -> None:
        """The worker's ``finished`` (on the reading side): the rest of the input is not needed (e.g. a
        satisfied limit), and the ``Release`` lets the task go; the worker then ends the call."""
        self.stop.set()
        channel.close()

    def _fail(self, channel: TaskChannel, exc: BaseException) -> None:
        self.error = exc
        channel.cancel_call()  # the reader raises, and the caller reports ``exc``

    def _run(self, channel: TaskChannel) -> None:
        if not self._accepted(channel):
            return
        source = iter(self.batches)
        rows = sent = 0
        while not self.stop.is_set():
            try:
                batch = next(source)
            except StopIteration:
                break
            except BaseException as exc:  # noqa: BLE001 - the input failed: reported by the reader
                if not self.stop.is_set():
                    self._fail(channel, exc)
                return
            try:
                if not channel.write_input(batch):
                    return  # the task was let go, or the call ended
            except (pa.ArrowException, OSError) as exc:
                # Usually the worker ended the call (its error frame is on the way to the reader);
                # if nothing ends the exchange soon, the error was ours (e.g. a batch of another schema).
                if not self.stop.wait(2.0):
                    self._fail(channel, exc)
                return
            rows, sent = rows + batch.num_rows, sent + 1
        if not self.stop.is_set():  # finished early (e.g. a limit) or failed: the input's end does not matter
            channel.send(protocol_pb2.CoordinatorFrame(input_end=protocol_pb2.InputEnd(rows=rows, batches=sent)))

    def _accepted(self, channel: TaskChannel) -> bool:
        """Wait for the worker's ``ready``; a worker that queued the task for capacity bounds the wait itself."""
        deadline = time.monotonic() + self.connect_timeout
        while not channel.ready.wait(0.05):
            if self.stop.is_set():
                return False  # the reader sees the worker's error
            if time.monotonic() > deadline and not channel.queued.is_set():
                self._fail(
                    channel,
                    WorkerUnavailableError(
                        f"worker {channel.url} did not accept map task {channel.key} within {self.connect_timeout:g}s",
                        worker_url=channel.url,
                        stage_key=channel.key,
                    ),
                )
                return False
        return True

    def end(self, channel: TaskChannel, client: fl.FlightClient) -> None:
        """Stop the upload, then let the task go and close the writer: never two writers at once."""
        self.stop.set()
        job = self.job
        if job is not None and job.is_alive():
            channel.cancel_call()  # unblocks a write waiting for flow control; the call is over anyway
            job.join(_JOIN_S)
            if job.is_alive():
                # Still inside the caller's input iterator: leave the writer to it (the call is cancelled).
                log.warning("task %s: the input iterator did not return within %.0fs; leaving it behind", channel.key, _JOIN_S)
                return
        channel.finish()
        client.close()


def _own(exc: BaseException, channel: TaskChannel) -> BaseException:
    """A Flight error of the upload as a WorkerError; anything else (the input's own error) as it is."""
    return translate_flight_error(exc, channel.url, channel.key) if isinstance(exc, (pa.ArrowException, OSError)) else exc


def _plan_bytes(stage: Query | plan_pb2.StagePlan | bytes) -> bytes:
    if isinstance(stage, bytes):
        return stage
    if isinstance(stage, Query):
        if not any(isinstance(n, ExchangeInputNode) for n in stage.node.walk()):
            raise PlanError("map_batches needs a map stage: build it from flight.map_input(schema)")
        return encode_plan(stage.stage_plan())
    return encode_plan(stage)
