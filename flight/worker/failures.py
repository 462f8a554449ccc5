"""How the worker reports a failure: one ``ErrorInfo`` as a frame, and the Flight status the call ends with.

Every error leaves as a FlightError whose extra_info is the ErrorInfo (protocol.status_error):
a clean message, a code, the field, the stage key and this worker's URL; never a traceback.
Apart from the handlers so that every one of them, and the runner thread, says it the same way.
"""

from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.flight as fl

from flight.engine.readers import PathRefused, UnitReadError
from flight.errors import ProtocolError, VersionMismatchError, WorkerUnavailableError
from flight.wire._proto import protocol_pb2
from flight.wire.limits import MAX_ECHO_CHARS, MAX_MESSAGE_CHARS, clip
from flight.wire.protocol import status_error, status_message
from flight.worker.exchange import Sender
from flight.worker.tasks import Task

__all__ = ["error_info", "fail", "refuse", "reject", "send_error"]

log = logging.getLogger("flight.worker.server")


def error_info(
    url: str, code: protocol_pb2.ErrorCode.ValueType, message: str, stage_key: protocol_pb2.StageKey | None, field: str = ""
) -> protocol_pb2.ErrorInfo:
    """The ErrorInfo worker ``url`` answers with."""
    # One line (a schema printed by pyarrow spans several), within the cap with the field appended.
    text = clip(" ".join(message.split()), MAX_MESSAGE_CHARS - 2 * MAX_ECHO_CHARS)
    info = protocol_pb2.ErrorInfo(code=code, message=text, worker_url=url, field=clip(field))
    if stage_key is not None:
        info.stage_key.CopyFrom(stage_key)
    return info


def send_error(sender: Sender, info: protocol_pb2.ErrorInfo) -> None:
    try:
        sender.frame(protocol_pb2.WorkerFrame(error=info))
    except (pa.ArrowException, OSError) as exc:
        log.debug("could not send an error frame (the coordinator is gone?): %s", exc)


def refuse(
    url: str, sender: Sender, code: protocol_pb2.ErrorCode.ValueType, message: str, stage_key: protocol_pb2.StageKey | None
) -> fl.FlightError:
    """An error frame for the coordinator, and the status the exchange ends with."""
    info = error_info(url, code, message, stage_key)
    send_error(sender, info)
    return status_error(info)


def reject(url: str, sender: Sender, exc: ProtocolError, stage_key: protocol_pb2.StageKey | None) -> fl.FlightError:
    code = (
        protocol_pb2.ERROR_CODE_VERSION_MISMATCH
        if isinstance(exc, VersionMismatchError)
        else protocol_pb2.ERROR_CODE_INVALID_ARGUMENT
    )
    log.info("rejected a task: %s", exc)
    info = error_info(url, code, str(exc), stage_key, exc.field)
    send_error(sender, info)
    return status_error(info)


def fail(url: str, task: Task, sender: Sender, exc: BaseException) -> Exception:
    """Report a task's failure in a frame; return the Flight error its exchange ends with."""
    error = task.error or exc
    key = task.header.stage_key
    if isinstance(error, ProtocolError):
        log.info("task %s: bad input from the coordinator: %s", task.key, error)
        info = error_info(url, protocol_pb2.ERROR_CODE_INVALID_ARGUMENT, str(error), key, error.field)
        task.cancel(str(error))
    elif task.cancelled.is_set() and task.error is None and not isinstance(exc, UnitReadError):
        log.debug("task %s cancelled: %s", task.key, task.cancel_reason)
        info = error_info(url, protocol_pb2.ERROR_CODE_CANCELLED, f"task {task.key} cancelled: {task.cancel_reason}", key)
    else:
        message = status_message(error)
        log.info("task %s failed: %s", task.key, message)
        code = protocol_pb2.ERROR_CODE_UNAVAILABLE if isinstance(error, WorkerUnavailableError) else protocol_pb2.ERROR_CODE_EXECUTION
        if isinstance(error, PathRefused):
            code = protocol_pb2.ERROR_CODE_PERMISSION_DENIED
        # An unavailable peer (a producer this task could not read) is the worker the error names.
        where = error.worker_url if isinstance(error, WorkerUnavailableError) and error.worker_url else url
        if code == protocol_pb2.ERROR_CODE_UNAVAILABLE and where != url and task.unavailable is None:
            # Its readers are told the same (DoGet): two stages up, the cut worker is still the one to blame.
            task.unavailable = where, f"task {task.key} failed on {url}: {message}"
        info = error_info(where, code, f"task {task.key} failed on {url}: {message}", key)
        task.cancel(message, failed=True)
    send_error(sender, info)
    return status_error(info)
