"""The worker's end of a task's DoExchange: writing frames safely, reading the coordinator's side.

A Flight writer must never be used from two threads at once (gRPC aborts the process),
and it is only valid while the handler runs; ``Sender`` serialises every write and
drops writes once the handler is returning. ``read_frames`` is the exchange's inbound
side: it runs on the handler's thread, the only place the reader may be used.
"""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pyarrow.flight as fl

from flight.errors import FlightExecError, ProtocolError, TaskCancelledError
from flight.wire._proto import protocol_pb2
from flight.wire.ipc import check_batch
from flight.wire.limits import clip
from flight.wire.protocol import decode_coordinator_frame, status_message
from flight.worker.tasks import Task

__all__ = ["Sender", "read_frames"]


class Sender:
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

    def try_frame(self, frame: protocol_pb2.WorkerFrame) -> bool:
        """Write ``frame`` unless another thread is writing now (then nothing is written): for heartbeats.

        False when skipped. A write in progress is itself a sign of life, or a peer
        that does not read (then the beat would only wait behind it).
        """
        data = pa.py_buffer(frame.SerializeToString())
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if not self._closed:
                self._writer.write_metadata(data)
            return True
        finally:
            self._lock.release()

    def begin(self, schema: pa.Schema, options: pa.ipc.IpcWriteOptions) -> None:
        with self._lock:
            if not self._closed:
                self._writer.begin(schema, options=options)

    def batch(self, batch: pa.RecordBatch) -> None:
        with self._lock:
            if self._closed:
                raise TaskCancelledError("the task's exchange is closed")
            self._writer.write_batch(batch)


def read_frames(task: Task, reader: fl.MetadataRecordBatchReader) -> None:
    """The exchange's inbound side: units, feed ends, cancels, heartbeats and (map stages) input batches."""
    try:
        while True:
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                task.half_closed = True
                break
            task.last_heard = time.monotonic()
            if chunk.data is not None:
                if not task.is_map or task.inputs is None:
                    why = "takes its input on an input call" if task.separate_input else "is not a map stage"
                    raise ProtocolError(f"task {task.key} {why} but received a record batch on its exchange", field="data")
                task.inputs.put(check_batch(chunk.data, f"map input batch {task.inputs.batches}"))
            if chunk.app_metadata is not None and chunk.app_metadata.size:
                if _dispatch(task, decode_coordinator_frame(chunk.app_metadata)):
                    break  # Release: the coordinator lets go, as a half-close would
    except ProtocolError as exc:
        task.fail(exc)
        return
    except FlightExecError:
        return  # the task already stopped (cancelled or failed); its runner reports why
    except (pa.ArrowException, OSError) as exc:
        task.cancel(f"the coordinator's exchange broke: {status_message(exc)}")
        return
    if task.is_map and task.inputs is not None and not task.inputs.end_seen and not task.finished:
        # pyarrow's server also ends the stream at an empty FlightData: without InputEnd, this is a cut.
        task.fail(
            ProtocolError(
                f"the map input ended after {task.inputs.rows} rows in {task.inputs.batches} batches "
                "without an InputEnd frame: the upload was cut short",
                field="app_metadata.input_end",
            )
        )
    elif task.is_map:
        pass  # the input was complete (InputEnd): the task finishes, then the client releases it
    elif not task.finished:
        task.cancel("the coordinator closed the task's exchange before it finished")
    else:
        # Finished, and the coordinator lets go: output nobody read any more (below a limit) is dropped.
        task.cancel("released by the coordinator")


def _dispatch(task: Task, frame: protocol_pb2.CoordinatorFrame) -> bool:
    """Act on one frame; True when it was the coordinator's ``Release`` (nothing more is read)."""
    kind = frame.WhichOneof("frame")
    if kind == "release":
        return True
    if kind == "units":
        task.inbox(frame.units.feed_id, frame.units.partition).deliver(list(frame.units.units))
    elif kind == "feed_end":
        task.inbox(frame.feed_end.feed_id, frame.feed_end.partition).end()
    elif kind == "feeds":
        _feeds(task, frame.feeds)
    elif kind == "attach":
        raise ProtocolError("InputAttach is only the first frame of an input call, not a task's exchange", field="app_metadata.attach")
    elif kind == "cancel":
        task.call_off(clip(frame.cancel.reason) or "cancelled by the coordinator", lost_worker=clip(frame.cancel.lost_worker))
    elif kind == "input_end":
        if not task.is_map or task.inputs is None:
            why = "takes its input on an input call" if task.separate_input else "is not a map stage"
            raise ProtocolError(f"task {task.key} {why} but received InputEnd on its exchange", field="app_metadata.input_end")
        task.inputs.end_with(frame.input_end.rows, frame.input_end.batches)
    return False


def _feeds(task: Task, feeds: protocol_pb2.FeedFrames) -> None:
    """Several partitions' units, then their ends (protocol 13): each acted on as its own frame would be, in that order;
    an entry refused is named by its place in the bundle."""
    for i, batch in enumerate(feeds.units):
        try:
            task.inbox(batch.feed_id, batch.partition).deliver(list(batch.units))
        except ProtocolError as exc:
            raise ProtocolError(f"entry {i} of a FeedFrames' units: {exc}", field=f"app_metadata.feeds.units[{i}]") from None
    for i, end in enumerate(feeds.ends):
        try:
            task.inbox(end.feed_id, end.partition).end()
        except ProtocolError as exc:
            raise ProtocolError(f"entry {i} of a FeedFrames' ends: {exc}", field=f"app_metadata.feeds.ends[{i}]") from None
