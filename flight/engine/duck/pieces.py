"""Which work units DuckDB reads itself, and the source text of a scan's local Parquet files and runs of row groups.

Why: DuckDB reads a local Parquet file faster than a pyarrow stream it is handed (in parallel, with the query's
filters and only the columns it needs). A unit naming a run of consecutive row groups (a large file cut so that
every task reads a part, ``flight.sources.providers.runs``) is read by DuckDB too, as the range of the file's row
numbers the run holds: DuckDB 2 skips the row groups outside a ``file_row_number`` filter (a task reading half of
TPC-DS's ``store_sales`` at SF 10 scans 118 of its 235 row groups). A unit of row groups that are not one run,
a file name DuckDB would read as a glob, or a URI is read by pyarrow (``flight.engine.readers``), which also
says what is wrong with a unit in its own words.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import pyarrow as pa

from flight.engine.duck.sqltext import string_literal
from flight.engine.readers import ReaderContext
from flight.errors import FlightExecError
from flight.sources.footers import parquet_metadata
from flight.wire._proto import plan_pb2

__all__ = ["MAX_RUN_FILES", "Plain", "duck_source", "plain_file"]

_GLOB = frozenset("*?[{")
"""Characters DuckDB reads as a glob in a file name: such files are read by pyarrow."""


class Plain(NamedTuple):
    """A unit DuckDB reads itself: where it came from (for errors), its path as sent and as the worker resolved it."""

    where: str
    path: str
    real: str
    rows: tuple[int, int] | None = None
    """``[start, stop)`` of the file's row numbers when the unit is a run of its row groups; None: the whole file."""
    body: bytes = b""
    """The unit as it came, for pyarrow when DuckDB does not read it after all (``duck_source`` gives None)."""


def plain_file(body: bytes, ctx: ReaderContext) -> tuple[str, str, tuple[int, int] | None]:
    """The unit's path, the real path DuckDB may read it at, and the row numbers of its run of row groups (None:
    the whole file); ``""`` as the real path when pyarrow must read it (row groups that are not one run of a file
    whose footer says so, a glob character, or not a FileUnit: its reader says so in its words). Raises
    ``PathRefused`` for a path outside the worker's data roots."""
    unit = plan_pb2.FileUnit()
    try:
        unit.ParseFromString(body)
    except Exception:  # noqa: BLE001 - DecodeError
        return "", "", None
    if not unit.path:
        return "", "", None
    real = ctx.open_path(unit.path)
    if _GLOB & set(real) or "\x00" in real or "://" in real:  # a URI: pyarrow.fs reads it
        return unit.path, "", None
    if not unit.row_groups:
        return unit.path, real, None
    rows = _run_rows(real, list(unit.row_groups))
    return (unit.path, real, rows) if rows is not None else (unit.path, "", None)


def _run_rows(real: str, groups: list[int]) -> tuple[int, int] | None:
    """The row numbers of row groups ``groups`` of the file, when they are one run of consecutive groups it has."""
    first = groups[0]
    if groups != list(range(first, first + len(groups))):
        return None
    try:
        meta = parquet_metadata(real)  # the footer, remembered while the file is unchanged
    except (OSError, pa.ArrowException, FlightExecError, ValueError):
        return None  # pyarrow's reader says what is wrong with it
    if first + len(groups) > meta.num_row_groups:
        return None
    start = sum(meta.row_group(g).num_rows for g in range(first))
    return start, start + sum(meta.row_group(g).num_rows for g in groups)


MAX_RUN_FILES = 32
"""Most files of one query read as ranges of row numbers (one ``read_parquet`` each, in a ``UNION ALL``): past it
pyarrow reads the scan's units (a split of very many files into row groups, ``split_row_groups=True``)."""


def duck_source(files: Sequence[Plain]) -> str | None:
    """The table expression DuckDB reads ``files`` with: ``read_parquet([...])`` of the whole files and, for each
    file with runs of row groups, ``read_parquet`` of it kept to their rows (adjacent runs merged, others OR'd:
    DuckDB skips the row groups outside), all in one ``UNION ALL BY NAME``; None past ``MAX_RUN_FILES``."""
    whole = [f.real for f in files if f.rows is None]
    ranges: dict[str, list[tuple[int, int]]] = {}
    for f in files:
        if f.rows is not None:
            ranges.setdefault(f.real, []).append(f.rows)
    listed = "read_parquet([" + ", ".join(string_literal(r) for r in whole) + "])"
    if not ranges:
        return listed
    if len(ranges) > MAX_RUN_FILES:
        return None
    parts = [f"SELECT * FROM {listed}"] if whole else []
    for real, spans in ranges.items():
        kept = " OR ".join(f"(file_row_number >= {a} AND file_row_number < {b})" for a, b in _merged(spans))
        parts.append(f"SELECT * EXCLUDE (file_row_number) FROM read_parquet({string_literal(real)}, file_row_number = true) WHERE {kept}")
    return "(" + " UNION ALL BY NAME ".join(parts) + ")"


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``spans`` sorted, those that touch or overlap made one (as the OR of them would read them: a row of a file
    is read once, whatever runs name it)."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out
