"""Where a co-located join runs: both sides fresh scans, or one fresh scan joining a fragment
that is co-located already (``flight.planner.colocate`` holds the key-range decisions).

Why apart from the cutter: a chain of joins on one clustered key (TPC-H Q21's lineitem joined
with orders, then semi- and anti-joined with lineitem twice more, all by order key) should stay
in one stage, each task reading its key range of every scan, instead of shuffling millions of
rows by a key the files already cluster. The second and later joins reuse the first one's
boundaries, so a scan joins the stage only when its files split well at them.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol

import pyarrow as pa

from flight.plan.expr import col
from flight.plan.nodes import FeedScanNode, FilterNode, Node, ProjectNode
from flight.plan.relnodes import AggregateNode, JoinNode
from flight.planner.colocate import (
    EXACT,
    KEPT_UNMATCHED,
    KeyRanges,
    key_scan,
    range_files,
    rereads_pay,
    split_points,
    straddled,
)
from flight.planner.eager import map_children
from flight.planner.frag import Frag, smaller
from flight.planner.notes import join_text
from flight.planner.reuse import repeated_subtrees
from flight.planner.stages import FeedPlan
from flight.sources.feed import WorkUnitFeed
from flight.sources.statistics import FileRange


class Planner(Protocol):
    """What these decisions need of the cutter (``flight.planner.cut``): its settings, the rewrites
    it reports, and how it swaps a join's sides."""

    colocate: bool
    max_tasks: int
    rewrites: list[str]
    repeated: set[int]

    def swapped(self, node: JoinNode, left: Node, right: Node, strategy: str, lf: Frag, rf: Frag) -> Node: ...

__all__ = [
    "colocated", "could_colocate", "grouped_below", "grouped_in_place", "joined_into_ranges", "rotate_joins", "rotated_for_colocation",
    "split_for_groups",
]

_Side = tuple[Frag, FeedScanNode, str, list[FileRange]]


def _fresh_side(f: Frag, key: str, keeps: bool) -> _Side | None:
    """``f`` as a scan a key range can split: one list of Parquet files, nothing shuffled into it,
    the join key an integer column its footers bound (and count no nulls in, when its unmatched
    rows come out: no key range reads a null key)."""
    if not f.leaf or len(f.feeds) != 1 or f.feeds[0].shared or f.ranges or any(r.mode != "broadcast" for r in f.reads):
        return None
    traced = key_scan(f.node, key)
    if traced is None or traced[0].feed.feed_id != f.feeds[0].feed.feed_id or traced[0].reader != "parquet":
        return None
    scan, column = traced
    if not pa.types.is_integer(scan.schema.field(column).type):
        return None
    key_ranges = getattr(f.feeds[0].feed.inner(), "key_ranges", None)
    ranges = key_ranges(column) if key_ranges is not None else None
    if not ranges or any(max(abs(r.low), abs(r.high)) > EXACT for r in ranges):
        return None
    if keeps and any(r.nulls for r in ranges):
        return None
    return f, scan, column, ranges


def _placed_key(f: Frag, key: str, keeps: bool) -> KeyRanges | None:
    """The key ranges of co-located fragment ``f`` that ``key`` comes from unchanged, or None."""
    traced = key_scan(f.node, key)
    if traced is None or traced[0].feed.feed_id not in f.ranges:
        return None
    scan, column = traced
    r = f.ranges[scan.feed.feed_id]
    if r.column != column:
        return None
    if keeps:  # its null-keyed rows must come out, and a range filter drops them
        key_ranges = getattr(scan.feed.inner(), "key_ranges", None)
        found = key_ranges(column) if key_ranges is not None else None
        if not found or any(x.nulls for x in found):
            return None
    return r


def _split(sides: Sequence[_Side], points: list[int], tasks: int) -> tuple[list[FeedPlan], dict[str, KeyRanges]] | None:
    """Each side's feed cut at ``points``, or None when a side's keys spread over every file
    (reading each file's share would read more than a shuffle moves)."""
    feeds: list[FeedPlan] = []
    bounds: dict[str, KeyRanges] = {}
    if not rereads_pay([ranges for _, _, _, ranges in sides], points):
        return None
    for f, scan, column, ranges in sides:
        feed = f.feeds[0].feed
        grouped = feed.inner().grouped(range_files(ranges, points))  # type: ignore[attr-defined]  # key_ranges had it
        feeds.append(FeedPlan(WorkUnitFeed(grouped, feed.feed_id), tasks))
        bounds[feed.feed_id] = KeyRanges(column, scan.schema.field(column).type, points, straddled(ranges, points))
    return feeds, bounds


