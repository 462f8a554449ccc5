"""Answers remembered per process, bounded: ``Memo``.

Why one small class: the worker and the planner keep answers that depend only on what a message
holds (an expression's types, a literal's value or its Arrow stream), because every run of
a query of the same shape asks the same questions. A peer chooses those messages, so every such
store must be bounded in entries (and its callers bound the size of each key), and used from many
threads at once. Errors are never stored: a bad message is examined, and refused, each time.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

__all__ = ["Memo"]

K = TypeVar("K")
V = TypeVar("V")


class Memo(Generic[K, V]):
    """At most ``most`` answers; the least recently used goes first. Thread-safe."""

    def __init__(self, most: int = 1024) -> None:
        self.most = most
        self._items: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.most:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        return len(self._items)
