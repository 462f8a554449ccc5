"""Row-group pruning: a filter's predicate checked against a Parquet file's statistics, and the count.

Why apart from the readers: it is a decision about what to read, not reading. The Parquet and
Iceberg readers ask ``row_groups`` which of a unit's row groups to decode; ``ScanStats`` keeps
the task's tally for its metrics (``TaskMetrics.scan``, ``explain(analyze=True)``).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from flight.compute.expressions import to_pyarrow
from flight.errors import ProtocolError
from flight.sources.storage import Location
from flight.wire._proto import plan_pb2, protocol_pb2

if TYPE_CHECKING:
    from flight.engine.readers import ReaderContext

__all__ = ["ScanStats", "prune_of", "row_groups"]

log = logging.getLogger(__name__)


class ScanStats:
    """What a task's Parquet readers read, and what a filter let them skip (``TaskMetrics.scan``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # a task's several scans may read at once
        self.row_groups_read = self.row_groups_skipped = self.bytes_read = self.bytes_skipped = 0

    def add(self, read: int, skipped: int, bytes_read: int, bytes_skipped: int) -> None:
        with self._lock:
            self.row_groups_read += read
            self.row_groups_skipped += skipped
            self.bytes_read += bytes_read
            self.bytes_skipped += bytes_skipped

    def to_proto(self) -> protocol_pb2.ScanMetrics:
        with self._lock:
            return protocol_pb2.ScanMetrics(
                row_groups_read=self.row_groups_read, row_groups_skipped=self.row_groups_skipped,
                bytes_read=self.bytes_read, bytes_skipped=self.bytes_skipped,
            )


def row_groups(pf: pq.ParquetFile, groups: list[int], where: str | Location, ctx: ReaderContext) -> list[int]:
    """The row groups to read: ``groups`` less those whose statistics exclude ``ctx.prune``; counted."""
    keep = groups
    if ctx.prune is not None and groups and ctx.options.get("prune", "true") != "false":
        keep = _surviving(groups, where, ctx) or []
    if ctx.scan is not None:
        meta = pf.metadata
        size = {g: meta.row_group(g).total_byte_size for g in groups}
        kept = set(keep)
        ctx.scan.add(len(keep), len(groups) - len(keep), sum(size[g] for g in keep), sum(v for g, v in size.items() if g not in kept))
    return keep


def _surviving(groups: list[int], where: str | Location, ctx: ReaderContext) -> list[int] | None:
    """``groups`` that may hold a row passing ``ctx.prune``, by the footer's statistics (Arrow's
    dataset fragments); all of them when the predicate cannot be checked against statistics."""
    try:
        if isinstance(where, Location):
            fs, path = ctx.filesystems().filesystem(where), where.fs_path
        else:
            fs, path = pafs.LocalFileSystem(), where
        fragment = pads.ParquetFileFormat().make_fragment(path, filesystem=fs, row_groups=groups)
        return [rg.id for rg in fragment.subset(ctx.prune).row_groups]  # type: ignore[attr-defined]  # a ParquetFileFragment (stubs: Fragment)
    except (pa.ArrowException, OSError, TypeError, ValueError) as exc:  # a type statistics cannot meet: read all
        log.debug("row-group pruning skipped: %s", type(exc).__name__)
        return groups


def prune_of(flt: plan_pb2.Filter, field: str) -> pc.Expression | None:
    """A filter's predicate for the scan below it to skip data with (None if it cannot be had)."""
    try:
        return to_pyarrow(flt.predicate, field)
    except ProtocolError:
        return None  # the filter node reports it