def _joined(planner: Planner, node: JoinNode, left: Frag, right: Frag, swappable: bool) -> Node:
    if swappable and smaller(left, right):
        return planner.swapped(node, left.node, right.node, "co-located", left, right)
    return JoinNode(left.node, right.node, node.left_keys, node.right_keys, node.join_type, node.right_suffix, "co-located", node.filter)


def colocated(planner: Planner, node: JoinNode, left: Frag, right: Frag, rows: float | None, swappable: bool) -> Frag | None:
    """The join in place, each task reading one range of the first join key on both sides,
    when each side scans one list of Parquet files whose footers bound that key."""
    if not planner.colocate or planner.max_tasks < 2 or node.join_type not in KEPT_UNMATCHED:
        return None
    kept = KEPT_UNMATCHED[node.join_type]
    sides = [_fresh_side(left, node.left_keys[0], "left" in kept), _fresh_side(right, node.right_keys[0], "right" in kept)]
    if sides[0] is None or sides[1] is None:
        return None
    both = [sides[0], sides[1]]
    points = split_points(both[0][3] + both[1][3], planner.max_tasks)
    if points is None:
        return None
    tasks = len(points) + 1
    split = _split(both, points, tasks)
    if split is None:
        return None
    feeds, bounds = split
    planner.rewrites.append(
        f"{join_text(node)}: co-located, nothing shuffled: the Parquet footers bound {both[0][2]!r} and "
        f"{both[1][2]!r}, so task t reads key range t of both sides (boundaries {points})"
    )
    joined = _joined(planner, node, left, right, swappable)
    return Frag(joined, tasks, rows, feeds, left.reads + right.reads, leaf=True, ranges=bounds)


def joined_into_ranges(planner: Planner, node: JoinNode, left: Frag, right: Frag, rows: float | None, swappable: bool) -> Frag | None:
    """The join in a co-located fragment's tasks, when one side is that fragment with the join key
    one of its range columns and the other a fresh scan its boundaries split well: the scan
    joins the stage (task t reads its key range t) and nothing is shuffled."""
    if not planner.colocate or node.join_type not in KEPT_UNMATCHED:
        return None
    kept = KEPT_UNMATCHED[node.join_type]
    if left.ranges and right.ranges:
        return _merged(planner, node, left, right, rows, swappable)
    pairs = ((left, right, node.left_keys[0], node.right_keys[0], "left", "right"),
             (right, left, node.right_keys[0], node.left_keys[0], "right", "left"))
    for placed, fresh, placed_key, fresh_key, placed_name, fresh_name in pairs:
        if not placed.ranges or fresh.ranges:
            continue
        r = _placed_key(placed, placed_key, placed_name in kept)
        side = _fresh_side(fresh, fresh_key, fresh_name in kept) if r is not None else None
        if r is None or side is None:
            continue
        split = _split([side], r.points, placed.tasks)
        if split is None:
            continue
        feeds, bounds = split
        planner.rewrites.append(
            f"{join_text(node)}: co-located, nothing shuffled: {side[2]!r} joins the stage already split by "
            f"{r.column!r}, task t reading key range t (boundaries {r.points})"
        )
        joined = _joined(planner, node, left, right, swappable)
        return Frag(joined, placed.tasks, rows, placed.feeds + feeds, left.reads + right.reads,
                    leaf=True, ranges={**placed.ranges, **bounds})
    return None


def _merged(planner: Planner, node: JoinNode, left: Frag, right: Frag, rows: float | None, swappable: bool) -> Frag | None:
    """Two co-located fragments split at the same boundaries, joined on a range column of each:
    key range t of both is in task t, so the join runs there (one stage, nothing moved)."""
    kept = KEPT_UNMATCHED[node.join_type]
    a = _placed_key(left, node.left_keys[0], "left" in kept)
    b = _placed_key(right, node.right_keys[0], "right" in kept)
    if a is None or b is None or a.points != b.points or left.tasks != right.tasks or set(left.ranges) & set(right.ranges):
        return None
    planner.rewrites.append(
        f"{join_text(node)}: co-located, nothing shuffled: both sides are split by {a.column!r} and "
        f"{b.column!r} at the same boundaries {a.points}, so task t joins key range t of both"
    )
    joined = _joined(planner, node, left, right, swappable)
    return Frag(joined, left.tasks, rows, left.feeds + right.feeds, left.reads + right.reads,
                leaf=True, ranges={**left.ranges, **right.ranges})


