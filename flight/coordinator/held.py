"""A head task's rows, held back until its whole output was read: memory, then a temporary file.

Why: with ``ExecOptions.stage_recovery`` a head task of a multi-stage query may run again after
a lost worker (``rerun.py``). Its rows must then reach the caller once, so none reach it before
the task's output stream ended whole; a task that is lost meanwhile has its held rows dropped.
Held rows past ``ExecOptions.held_output_bytes`` go to an Arrow IPC file in the temporary
directory, read back (memory-mapped) when the task is delivered and removed after.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pyarrow as pa

__all__ = ["HeldOutput"]


class HeldOutput:
    """Batches of one head task, in order; ``batches()`` once, then ``close()``."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit = limit_bytes
        self.held: list[pa.RecordBatch] = []
        self.size = 0
        self.rows = 0
        self._path: str | None = None
        self._sink: pa.NativeFile | None = None
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None

    def add(self, batch: pa.RecordBatch) -> None:
        self.rows += batch.num_rows
        if self._writer is None and self.size + batch.nbytes <= self.limit:
            self.held.append(batch)
            self.size += batch.nbytes
            return
        if self._writer is None:
            fd, self._path = tempfile.mkstemp(prefix="flight-held-", suffix=".arrows")
            os.close(fd)
            self._sink = pa.OSFile(self._path, "wb")
            self._writer = pa.ipc.new_stream(self._sink, batch.schema)
        self._writer.write_batch(batch)

    def batches(self) -> Iterator[pa.RecordBatch]:
        """Every batch held, in the order added (those in memory first: they came first)."""
        yield from self.held
        if self._writer is None or self._path is None:
            return
        self._writer.close()
        self._writer = None
        assert self._sink is not None
        self._sink.close()
        with pa.memory_map(self._path) as source:
            yield from pa.ipc.open_stream(source)

    def close(self) -> None:
        """Drop what is held and remove the file (also after ``batches()``)."""
        self.held = []
        if self._writer is not None:
            try:
                self._writer.close()
            except (pa.ArrowException, OSError):
                pass  # the file is removed below either way
            self._writer = None
        if self._sink is not None:
            self._sink.close()
        if self._path is not None:
            try:
                os.unlink(self._path)
            except FileNotFoundError:
                pass
            self._path = None
