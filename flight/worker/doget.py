"""A task's output partitions as a DoGet stream: batches in partition order, heartbeats while it waits.

Why heartbeats: a reader of a DoGet stream (a consumer task on another worker, the
coordinator) cannot put a deadline on it, since a slow producer may legitimately keep
it waiting for minutes, and gRPC has no keepalive here. Without a sign of life a frozen
or partitioned worker left its readers blocked forever. So while the stream has nothing
to send, it sends a 0-row batch of its schema every heartbeat interval of the task
(``TaskOptions.heartbeat_ms``), its ``BatchMetadata.heartbeat`` set: a reader that hears
nothing for its own bound knows the worker is gone (``flight.wire.stall``), and a reader
that does not know the flag sees an empty batch of the partition being read, which adds
no rows. docs/protocol.md, section 11.

Each partition ends with a trailer, a 0-row batch whose ``BatchMetadata.trailer`` says the
rows, batches and CRC-32 the partition carried (``flight.wire.integrity``, section 17): the
reader checks them, so a stream that lost a batch on the way is an error, not a short result.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import pyarrow as pa

from flight.errors import FlightExecError, TaskCancelledError, WorkerError
from flight.wire._proto import protocol_pb2
from flight.wire.integrity import Tally
from flight.wire.limits import heartbeat_seconds
from flight.wire.protocol import status_error
from flight.worker.tasks import Task

__all__ = ["GONE_POLL_S", "heartbeat_batch", "output_stream"]

log = logging.getLogger("flight.worker.server")


def _left(task: Task) -> None:
    """The stream ended before its end (its reader cancelled, left, or the task failed): a head task
    that keeps no output for re-reads is cancelled, since no one else will read it (protocol §11)."""
    options = task.header.options
    if options.head and not options.retain_output and not task.cancelled.is_set() and task.error is None:
        log.info("task %s: its reader left before the end of its output; cancelling it", task.key)
        task.cancel("its reader left before the end of its output (the query's client cancelled or went away)")


def heartbeat_batch(schema: pa.Schema) -> pa.RecordBatch | None:
    """A batch of 0 rows of ``schema`` (None if pyarrow cannot make one: that stream then sends no heartbeats).

    ``pa.nulls(0, type)`` rather than ``pa.array([])``: it makes every type, unions included."""
    try:
        return pa.RecordBatch.from_arrays([pa.nulls(0, field.type) for field in schema], schema=schema)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        log.debug("no heartbeat batch for schema %s: %s", schema, exc)
        return None


GONE_POLL_S = 0.25
"""How often a DoGet stream with nothing to send looks whether its reader is still there."""


def output_stream(
    task: Task, start: int, end: int, gone: Callable[[], bool] = lambda: False
) -> Iterator[tuple[pa.RecordBatch, bytes]]:
    """Partitions [start, end) of ``task``'s output as (batch, app_metadata) pairs, for pyarrow's GeneratorStream.

    A failure of the task ends the stream with the Flight status that says what happened
    (docs/protocol.md, section 11), never with a Python traceback. ``gone``: the call's
    ``is_cancelled``, asked on the call's own thread every ``GONE_POLL_S`` while the stream
    waits: a head task whose reader left is cancelled within that (``_left``), rather than
    compute for no one until its heartbeat's write fails."""
    assert task.output is not None
    idle = heartbeat_seconds(task.header.options.heartbeat_ms)
    poll = min(idle, GONE_POLL_S)
    empty = heartbeat_batch(task.output_schema)
    if empty is None:  # pragma: no cover - pa.nulls makes every type; without it no trailer could be sent
        empty = pa.RecordBatch.from_pylist([], schema=task.output_schema)
    checksums = not task.header.options.no_checksum
    try:
        for partition in range(start, end):
            meta = protocol_pb2.BatchMetadata(partition=partition).SerializeToString()
            beat = empty, protocol_pb2.BatchMetadata(partition=partition, heartbeat=True).SerializeToString()
            tally, quiet = Tally(checksums), 0.0
            for batch in task.output.read(partition, poll):
                if batch is None:
                    if gone():
                        _left(task)
                        return
                    quiet += poll
                    if quiet >= idle:
                        quiet = 0.0
                        yield beat
                elif batch.num_rows:  # an empty batch carries nothing: not sent, not counted
                    quiet = 0.0
                    yield tally.add(batch), meta
            yield empty, protocol_pb2.BatchMetadata(partition=partition, trailer=tally.trailer()).SerializeToString()
    except GeneratorExit:  # pyarrow let the stream go: its reader cancelled or left while batches flowed
        _left(task)
        raise
    except TaskCancelledError as exc:
        code, message = protocol_pb2.ERROR_CODE_CANCELLED, f"task {task.key} on {task.worker_url}: {exc.cause}"
    except FlightExecError as exc:
        cause = exc.cause if isinstance(exc, WorkerError) else str(exc)
        code, message = protocol_pb2.ERROR_CODE_EXECUTION, f"task {task.key} failed on {task.worker_url}: {cause}"
    except Exception as exc:
        log.warning("task %s: streaming its output failed", task.key, exc_info=True)
        code, message = protocol_pb2.ERROR_CODE_EXECUTION, f"task {task.key} on {task.worker_url}: {type(exc).__name__} while streaming"
    else:
        return
    where = task.worker_url
    if task.unavailable is not None:  # a worker it needed is gone (moved by its coordinator, or a peer it could not reach)
        code, (where, message) = protocol_pb2.ERROR_CODE_UNAVAILABLE, task.unavailable
    info = protocol_pb2.ErrorInfo(code=code, message=message, stage_key=task.header.stage_key, worker_url=where)
    raise status_error(info)
