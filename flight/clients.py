"""Flight clients to workers, and what their errors mean in this project's terms.

Both the coordinator and workers (reading each other's shuffle output) talk to
workers through one pooled client per URL, and turn pyarrow's Flight
exceptions into the most specific ``WorkerError``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.flight as fl

from flight.errors import InvalidTaskError, TaskCancelledError, TaskFailedError, WorkerError, WorkerUnavailableError
from flight.protocol import status_message

__all__ = ["ClientPool", "read_stream", "translate_flight_error"]

log = logging.getLogger(__name__)


def translate_flight_error(exc: BaseException, url: str, stage_key: str = "") -> WorkerError:
    """A pyarrow/Flight exception from talking to ``url`` as the most specific own error."""
    message = status_message(exc)
    if isinstance(exc, fl.FlightUnavailableError) or "failed to connect" in message.lower():
        return WorkerUnavailableError(f"worker {url} is unavailable: {message}", worker_url=url, stage_key=stage_key, cause=message)
    if isinstance(exc, fl.FlightTimedOutError):
        return WorkerUnavailableError(f"worker {url} timed out: {message}", worker_url=url, stage_key=stage_key, cause=message)
    if isinstance(exc, fl.FlightCancelledError):
        return TaskCancelledError(message, worker_url=url, stage_key=stage_key)
    if isinstance(exc, pa.ArrowInvalid):
        return InvalidTaskError(message, worker_url=url, stage_key=stage_key)
    return TaskFailedError(message, worker_url=url, stage_key=stage_key)


class ClientPool:
    """One FlightClient per worker URL (clients are thread-safe), for a query or a worker's life."""

    def __init__(self) -> None:
        self._clients: dict[str, fl.FlightClient] = {}
        self._lock = threading.Lock()

    def get(self, url: str) -> fl.FlightClient:
        with self._lock:
            client = self._clients.get(url)
            if client is None:
                try:
                    client = fl.connect(url)
                except (pa.ArrowException, OSError) as exc:
                    raise translate_flight_error(exc, url) from exc
                self._clients[url] = client
            return client

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            try:
                client.close()
            except (pa.ArrowException, OSError) as exc:
                log.debug("closing a Flight client failed: %s", exc)


def read_stream(client: fl.FlightClient, ticket: bytes) -> Iterator[pa.RecordBatch]:
    """The non-empty batches of a DoGet stream, read chunk by chunk.

    ``read_chunk`` rather than ``read_all``: pyarrow turns a CANCELLED status read
    by ``read_all`` on the main thread into a KeyboardInterrupt.
    """
    reader = client.do_get(fl.Ticket(ticket))
    while True:
        try:
            chunk = reader.read_chunk()
        except StopIteration:
            return
        if chunk.data is not None and chunk.data.num_rows:
            yield chunk.data
