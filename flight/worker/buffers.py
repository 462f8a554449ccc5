"""A task's output buffer: bounded, partitioned, freed as it is read.

The producer (the task's pipeline) waits when the unread bytes pass the bound,
so a slow reader slows the task instead of growing the worker's memory.
Each partition is read once (by one ``DoGet``); a batch is dropped from the
buffer as soon as it has been handed to the reader.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator

import pyarrow as pa

from flight.errors import TaskCancelledError

__all__ = ["OutputBuffer"]


class OutputBuffer:
    def __init__(self, partitions: int, max_bytes: int) -> None:
        self._queues: list[deque[pa.RecordBatch]] = [deque() for _ in range(partitions)]
        self._readers: set[int] = set()
        self._drained: set[int] = set()
        self._max_bytes = max_bytes
        self._bytes = 0
        self._finished = False
        self._error: BaseException | None = None
        self._cond = threading.Condition()

    @property
    def partitions(self) -> int:
        return len(self._queues)

    @property
    def buffered_bytes(self) -> int:
        return self._bytes

    def put(self, partition: int, batch: pa.RecordBatch) -> None:
        """Append a batch; blocks while the buffer is full. Raises once the buffer failed."""
        size = batch.nbytes
        with self._cond:
            while self._bytes > 0 and self._bytes + size > self._max_bytes and self._error is None:
                self._cond.wait()
            if self._error is not None:
                raise self._error
            self._queues[partition].append(batch)
            self._bytes += size
            self._cond.notify_all()

    def finish(self) -> None:
        with self._cond:
            self._finished = True
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        """Wake every producer and reader with ``error`` and drop what is buffered."""
        with self._cond:
            if self._error is None:
                self._error = error
            for q in self._queues:
                q.clear()
            self._bytes = 0
            self._cond.notify_all()

    def all_drained(self) -> bool:
        with self._cond:
            return self._finished and len(self._drained) == len(self._queues)

    def wait_drained(self, timeout: float | None = None) -> bool:
        with self._cond:
            return self._cond.wait_for(
                lambda: self._error is not None or (self._finished and len(self._drained) == len(self._queues)),
                timeout,
            )

    def read(self, partition: int) -> Iterator[pa.RecordBatch]:
        """Batches of ``partition`` until the task finished; each partition may be read once."""
        with self._cond:
            if partition in self._readers:
                raise TaskCancelledError(f"output partition {partition} is already being read or was read")
            self._readers.add(partition)
        queue = self._queues[partition]
        while True:
            with self._cond:
                while not queue and not self._finished and self._error is None:
                    self._cond.wait()
                if self._error is not None:
                    raise self._error
                if not queue:
                    self._drained.add(partition)
                    self._cond.notify_all()
                    return
                batch = queue.popleft()
                self._bytes -= batch.nbytes
                self._cond.notify_all()
            yield batch
