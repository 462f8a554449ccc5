"""From a query to stages and tasks.

Until multi-stage plans exist, a query is one stage: its leaf reads feeds,
its root is what the caller sees. The planner bounds how many tasks the stage
may get (never more than the workers the resolver returns at planning time)
and says how feed partitions map to tasks. A stage fed by a shared-queue feed
gets its final task count at execution, from a ``TaskEstimator`` looking at
the first discovered units; URLs are bound right before execution too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from flight._proto import plan_pb2
from flight.errors import PlanError
from flight.estimate import TaskEstimate
from flight.feed import WorkUnitFeed
from flight.plan.nodes import ExchangeInputNode, FeedScanNode, LimitNode, Node, ValuesNode
from flight.plan.optimize import prune_columns
from flight.protocol import encode_schema

__all__ = ["FeedPlan", "StageSpec", "plan_stage"]


@dataclass(frozen=True)
class FeedPlan:
    feed: WorkUnitFeed
    partitions: int  # discovery streams: 1 for a shared-queue feed
    shared: bool = False


@dataclass
class StageSpec:
    """One stage, ready to be sized and bound to workers."""

    stage_id: int
    root: Node
    max_tasks: int
    feeds: list[FeedPlan]
    final_limit: tuple[int, int] | None = None  # (count, offset) the coordinator applies over all tasks
    notes: list[str] = field(default_factory=list)
    task_count: int = 0  # fixed at planning, or at execution for a shared-queue leaf
    estimate: TaskEstimate | None = None

    @property
    def output_schema(self) -> pa.Schema:
        return self.root.schema

    @property
    def shared_feeds(self) -> list[FeedPlan]:
        return [f for f in self.feeds if f.shared]

    @property
    def sized_at_execution(self) -> bool:
        return bool(self.shared_feeds)

    def assignments(self, task_count: int) -> list[dict[str, list[int]]]:
        """Per task: feed id -> the partitions it consumes (its own task number for a shared feed)."""
        out: list[dict[str, list[int]]] = [{f.feed.feed_id: [] for f in self.feeds} for _ in range(task_count)]
        for f in self.feeds:
            if f.shared:
                for t in range(task_count):
                    out[t][f.feed.feed_id] = [t]
            else:
                for p in range(f.partitions):
                    out[p % task_count][f.feed.feed_id].append(p)
        return out

    def stage_plan(self) -> plan_pb2.StagePlan:
        root = self.root
        if self.final_limit is not None:
            # Each task keeps count + offset rows; the coordinator applies the real limit.
            count, offset = self.final_limit
            assert isinstance(root, LimitNode)
            root = LimitNode(root.input, count + offset, 0)
        return plan_pb2.StagePlan(
            root=root.to_proto(),
            output=plan_pb2.OutputSpec(partitions=1),
            output_schema=encode_schema(self.root.schema),
        )


def plan_stage(root: Node, max_tasks: int, stage_id: int = 0) -> StageSpec:
    """Bound one stage's tasks and describe its feeds."""
    if max_tasks < 1:
        raise PlanError("the resolver returned no worker URLs; start workers or check the resolver's source")
    root = prune_columns(root)
    nodes = list(root.walk())
    if any(isinstance(n, ExchangeInputNode) for n in nodes):
        raise PlanError("a plan reading exchange input is a map stage: run it with flight.map_batches or flight.spark.flight_map")
    scans = [n for n in nodes if isinstance(n, FeedScanNode)]
    notes: list[str] = []
    feeds: list[FeedPlan] = []
    task_count = 1
    if not scans:
        notes.append("no feed: one task")
    else:
        fixed: list[int] = []
        for scan in scans:
            provider = scan.feed.inner()
            if provider.shared:
                feeds.append(FeedPlan(scan.feed, 1, shared=True))
            else:
                declared = provider.partitions()
                if declared is not None and declared < 1:
                    raise PlanError(f"feed {scan.feed.feed_id!r}: partitions() returned {declared}; it must be at least 1")
                feeds.append(FeedPlan(scan.feed, declared or 0))
                if declared is not None:
                    fixed.append(declared)
        task_count = min(max_tasks, max(fixed)) if fixed else max_tasks
        feeds = [FeedPlan(f.feed, f.partitions or task_count, f.shared) for f in feeds]
        if any(f.shared for f in feeds):
            notes.append(f"shared-queue feed: up to {max_tasks} task(s), the count decided from discovery at execution")
        else:
            shown = [f.partitions for f in feeds]
            notes.append(f"{task_count} task(s): {max_tasks} worker(s), feed partitions {shown}")
    final_limit = None
    if isinstance(root, LimitNode) and (task_count > 1 or any(f.shared for f in feeds)):
        final_limit = (root.count, root.offset)
        notes.append(f"limit {root.count} offset {root.offset} applied again over all tasks")
    if any(isinstance(n, ValuesNode) for n in nodes) and task_count > 1:
        notes.append("values are emitted by task 0 only")
    return StageSpec(stage_id, root, max_tasks, feeds, final_limit, notes, task_count)