def grouped_in_place(f: Frag, keys: Sequence[str]) -> KeyRanges | None:
    """The key ranges that already put every group of ``keys`` in one task of co-located fragment
    ``f`` (a key is one of its range columns, whose footers count no nulls: a null group could
    otherwise be in several tasks), or None."""
    if not f.ranges:
        return None
    for key in keys:
        r = _placed_key(f, key, True)
        if r is not None:
            return r
    return None



def split_for_groups(planner: Planner, f: Frag, keys: Sequence[str]) -> Frag | None:
    """Fresh scan ``f`` split into key ranges of a group key its footers bound (and count no nulls
    in), so that an aggregate over it runs whole in each task: no partial aggregate, no shuffle
    (TPC-H Q18's lineitem grouped by order key: 1.5 million groups, nearly as many rows as a
    shuffle of partial aggregates moves). A later join on that key can then join the stage too."""
    if not planner.colocate or planner.max_tasks < 2:
        return None
    for key in keys:
        side = _fresh_side(f, key, True)
        points = split_points(side[3], planner.max_tasks) if side is not None else None
        if side is None or points is None:
            continue
        split = _split([side], points, len(points) + 1)
        if split is None:
            continue
        feeds, bounds = split
        planner.rewrites.append(
            f"the scan of {side[2]!r} is split into key ranges at {points} (its Parquet footers bound it), "
            f"so the aggregate by {list(keys)} runs whole in each task"
        )
        return Frag(f.node, len(points) + 1, f.rows, feeds, f.reads, leaf=True, ranges=bounds)
    return None


def _scan_only(node: Node, repeated: Collection[int] = ()) -> FeedScanNode | None:
    """The one scan of ``node`` when it only filters and projects it, or semi-joins it with a subplan the
    query repeats (``repeated``: made once and broadcast to each use, ``_Planner.shared``), else None."""
    scans: list[FeedScanNode] = []
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, JoinNode) and n.join_type in ("left semi", "left anti") and id(n.right) in repeated:
            stack.append(n.left)
            continue
        if not isinstance(n, (FeedScanNode, FilterNode, ProjectNode)):
            return None
        scans += [n] if isinstance(n, FeedScanNode) else []
        stack.extend(n.children())
    return scans[0] if len(scans) == 1 else None


def _could_colocate(planner: Planner, left: Node, right: Node, lkey: str, rkey: str) -> bool:
    """Whether an inner join of two scan-only subtrees on these keys would be co-located (no side effects)."""
    sides = []
    for node, key in ((left, lkey), (right, rkey)):
        scan = _scan_only(node, planner.repeated)
        if scan is None:
            return False
        side = _fresh_side(Frag(node, planner.max_tasks, None, [FeedPlan(scan.feed, 1)], leaf=True), key, False)
        if side is None:
            return False
        sides.append(side)
    points = split_points(sides[0][3] + sides[1][3], planner.max_tasks)
    return points is not None and rereads_pay([s[3] for s in sides], points)


def could_colocate(planner: Planner, join: JoinNode) -> bool:
    """Whether the cutter would co-locate ``join`` as it is (an inner join of two scan-only sides clustered on its
    first keys): its sides' rows then meet where they are read."""
    return (planner.colocate and planner.max_tasks > 1 and join.join_type == "inner"
            and _could_colocate(planner, join.left, join.right, join.left_keys[0], join.right_keys[0]))


