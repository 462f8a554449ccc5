"""The one exception tree of flight-exec.

    FlightExecError                 base of everything this package raises on purpose
    ├── PlanError                   the plan is wrong: a user mistake found before any worker runs
    ├── ProtocolError               a peer sent bytes that do not follow docs/protocol.md
    │   └── VersionMismatchError    coordinator and worker speak different protocol versions
    ├── ResolverError               a WorkerResolver has no usable URL (empty list, unreadable source)
    ├── WorkerError                 a worker reported or caused a failure; carries url and stage key
    │   ├── TaskFailedError         a task failed while running (bad unit, reader error, ...)
    │   ├── InvalidTaskError        the worker rejected the task's header, plan or frames
    │   ├── UnauthenticatedError    the worker wants credentials this client did not present (token, certificate)
    │   ├── PermissionDeniedError   authenticated, but not allowed: a path outside the data roots, another query's secret
    │   └── RetryableError          the failure may pass if tried again
    │       ├── WorkerUnavailableError  the worker did not answer within the deadline, went silent, or is draining
    │       ├── WorkerBusyError         the worker is at capacity (the coordinator retries with a backoff)
    │       └── TaskCancelledError      the task was cancelled (query cancelled, worker drained)
    ├── QueryTimeoutError           the query's deadline (ExecOptions.deadline) passed; also a TimeoutError
    └── FeedError                   a WorkUnitFeed was used where it cannot be (e.g. inner() on a worker)

Exceptions raised by user code (a provider's ``feed()``) are not wrapped: the
query fails with the provider's own exception, with a note naming the feed.
"""

from __future__ import annotations

import copy

__all__ = [
    "FeedError",
    "FlightExecError",
    "InvalidTaskError",
    "PermissionDeniedError",
    "PlanError",
    "ProtocolError",
    "QueryTimeoutError",
    "ResolverError",
    "RetryableError",
    "TaskCancelledError",
    "TaskFailedError",
    "UnauthenticatedError",
    "UnitReadError",
    "VersionMismatchError",
    "WorkerBusyError",
    "WorkerError",
    "WorkerUnavailableError",
    "light_copy",
]


class FlightExecError(Exception):
    """Base class of every error flight-exec raises on purpose."""


class PlanError(FlightExecError):
    """The plan is invalid; found on the coordinator before any worker is contacted."""


class ProtocolError(FlightExecError):
    """Bytes on the wire do not follow the protocol; ``field`` names what was wrong."""

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.field = field


class VersionMismatchError(ProtocolError):
    """The peer speaks another protocol version."""


class UnitReadError(FlightExecError):
    """A worker could not read a work unit; the message names what (e.g. the file) and why.

    Raised by readers on a worker (``flight.engine.readers``, and readers registered with
    ``register_reader``); the coordinator sees it as the task's ``TaskFailedError``.
    """


class ResolverError(FlightExecError):
    """A resolver could not produce any worker URL."""


class FeedError(FlightExecError):
    """A work-unit feed was misused (e.g. its local provider asked for on a worker)."""


class WorkerError(FlightExecError):
    """A failure on or reaching a worker.

    ``worker_url`` and ``stage_key`` (a ``"query/stage/task"`` string) say where;
    ``cause`` is the worker's own message.
    """

    def __init__(self, message: str, *, worker_url: str = "", stage_key: str = "", cause: str = "") -> None:
        where = ", ".join(p for p in (f"task {stage_key}" if stage_key else "", f"worker {worker_url}" if worker_url else "") if p)
        super().__init__(f"{message} ({where})" if where else message)
        self.worker_url = worker_url
        self.stage_key = stage_key
        self.cause = cause or message


class TaskFailedError(WorkerError):
    """A task failed while running on its worker."""


class InvalidTaskError(WorkerError):
    """The worker rejected the task: malformed header, plan or frame, unknown reader or function."""

    def __init__(self, message: str, *, field: str = "", **kwargs: str) -> None:
        super().__init__(message, **kwargs)
        self.field = field


class RetryableError(WorkerError):
    """A failure that may not happen again: the worker was unreachable, busy or drained."""


class WorkerUnavailableError(RetryableError):
    """The worker did not answer within the deadline, refused the connection, or is draining."""


class TaskCancelledError(RetryableError):
    """The task was cancelled before it finished."""


class WorkerBusyError(RetryableError):
    """The worker is at capacity and refused the task; its message says the worker's load."""


class QueryTimeoutError(FlightExecError, TimeoutError):
    """The query ran past ``ExecOptions.deadline``; every task was cancelled."""


class UnauthenticatedError(WorkerError):
    """The worker requires credentials (a bearer token or a client certificate) this client lacks."""


class PermissionDeniedError(WorkerError):
    """The worker refused something the credentials do not allow (a path, another query's output)."""


def light_copy(exc: BaseException) -> BaseException:
    """``exc`` (same type, message and fields) without its traceback, cause and context.

    Why: one stored error (a task's cancellation, a feed's failure) is raised again in every
    thread that waits on what failed, and each raise chains that thread's frames onto the one
    object. Frames hold their task, and native code (pyarrow's error detail) may hold the error
    beyond the garbage collector's sight: a stopped task was kept for the process's life. A
    stored error is raised as a fresh light copy instead.
    """
    try:
        error = copy.copy(exc)
    except Exception:  # noqa: BLE001 - a type that cannot be rebuilt from its args: the original, stripped
        error = exc
    error.__traceback__ = None
    error.__cause__ = error.__context__ = None
    error.__suppress_context__ = True
    return error
