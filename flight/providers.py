"""Ready-made work-unit providers for the common case: a known list of files."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from flight._proto import plan_pb2
from flight.errors import FlightExecError
from flight.feed import FeedContext, WorkUnitFeedProvider, file_unit
from flight.storage import open_input

__all__ = ["FileListProvider"]


class FileListProvider(WorkUnitFeedProvider):
    """Files dealt round-robin over the feed's partitions (one per task by default).

    With ``split_row_groups`` a Parquet file becomes one unit per row group,
    so a few large files still spread over many tasks.
    """

    def __init__(self, paths: Sequence[str | os.PathLike[str]], *, split_row_groups: bool = False, partitions: int | None = None) -> None:
        self.paths = [os.fspath(p) for p in paths]
        self.split_row_groups = split_row_groups
        self._partitions = partitions
        self._rows: float | None = None

    def partitions(self) -> int | None:
        """As asked, else one per file: a task with no file to read would only cost a task's start
        (with ``split_row_groups`` the units are not known before the footers are read: as many as tasks)."""
        if self._partitions is not None or self.split_row_groups:
            return self._partitions
        return max(1, len(self.paths))

    def estimated_rows(self) -> float | None:
        """From the Parquet footers (read once); unknown for other formats."""
        if self._rows is None and all(p.endswith(".parquet") for p in self.paths):
            try:
                self._rows = float(sum(_footer_rows(p) for p in self.paths))
            except (OSError, pa.ArrowException, FlightExecError):
                return None  # a file that cannot be read fails the query where it is read, with its name
        return self._rows

    def _units(self) -> Iterator[plan_pb2.FileUnit]:
        for path in self.paths:
            if self.split_row_groups:
                with open_input(path) as source:  # the footer only, local or in a store
                    groups = pq.ParquetFile(source).num_row_groups
                for rg in range(groups):
                    yield file_unit(path, [rg])
            else:
                yield file_unit(path)

    def feed(self, partition: int, ctx: FeedContext) -> Iterator[plan_pb2.FileUnit]:
        for i, unit in enumerate(self._units()):
            if i % ctx.partitions == partition:
                yield unit


def _footer_rows(path: str) -> int:
    with open_input(path) as source:
        return pq.ParquetFile(source).metadata.num_rows
