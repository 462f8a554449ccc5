"""Small broadcasts into a stage that scans files become scans that every task of that stage reads.

Why: a co-located stage (``flight.planner.colocate``) cannot start its query before every stage it
reads has finished, and each of those is a round of task starts, a scan and a broadcast. TPC-H Q5
broadcast customer (150,000 rows) and supplier ⋈ nation ⋈ region (two stages in a chain) into its
lineitem ⋈ orders stage: 73 ms of a 206 ms query went by before that stage's query began, where
reading those tables took each task a few milliseconds. Read in the stage itself, they are also
joined in one query, which the engine orders by their true sizes (Q5's customers are cut to one
region through the supplier's nation).

A broadcast producer qualifies when it only filters, projects and joins Parquet file lists (and
broadcasts that qualify in turn) and its files hold at most ``max_rows`` rows in all: every task
reads all of them, so the cost grows with the task count, where a broadcast's grows with the
bytes moved. The producer's feeds become ``FileGroups`` with every file in every group, task t
taking group t; the stages left are numbered again from 0.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace

from flight.plan.nodes import FeedScanNode, FilterNode, Node, ProjectNode
from flight.plan.relnodes import JoinNode, ShuffleReadNode, UnionNode
from flight.planner.stages import FeedPlan, StageSpec
from flight.sources.feed import WorkUnitFeed
from flight.sources.providers import FileListProvider

__all__ = ["canonical_reads", "replicable", "replicate_small_broadcasts", "substitute_reads", "without_stages"]


def replicate_small_broadcasts(stages: list[StageSpec], max_rows: float, rewrites: list[str], *, fixed: bool = True) -> list[StageSpec]:
    """``stages`` with each qualifying broadcast into a stage that scans files read by that stage instead.

    ``fixed=False``: only into co-located stages (whose task count is fixed already), for callers
    that run ``StageSpec.root`` as it is in every task (``plan_query(colocate=False)``)."""
    by_id = {s.stage_id: s for s in stages}
    gone: set[int] = set()
    for stage in stages:
        if stage.stage_id in gone:
            continue
        if stage.task_roots is None and (not fixed or not stage.feeds or stage.sized_at_execution or _rows(stage, by_id, max_rows) is not None):
            continue  # reads no files, is sized at execution, or is itself read in place with what it reads
        tasks = len(stage.task_roots) if stage.task_roots is not None else stage.task_count
        inline: dict[int, Node] = {}
        for read in stage.reads:
            producer = by_id[read.stage_id]
            rows = _rows(producer, by_id, max_rows) if read.mode == "broadcast" else None
            if rows is None:
                continue
            root, feeds, ids = _inlined(producer, by_id)
            inline[read.stage_id] = root
            stage.feeds.extend(_replicated_feed(f, tasks) for f in feeds)
            gone.update(ids)
            rewrites.append(
                f"stage {read.stage_id} (a broadcast of ~{rows:,.0f} rows of files) is read by every task of "
                f"{'co-located ' if stage.task_roots is not None else ''}stage {stage.stage_id} instead: it starts without waiting for it"
            )
        if inline:
            if stage.task_roots is None:  # a leaf stage: its count is fixed now (task t reads partition t of each copy)
                stage.task_roots = [stage.root] * tasks
                stage.notes.append(f"{tasks} tasks (fixed count: each reads every file of the stages inlined into it)")
            stage.root = substitute_reads(stage.root, inline)
            stage.task_roots = _each_once(stage.task_roots, functools.partial(substitute_reads, inline=inline))
            stage.reads = [r for r in stage.reads if r.stage_id not in inline]
    if not gone:
        return stages
    kept = [s for s in stages if s.stage_id not in gone]
    return _renumbered(kept)


def replicable(root: Node, feeds: list[FeedPlan], reads: list[ShuffleReadNode], max_rows: float) -> bool:
    """Whether a broadcast of ``root`` could be read whole by each task of a co-located stage
    (per-row operators over at most ``max_rows`` rows of Parquet files, reading no stage). The cutter
    then makes each use of it a stage of its own rather than one read twice: a stage read twice
    stays a stage, where two can each be inlined (TPC-H Q2's region, 50 ms of a stage's wait)."""
    return not reads and _replicable_rows(root, feeds, reads, max_rows) is not None


def _rows(stage: StageSpec, by_id: dict[int, StageSpec], max_rows: float) -> float | None:
    """The rows ``stage`` and the broadcasts it reads scan, if it may be inlined and they are few enough."""
    if stage.output_mode != "broadcast" or stage.task_roots is not None or stage.shared:
        return None  # a shared stage (flight.planner.reuse) has other readers: it stays
    return _replicable_rows(stage.root, stage.feeds, stage.reads, max_rows, by_id)


def canonical_reads(node: Node, reads: list[ShuffleReadNode], copies: dict[int, int]) -> tuple[Node, list[int]]:
    """``node`` with each read of a small broadcast's copy (``copies``: stage -> the first stage equal to it) reading
    the first instead, for a fingerprint that finds two uses' equal stages equal; and the copies' ids.

    Why: a small broadcast is a stage per use, so that each can be read in place (``replicable``); a stage above it
    read a copy of its own in each use, and a CTE's stages cut again in a use that differs above them (TPC-DS
    q57's first use, a filter pushed into it) were computed once more."""
    swap = {r.stage_id: replace(r, stage_id=copies[r.stage_id]) for r in reads if copies.get(r.stage_id, r.stage_id) != r.stage_id}
    return (substitute_reads(node, dict(swap)) if swap else node), list(swap)


