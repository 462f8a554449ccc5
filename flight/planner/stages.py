"""The stage contract: what the planner hands the coordinator.

A ``QueryPlan`` is its stages, children before their consumers and the head last. A
``StageSpec`` is one stage: its operators (the ``StagePlan`` every task of it runs), how many
tasks, which feeds drive its leaves (``FeedPlan``), and how its output is partitioned for
its consumers: one, or several when the plan holds the same subplan twice (a CTE or a view used
twice is computed once, and its stage is read by each use). ``PlannerOptions`` are the planner's thresholds. The cut that makes them is
``planner.cut``; the coordinator reads only this.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from flight.plan.nodes import Node
from flight.plan.relnodes import ShuffleReadNode
from flight.sources.estimate import TaskEstimate
from flight.sources.feed import WorkUnitFeed
from flight.wire._proto import plan_pb2

__all__ = ["FeedPlan", "PlannerOptions", "QueryPlan", "StageSpec"]


@dataclass(frozen=True)
class PlannerOptions:
    broadcast_bytes: int = 32 << 20
    """A join's right side estimated below this is broadcast instead of shuffled."""
    rows_per_task: int = 250_000
    """Upper stages get one task per this many estimated input rows (at most one per worker)."""
    replicate_rows: int = 500_000
    """A broadcast into a co-located stage whose files hold at most this many rows is read by every
    task of that stage instead (``flight.planner.replicate``)."""
    small_query_bytes: int = 0
    """A query whose scans are estimated to read at most this many bytes is planned as one task (0: never)."""
    cut_file_rows: int = 0
    """Parquet files fewer than a scan's tasks, of at least this many rows, are cut into a run of row groups
    per task (``FileListProvider.may_cut``; 0: never)."""
    one_stage: bool = False
    """Plan the query as one stage whatever it holds (``run_local``): a subplan it repeats is computed at each use
    even where its sources would crowd one task (``flight.planner.small.too_many_sources``)."""


@dataclass(frozen=True)
class FeedPlan:
    feed: WorkUnitFeed
    partitions: int  # discovery streams: 1 for a shared-queue feed
    shared: bool = False


@dataclass
class StageSpec:
    """One stage: its operators, its tasks, and how its output reaches its consumers."""

    stage_id: int
    root: Node
    max_tasks: int
    feeds: list[FeedPlan]
    reads: list[ShuffleReadNode]
    output_mode: str = "head"  # head, hash, gather, broadcast, round_robin
    output_keys: list[str] = field(default_factory=list)
    consumers: list[int] = field(default_factory=list)
    """The stages that read this one, once per read (a stage reading it twice is listed twice); none
    for the head. Consumers of a hash output all have one task count (``plan_query`` sees to it)."""
    task_count: int = 0  # fixed at planning, or at execution for a shared-queue leaf
    estimate: TaskEstimate | None = None
    output_rows: float | None = None
    """The rows the planner estimated its output at (None: unknown); ``explain(analyze=True)`` shows the actual beside."""
    output_bytes: float | None = None
    """Those rows' estimated bytes (rows × ``cost.row_width`` of the schema)."""
    notes: list[str] = field(default_factory=list)
    task_roots: list[Node] | None = None
    """A co-located stage's per-task operators (``root`` with each scan's key range); its task count
    is then fixed: task t must read key range t."""
    _protos: dict[int, tuple[Node, plan_pb2.Operator]] = field(default_factory=dict, repr=False, compare=False)

    def root_proto(self, task: int = 0) -> plan_pb2.Operator:
        """A new message of task ``task``'s operators (the caller may change it).

        Made from the nodes once per root, then copied: a query's stages are encoded for each
        task of each execution, and for the head once more (``replay.replay_mode``); encoding
        walks every node and expression in Python (~0.5 ms for a TPC-H query's plan), copying
        the message is one call into protobuf's C code."""
        root = self.root if self.task_roots is None else self.task_roots[task]
        known = self._protos.get(id(root))
        if known is None or known[0] is not root:
            known = self._protos[id(root)] = (root, root.to_proto())
        copy = plan_pb2.Operator()
        copy.CopyFrom(known[1])
        return copy

    @property
    def output_schema(self) -> pa.Schema:
        return self.root.schema

    @property
    def consumer(self) -> int | None:
        """The first stage reading this one (None for the head)."""
        return self.consumers[0] if self.consumers else None

    @property
    def shared(self) -> bool:
        """Read more than once: its output is retained until the query ends (memory, then spill
        files), so that no consumer's pace can hold the others (``binding.bound_header``)."""
        return len(self.consumers) > 1

    @property
    def shared_feeds(self) -> list[FeedPlan]:
        return [f for f in self.feeds if f.shared]

    @property
    def sized_at_execution(self) -> bool:
        return bool(self.shared_feeds)

    @property
    def children(self) -> list[int]:
        return [r.stage_id for r in self.reads]

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

    def output_spec(self, reader_tasks: list[int]) -> plan_pb2.OutputSpec:
        """The output's partitions and readers, given the task count of each read of it (``[1]`` for the head)."""
        if self.output_mode in ("hash", "round_robin"):
            return plan_pb2.OutputSpec(partitions=reader_tasks[0], hash_keys=self.output_keys, readers=len(reader_tasks))
        if self.output_mode == "broadcast":
            return plan_pb2.OutputSpec(partitions=1, readers=sum(reader_tasks))
        return plan_pb2.OutputSpec(partitions=1, readers=len(reader_tasks))


@dataclass
class QueryPlan:
    stages: list[StageSpec]  # children before their consumers; the head is last
    rewrites: list[str] = field(default_factory=list)
    """What the optimizer and the planner changed, one line each, for explain()."""

    @property
    def head(self) -> StageSpec:
        return self.stages[-1]

    def stage(self, stage_id: int) -> StageSpec:
        return self.stages[[s.stage_id for s in self.stages].index(stage_id)]
