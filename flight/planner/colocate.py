"""Co-located joins: when the Parquet footers bound each file's join keys, split the key line instead of shuffling.

Why: tables written in key order (TPC-H's orders and lineitem by order key; any table an Iceberg
sort order or a Hive bucketing clusters) keep each key in one or two files, and the footers
say which. Cut the key line into one range per task; task ``t`` reads, of both sides, only the
files whose ``[min, max]`` meets its range, and keeps only the rows whose key lies in it (a
filter on the scan, so the engine skips the row groups outside it). Every key is then in one
task's range, so a row has all its matches in its own task: the join needs no shuffle and no
broadcast (Spark calls this a storage-partitioned join). A file that straddles a boundary is
read by two tasks, each keeping its own rows.

The ranges partition the whole line (the first is open below, the last above), so every row
with a key is read exactly once whatever the footers say; a row whose key is null is read by
none, which an inner or semi join never misses, and which the planner only allows for a side
whose footers count no nulls otherwise (``FileRange.nulls``). Decisions only; the footers are
read by ``FileListProvider.key_ranges``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import pyarrow as pa

from flight.engine.partition import hash_columns
from flight.plan.expr import col, lit
from flight.plan.nodes import FeedScanNode, FilterNode, Node, ProjectNode
from flight.plan.relnodes import AggregateNode, JoinNode, UnionNode
from flight.sources.statistics import FileRange

__all__ = [
    "COLOCATE_READ",
    "EXACT",
    "KEPT_UNMATCHED",
    "KeyRanges",
    "distinct_bound",
    "in_range",
    "key_scan",
    "range_files",
    "rereads_pay",
    "rows_read",
    "split_points",
    "spread_keys",
    "straddled",
]

EXACT = float(1 << 53)
"""Integer keys beyond this are not all exact as floats: such files are never co-located."""


def _below(files: Sequence[FileRange], x: float) -> float:
    """Rows estimated below ``x``, each file's rows spread evenly over its range."""
    total = 0.0
    for f in files:
        if f.high < x:
            total += f.rows
        elif f.low < x:
            total += f.rows * (x - f.low) / max(f.high - f.low, 1.0)
    return total


def _straddling(files: Sequence[FileRange], x: float) -> float:
    """Rows of the files a boundary at ``x`` cuts (some of their keys below it, some not)."""
    return sum(f.rows for f in files if f.low < x <= f.high)


def split_points(files: Sequence[FileRange], tasks: int) -> list[int] | None:
    """``tasks - 1`` increasing integer boundaries cutting ``files`` (both sides) into ranges of
    near-equal rows. Each boundary is a file's lowest key where one is close, the one that cuts
    the fewest rows of other files: a side no boundary cuts needs no range filter (``straddled``),
    and the engine then sees its true size (DuckDB guesses a filter keeps a fifth, and may build a
    semi join on the larger side for it). None when the files do not spread over that many keys."""
    live = [f for f in files if f.rows > 0]
    if tasks < 2 or not live:
        return None
    total = sum(f.rows for f in live)
    lows = sorted({f.low for f in live})[1:]
    lo, hi = min(f.low for f in live), max(f.high for f in live)
    points: list[int] = []
    for k in range(1, tasks):
        want = total * k / tasks
        a, b = lo, hi
        for _ in range(64):  # bisection on a monotone function
            mid = (a + b) / 2
            if _below(live, mid) < want:
                a = mid
            else:
                b = mid
        x = b
        near = [c for c in lows if abs(_below(live, c) - want) <= total / (4 * tasks)]
        if near:
            x = min(near, key=lambda c: (_straddling(live, c), abs(_below(live, c) - want)))
        point = int(x)
        if point <= (points[-1] if points else lo) or point > hi:
            return None
        points.append(point)
    return points


