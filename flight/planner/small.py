"""Small queries run as one task: whether a query's scans are small enough.

Why: every stage a query is cut into costs its tasks' starts, a hand-off of rows between processes
and a DuckDB query of its own, a few milliseconds each, while a second worker at most halves the
work of each stage. When the columns a query reads are estimated small (from the Parquet footers'
row counts), that work is less than what the stages cost: the whole query runs as one task on one
worker, one DuckDB query over its files (TPC-H at SF 0.1, 22 queries: geomean 0.30 -> 0.37 of
DuckDB's time; at SF 1, Q11 0.82 and Q16 0.73 of their time on two workers, while Q13, which reads
73 MB of order comments, took 1.3 times as long as one task). Concurrent small queries take turns
over the workers (``coordinator/run.py``). Decisions only: the footers are read by the providers.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit

import pyarrow as pa

from flight.plan.nodes import ExchangeInputNode, FeedScanNode, InputCallNode, LimitNode, Node
from flight.plan.relnodes import AggregateNode, JoinNode, SortNode, UnionNode
from flight.planner.cost import row_width
from flight.planner.groups import group_bound
from flight.planner.keysets import estimated_rows
from flight.planner.prune import scan_columns
from flight.planner.reuse import repeated_subtrees
from flight.planner.stages import QueryPlan, StageSpec
from flight.sources.providers import FileListProvider

__all__ = [
    "CROWDED_MOVES_BYTES", "ONE_TASK_SOURCES", "WORKER_SOURCES", "crowded_moves", "crowded_note", "hands_off", "many_groups", "one_host",
    "reads_twice", "scan_bytes", "small_note", "small_query", "source_count", "too_many_sources",
]


def scan_bytes(root: Node) -> float | None:
    """The bytes the scans of ``root`` are estimated to read (their rows times the width of the columns
    read), or None when a scan's rows are not known before it runs (a feed discovered as it goes).

    Kept on ``root`` once known (a node never changes once made): the coordinator sizes the plan before it
    asks the planner, which sizes the same plan again (``small_query``). Sizing works out the columns each scan
    keeps (``scan_columns``) without making the pruned plan."""
    return root.remembered("_scan_bytes", lambda: _scan_bytes(root))


def _scan_bytes(root: Node) -> float | None:
    if any(isinstance(node, (InputCallNode, ExchangeInputNode)) for node in root.walk()):
        return None  # rows the client sends while it runs
    total = 0.0
    for node, columns in scan_columns(root):  # the columns pruning keeps, without making the pruned plan
        if not isinstance(node, FeedScanNode):
            continue
        estimate = getattr(node.feed.inner(), "estimated_rows", None)
        rows = estimate() if estimate is not None else None
        if rows is None:
            return None
        total += rows * row_width(pa.schema([node.schema.field(c) for c in columns]))
    return total


def small_query(root: Node, max_tasks: int, limit: int) -> str:
    """Why ``root`` runs as one task (a rewrite note), or "" when it does not: one task was all there was,
    the rule is off (``limit`` 0), a scan's size is not known, or its scans read more than ``limit`` bytes."""
    if max_tasks <= 1 or limit <= 0:
        return ""
    read = scan_bytes(root)
    if read is None or read > limit or too_many_sources(root):
        return ""
    return small_note(read, limit)


def small_note(read: float, limit: int) -> str:
    """The rewrite note of a query run as one task because its scans read ``read`` bytes, at most ``limit``."""
    return (f"the query's scans are estimated to read ~{read / (1 << 20):,.1f} MiB (at most "
            f"{limit / (1 << 20):,.0f} MiB): it runs as one task on one worker")


def one_host(urls: Sequence[str]) -> bool:
    """Whether the workers are several and every URL names the same host: they share one machine's cores,
    so a second one adds no core, only stages (a ``LocalCluster``, a benchmark on one machine).
    Workers on one machine behind different addresses (containers) count as several hosts."""
    return len(urls) > 1 and len({urlsplit(u).hostname for u in urls}) == 1


SPLIT_GROUPS = 500_000
"""A plan that only gathers its tasks' work keeps its split when it aggregates at least this many groups
(estimated): each task's hash table is then a share of one task's."""


def reads_twice(root: Node) -> bool:
    """Whether ``root`` (filters pushed) computes a subplan twice (a CTE or a view that aggregates or joins, used
    twice): split, it is one stage read twice; one task would compute it once per use (TPC-H Q15 took 1.28
    times as long). A table scanned twice (filtered, projected) costs the same either way."""
    repeated = repeated_subtrees(root)
    return any(isinstance(d, (AggregateNode, JoinNode)) for n in root.walk() if id(n) in repeated for d in n.walk())


