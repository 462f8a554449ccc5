"""Row groups a scan's filter can keep, read from the footers at planning, so that a cut file's tasks share what
is read.

Why: a large file is cut into one run of consecutive row groups per task (``FileListProvider``,
``ExecOptions.cut_file_rows``), as even in rows as the row groups allow. A fact table written in date order
(TPC-DS ``catalog_sales``, ``inventory``) filtered to some months keeps a band of consecutive row groups, all in
one task's run: that task reads them while the others skip all of theirs. Cut over only the row groups the filter
can keep (``KeptRowGroups``), each task reads an even share of what is read. Trino prunes a scan's splits at the
coordinator the same way, with the filters its build sides send: ``flight.planner.adaptive`` runs a small
filtered build side first when the scan's file is in its key's order, and the key range its rows span becomes
such a filter (``key_filters``).

A row group is left out only when a column the filter bounds (``column <op> literal`` conjuncts) has a footer
range wholly outside the bound: then every row of it fails the filter (a null fails each comparison). Only
integer and date columns are compared: their values are exact on the planner's number line (``as_number``).
Decisions only: the footers are read by the provider (``FileListProvider.key_ranges``, remembered with them).
"""

from __future__ import annotations

import pyarrow as pa

from flight.plan.expr import Expr
from flight.plan.nodes import FeedScanNode, FilterNode, Node, ProjectNode
from flight.plan.relnodes import JoinNode
from flight.planner.colocate import EXACT
from flight.planner.optimize import conjunction
from flight.planner.ranges import column_bounds
from flight.planner.stages import FeedPlan, StageSpec
from flight.sources.feed import WorkUnitFeed
from flight.sources.footers import parquet_metadata
from flight.sources.providers import FileListProvider

__all__ = ["CLUSTERED", "clustered", "cut_feeds", "kept_row_groups", "prune_runs"]

CLUSTERED = 8
"""A column is in the file's order (``clustered``) when its row groups' ranges are on average at most this many
times narrower than the whole range: a bound on it then keeps a band of row groups, not a share of each."""


def clustered(provider: FileListProvider, column: str) -> bool:
    """Whether ``column``'s row groups each span a narrow part of its range (the rows are written in its order)."""
    ranges = provider.key_ranges(column)
    groups = [g for r in ranges or [] for g in r.groups]
    if len(groups) < 2:
        return False
    low, high = min(g[0] for g in groups), max(g[1] for g in groups)
    return high > low and sum(g[1] - g[0] for g in groups) / len(groups) * CLUSTERED <= high - low


def kept_row_groups(provider: FileListProvider, scan: FeedScanNode, predicates: list[Expr]) -> list[tuple[str, list[int]]] | None:
    """Per file, the row groups one of ``predicates`` (each a filter of ``scan``'s rows) may keep; None when one
    bounds no column the footers can compare, or every row group may be kept."""
    keep: dict[str, set[int]] = {}
    bounded = False
    for predicate in predicates:
        mine: dict[str, set[int]] | None = None  # what this filter keeps: every bounded column's groups agree
        for column, (lo, hi) in column_bounds(predicate, scan.schema).items():
            if column not in scan.schema.names:
                continue
            kind = scan.schema.field(column).type
            ranges = provider.key_ranges(column) if pa.types.is_integer(kind) or pa.types.is_date(kind) else None
            if not ranges or any(max(abs(r.low), abs(r.high)) > EXACT for r in ranges):
                continue
            bounded = True
            fits = {r.path: {g for g, (a, b, _) in enumerate(r.groups) if b >= lo and a <= hi} for r in ranges}
            mine = fits if mine is None else {p: mine[p] & fits[p] for p in fits}
        if mine is None:
            return None  # this filter keeps any row group: so does their union
        for path, groups in mine.items():
            keep.setdefault(path, set()).update(groups)
    if not bounded:
        return None
    kept = [(path, sorted(keep.get(path, ()))) for path in provider.paths]
    if all(len(groups) == _groups(path) for path, groups in kept) or not any(groups for _, groups in kept):
        return None  # all kept: the plain runs; none: the plain runs too, whose readers skip every row group (a task
        # with no unit at all would give a global aggregate no partial row)
    return [(path, groups) for path, groups in kept if groups]


