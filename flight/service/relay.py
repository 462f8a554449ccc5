"""A relayed stream that notices its client leaving: the service's DoGet of a head's rows.

Why: a Flight SQL client that cancels its DoGet (ADBC's ``adbc_cancel``), closes its
connection or dies sends the service nothing more; pyarrow tells the handler only when it
next writes, and a relay waiting on a head task that computes for minutes writes nothing
(the worker's heartbeats end at the relay's reader). The query then held its workers for
5-8 s and more (issue 41). Here the upstream stream is read on a thread of its own into a
small queue, and the call's thread, waiting on that queue, asks the call's ``is_cancelled``
every ``poll`` seconds: the call's context is only ever touched on the call's own thread,
while the call is alive (pyarrow frees it when the call ends).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator

import pyarrow as pa

from flight.threads import spawn

__all__ = ["GONE_POLL_S", "watched"]

GONE_POLL_S = 0.2
"""How often a waiting relay asks whether its client is still there."""

_END = object()


def watched(
    upstream: Iterator[pa.RecordBatch], gone: Callable[[], bool], on_gone: Callable[[], object], *, poll: float = GONE_POLL_S, depth: int = 4
) -> Iterator[pa.RecordBatch]:
    """``upstream``'s batches; when the client leaves, ``on_gone()`` (cancel the query) and stop.

    The client left when ``gone()`` turns true while the relay waits, or when pyarrow lets the
    stream go before its end (GeneratorExit: a write to the client failed). ``upstream`` runs on
    a thread of its own, at most ``depth`` batches ahead; an error of it is raised here, on the
    caller's thread. That thread ends once ``upstream`` yields again or fails, which the
    cancelled query makes it do, and closes ``upstream`` itself (a generator is used by one
    thread at a time)."""
    items: queue.Queue[object] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def offer(item: object) -> bool:
        while not stop.is_set():
            try:
                items.put(item, timeout=poll)
                return True
            except queue.Full:
                continue
        return False

    def pump() -> None:
        try:
            for batch in upstream:
                if not offer(batch):
                    return
            offer(_END)
        except BaseException as exc:  # noqa: BLE001 - passed to the caller's thread, which raises it
            offer(exc)
        finally:
            close = getattr(upstream, "close", None)
            if close is not None:
                close()

    spawn(pump, name="service-relay")
    ended = False
    try:
        while True:
            try:
                item = items.get(timeout=poll)
            except queue.Empty:
                if gone():
                    on_gone()
                    ended = True
                    return
                continue
            if item is _END:
                ended = True
                return
            if isinstance(item, BaseException):
                ended = True
                raise item
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        if not ended:  # let go early: the client is gone
            on_gone()
