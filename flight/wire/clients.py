"""Flight clients to workers, and what their errors mean in this project's terms.

Both the coordinator and workers (reading each other's shuffle output) talk to
workers through one pooled client per URL, and turn pyarrow's Flight
exceptions into the most specific ``WorkerError``.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.flight as fl

from flight.errors import (
    FlightExecError,
    InvalidTaskError,
    PermissionDeniedError,
    TaskCancelledError,
    TaskFailedError,
    UnauthenticatedError,
    WorkerBusyError,
    WorkerError,
    WorkerUnavailableError,
)
from flight.security import Security, connect
from flight.wire._proto import protocol_pb2
from flight.wire.integrity import StreamCheck
from flight.wire.protocol import error_info_of, format_stage_key, status_message
from flight.wire.stall import open_stream, unwatch, watch

__all__ = ["ClientPool", "error_from_info", "health_check", "read_stream", "shared_pool", "translate_flight_error"]

log = logging.getLogger(__name__)


def error_from_info(info: protocol_pb2.ErrorInfo, url: str, stage_key: str) -> WorkerError:
    """A worker's structured ErrorInfo (an error frame, or a status's extra_info) as the matching own error."""
    key = format_stage_key(info.stage_key) if info.HasField("stage_key") else stage_key
    where = info.worker_url or url
    code = info.code
    if code in (protocol_pb2.ERROR_CODE_INVALID_ARGUMENT, protocol_pb2.ERROR_CODE_VERSION_MISMATCH, protocol_pb2.ERROR_CODE_TOO_LARGE):
        return InvalidTaskError(info.message, field=info.field, worker_url=where, stage_key=key)
    if code == protocol_pb2.ERROR_CODE_CANCELLED:
        return TaskCancelledError(info.message, worker_url=where, stage_key=key)
    if code == protocol_pb2.ERROR_CODE_UNAUTHENTICATED:
        return UnauthenticatedError(info.message, worker_url=where, stage_key=key)
    if code == protocol_pb2.ERROR_CODE_PERMISSION_DENIED:
        return PermissionDeniedError(info.message, worker_url=where, stage_key=key)
    if code == protocol_pb2.ERROR_CODE_BUSY:
        return WorkerBusyError(info.message, worker_url=where, stage_key=key)
    if code == protocol_pb2.ERROR_CODE_UNAVAILABLE:
        return WorkerUnavailableError(info.message, worker_url=where, stage_key=key)
    if code == protocol_pb2.ERROR_CODE_NOT_FOUND and info.never_here:
        # The worker never had the task it was given: it restarted, or its coordinator could not reach it.
        # That worker is lost to the query (retryable, naming it), not a task that ended.
        return WorkerUnavailableError(f"{info.message} (the worker restarted, or the task never reached it)", worker_url=where, stage_key=key)
    return TaskFailedError(info.message, worker_url=where, stage_key=key)


def translate_flight_error(exc: BaseException, url: str, stage_key: str = "") -> WorkerError:
    """A pyarrow/Flight exception from talking to ``url`` as the most specific own error.

    A worker's own errors carry an ErrorInfo in ``extra_info``: that decides. Otherwise the
    status class does (UNAVAILABLE is also what gRPC reports when it cannot connect).
    """
    info = error_info_of(exc)
    if info is not None:
        return error_from_info(info, url, stage_key)
    message = status_message(exc)
    if isinstance(exc, fl.FlightUnauthenticatedError):
        return UnauthenticatedError(f"worker {url} refused the call: {message}", worker_url=url, stage_key=stage_key, cause=message)
    if isinstance(exc, fl.FlightUnauthorizedError):
        return PermissionDeniedError(f"worker {url} refused the call: {message}", worker_url=url, stage_key=stage_key, cause=message)
    if isinstance(exc, fl.FlightUnavailableError):
        return WorkerUnavailableError(f"worker {url} is unavailable: {message}", worker_url=url, stage_key=stage_key, cause=message)
    if isinstance(exc, fl.FlightTimedOutError):
        return WorkerUnavailableError(f"worker {url} timed out: {message}", worker_url=url, stage_key=stage_key, cause=message)
    if isinstance(exc, fl.FlightCancelledError):
        return TaskCancelledError(message, worker_url=url, stage_key=stage_key)
    if isinstance(exc, pa.ArrowInvalid):
        return InvalidTaskError(message, worker_url=url, stage_key=stage_key)
    return TaskFailedError(message, worker_url=url, stage_key=stage_key)


class ClientPool:
    """One FlightClient per worker URL (clients are thread-safe), for a worker's life or a process's.

    Every client presents ``security``'s credentials (``flight.security.connect``). At most
    ``max_clients`` are kept: the longest unused is let go (a query still using it keeps it
    alive until it is done; pyarrow closes a client nothing refers to).
    """

    def __init__(self, security: Security | None = None, max_clients: int = 256) -> None:
        self._security = security
        self._clients: OrderedDict[str, fl.FlightClient] = OrderedDict()
        self._max = max_clients
        self._lock = threading.Lock()

    def get(self, url: str) -> fl.FlightClient:
        with self._lock:
            client = self._clients.get(url)
            if client is not None:
                self._clients.move_to_end(url)
                return client
            try:
                client = connect(url, self._security)
            except (pa.ArrowException, OSError) as exc:
                raise translate_flight_error(exc, url) from exc
            self._clients[url] = client
            while len(self._clients) > self._max:
                self._clients.popitem(last=False)
            return client

    def forget(self, url: str) -> None:
        """Let go of ``url``'s client (its worker was unreachable): the next ``get`` connects anew,
        rather than wait out the gRPC channel's reconnect backoff."""
        with self._lock:
            self._clients.pop(url, None)

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), OrderedDict()
        for client in clients:
            try:
                client.close()
            except (pa.ArrowException, OSError) as exc:
                log.debug("closing a Flight client failed: %s", exc)