def _groups(path: str) -> int:
    return parquet_metadata(path).num_row_groups


def cut_feeds(stages: list[StageSpec]) -> set[str]:
    """The ids of the feeds ``stages`` cut into runs of row groups (not those a co-located join groups by key)."""
    return {plan.feed.feed_id for stage in stages for plan in stage.feeds
            if not plan.shared and isinstance(provider := plan.feed.inner(), FileListProvider) and provider.cuts(plan.partitions)}


def prune_runs(stages: list[StageSpec], rewrites: list[str]) -> None:
    """Each stage's feeds that cut files into runs (``FileListProvider.cuts``), read only under filters, made to
    cut only the row groups those filters can keep (module doc); each change said in ``rewrites``."""
    for stage in stages:
        for i, plan in enumerate(stage.feeds):
            provider = plan.feed.inner()
            if plan.shared or not isinstance(provider, FileListProvider) or not provider.cuts(plan.partitions):
                continue
            found = _scans(stage, plan.feed.feed_id)
            if found is None:
                continue
            scan, predicates = found
            kept = kept_row_groups(provider, scan, predicates)
            if kept is None:
                continue
            total = sum(_groups(p) for p in provider.paths)
            stage.feeds[i] = FeedPlan(WorkUnitFeed(provider.kept(kept), plan.feed.feed_id), plan.partitions)
            rewrites.append(f"scan of {plan.feed.feed_id}: its filter keeps at most {sum(len(g) for _, g in kept)} of its {total} "
                            f"row groups (footers); only they are cut into runs, one per task")


def _scans(stage: StageSpec, feed_id: str) -> tuple[FeedScanNode, list[Expr]] | None:
    """The scan of ``feed_id`` in ``stage`` and, for each place it is read, the conjunction of the filters every row
    it reads there must pass (``_applying``); None when a place reads it with none."""
    scan: FeedScanNode | None = None
    predicates: list[Expr] = []
    for root in [stage.root, *(stage.task_roots or [])]:
        stack: list[tuple[Node, tuple[Expr, ...]]] = [(root, ())]
        while stack:
            node, above = stack.pop()
            if isinstance(node, FeedScanNode) and node.feed.feed_id == feed_id:
                if not above:
                    return None
                scan = node
                predicates.append(conjunction(above))
            stack.extend((child, _applying(node, child, above)) for child in node.children())
    return None if scan is None else (scan, predicates)


def _applying(node: Node, child: Node, above: tuple[Expr, ...]) -> tuple[Expr, ...]:
    """Of the filters every row of ``node`` passed (``above``, and ``node``'s own), those every row of ``child``
    that reaches ``node``'s output must pass: a filter's input, a projection's input (for the columns it passes
    unchanged), an inner join's sides and a semi or anti join's left side (for their own columns); none below
    any other operator (an aggregate, a limit, an outer join: rows a filter above drops may still count)."""
    if isinstance(node, FilterNode):
        return (*above, node.predicate)
    if isinstance(node, ProjectNode):
        passed = {name for name, expr in node.exprs if expr.column_name() == name}
        return tuple(p for p in above if p.referenced_fields() <= passed)
    if isinstance(node, JoinNode) and (node.join_type == "inner" or (node.join_type in ("left semi", "left anti") and child is node.left)):
        names = set(child.schema.names)
        if child is not node.left:  # a name both sides have is the left one's above the join (the right one's renamed)
            names -= set(node.left.schema.names)
        return tuple(p for p in above if p.referenced_fields() <= names)
    return ()