def rotation_sides(node: JoinNode) -> tuple[JoinNode, Node, Node, Node] | None:
    """``node`` as ``(A ⋈ B) ⋈ C`` that may become ``A ⋈ (B ⋈ C)``: (the inner join, A, B, C), or None. Both joins
    inner without a filter of their own, the inner one under a column selection at most, no name twice among the three
    (a suffixed name would move), and ``node``'s keys on the inner join's side all from B."""
    inner = node.left
    if isinstance(inner, ProjectNode) and inner.selects():
        inner = inner.input  # a column selection: the rotated join keeps every column, then selects
    if node.join_type != "inner" or node.filter is not None:
        return None
    if not isinstance(inner, JoinNode) or inner.join_type != "inner" or inner.filter is not None:
        return None
    a, b, c = inner.left, inner.right, node.right
    names = [*a.schema.names, *b.schema.names, *c.schema.names]
    if len(set(names)) != len(names):
        return None
    if all(k in a.schema.names for k in node.left_keys):
        a, b = b, a  # the outer keys come from inner.left
    elif not all(k in b.schema.names for k in node.left_keys):
        return None
    return inner, a, b, c


def rotated(node: JoinNode, inner: JoinNode, a: Node, b: Node, bc: JoinNode) -> Node:
    """``A ⋈ (B ⋈ C)`` made of ``rotation_sides``' parts and the new ``bc``, its columns in ``node``'s order."""
    if b is inner.right:
        joined = JoinNode(a, bc, inner.left_keys, inner.right_keys, "inner", inner.right_suffix)
    else:
        joined = JoinNode(bc, a, inner.left_keys, inner.right_keys, "inner", inner.right_suffix)
    if joined.schema.names == node.schema.names:
        return joined
    return ProjectNode(joined, [(n, col(n)) for n in node.schema.names])


def rotated_for_colocation(planner: Planner, node: JoinNode) -> Node | None:
    """``(A ⋈ B) ⋈ C`` as ``A ⋈ (B ⋈ C)`` (inner joins, the outer keys from B) when B ⋈ C can be
    co-located and A ⋈ B cannot, columns in the query's order; else None.

    Why: the SQL front end orders joins by its own estimates, not by how the files are laid out.
    TPC-H Q10 arrives as (customer ⋈ orders) ⋈ lineitem; cut in that order, the 1.5 million
    returned lines were broadcast into customer's tasks. Rotated, orders ⋈ lineitem runs in place
    by order key and customer (small) is read beside it."""
    if not planner.colocate or planner.max_tasks < 2:
        return None
    sides = rotation_sides(node)
    if sides is None:
        return None
    inner, a, b, c = sides
    if _could_colocate(planner, inner.left, inner.right, inner.left_keys[0], inner.right_keys[0]):
        return None  # A ⋈ B is co-located as it is
    if not _could_colocate(planner, b, c, node.left_keys[0], node.right_keys[0]):
        return None
    bc = JoinNode(b, c, node.left_keys, node.right_keys, "inner", node.right_suffix)
    planner.rewrites.append(
        f"{join_text(node)} over {join_text(inner)}: joins reordered, {join_text(bc)} first, so that it is co-located"
    )
    return rotated(node, inner, a, b, bc)


def rotate_joins(root: Node, planner: Planner) -> Node:
    """``root`` with every rotation ``rotated_for_colocation`` makes, made before the rewrites that read the join
    order: an aggregate's pre-aggregate sinks onto a side that is a join's output (``flight.planner.eager``), and
    TPC-H Q10 reaches it as (customer ⋈ orders) ⋈ lineitem, lineitem a scan beside the join. Rotated first, the
    revenue is summed by ``o_custkey`` in the co-located orders ⋈ lineitem stage (at SF 10 on two hosts, 1.1 million
    joined rows became ~0.4 million) before customer meets it. Only here: the cutter takes the joins as they are."""
    planner.repeated = repeated_subtrees(root)

    def walk(node: Node) -> Node:
        node = map_children(node, walk)
        if isinstance(node, JoinNode):
            rotated = rotated_for_colocation(planner, node)
            if rotated is not None:
                return rotated
        return node

    return walk(root)


def grouped_below(node: Node) -> AggregateNode | None:
    """The (whole, not partial) aggregate right below ``node`` through filters and projections
    that pass columns on under their own names, or None: an aggregate above grouping by a subset
    of its keys can have it shuffled on that subset and then run in place."""
    while True:
        if isinstance(node, AggregateNode):
            return None if node.partial else node
        if isinstance(node, FilterNode):
            node = node.input
        elif isinstance(node, ProjectNode) and node.selects():
            node = node.input
        else:
            return None