def without_stages(stages: list[StageSpec], ids: set[int]) -> list[StageSpec]:
    """``stages`` without those of ``ids`` that no stage reads (a copy a use found made may still be read by another
    use's stage), numbered again."""
    read = {r.stage_id for s in stages for r in s.reads}
    gone = ids - read
    return _renumbered([s for s in stages if s.stage_id not in gone]) if gone else stages


def _replicable_rows(
    root: Node, feeds: list[FeedPlan], reads: list[ShuffleReadNode], max_rows: float, by_id: dict[int, StageSpec] | None = None
) -> float | None:
    """The rows the operators ``root`` (over ``feeds``, reading ``reads``) scan, when every task of a
    co-located stage may compute them whole: only per-row operators over Parquet file lists, at most
    ``max_rows`` rows, reading only broadcasts (that qualify in turn, when ``by_id`` has them)."""
    if not feeds or any(not _per_row(n) for n in root.walk()):
        return None
    total = 0.0
    for f in feeds:
        provider = f.feed.inner()
        rows = provider.estimated_rows() if isinstance(provider, FileListProvider) and not f.shared else None
        if rows is None:
            return None
        total += rows
    for read in reads:
        if read.mode != "broadcast":
            return None
        if by_id is not None:
            inner = _rows(by_id[read.stage_id], by_id, max_rows)
            if inner is None:
                return None
            total += inner
    return total if total <= max_rows else None


def _per_row(node: Node) -> bool:
    """Operators whose output over all units is the union of their outputs over parts of them
    (a join's other side being read whole in each task)."""
    if isinstance(node, JoinNode):
        return node.join_type in ("inner", "left semi", "left anti", "left outer")
    return isinstance(node, (FeedScanNode, FilterNode, ProjectNode, ShuffleReadNode))


def _inlined(stage: StageSpec, by_id: dict[int, StageSpec]) -> tuple[Node, list[FeedPlan], list[int]]:
    """``stage``'s operators with the broadcasts it reads inlined; every feed they scan; the stages inlined."""
    feeds, ids, inline = list(stage.feeds), [stage.stage_id], {}
    for read in stage.reads:
        root, more, more_ids = _inlined(by_id[read.stage_id], by_id)
        inline[read.stage_id] = root
        feeds += more
        ids += more_ids
    return substitute_reads(stage.root, inline), feeds, ids


def _replicated_feed(plan: FeedPlan, tasks: int) -> FeedPlan:
    """The feed (a ``FileListProvider``'s) with all its files in each of ``tasks`` partitions."""
    provider = plan.feed.inner()
    assert isinstance(provider, FileListProvider)  # _replicable_rows checked
    return FeedPlan(WorkUnitFeed(provider.grouped([provider.paths] * tasks), plan.feed.feed_id), tasks)


def _with_children(node: Node, change: Callable[[Node], Node]) -> Node:
    """``node`` with ``change`` applied to each child (the same object when none changed)."""
    changes: dict[str, object] = {}
    for name in ("input", "left", "right"):
        child = getattr(node, name, None)
        if isinstance(child, Node):
            new = change(child)
            if new is not child:
                changes[name] = new
    if isinstance(node, UnionNode):
        inputs = [change(c) for c in node.inputs]
        if any(a is not b for a, b in zip(inputs, node.inputs)):
            changes["inputs"] = inputs
    if isinstance(node, JoinNode) and any(
        isinstance(getattr(node, side), ShuffleReadNode) and not isinstance(changes[side], ShuffleReadNode) for side in changes
    ):
        changes["strategy"] = node.strategy.replace("broadcast", "replicated")
    return replace(node, **changes) if changes else node  # type: ignore[type-var]


def substitute_reads(node: Node, inline: dict[int, Node]) -> Node:
    """``node`` with each read of a stage in ``inline`` replaced by that stage's operators."""
    if isinstance(node, ShuffleReadNode):
        return inline.get(node.stage_id, node)
    return _with_children(node, lambda child: substitute_reads(child, inline))


def _each_once(roots: list[Node], change: Callable[[Node], Node]) -> list[Node]:
    """``change`` of each root, made once for roots the tasks share (``[root] * tasks``), and shared in turn."""
    made: dict[int, Node] = {}
    return [made[id(r)] if id(r) in made else made.setdefault(id(r), change(r)) for r in roots]


def _renumbered(stages: list[StageSpec]) -> list[StageSpec]:
    """``stages`` numbered 0, 1, … in their order, their reads following."""
    new = {s.stage_id: i for i, s in enumerate(stages)}
    if all(k == v for k, v in new.items()):
        return stages

    def renumber(node: Node) -> Node:
        if isinstance(node, ShuffleReadNode):
            return replace(node, stage_id=new[node.stage_id])
        return _with_children(node, renumber)

    for s in stages:
        s.stage_id = new[s.stage_id]
        s.root = renumber(s.root)
        if s.task_roots is not None:
            s.task_roots = _each_once(s.task_roots, renumber)
        s.reads = [replace(r, stage_id=new[r.stage_id]) for r in s.reads]
    return stages
