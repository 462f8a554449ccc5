"""Ready-made work-unit providers: a known list of files, and a store's prefix listed as the query runs."""

from __future__ import annotations

import fnmatch
import functools
import math
import os
from collections.abc import Iterator, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from flight.errors import FlightExecError
from flight.sources.feed import FeedContext, Unit, WorkUnit, WorkUnitFeedProvider, file_unit
from flight.sources.footers import footer_derived, parquet_metadata
from flight.sources.statistics import FileRange, as_number
from flight.sources.storage import Location, open_input, parse_location, process_filesystems
from flight.wire._proto import plan_pb2

__all__ = ["FileGroups", "FileListProvider", "KeptRowGroups", "ListingProvider", "footer_range", "runs"]


class FileListProvider(WorkUnitFeedProvider):
    """Files dealt round-robin over the feed's partitions (one per task by default).

    With ``split_row_groups`` a Parquet file becomes one unit per row group,
    so a few large files still spread over many tasks; given a number of bytes, only the files
    larger than that are split (``splits``); ``False`` keeps every file whole. By default (``None``)
    the files are cut only when the planner gives the feed more partitions than files
    (``ExecOptions.cut_file_rows``, ``may_cut``): each file of several row groups becomes one run of row
    groups per partition (``runs``), balanced by rows, so that one large file (a table written as one file)
    is read by every task instead of one. Repeatable: a second read lists the same files.
    """

    repeatable = True
    dealt = True

    def __init__(
        self, paths: Sequence[str | os.PathLike[str]], *, split_row_groups: bool | int | None = None,
        partitions: int | None = None
    ) -> None:
        self.paths = [os.fspath(p) for p in paths]
        self.split_row_groups = split_row_groups
        self._partitions = partitions
        self._rows: float | None = None
        self._groups: bool | None = None
        self._ranges: dict[str, tuple[float, float] | None] = {}
        self._file_ranges: dict[str, list[FileRange] | None] = {}

    def partitions(self) -> int | None:
        """As asked, else one per file: a task with no file to read would only cost a task's start
        (with ``split_row_groups`` the units are not known before the footers are read: as many as tasks).
        The planner gives files it may cut (``may_cut``) more partitions than files, up to a task each."""
        if self._partitions is not None or self.split_row_groups:
            return self._partitions
        return max(1, len(self.paths))

    def may_cut(self, min_rows: int) -> bool:
        """Whether these files may be cut into runs of row groups (the planner then gives the feed a partition per
        task, more than files): by default (``split_row_groups=None``, no ``partitions``), Parquet files of at
        least ``min_rows`` rows in all (0: never), one of them of several row groups (from the footers, read once)."""
        if self.split_row_groups is not None or self._partitions is not None or min_rows <= 0:
            return False
        rows = self.estimated_rows()
        if rows is None or rows < min_rows:
            return False
        if self._groups is None:
            try:
                self._groups = any(parquet_metadata(p).num_row_groups > 1 for p in self.paths)
            except (OSError, pa.ArrowException, FlightExecError):
                self._groups = False  # a file that cannot be read fails the query where it is read, with its name
        return self._groups

    def estimated_rows(self) -> float | None:
        """From the Parquet footers (read once); unknown for other formats."""
        if self._rows is None and all(p.endswith(".parquet") for p in self.paths):
            try:
                self._rows = float(sum(_footer_rows(p) for p in self.paths))
            except (OSError, pa.ArrowException, FlightExecError):
                return None  # a file that cannot be read fails the query where it is read, with its name
        return self._rows

    def column_range(self, name: str) -> tuple[float, float] | None:
        """The least and greatest value of column ``name`` over every row group (``ranges.as_number``
        values), from the Parquet footers; None when a footer lacks them or they are not numbers."""
        if name not in self._ranges:
            self._ranges[name] = footer_range(self.paths, name)
        return self._ranges[name]

    def key_ranges(self, name: str) -> list[FileRange] | None:
        """Per file, the least and greatest value of column ``name`` (over its row groups) and its
        rows, from the Parquet footers: what a co-located join groups files by
        (``flight.planner.colocate``). None when any footer lacks them or they are not numbers."""
        if name not in self._file_ranges:
            self._file_ranges[name] = _file_ranges(self.paths, name)
        return self._file_ranges[name]

    def grouped(self, groups: Sequence[Sequence[str]]) -> FileGroups:
        """These files in fixed groups, one feed partition each (a co-located join's key ranges)."""
        return FileGroups(self, groups)

    def file_units(self, path: str) -> Iterator[plan_pb2.FileUnit]:
        """The units of one file: the whole file, or one per row group when it is split."""
        if not self.split_row_groups:
            yield file_unit(path)
            return
        with open_input(path) as source:  # its size only, local or in a store
            size = source.size()
        if splits(self.split_row_groups, size):
            groups = parquet_metadata(path).num_row_groups  # the footer only
            yield from (file_unit(path, [rg]) for rg in range(groups))
        else:
            yield file_unit(path)

    def cuts(self, partitions: int) -> bool:
        """Whether a feed of ``partitions`` partitions cuts these files into runs of row groups (``feed``)."""
        return self.split_row_groups is None and self._partitions is None and len(self.paths) < partitions

    def kept(self, groups: Sequence[tuple[str, Sequence[int]]]) -> KeptRowGroups:
        """Only these row groups of the files, cut into a part per partition (a scan's filter keeps no others)."""
        return KeptRowGroups(self, groups)

    def feed(self, partition: int, ctx: FeedContext) -> Iterator[plan_pb2.FileUnit]:
        cut = self.cuts(ctx.partitions)
        i = 0
        for path in self.paths:
            for unit in (runs(path, ctx.partitions) if cut else self.file_units(path)):
                if i % ctx.partitions == partition:
                    yield unit
                i += 1