def many_groups(root: Node) -> bool:
    """Whether ``root`` aggregates ``SPLIT_GROUPS`` or more groups, or an unknown number (estimated, and no more
    than what its keys can hold: ``flight.planner.groups``)."""
    for node in root.walk():
        if isinstance(node, AggregateNode) and node.keys:
            known = [g for g in (estimated_rows(node), group_bound(node)) if g is not None]
            if not known or min(known) >= SPLIT_GROUPS:
                return True
    return False


def hands_off(plan: QueryPlan) -> bool:
    """Whether rows cross between workers mid-plan: a stage's output hashed or broadcast to another, not only
    gathered to the head. A plan that only gathers co-located work splits its joins and aggregates for free
    (Q18's 1.5 million groups, halved per task, took 1.42 times as long as one task)."""
    return any(s.output_mode in ("hash", "broadcast", "round_robin") for s in plan.stages)


ONE_TASK_SOURCES = 32
"""Most sources (scans, unions, limits: each holds a thread while it waits) a query planned as one task may
have: half a worker's default 64 source threads, so two such queries run at once. A text that repeats a
large subplan many times (TPC-DS q14's ROLLUP over a union of three channels: 308) keeps its split, where
each repeated subplan is one stage every use reads."""


WORKER_SOURCES = 64
"""A worker's default source threads (``WorkerConfig.source_threads``): the most a one-task plan may hold."""

CROWDED_MOVES_BYTES = 256 << 20
"""A crowded plan (over ``ONE_TASK_SOURCES``: every subplan it repeats is a stage of its own, so that no task
holds too many source threads) is cut again without that, holding up to ``WORKER_SOURCES`` a task, when those
stages would move more than this (estimated). TPC-DS q04 repeats a CTE six times: its repeated joins, each a
stage, shipped ~1.5 GB of joined rows to their uses (4.2 s at SF 1 on one host; cut again, 1.5 s; since its uses
stopped reading each other's keys, ``flight.planner.keysets``, it is not crowded at all); q64 and q67
alike (1.24 -> 0.45 s, 2.05 -> 1.13 s). Crowded plans whose stages move little (q05, q77, q80: a union branch
apart) keep their stages: computed in place they took 1.6 to 2.3 times as long."""


def source_count(root: Node) -> int:
    """The source threads ``root`` as one task would hold (as ``flight.engine.acero.pipeline.source_threads``
    counts them: one per scan, input, limit, union and top-k)."""
    blocking = (FeedScanNode, ExchangeInputNode, InputCallNode, LimitNode, UnionNode)
    return sum(1 for n in root.walk() if isinstance(n, blocking) or (isinstance(n, SortNode) and n.fetch > 0))


def scans_split(node: Node, cut_file_rows: int) -> bool:
    """Whether some scan under ``node`` is read by more than one task of a fleet of several (as the cutter's ``scan``
    counts them: a feed of several partitions, or as many as there are tasks, or one file it may cut)."""
    for n in node.walk():
        if isinstance(n, FeedScanNode):
            provider, declared = n.feed.inner(), n.feed.inner().partitions()
            if provider.shared or declared is None or declared > 1 or (isinstance(provider, FileListProvider) and provider.may_cut(cut_file_rows)):
                return True
    return False


def too_many_sources(root: Node) -> bool:
    """Whether ``root`` as one task would hold more than ``ONE_TASK_SOURCES`` source threads (``source_count``)."""
    return source_count(root) > ONE_TASK_SOURCES


def crowded_moves(root: Node, stages: Sequence[StageSpec]) -> float | None:
    """For a crowded ``root`` that one worker's source threads can hold, the bytes its ``stages`` move between them
    (estimated) when that is over ``CROWDED_MOVES_BYTES``: it is cut again without a stage per repeat; else None."""
    if source_count(root) > WORKER_SOURCES:
        return None
    moved = sum(s.output_bytes or 0.0 for s in stages if s.output_mode != "head")
    return moved if moved > CROWDED_MOVES_BYTES else None


def crowded_note(moved: float) -> str:
    """What the plan's rewrites say when ``crowded_moves`` is not None."""
    return (f"a stage per repeated subplan would move ~{moved / (1 << 20):,.0f} MiB between stages: each is computed where "
            f"it is used instead, a task holding up to {WORKER_SOURCES} source threads (small.CROWDED_MOVES_BYTES)")
