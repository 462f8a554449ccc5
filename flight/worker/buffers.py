"""A task's output buffer: bounded, partitioned, freed as it is read.

The producer (the task's pipeline) waits when the unread bytes pass the bound,
so a slow reader slows the task instead of growing the worker's memory. Each
partition is read by a fixed number of readers: one for a hash shuffle or the
coordinator, every consumer task for a broadcast. A batch is dropped once all
of its partition's readers have passed it.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator

import pyarrow as pa

from flight.errors import TaskCancelledError

__all__ = ["OutputBuffer"]


class _Partition:
    def __init__(self, readers: int) -> None:
        self.batches: deque[pa.RecordBatch] = deque()
        self.base = 0  # index of batches[0] in the partition's whole stream
        self.cursors = [0] * readers
        self.claimed = 0
        self.done_readers = 0

    def total(self) -> int:
        return self.base + len(self.batches)


class OutputBuffer:
    def __init__(self, partitions: int, max_bytes: int, readers: int = 1) -> None:
        self._parts = [_Partition(max(1, readers)) for _ in range(partitions)]
        self._readers = max(1, readers)
        self._max_bytes = max_bytes
        self._bytes = 0
        self._finished = False
        self._error: BaseException | None = None
        self._cond = threading.Condition()

    @property
    def partitions(self) -> int:
        return len(self._parts)

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
            self._parts[partition].batches.append(batch)
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
            for part in self._parts:
                part.base += len(part.batches)
                part.batches.clear()
            self._bytes = 0
            self._cond.notify_all()

    def all_drained(self) -> bool:
        with self._cond:
            return self._finished and all(p.done_readers == self._readers for p in self._parts)

    def wait_drained(self, timeout: float | None = None) -> bool:
        with self._cond:
            return self._cond.wait_for(
                lambda: self._error is not None
                or (self._finished and all(p.done_readers == self._readers for p in self._parts)),
                timeout,
            )

    def _trim(self, part: _Partition) -> None:
        """Drop the batches every reader of ``part`` has passed."""
        low = min(part.cursors)
        while part.base < low and part.batches:
            self._bytes -= part.batches.popleft().nbytes
            part.base += 1

    def read(self, partition: int) -> Iterator[pa.RecordBatch]:
        """Batches of ``partition`` until the task finished; each partition has a fixed number of readers."""
        part = self._parts[partition]
        with self._cond:
            if part.claimed >= self._readers:
                raise TaskCancelledError(
                    f"output partition {partition} already has its {self._readers} reader(s)"
                )
            slot = part.claimed
            part.claimed += 1
        try:
            while True:
                with self._cond:
                    while part.cursors[slot] >= part.total() and not self._finished and self._error is None:
                        self._cond.wait()
                    if self._error is not None:
                        raise self._error
                    index = part.cursors[slot]
                    if index >= part.total():
                        return
                    batch = part.batches[index - part.base]
                    part.cursors[slot] = index + 1
                    self._trim(part)
                    self._cond.notify_all()
                yield batch
        finally:
            # Done, failed or abandoned (a reader below a limit stops early): it holds nothing back any more.
            with self._cond:
                part.done_readers += 1
                part.cursors[slot] = 1 << 62
                self._trim(part)
                self._cond.notify_all()
