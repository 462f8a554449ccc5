"""An input call: the batches of a task whose input another process sends (docs/protocol.md, section 16).

Why a call of its own: a stage reading a Spark DataFrame (``flight.spark.table``) is opened,
watched and released by its coordinator like any stage, on the task's own exchange, so its
consumers find it at once and a lost coordinator still frees it. Only its rows come from
elsewhere: each Spark task opens one DoExchange (descriptor path ``flight-exec.input``),
says which task it feeds (``InputAttach``, with the query's secret), streams its partition
and ends with ``InputEnd``. The batches go into the task's ``InputQueue`` (bounded: a full
queue stops reading the call, and gRPC's flow control holds the sender back), so the map
stage's input path is the one used here, only fed from another call.

This handler only reads; it writes nothing but the call's final status. A task may take one
input call; a call cut before ``InputEnd``, a batch of another schema, or counts that differ
fail the task, so its consumers never read a short input (a call that ends before its first
batch leaves the task free for another: nothing reached it).
"""

from __future__ import annotations

import logging
import threading

import pyarrow as pa
import pyarrow.flight as fl

from flight.errors import FlightExecError, ProtocolError, TaskCancelledError
from flight.wire._proto import protocol_pb2
from flight.wire.ipc import check_batch
from flight.wire.limits import clip
from flight.wire.protocol import decode_attach, decode_coordinator_frame, format_stage_key, status_error, status_message
from flight.worker.auth import same_secret
from flight.worker.failures import error_info
from flight.worker.tasks import Task, TaskRegistry

__all__ = ["serve_input_call"]

log = logging.getLogger("flight.worker.server")

_claim = threading.Lock()


def serve_input_call(registry: TaskRegistry, url: str, reader: fl.MetadataRecordBatchReader, wait: float) -> None:
    """Read one input call to its ``InputEnd``; raise a Flight error (with ErrorInfo) when it is refused or fails."""
    invalid = protocol_pb2.ERROR_CODE_INVALID_ARGUMENT
    try:
        first = reader.read_chunk()
    except StopIteration:
        raise status_error(error_info(url, invalid, "the input call ended before its InputAttach frame", None, "app_metadata.attach")) from None
    try:
        if first.data is not None:
            raise ProtocolError("an input call starts with an InputAttach frame, not a batch", field="data")
        attach = decode_attach(first.app_metadata)
    except ProtocolError as exc:
        raise status_error(error_info(url, invalid, str(exc), None, exc.field)) from None
    task = _attached_task(registry, url, attach, wait)
    try:
        _stream(task, reader)
    except ProtocolError as exc:
        _give_up(task, exc)  # a short or altered input must never look complete to the task's consumers
        raise status_error(error_info(url, invalid, f"input call of task {task.key}: {exc}", attach.stage_key, exc.field)) from None
    except FlightExecError as exc:  # the task stopped (failed, cancelled): the call says so
        code = protocol_pb2.ERROR_CODE_CANCELLED if isinstance(exc, TaskCancelledError) else protocol_pb2.ERROR_CODE_EXECUTION
        raise status_error(error_info(url, code, f"task {task.key} on {url} stopped taking input: {clip(exc)}", attach.stage_key)) from None
    except (pa.ArrowException, OSError) as exc:  # the sender went away mid-stream, or sent what is no IPC stream
        _give_up(task, ProtocolError(f"the input call broke before InputEnd: {status_message(exc)}", field="app_metadata.input_end"))
        raise status_error(error_info(url, protocol_pb2.ERROR_CODE_CANCELLED, f"input call of task {task.key} broke", attach.stage_key)) from None
    log.debug("task %s: input call complete (%d rows in %d batches)", task.key, task.inputs.rows if task.inputs else 0,
              task.inputs.batches if task.inputs else 0)


def _give_up(task: Task, error: ProtocolError) -> None:
    """The call ended badly. Before its first batch nothing reached the task: it stays free for another
    call (Spark's retry of the sending task); after it, the task fails, so no reader sees a short input."""
    inputs = task.inputs
    if inputs is not None and inputs.batches == 0 and not inputs.end_seen:
        with _claim:
            task.input_attached = False
        return
    task.fail(error, failed=True)


def _attached_task(registry: TaskRegistry, url: str, attach: protocol_pb2.InputAttach, wait: float) -> Task:
    """The task ``attach`` names, claimed for this call; a Flight error when it cannot take it."""
    key = format_stage_key(attach.stage_key)
    task, why = registry.get(key, wait=wait)
    field = "app_metadata.attach.stage_key"
    if task is None:
        gone = registry.unavailable(key)
        if gone is not None:
            raise status_error(error_info(gone[0], protocol_pb2.ERROR_CODE_UNAVAILABLE, gone[1], attach.stage_key, field))
        info = error_info(url, protocol_pb2.ERROR_CODE_NOT_FOUND, f"no task {key} on worker {url}: {why}", attach.stage_key, field)
        info.never_here = registry.never_here(key)
        raise status_error(info)
    if not same_secret(attach.query_secret, task.header.query_secret):
        message = f"the input call for task {key} does not carry its query's secret"
        raise status_error(error_info(url, protocol_pb2.ERROR_CODE_PERMISSION_DENIED, message, attach.stage_key, "app_metadata.attach.query_secret"))
    invalid = protocol_pb2.ERROR_CODE_INVALID_ARGUMENT
    if not task.separate_input or task.inputs is None:
        message = f"task {key} does not take an input call (its plan has no separate input)"
        raise status_error(error_info(url, invalid, message, attach.stage_key, field))
    with _claim:
        if task.input_attached:
            raise status_error(error_info(url, invalid, f"task {key} already has its input call", attach.stage_key, field))
        task.input_attached = True
    return task


def _stream(task: Task, reader: fl.MetadataRecordBatchReader) -> None:
    """Batches into the task's input queue until ``InputEnd`` (heartbeats are ignored)."""
    inputs = task.inputs
    assert inputs is not None and task.input_schema is not None
    while True:
        try:
            chunk = reader.read_chunk()
        except StopIteration:
            raise ProtocolError(
                f"the input call ended after {inputs.rows} rows in {inputs.batches} batches without an InputEnd frame: "
                "the input was cut short",
                field="app_metadata.input_end",
            ) from None
        if chunk.data is not None:
            batch = check_batch(chunk.data, f"input batch {inputs.batches}")
            if not batch.schema.equals(task.input_schema):
                raise ProtocolError(
                    f"input batch {inputs.batches} has schema ({clip(batch.schema.to_string(show_schema_metadata=False))}); "
                    f"task {task.key} takes ({clip(task.input_schema.to_string(show_schema_metadata=False))})",
                    field="data",
                )
            inputs.put(batch)
        if chunk.app_metadata is not None and chunk.app_metadata.size:
            frame = decode_coordinator_frame(chunk.app_metadata)
            kind = frame.WhichOneof("frame")
            if kind == "input_end":
                inputs.end_with(frame.input_end.rows, frame.input_end.batches)
                return
            if kind != "heartbeat":
                raise ProtocolError(f"an input call carries batches, heartbeats and InputEnd, not {kind}", field="app_metadata")