class FileGroups(WorkUnitFeedProvider):
    """The files of a ``FileListProvider`` in fixed groups, group ``p`` being feed partition ``p``.

    The planner makes one for each side of a co-located join, so that the task owning partition
    ``p`` of one side owns partition ``p`` of the other: the files whose keys can meet.
    """

    repeatable = True

    def __init__(self, files: FileListProvider, groups: Sequence[Sequence[str]]) -> None:
        self.files = files
        self.groups = [list(g) for g in groups]

    def partitions(self) -> int | None:
        return len(self.groups)

    def estimated_rows(self) -> float | None:
        return self.files.estimated_rows()

    def column_range(self, name: str) -> tuple[float, float] | None:
        return self.files.column_range(name)

    def feed(self, partition: int, ctx: FeedContext) -> Iterator[plan_pb2.FileUnit]:
        for path in self.groups[partition]:
            yield from self.files.file_units(path)


class KeptRowGroups(WorkUnitFeedProvider):
    """The row groups of a ``FileListProvider``'s files that a scan's filter may keep (their footers' ranges meet
    it: ``flight.planner.rowgroups``), cut into one part per feed partition, as even in rows as they allow; each
    part's units are its runs of consecutive row groups of one file.

    Why: a file cut into even runs (``runs``) whose rows are in the filtered column's order (a fact table written by
    date) gives a month's rows to the one task whose run holds them, and the others skip all of theirs."""

    repeatable = True
    dealt = True

    def __init__(self, files: FileListProvider, kept: Sequence[tuple[str, Sequence[int]]]) -> None:
        self.files = files
        self.kept = [(path, list(groups)) for path, groups in kept]

    def estimated_rows(self) -> float | None:
        return self.files.estimated_rows()

    def column_range(self, name: str) -> tuple[float, float] | None:
        return self.files.column_range(name)

    def feed(self, partition: int, ctx: FeedContext) -> Iterator[plan_pb2.FileUnit]:
        items = [(path, g, parquet_metadata(path).row_group(g).num_rows) for path, groups in self.kept for g in groups]
        start, stop = _balanced([n for _, _, n in items], ctx.partitions)[partition]
        run: list[int] = []
        for i, (path, g, _) in enumerate(items[start:stop], start):
            run.append(g)
            if i + 1 == stop or items[i + 1][0] != path or items[i + 1][1] != g + 1:
                yield file_unit(path, run)
                run = []


def _balanced(rows: Sequence[int], parts: int) -> list[tuple[int, int]]:
    """``parts`` consecutive spans ``[start, stop)`` of ``rows``' indices, as even in rows as they allow (the last
    ones empty when there are fewer items than parts)."""
    total, start, seen = max(1, sum(rows)), 0, 0
    spans: list[tuple[int, int]] = []
    for i, n in enumerate(rows):
        seen += n
        if i == len(rows) - 1 or (len(spans) + 1 < parts and seen * parts >= (len(spans) + 1) * total):
            spans.append((start, i + 1))
            start = i + 1
    spans += [(len(rows), len(rows))] * (parts - len(spans))
    return spans


def runs(path: str, parts: int) -> Iterator[plan_pb2.FileUnit]:
    """The units of one file cut into at most ``parts`` runs of consecutive row groups, as even in rows as the
    row groups allow (a worker's DuckDB reads a run as a range of the file's row numbers)."""
    meta = parquet_metadata(path)
    groups = meta.num_row_groups
    if groups <= 1 or parts <= 1:
        yield file_unit(path)
        return
    for start, stop in _balanced([meta.row_group(g).num_rows for g in range(groups)], parts):
        if stop > start:
            yield file_unit(path, range(start, stop))


def splits(split_row_groups: bool | int, size: int) -> bool:
    """Whether a file of ``size`` bytes becomes one unit per row group: ``True`` every file,
    ``False`` none, a number of bytes the files larger than that (their footers are read
    by the coordinator; a smaller file is one unit, its footer left to the task)."""
    if isinstance(split_row_groups, bool):
        return split_row_groups
    return size > split_row_groups


