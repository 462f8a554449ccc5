"""From a query to stages and tasks.

Until multi-stage plans exist, a query is one stage: its leaf reads feeds,
its root is what the caller sees. The planner decides how many tasks the
stage gets (never more than the workers the resolver returns at planning
time) and which feed partitions each task consumes. URLs are bound later,
right before execution.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from flight._proto import plan_pb2
from flight.errors import PlanError
from flight.feed import WorkUnitFeed
from flight.plan.nodes import ExchangeInputNode, FeedScanNode, LimitNode, Node, ValuesNode
from flight.plan.optimize import prune_columns
from flight.protocol import encode_schema

__all__ = ["FeedPlan", "StageSpec", "plan_stage"]


@dataclass(frozen=True)
class FeedPlan:
    feed: WorkUnitFeed
    partitions: int


@dataclass
class StageSpec:
    """One stage, ready to be bound to workers."""

    stage_id: int
    root: Node
    task_count: int
    feeds: list[FeedPlan]
    assignments: list[dict[str, list[int]]]  # per task: feed id -> partitions
    final_limit: tuple[int, int] | None = None  # (count, offset) the coordinator applies over all tasks
    notes: list[str] = field(default_factory=list)

    @property
    def output_schema(self) -> pa.Schema:
        return self.root.schema

    def stage_plan(self) -> plan_pb2.StagePlan:
        return plan_pb2.StagePlan(
            root=self.root.to_proto(),
            output=plan_pb2.OutputSpec(partitions=1),
            output_schema=encode_schema(self.root.schema),
        )


def plan_stage(root: Node, max_tasks: int, stage_id: int = 0) -> StageSpec:
    """Size one stage and hand out its feed partitions round-robin."""
    if max_tasks < 1:
        raise PlanError("the resolver returned no worker URLs; start workers or check the resolver's source")
    root = prune_columns(root)
    nodes = list(root.walk())
    if any(isinstance(n, ExchangeInputNode) for n in nodes):
        raise PlanError("a plan reading exchange input is a map stage: run it with flight.map_batches or flight.spark.flight_map")
    scans = [n for n in nodes if isinstance(n, FeedScanNode)]
    notes: list[str] = []
    if not scans:
        task_count = 1
        notes.append("no feed: one task")
    else:
        declared = [s.feed.inner().partitions() for s in scans]
        fixed = [p for p in declared if p is not None]
        task_count = min(max_tasks, max(fixed)) if fixed else max_tasks
        task_count = max(task_count, 1)
        notes.append(f"{task_count} tasks: {max_tasks} workers, feed partitions {['per task' if p is None else p for p in declared]}")
    feeds = []
    assignments: list[dict[str, list[int]]] = [{} for _ in range(task_count)]
    for scan, declared_p in zip(scans, [s.feed.inner().partitions() for s in scans]):
        partitions = declared_p if declared_p is not None else task_count
        feeds.append(FeedPlan(scan.feed, partitions))
        for p in range(partitions):
            assignments[p % task_count].setdefault(scan.feed.feed_id, []).append(p)
    final_limit = None
    if isinstance(root, LimitNode) and task_count > 1:
        # Each task keeps count + offset rows; the coordinator applies the real limit.
        final_limit = (root.count, root.offset)
        root = LimitNode(root.input, root.count + root.offset, 0)
        notes.append(f"limit {final_limit[0]} offset {final_limit[1]} applied again over all tasks")
    if any(isinstance(n, ValuesNode) for n in nodes) and task_count > 1:
        notes.append("values are emitted by task 0 only")
    return StageSpec(stage_id, root, task_count, feeds, assignments, final_limit, notes)