def read_stream(
    client: fl.FlightClient, ticket: bytes, *, stall: float | None = None, url: str = "", check: bool = True, checksums: bool = True
) -> Iterator[pa.RecordBatch]:
    """The non-empty batches of a DoGet stream, read chunk by chunk: never a heartbeat (0 rows) nor a trailer.

    ``stall``: seconds a read may wait with nothing at all arriving (the worker sends
    heartbeats while the stream has nothing to send: docs/protocol.md §11) before the worker
    ``url`` is taken as gone: the read is cancelled (``flight.wire.stall``) and raises
    ``FlightUnavailableError``, which every reader here already takes for a lost worker.
    The worker can send nothing before the task exists, and it may wait for capacity (§14):
    while the stream's first message (its schema) is awaited, a worker that still answers
    ``health`` is waited for, one that does not is given up (``flight.wire.stall.open_stream``).

    ``check``: ``ticket`` is a worker's ``Ticket`` and every partition it asks for must end
    with its trailer, whose rows, batches and (``checksums``) CRC match what arrived (§17);
    if not, ``StreamIntegrityError`` naming the producer, the task and the partition.

    ``read_chunk`` rather than ``read_all``: pyarrow turns a CANCELLED status read
    by ``read_all`` on the main thread into a KeyboardInterrupt.
    """
    checker = _checker(ticket, url, checksums) if check else None
    reader = client.do_get(fl.Ticket(ticket)) if stall is None else open_stream(client, fl.Ticket(ticket), stall, url)
    watched = None if stall is None else watch(reader, stall)
    try:
        while True:
            if watched is not None:
                watched.waiting()
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                if checker is not None:
                    checker.finish()
                return
            except (pa.ArrowException, OSError) as exc:
                if watched is not None and watched.silent:
                    raise fl.FlightUnavailableError(
                        f"worker {url or '(unnamed)'} sent nothing on a DoGet stream for {watched.silent:.1f}s "
                        "(heartbeats included): it is frozen, overloaded or unreachable"
                    ) from exc
                raise
            finally:
                if watched is not None:
                    watched.heard()
            if checker is not None:
                meta = chunk.app_metadata
                if checker.message(chunk.data, None if meta is None else meta.to_pybytes()) and chunk.data is not None:
                    yield chunk.data
            elif chunk.data is not None and chunk.data.num_rows:
                yield chunk.data
    finally:
        if watched is not None:
            unwatch(watched)


def _checker(ticket: bytes, url: str, checksums: bool) -> StreamCheck:
    t = protocol_pb2.Ticket.FromString(ticket)  # our own ticket: a caller's bug if it does not parse
    return StreamCheck(t.partition_start, t.partition_end, format_stage_key(t.stage_key), url or "(unnamed)", checksums)


def health_check(url: str, timeout: float, security: Security | None = None) -> BaseException | None:
    """None if the worker answers ``health`` within ``timeout`` seconds; otherwise why not."""
    try:
        with connect(url, security) as client:
            results = list(client.do_action(fl.Action("health", b""), fl.FlightCallOptions(timeout=timeout)))
    except (pa.ArrowException, OSError) as exc:
        return translate_flight_error(exc, url)
    if [r.body.to_pybytes() for r in results] != [b"ok"]:
        return WorkerUnavailableError(f"worker {url} answered the health check with {results!r}", worker_url=url)
    return None


def shared_pool(security: Security | None = None) -> ClientPool:
    """This process's clients for ``security``: every query of the process uses them.

    Why: a client is a gRPC channel, and a new channel connects (TCP, HTTP/2) on its first
    call; a query's tasks opened on fresh clients waited 0.6-0.9 ms more each (TPC-H Q6,
    three tasks). Kept per credentials (``Security`` compares by value), so a query never
    calls with another's token or certificate, and per process: a forked child (a Spark
    Python worker) starts with none rather than use channels it inherited.
    """
    key = security or Security()
    with _shared_lock:
        pool = _SHARED.get(key)
        if pool is None:
            pool = _SHARED[key] = ClientPool(security)
        return pool


_SHARED: dict[Security, ClientPool] = {}
_shared_lock = threading.Lock()


_INHERITED: list[dict[Security, ClientPool]] = []
"""The parent's pools, in a forked child: kept, never used. Dropping them would destroy gRPC
channels the child did not make, which can hang it."""


def _forget_inherited() -> None:
    global _SHARED, _shared_lock
    _INHERITED.append(_SHARED)  # the parent's channels: its to use and close, not the child's
    _SHARED = {}
    _shared_lock = threading.Lock()  # a parent thread may have held it at the fork


os.register_at_fork(after_in_child=_forget_inherited)


@atexit.register
def _close_shared() -> None:
    """Close the kept clients before the interpreter winds down (gRPC objects alive then complain)."""
    with _shared_lock:
        pools = list(_SHARED.values())
        _SHARED.clear()
    for pool in pools:
        pool.close()


def worker_info_dict(pool: ClientPool, url: str) -> dict[str, object]:
    """A worker's ``info`` action as plain values (for the service's page), or why it could not be had."""
    from google.protobuf.json_format import MessageToDict

    try:
        result = next(iter(pool.get(url).do_action(fl.Action("info", b""))))
        info = protocol_pb2.WorkerInfo()
        info.ParseFromString(result.body.to_pybytes())
    except (pa.ArrowException, OSError, StopIteration, FlightExecError) as exc:
        return {"url": url, "error": " ".join(str(exc).split())[:300]}
    return {"url": url, **MessageToDict(info, preserving_proto_field_name=True)}