def footer_range(paths: list[str], name: str) -> tuple[float, float] | None:
    """The least and greatest value of column ``name`` over the files' row groups (``ranges.as_number`` values), from
    their footers (remembered with them: ``footer_derived``); None when one lacks them or cannot be read."""
    found = [f for f in _file_ranges(paths, name) or [] if f.rows > 0]
    if not found:
        return None
    low, high = min(f.low for f in found), max(f.high for f in found)
    return (low, high) if low <= high else None


def _file_ranges(paths: list[str], name: str) -> list[FileRange] | None:
    """Each file's range of column ``name`` over its row groups, or None if any is unknown."""
    if not paths or not all(p.endswith(".parquet") for p in paths):
        return None
    out = []
    try:
        for path in paths:
            found = footer_derived(path, f"range {name}", functools.partial(_file_range, path, name=name))
            if found is None:
                return None
            out.append(found)
    except (OSError, pa.ArrowException, FlightExecError, ValueError):
        return None  # a file that cannot be read fails the query where it is read, with its name
    return out


def _file_range(path: str, meta: pq.FileMetaData, *, name: str) -> FileRange | None:
    """One file's range of column ``name`` from its footer (None: a row group's statistics lack it)."""
    names = [meta.schema.column(i).path for i in range(meta.num_columns)]
    if name not in names:
        return None
    index = names.index(name)
    low, high, nulls = math.inf, -math.inf, False
    groups = []
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(index).statistics
        if stats is None or not stats.has_min_max:
            return None
        lo, hi = as_number(stats.min), as_number(stats.max)
        if lo is None or hi is None:
            return None
        low, high = min(low, lo), max(high, hi)
        groups.append((lo, hi, float(meta.row_group(g).num_rows)))
        nulls = nulls or stats.null_count is None or stats.null_count > 0
    if meta.num_rows == 0:
        low = high = 0.0  # no rows: read once, widening no range (rows=0 says so)
    elif not low <= high:
        return None
    return FileRange(path, low, high, float(meta.num_rows), nulls, tuple(groups))


def _footer_rows(path: str) -> int:
    return parquet_metadata(path).num_rows


class ListingProvider(WorkUnitFeedProvider):
    """The files under a prefix (``s3://bucket/events/``, a local directory), listed while the query runs.

    A shared queue: each file found goes to whichever task has credit, while the listing goes
    on, so the first rows arrive before the last page is listed. ``pattern`` is a glob
    (``fnmatch``) matched against each file's path below the prefix (``*`` spans ``/``).
    ``split_row_groups`` makes a unit of each row group, from the file's footer, read by the
    coordinator as it lists; given a number of bytes, only of the files larger than that
    (their sizes come with the listing, so smaller files cost no extra request). The coordinator lists with its own store configuration
    (``flight.configure_storage``, its environment); the workers read with theirs.
    """

    shared = True

    def __init__(self, prefix: str, pattern: str = "*", *, split_row_groups: bool | int = False, page_size: int = 1000) -> None:
        where = parse_location(prefix)
        self.prefix = prefix
        self.location = where if isinstance(where, Location) else Location("", "", os.path.abspath(where))
        self.pattern = pattern
        self.split_row_groups = split_row_groups
        self.page_size = page_size
        self.pages = 0  # listed so far (this execution's)

    def files(self) -> Iterator[tuple[str, int]]:
        """Each matching file's path (a URI for a store) and size, in listing order."""
        self.pages = 0
        if not self.location.scheme:
            yield from self._local()
            return
        root = self.location.key + "/" if self.location.key else ""
        for page in process_filesystems().listing(self.location, self.page_size):
            self.pages += 1
            for found, size in page:
                if fnmatch.fnmatchcase(found.key[len(root):], self.pattern):
                    yield str(found), size

    def _local(self) -> Iterator[tuple[str, int]]:
        base = self.location.key
        for top, dirs, names in os.walk(base):
            dirs.sort()
            self.pages += 1
            for name in sorted(names):
                path = os.path.join(top, name)
                if fnmatch.fnmatchcase(os.path.relpath(path, base).replace(os.sep, "/"), self.pattern):
                    yield path, os.path.getsize(path)

    def feed(self, partition: int, ctx: FeedContext) -> Iterator[WorkUnit]:
        for path, size in self.files():
            if ctx.is_cancelled():
                return
            if splits(self.split_row_groups, size):
                meta = parquet_metadata(path)
                for rg in range(meta.num_row_groups):
                    group = meta.row_group(rg)
                    yield Unit(file_unit(path, [rg]), rows=group.num_rows, bytes=group.total_byte_size)
            else:
                yield Unit(file_unit(path), bytes=size)

    def first(self) -> str | None:
        """The first matching file (planning reads its schema), or None."""
        for path, _ in self.files():
            return path
        return None