def range_files(files: Sequence[FileRange], points: Sequence[int]) -> list[list[str]]:
    """Per range (``points`` cut ``len(points) + 1`` of them), the files whose keys may fall in it:
    range ``t`` holds the keys ``k`` with ``points[t-1] <= k < points[t]``. A file of no rows
    (no range) goes to the first, so it is still read once."""
    bounds = [-float("inf"), *points, float("inf")]
    out: list[list[str]] = [[] for _ in range(len(points) + 1)]
    for f in files:
        if f.rows == 0:
            out[0].append(f.path)
            continue
        for t in range(len(out)):
            if f.high >= bounds[t] and f.low < bounds[t + 1]:
                out[t].append(f.path)
    return out


def rows_read(files: Sequence[FileRange], points: Sequence[int]) -> float:
    """Rows the tasks read in all, each skipping the row groups outside its range: one read of
    every row when no row group straddles a boundary, more as more do."""
    bounds = [-float("inf"), *points, float("inf")]
    total = 0.0
    for f in files:
        parts = f.groups or ((f.low, f.high, f.rows),)
        for low, high, rows in parts:
            total += rows * sum(1 for t in range(len(bounds) - 1) if high >= bounds[t] and low < bounds[t + 1])
    return total


def straddled(files: Sequence[FileRange], points: Sequence[int]) -> list[bool]:
    """Per range, whether any file read for it (``range_files``) holds keys outside it: only then
    must its task filter that side to its range. A file wholly inside one range is read by that
    range's task alone, so its rows need no filter; its null keys (no range has them) pass, which
    only a side whose unmatched rows come out could notice, and the planner co-locates such a side
    only when its footers count no nulls."""
    bounds = [-float("inf"), *points, float("inf")]
    out = [False] * (len(points) + 1)
    for f in files:
        if f.rows == 0:
            continue
        for t in range(len(out)):
            if f.high >= bounds[t] and f.low < bounds[t + 1] and (f.low < bounds[t] or f.high >= bounds[t + 1]):
                out[t] = True
    return out


COLOCATE_READ = 1.1
"""A scan split into key ranges may read at most this many times its rows in all (row groups that
straddle a key boundary are read by two tasks); beyond, the keys are not clustered enough. A join
of two such scans may read more where that still costs less than moving a side (``rereads_pay``)."""

REREAD_PER_MOVED = 0.5
"""Rows a co-located join may read a second time, per row that a broadcast or shuffle would move
instead: a row group read again costs a decode on the task's own core, a row moved costs its
encoding, the network and a decode at the other end, and a stage boundary."""


def rereads_pay(sides: Sequence[Sequence[FileRange]], points: Sequence[int]) -> bool:
    """Whether splitting ``sides`` (the files of each scan) at ``points`` reads few enough rows twice.

    One side: at most ``COLOCATE_READ`` times its rows. Two (a join): that, or the rows read twice at
    most ``REREAD_PER_MOVED`` times the rows the cheaper of a shuffle (both sides, once) and a
    broadcast (the smaller side to every other task) would move. At eight tasks TPC-H SF 1's orders
    (one row group a file) is read 1.44 times, 0.66 M rows again, where a broadcast of it moves 10.5 M."""
    rows = [sum(r.rows for r in side) for side in sides]
    extra = [rows_read(side, points) - n for side, n in zip(sides, rows, strict=True)]
    if all(e <= (COLOCATE_READ - 1) * n for e, n in zip(extra, rows, strict=True)):
        return True
    if len(sides) < 2:
        return False
    moved = min(sum(rows), min(rows) * len(points))
    return sum(extra) <= REREAD_PER_MOVED * moved

KEPT_UNMATCHED = {
    "inner": (), "left semi": (), "left outer": ("left",), "left anti": ("left",),
    "right outer": ("right",), "full outer": ("left", "right"),
}
"""Join types a co-located join may run, and the sides whose rows come out even unmatched
(a null key among them would be lost: no key range reads it)."""


@dataclass(frozen=True)
class KeyRanges:
    """One co-located scan's key ranges: task t keeps the rows of ``column`` in range t."""

    column: str
    kind: pa.DataType
    points: list[int]
    """The boundaries: range t is ``points[t-1] <= key < points[t]``."""
    straddled: list[bool]
    """Per range, whether a file its task reads holds keys outside it (else the task needs no filter)."""


