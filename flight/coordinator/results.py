"""The result queue between the head tasks' DoGet threads and the caller: bounded, never stuck."""

from __future__ import annotations

import queue
import threading

__all__ = ["DONE", "offer"]


DONE = object()
"""Put in a result queue: a head task's stream ended, or (alone) the query is over."""


def offer(q: queue.Queue[object], item: object, stop: threading.Event | None = None) -> bool:
    """Put with back-pressure that gives up once ``stop`` is set; False if it gave up."""
    while True:
        try:
            q.put(item, timeout=0.1)
            return True
        except queue.Full:
            if stop is None:
                try:
                    q.get_nowait()  # make room for the wake-up sentinel: the query is over anyway
                except queue.Empty:
                    pass
            elif stop.is_set():
                return False
