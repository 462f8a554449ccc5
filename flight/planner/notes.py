"""What explain() says the planner did: each stage's notes, and each filter the optimizer moved (and the
small facts about a plan the cutter's notes and choices read)."""

from __future__ import annotations

from flight.plan.nodes import FeedScanNode, FilterNode, Node
from flight.plan.relnodes import JoinNode
from flight.planner.cost import BROADCAST_ALWAYS_BYTES, broadcast_copies
from flight.planner.frag import Frag, frag_bytes
from flight.planner.optimize import conjuncts
from flight.planner.stages import StageSpec

__all__ = ["describe", "join_text", "moved_filters", "repeatable", "strategy_text", "why_broadcast", "why_shuffle"]


def moved_filters(stages: list[StageSpec]) -> list[str]:
    """One line per filter the optimizer moved or derived: what it reads, why it is there, where that is."""
    lines = []
    for stage in stages:
        for node in stage.root.walk():
            if isinstance(node, FilterNode) and any(node.origins):
                below = node.input
                where = f"the scan of {below.feed.feed_id}" if isinstance(below, FeedScanNode) else below.label().split("[")[0]
                terms = conjuncts(node.predicate)
                if len(terms) != len(node.origins):
                    continue
                read: dict[str, set[str]] = {}
                for term, origin in zip(terms, node.origins):
                    if origin:
                        read.setdefault(origin, set()).update(term.referenced_fields())
                for origin, columns in read.items():
                    lines.append(f"stage {stage.stage_id}: filter on {sorted(columns)} {origin}; now directly above {where}")
    return lines


def describe(stage: StageSpec) -> None:
    if stage.shared_feeds:
        stage.notes.append(f"shared-queue feed: up to {stage.max_tasks} task(s), the count decided from discovery at execution")
    elif stage.feeds:
        stage.notes.append(f"{stage.task_count} task(s): feed partitions {[f.partitions for f in stage.feeds]}")
    if stage.output_mode not in ("head", "gather"):
        keys = f" on {stage.output_keys}" if stage.output_keys else ""
        stage.notes.append(f"output: {stage.output_mode}{keys} to stage{'s' if stage.shared else ''} {', '.join(map(str, stage.consumers))}")


def join_text(node: JoinNode) -> str:
    """A join as the planner's rewrite notes name it: ``HashJoin[inner, a=b]``."""
    keys = ", ".join(f"{a}={b}" for a, b in zip(node.left_keys, node.right_keys))
    return f"HashJoin[{node.join_type}, {keys}]"


def repeatable(node: Node) -> bool:
    """Whether reading ``node`` again in the same query gives the same rows: every feed it scans is."""
    return all(n.feed.inner().repeatable for n in node.walk() if isinstance(n, FeedScanNode))


def strategy_text(node: JoinNode, strategy: str, build: str, probe: str, tasks: int, why: str) -> str:
    """A join's way across workers with the estimates that chose it, for ``QueryPlan.rewrites``: ``build`` and
    ``probe`` are ``frag.size_text`` of each side; ``explain(analyze=True)`` shows each stage's actual output."""
    return f"{join_text(node)}: {strategy} into {tasks} task(s), build side {build}, probe side {probe}: {why}"


def why_broadcast(small: Frag, probe: Frag) -> str:
    """Why ``_Planner.may_broadcast`` (``flight.planner.cut``) said yes, for its rewrite note."""
    other = frag_bytes(probe)
    copies = broadcast_copies(frag_bytes(small) or 0.0, probe.tasks)
    if copies <= (float("inf") if other is None else other):
        return f"its copies (~{copies / (1 << 20):,.1f} MiB) move no more than shuffling the probe side"
    if copies <= BROADCAST_ALWAYS_BYTES:
        return f"its copies (~{copies / (1 << 20):,.1f} MiB) are too few bytes for a stage of their own"
    return "each task will read its files in place (replicated: nothing crosses the network)"


def why_shuffle(build: Frag, probe: Frag, limit: int) -> str:
    """Why neither side was broadcast, for the shuffle's rewrite note."""
    size, other = frag_bytes(build), frag_bytes(probe)
    if size is None:
        return "the build side's size is unknown"
    if size > limit:
        return f"the build side is over broadcast_bytes ({limit / (1 << 20):,.0f} MiB)"
    if other is not None and size > other:
        return "the build side is the larger"
    return (f"copies of the build side to {probe.tasks} task(s) (~{broadcast_copies(size, probe.tasks) / (1 << 20):,.1f} MiB) would "
            "move more than shuffling both sides, or the join type keeps the build side's unmatched rows")
