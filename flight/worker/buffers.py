"""A task's output buffer: bounded, partitioned, freed as it is read (or retained).

The producer (the task's pipeline) waits when the unread bytes pass the bound,
so a slow reader slows the task instead of growing the worker's memory. Each
partition is read by a fixed number of readers: one for a hash shuffle or the
coordinator, every consumer task for a broadcast. A batch is dropped once all
of its partition's readers have passed it.

A **retained** buffer (``TaskOptions.retain_output``: a detached query's head,
which Spark may read again) keeps every batch for any number of readers, each
from the start, until the task is freed. Past the bound it never blocks the
producer: further batches go to a spill file of the partition (Arrow IPC
messages, read back memory-mapped), so memory stays within the bound.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import overload

import pyarrow as pa

from flight.errors import TaskCancelledError, TaskFailedError, light_copy
from flight.wire.limits import MAX_RETAINED_BYTES

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


class _Spill:
    """A retained partition's batches past the memory bound: one file of IPC messages, appended.

    Read back with ``pread`` (from the page cache, most often): a memory map would have to be
    made again after every append, and readers follow the writer closely (a re-map per batch
    made a recoverable multi-stage query 1.4-1.7x slower)."""

    def __init__(self, directory: str) -> None:
        fd, self.path = tempfile.mkstemp(prefix="flight-retained-", suffix=".arrows", dir=directory or None)
        self._file = os.fdopen(fd, "wb")
        self.spans: list[tuple[int, int]] = []  # (offset, length) of each batch's message
        self.bytes = 0
        self._closing = threading.Lock()  # a read never meets a closed (or reused) descriptor
        self._closed = False

    def append(self, batch: pa.RecordBatch) -> None:
        data = batch.serialize()
        self._file.write(memoryview(data))
        self._file.flush()
        self.spans.append((self.bytes, data.size))
        self.bytes += data.size

    def read(self, i: int, schema: pa.Schema) -> pa.RecordBatch:
        offset, length = self.spans[i]
        with self._closing:
            if self._closed:
                raise OSError(f"the retained output's spill file {os.path.basename(self.path)} was removed")
            data = os.pread(self._file.fileno(), length, offset)
        return pa.ipc.read_record_batch(pa.py_buffer(data), schema)

    def remove(self) -> None:
        with self._closing:
            self._closed = True
            self._file.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


class OutputBuffer:
    def __init__(
        self,
        partitions: int,
        max_bytes: int,
        readers: int = 1,
        *,
        retain: bool = False,
        spill_dir: str = "",
        max_retained: int = MAX_RETAINED_BYTES,
    ) -> None:
        self._parts = [_Partition(max(1, readers)) for _ in range(partitions)]
        self._readers = max(1, readers)
        self._max_bytes = max_bytes
        self._bytes = 0
        self._finished = False
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self.retain = retain
        self._spill_dir = spill_dir
        self._spills: dict[int, _Spill] = {}  # retained partitions past the bound
        self._max_retained = max_retained
        self._schema: pa.Schema | None = None

    @property
    def partitions(self) -> int:
        return len(self._parts)

    @property
    def buffered_bytes(self) -> int:
        return self._bytes

    @property
    def spilled_bytes(self) -> int:
        return sum(s.bytes for s in self._spills.values())

    def put(self, partition: int, batch: pa.RecordBatch) -> None:
        """Append a batch; blocks while the buffer is full. Raises once the buffer failed."""
        if self.retain:
            self._retain(partition, batch)
            return
        size = batch.nbytes
        with self._cond:
            while self._bytes > 0 and self._bytes + size > self._max_bytes and self._error is None:
                self._cond.wait()
            if self._error is not None:
                raise light_copy(self._error)
            self._parts[partition].batches.append(batch)
            self._bytes += size
            self._cond.notify_all()

    def _retain(self, partition: int, batch: pa.RecordBatch) -> None:
        with self._cond:
            if self._error is not None:
                raise light_copy(self._error)
            self._schema = self._schema or batch.schema
            spill = self._spills.get(partition)
            if spill is None and self._bytes + batch.nbytes <= self._max_bytes:
                self._parts[partition].batches.append(batch)
                self._bytes += batch.nbytes
            else:
                # Past the bound, and for the rest of this partition (its order is kept: memory first).
                if self.spilled_bytes + batch.nbytes > self._max_retained:
                    raise TaskFailedError(
                        f"the retained output (TaskOptions.retain_output) passed {self._max_retained} bytes, "
                        "the most a worker keeps for one task"
                    )
                if spill is None:
                    spill = self._spills[partition] = _Spill(self._spill_dir)
                spill.append(batch)
            self._cond.notify_all()

    def _retained_count(self, partition: int) -> int:
        spill = self._spills.get(partition)
        return len(self._parts[partition].batches) + (len(spill.spans) if spill is not None else 0)

    def _wait(self, more: Callable[[], bool], idle: float | None) -> bool:
        """Wait, the lock held, until ``more()``; False when ``idle`` seconds passed first (never without ``idle``).

        A timed wait on the condition, not a poll: a batch, the end or a failure wakes it at once."""
        if idle is None:
            while not more():
                self._cond.wait()
            return True
        return self._cond.wait_for(more, idle)

    def _read_retained(self, partition: int, idle: float | None) -> Iterator[pa.RecordBatch | None]:
        """Every batch of ``partition`` from the start, waiting for more until the task finished (None: see ``read``)."""
        part = self._parts[partition]
        index = 0

        def more() -> bool:
            return index < self._retained_count(partition) or self._finished or self._error is not None

        while True:
            spill: _Spill | None = None
            with self._cond:
                waited = self._wait(more, idle)
                if waited:
                    if self._error is not None:
                        raise light_copy(self._error)
                    if index >= self._retained_count(partition):
                        return
                    in_memory = len(part.batches)
                    spill = None if index < in_memory else self._spills[partition]
                    batch = part.batches[index] if spill is None else None
                    schema = self._schema
            if not waited:
                yield None  # outside the lock: nothing to send for ``idle`` seconds
                continue
            if spill is not None:  # read outside the lock: the producer need not wait for the disk
                assert schema is not None
                try:
                    batch = spill.read(index - in_memory, schema)
                except OSError:  # the task was freed (its file removed) meanwhile
                    with self._cond:
                        if self._error is not None:
                            raise light_copy(self._error) from None
                    raise
            index += 1
            assert batch is not None
            yield batch

    @property
    def bound(self) -> int:
        """The most bytes the buffer holds in memory (past it, a kept output spills)."""
        return self._max_bytes

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
            for spill in self._spills.values():
                spill.remove()
            self._spills.clear()
            self._cond.notify_all()

    def all_drained(self) -> bool:
        """Every reader read every batch (never, for a retained buffer: it may be read again)."""
        with self._cond:
            return not self.retain and self._finished and all(p.done_readers == self._readers for p in self._parts)

    def wait_drained(self, timeout: float | None = None) -> bool:
        if self.retain:
            return False  # read any number of times: kept until the task is freed
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

    @overload
    def read(self, partition: int) -> Iterator[pa.RecordBatch]: ...
    @overload
    def read(self, partition: int, idle: float) -> Iterator[pa.RecordBatch | None]: ...

    def read(self, partition: int, idle: float | None = None) -> Iterator[pa.RecordBatch | None]:
        """Batches of ``partition`` until the task finished; each partition has a fixed number of readers
        (a retained one: any number, each from the start).

        ``idle``: the reader must show it is alive while it waits (a DoGet stream's heartbeats), so it
        is handed None each time ``idle`` seconds passed with nothing to read; it is woken at once
        when a batch comes. Without ``idle``, never None.
        """
        if self.retain:
            yield from self._read_retained(partition, idle)
            return
        part = self._parts[partition]
        with self._cond:
            if part.claimed >= self._readers:
                raise TaskCancelledError(
                    f"output partition {partition} already has its {self._readers} reader(s)"
                )
            slot = part.claimed
            part.claimed += 1

        def more() -> bool:
            return part.cursors[slot] < part.total() or self._finished or self._error is not None

        try:
            while True:
                batch: pa.RecordBatch | None = None
                with self._cond:
                    if self._wait(more, idle):
                        if self._error is not None:
                            raise light_copy(self._error)
                        index = part.cursors[slot]
                        if index >= part.total():
                            return
                        batch = part.batches[index - part.base]
                        part.cursors[slot] = index + 1
                        self._trim(part)
                        self._cond.notify_all()
                yield batch  # None: nothing for ``idle`` seconds
        finally:
            # Done, failed or abandoned (a reader below a limit stops early): it holds nothing back any more.
            with self._cond:
                part.done_readers += 1
                part.cursors[slot] = 1 << 62
                self._trim(part)
                self._cond.notify_all()
