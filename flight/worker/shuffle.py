"""Reading other tasks' output partitions: worker to worker with DoGet, or locally.

A consumer task reads its partitions from every producer task at once (one
thread each, into a small bounded queue), so producers progress independently.
A producer on the same worker is read straight from its output buffer: no
network, no serialization.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.flight as fl

from flight.errors import FlightExecError, TaskFailedError, WorkerUnavailableError
from flight.threads import spawn
from flight.wire._proto import protocol_pb2
from flight.wire.clients import ClientPool, error_from_info, read_stream
from flight.wire.protocol import error_info_of, format_stage_key, status_message
from flight.worker.auth import same_secret
from flight.worker.tasks import Task, TaskRegistry

__all__ = ["read_partitions"]

log = logging.getLogger(__name__)

_END = object()


def read_partitions(
    task: Task,
    registry: TaskRegistry,
    peers: ClientPool,
    own_url: str,
    producers: list[tuple[str, bytes]],
    start: int,
    end: int,
    wait: float,
    stall: float,
) -> Iterator[tuple[pa.RecordBatch, bool]]:
    """Partitions [start, end) of every producer, each batch with whether it was read locally.

    Raises a TaskFailedError (or WorkerUnavailableError) naming a producer that failed. A remote stream
    silent (no heartbeat either) for ``stall`` seconds, the worker's ``--peer-timeout``, is a lost worker.
    """
    results: queue.Queue[object] = queue.Queue(maxsize=8)
    stop = threading.Event()

    def offer(item: object) -> bool:
        while not stop.is_set() and not task.cancelled.is_set():
            try:
                results.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def pump(url: str, key_bytes: bytes) -> None:
        name = "(undecodable stage key)"
        try:
            key = protocol_pb2.StageKey.FromString(key_bytes)
            name = format_stage_key(key)
            if url == own_url:
                for batch in _local_batches(_local_producer(task, registry, name, wait), start, end):
                    if not offer((batch, True)):
                        return
            else:
                ticket = protocol_pb2.Ticket(
                    stage_key=key, partition_start=start, partition_end=end, query_secret=task.header.query_secret
                )
                checksums = not task.header.options.no_checksum
                for batch in read_stream(peers.get(url), ticket.SerializeToString(), stall=stall, url=url, checksums=checksums):
                    if not offer((batch, False)):
                        return
            offer(_END)
        except Exception as exc:  # noqa: BLE001 - anything must still reach the consumer, or it waits
            offer(_read_error(exc, url, name))

    for p in producers:
        spawn(pump, *p, name=f"shuffle-{task.key}")
    try:
        yield from _consume(task, results, len(producers))
    finally:
        stop.set()


def _local_producer(task: Task, registry: TaskRegistry, name: str, wait: float) -> Task:
    """Producer task ``name`` on this worker, of ``task``'s query and with an output; a cancelled consumer stops waiting."""
    producer, why = registry.get(name, wait=wait, stop=task.cancelled.is_set)
    if producer is not None and not same_secret(task.header.query_secret, producer.header.query_secret):
        raise TaskFailedError(f"producer task {name} belongs to another query (its secret differs)")
    if producer is None or producer.output is None:
        raise TaskFailedError(f"producer task {name} is not readable here: {why or 'it has no output buffer'}")
    return producer


def _local_batches(producer: Task, start: int, end: int) -> Iterator[pa.RecordBatch]:
    """Partitions [start, end) of a producer on this worker. If it failed because a worker it needed is
    gone, that worker is still the one to blame: the consumer is told UNAVAILABLE naming it."""
    assert producer.output is not None
    try:
        for p in range(start, end):
            yield from producer.output.read(p)
    except FlightExecError:
        if producer.unavailable is None:
            raise
        peer, why = producer.unavailable
        raise WorkerUnavailableError(why, worker_url=peer) from None


def _read_error(exc: Exception, url: str, name: str) -> Exception:
    """What the consumer is told when reading producer task ``name`` on ``url`` failed with ``exc``."""
    info = None if isinstance(exc, FlightExecError) else error_info_of(exc)
    if info is not None and info.worker_url and (info.code == protocol_pb2.ERROR_CODE_UNAVAILABLE or info.never_here):
        # The producer's worker answered UNAVAILABLE naming the worker to blame (the producer failed because it
        # could not reach that one, or was moved off a lost one): passed on, not put on the worker read. The
        # fleet's peer-cut test counted a worker outside the cut lost 1 run in 4 before. Or it never had the
        # producer (it restarted, or its coordinator was cut off from it): that worker is lost to the query.
        exc = error_from_info(info, url, name)
    if isinstance(exc, WorkerUnavailableError) and exc.worker_url:
        # The producer failed because a worker it read is unreachable: that worker is still the one to blame.
        return WorkerUnavailableError(f"reading task {name} on {url}: {exc}", cause=exc.cause, worker_url=exc.worker_url)
    if isinstance(exc, FlightExecError):
        return TaskFailedError(f"reading task {name} on {url}: {exc}")
    if isinstance(exc, (fl.FlightUnavailableError, fl.FlightTimedOutError)):
        # The producer's worker is gone: retryable, and it is that worker the error names.
        return WorkerUnavailableError(f"worker {url} (task {name}) is unavailable: {status_message(exc)}", cause=status_message(exc), worker_url=url)
    if isinstance(exc, (pa.ArrowException, OSError)):
        return TaskFailedError(f"reading task {name} on {url}: {status_message(exc)}")
    return TaskFailedError(f"reading task {name} on {url}: {type(exc).__name__}: {exc}")


def _consume(task: Task, results: queue.Queue[object], pending: int) -> Iterator[tuple[pa.RecordBatch, bool]]:
    """The consumer's side: the batches as the producers' threads offer them, until all ``pending`` ended (or the task stops)."""
    while pending:
        try:
            item = results.get(timeout=0.1)
        except queue.Empty:
            if task.cancelled.is_set():
                return
            continue
        if item is _END:
            pending -= 1
        elif isinstance(item, BaseException):
            raise item
        else:
            yield item  # type: ignore[misc]
