"""The watch over DoGet reads: a read that heard nothing (no batch, no heartbeat) for its bound is cancelled.

Why: a DoGet stream cannot have a deadline (a slow producer may legitimately take
minutes) and gRPC has no keepalive here, so a reader of a frozen or partitioned worker
waited forever. Workers send a heartbeat batch on every stream that has nothing to send
(``flight.worker.doget``); a reader that heard nothing for its bound gives up.

One watch for the whole process, ticking on the process's ticker thread
(``flight.threads.every``), rather than a thread per stream: a consumer task reads every
producer at once, and a coordinator every head task. Only the time a reader spends
*waiting in* ``read_chunk`` counts: a reader whose caller is slow to take its batches is
not silent. The watch's cancel is the only call another thread makes on a reader, and it
is safe: pyarrow's ``FlightStreamReader.cancel()`` is gRPC's ``ClientContext::TryCancel``
(thread-safe, from any thread, any number of times, also after the call ended), not a
second read or half-close on the call (docs/protocol.md §9, "One writer").
"""

from __future__ import annotations

import logging
import os
import threading
import time

import pyarrow as pa
import pyarrow.flight as fl

from flight.threads import every, spawn
from flight.wire.limits import MAX_HEARTBEAT_MS
from flight.wire.protocol import error_info_of

__all__ = ["SAFE_STALL_S", "TICK_S", "Watched", "open_stream", "unwatch", "watch"]

log = logging.getLogger(__name__)

TICK_S = 0.25
"""How often the watch looks at the reads it watches: a silent one is cancelled within its bound and this."""

SAFE_STALL_S = 3 * MAX_HEARTBEAT_MS / 1000
"""The bound for a reader that does not know the task's heartbeat interval (a Spark task reading a
detached query's head, the service relaying one): three times the longest interval a task may have."""


class Watched:
    """One DoGet read under the watch: ``waiting()`` before each ``read_chunk``, ``heard()`` after it."""

    __slots__ = ("_reader", "_since", "bound", "silent")

    def __init__(self, reader: fl.FlightStreamReader, bound: float) -> None:
        self._reader = reader
        self.bound = bound
        self._since: float | None = None  # when the current wait in read_chunk began; None: not waiting
        self.silent = 0.0  # seconds of silence after which the watch cancelled the read; 0: it did not

    def waiting(self) -> None:
        self._since = time.monotonic()

    def heard(self) -> None:
        self._since = None

    def _check(self, now: float) -> bool:
        """True when the read waited past its bound: it is cancelled then (on the watch's thread)."""
        since = self._since  # read once: the reader's thread sets it without a lock
        if since is None or now - since <= self.bound:
            return False
        self.silent = now - since
        try:
            self._reader.cancel()
        except (pa.ArrowException, OSError) as exc:
            log.debug("cancelling a silent DoGet read failed: %s", exc)
        return True


class _Watch:
    """The process's watched reads; ticking only while there are any."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reads: set[Watched] = set()
        self._ticking = False

    def add(self, read: Watched) -> None:
        with self._lock:
            self._reads.add(read)
            if self._ticking:
                return
            self._ticking = True
        every(TICK_S, self._tick)

    def remove(self, read: Watched) -> None:
        with self._lock:
            self._reads.discard(read)

    def _tick(self) -> bool:
        """One look at every read (on the ticker thread: it never blocks); False once there is none left."""
        now = time.monotonic()
        with self._lock:
            if not self._reads:
                self._ticking = False
                return False
            reads = list(self._reads)
        silent = [read for read in reads if read._check(now)]
        if silent:
            with self._lock:
                self._reads.difference_update(silent)
        return True


_WATCH = _Watch()
# A forked child (a Spark Python worker) has no ticker of the parent's: it starts with no reads.
os.register_at_fork(after_in_child=lambda: _Watch.__init__(_WATCH))


def watch(reader: fl.FlightStreamReader, bound: float) -> Watched:
    """Put ``reader`` under the watch: cancelled once a ``read_chunk`` waits more than ``bound`` seconds.

    The caller ``unwatch``es it when it stops reading."""
    read = Watched(reader, bound)
    _WATCH.add(read)
    return read


def unwatch(read: Watched) -> None:
    """The reader stopped reading: the watch forgets it."""
    _WATCH.remove(read)


class _Opening:
    """One ``do_get`` on a thread of its own, which the caller may stop waiting for (``abandon``).

    Why: pyarrow's ``do_get`` returns only once the stream's first message (its schema) arrived, and
    until then there is no reader to cancel. The call's thread is its only user: if the caller gave up,
    that thread cancels the reader that arrives late, so nothing else ever touches the call."""

    def __init__(self, client: fl.FlightClient, ticket: fl.Ticket) -> None:
        self._client, self._ticket = client, ticket
        self._lock = threading.Lock()
        self.done = threading.Event()
        self._reader: fl.FlightStreamReader | None = None
        self._error: BaseException | None = None
        self._abandoned = False

    def run(self) -> None:
        reader, error = None, None
        try:
            reader = self._client.do_get(self._ticket)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            error = exc
        with self._lock:
            self._reader, self._error = reader, error
            abandoned = self._abandoned
            self.done.set()
        if abandoned and reader is not None:
            try:
                reader.cancel()
            except (pa.ArrowException, OSError) as exc:
                log.debug("cancelling an abandoned DoGet failed: %s", exc)

    def abandon(self) -> bool:
        """Stop waiting (True), unless the call ended meanwhile (False: its outcome is there)."""
        with self._lock:
            if self.done.is_set():
                return False
            self._abandoned = True
            return True

    def result(self) -> fl.FlightStreamReader:
        if self._error is not None:
            raise self._error
        assert self._reader is not None
        return self._reader


def _answers(client: fl.FlightClient, bound: float) -> bool:
    """Whether the worker behind ``client`` answers ``health`` within ``bound`` seconds, whatever it answers
    (ok, draining, a refusal): only silence, a deadline or no connection at all count as no answer."""
    try:
        for _ in client.do_action(fl.Action("health", b""), fl.FlightCallOptions(timeout=bound)):
            pass
    except (fl.FlightTimedOutError, fl.FlightUnavailableError) as exc:
        return error_info_of(exc) is not None  # the worker's own UNAVAILABLE (draining) is an answer
    except (pa.ArrowException, OSError):
        return True
    return True


def open_stream(client: fl.FlightClient, ticket: fl.Ticket, bound: float, url: str) -> fl.FlightStreamReader:
    """``client.do_get(ticket)``, given up once the worker stops answering while its first message is awaited.

    The first message may come late for good reasons (the task is not registered yet, or it waits for
    capacity: docs/protocol.md §14, bounded by the worker's own ``--get-wait`` and ``--queue-wait``), and
    the worker cannot send heartbeats before it. So every ``bound`` seconds without it the worker is asked
    for ``health`` on the same connection: a worker that answers is waited for; one that does not (frozen,
    partitioned, a connection whose packets are lost) is given up: ``FlightUnavailableError`` naming it.
    Unwatched, such a wait lasted until TCP gave up, minutes later."""
    opening = _Opening(client, ticket)
    spawn(opening.run, name=f"doget-open-{url}")
    started = time.monotonic()
    while not opening.done.wait(bound):
        if not _answers(client, bound) and opening.abandon():
            raise fl.FlightUnavailableError(
                f"worker {url or '(unnamed)'} sent nothing on a DoGet stream for {time.monotonic() - started:.1f}s, not even its "
                f"first message, and did not answer a health check within {bound:g}s: it is frozen, partitioned or gone"
            )
    return opening.result()
