"""Decoding a Parquet unit's row groups on several threads at once, in the file's order.

Why not ``ParquetFile.iter_batches(use_threads=True)`` or a dataset scanner: a reader runs on
a thread Acero pulls from (an Arrow I/O pool thread), and a decode that schedules work on
Arrow's own pools and then waits for it there can run out of pool threads when many scans
do the same. This uses its own few threads instead, each with its own ``ParquetFile`` over
the already-read footer (a ``ParquetFile`` is not safe to share: pre-buffering keeps state),
reading one row group with ``use_threads=False``.

Why it helps: a task that has the cores (``flight-worker --engine-threads``) decodes up to
that many row groups at once instead of one after another, and for a file in object storage
the ranged reads of the next row groups are in flight while one is decoded.

Memory stays bounded: at most ``threads`` row groups are held decoded, and a file whose row
groups are larger than ``MAX_PARALLEL_GROUP_BYTES`` (uncompressed) is read one row group at a
time, batch by batch, as before.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["MAX_PARALLEL_GROUP_BYTES", "decode_threads", "row_group_batches"]

MAX_PARALLEL_GROUP_BYTES = 256 << 20
"""A row group larger than this (uncompressed, every column) is decoded batch by batch, alone."""


def decode_threads() -> int:
    """How many row groups of one unit a task decodes at once: the worker's engine threads."""
    from flight.engine.duck import settings  # the worker's --engine-threads; imported late: duck imports readers

    return max(1, settings().threads or os.cpu_count() or 1)


def row_group_batches(
    pf: pq.ParquetFile,
    reopen: Callable[[], pq.ParquetFile],
    groups: Sequence[int],
    columns: list[str] | None,
    batch_rows: int,
    threads: int,
) -> Iterator[pa.RecordBatch]:
    """The batches of ``groups`` of ``pf`` (in that order) with ``columns``, at most ``batch_rows`` rows each.

    ``reopen`` gives a new ``ParquetFile`` over the same file and footer, one per decoding
    thread. With one thread, one group, or large groups: ``pf.iter_batches`` on this thread.
    """
    meta = pf.metadata
    largest = max((meta.row_group(g).total_byte_size for g in groups), default=0)
    if threads <= 1 or len(groups) <= 1 or largest > MAX_PARALLEL_GROUP_BYTES:
        yield from pf.iter_batches(batch_size=batch_rows, row_groups=list(groups), columns=columns, use_threads=False)
        return
    workers = min(threads, len(groups))
    files: dict[int, pq.ParquetFile] = {}  # a thread's own ParquetFile, by thread id

    def read(group: int) -> pa.Table:
        me = threading.get_ident()
        own = files.get(me)
        if own is None:
            own = files[me] = reopen()
        return own.read_row_group(group, columns=columns, use_threads=False)

    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="parquet-decode")
    pending: deque[Future[pa.Table]] = deque()
    todo = iter(groups)
    try:
        for group in todo:
            pending.append(pool.submit(read, group))
            if len(pending) >= workers:
                break
        while pending:
            table = pending.popleft().result()
            nxt = next(todo, None)
            if nxt is not None:
                pending.append(pool.submit(read, nxt))
            yield from table.to_batches(max_chunksize=batch_rows)
    finally:
        for f in pending:
            f.cancel()
        pool.shutdown(wait=True, cancel_futures=True)