def in_range(node: Node, ranges: dict[str, KeyRanges], task: int) -> Node:
    """``node`` with a filter keeping key range ``task`` right above each scan named in ``ranges``
    whose files for that task hold keys outside it."""
    if isinstance(node, FeedScanNode):
        if node.feed.feed_id not in ranges or not ranges[node.feed.feed_id].straddled[task]:
            return node
        r = ranges[node.feed.feed_id]
        column, kind, points = r.column, r.kind, r.points
        terms = []
        if task > 0:
            terms.append(col(column) >= lit(points[task - 1], kind))
        if task < len(points):
            terms.append(col(column) < lit(points[task], kind))
        predicate = terms[0] if len(terms) == 1 else terms[0] & terms[1]
        return FilterNode(node, predicate, tuple(f"keeps key range {task} of a co-located join" for _ in terms))
    changes: dict[str, object] = {}
    for name in ("input", "left", "right"):
        child = getattr(node, name, None)
        if isinstance(child, Node):
            changes[name] = in_range(child, ranges, task)
    if isinstance(node, UnionNode):
        changes["inputs"] = [in_range(c, ranges, task) for c in node.inputs]
    return replace(node, **changes) if changes else node  # type: ignore[type-var]


def key_scan(node: Node, name: str) -> tuple[FeedScanNode, str] | None:
    """The feed scan column ``name`` comes from unchanged (through filters, renames, joins and group keys),
    or None when it is computed or comes from another stage."""
    while True:
        if isinstance(node, FeedScanNode):
            return (node, name) if name in node.schema.names else None
        if isinstance(node, FilterNode):
            node = node.input
        elif isinstance(node, ProjectNode):
            expr = dict(node.exprs).get(name)
            source = None if expr is None else expr.column_name()
            if source is None:
                return None
            node, name = node.input, source
        elif isinstance(node, AggregateNode):
            if name not in node.keys:  # a group key passes through; an aggregate's result is computed
                return None
            node = node.input
        elif isinstance(node, JoinNode):
            if name in node.left.schema.names:
                node = node.left
            elif name in node.right.schema.names and node.join_type not in ("left semi", "left anti"):
                node = node.right
            else:
                return None
        else:
            return None


def distinct_bound(node: Node, names: Sequence[str]) -> float | None:
    """At most how many distinct values the integer columns ``names`` of ``node`` hold together, from
    the footers' ranges of the scans they come from (``max - min + 1`` each, multiplied); None when a
    column is computed, not an integer, or its range is not known."""
    bound = 1.0
    for name in names:
        found = key_scan(node, name)
        if found is None or not pa.types.is_integer(found[0].schema.field(found[1]).type):
            return None
        column_range = getattr(found[0].feed.inner(), "column_range", None)
        known = None if column_range is None else column_range(found[1])
        if known is None:
            return None
        bound *= known[1] - known[0] + 1
    return bound


SPREAD_VALUES = 1024
"""Fewer distinct values than this (by the footers' ranges) spread rows unevenly over a shuffle's tasks."""


def spread_keys(node: Node, keys: Sequence[str]) -> list[str]:
    """The keys to hash-shuffle ``node``'s rows on for an aggregate grouped by ``keys``: all of them,
    or only the string ones when the others hold few values.

    A worker hashes only the keys that are not strings when there are any (docs/protocol.md,
    "Output partitioning"), and a few values of those send most rows to a few tasks: TPC-H Q16's
    groups by brand, type and size hashed the 8 sizes its filter keeps only, and one of two tasks
    got 88% of the rows. Any subset of an aggregate's keys keeps each group whole in one task.
    """
    types = [node.schema.field(k).type for k in keys]
    hashed = hash_columns(types)
    if len(hashed) == len(keys):
        return list(keys)
    values = distinct_bound(node, [keys[i] for i in hashed])
    if values is None or values >= SPREAD_VALUES:
        return list(keys)
    return [k for i, k in enumerate(keys) if i not in hashed]
