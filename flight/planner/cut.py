"""From a query to stages and tasks, cut at network boundaries.

The planner walks the logical plan bottom-up, growing *fragments* (operators
that run in the same tasks) and cutting a fragment into a stage where rows
must cross workers:

* aggregate → partial aggregate in every task, hash shuffle on the keys (one
  task for a global aggregate), final aggregate; ``mean`` travels as sum and
  count, ``count_distinct`` and the variances shuffle the rows and aggregate once;
* join → broadcast of the right (build) side when it is estimated small, else a
  hash shuffle of both sides on the keys; an inner or outer join whose left side
  is estimated smaller swaps its sides (the smaller side builds the hash table),
  and a semi or anti join's build side is reduced to its distinct keys in the
  tasks that produce it, before it crosses the network; a join of two lists of
  Parquet files clustered by the key runs in place, task t reading key range t
  of both sides (``flight.planner.colocate``);
* sort → sort (with fetch for a top-k) in every task, then one task merges; limit → a local limit in every task, then the final limit in one task;
* union → in place where each input gives its rows in the union's tasks (``frag.union_in_place``), else every input
  shuffled round-robin into them; a CTE used twice → one stage (``reuse``).

A fragment that already runs in one task needs none of that: with one worker the whole query is one stage. Leaf stages are
sized from their feeds (a shared-queue feed by a ``TaskEstimator`` at execution; with ``cut_file_rows``, Parquet files fewer
than the workers cut into runs of the row groups their filter can keep: ``rowgroups``), upper stages by their rows.

Before that, ``flight.planner.optimize`` pushes filters down to the scans, ``flight.planner.semijoin``
moves semi and anti joins below the joins they filter, and the columns nobody reads are pruned;
``QueryPlan.rewrites`` lists what moved.
"""

from __future__ import annotations

import math

import pyarrow as pa

from flight.errors import PlanError
from flight.plan.agg import MERGEABLE
from flight.plan.expr import Expr, coalesce, col, if_else, lit
from flight.plan.nodes import ExchangeInputNode, FeedScanNode, FilterNode, InputCallNode, LimitNode, Node, ProjectNode, UnnestNode, ValuesNode
from flight.plan.relnodes import AggCall, AggregateNode, JoinNode, ShuffleReadNode, SortNode, UnionNode
from flight.plan.window import WindowNode
from flight.planner.colocate import in_range, spread_keys
from flight.planner.cost import LARGE_BROADCAST, broadcast_copies, broadcast_pays, selectivity
from flight.planner.eager import eager_aggregates
from flight.planner.finish import finished_in_each_task
from flight.planner.frag import Frag, frag_bytes, grown, size_text, smaller, union_in_place
from flight.planner.groups import aggregate_rows, exact_mean_input
from flight.planner.gsets import merge_grouping_sets
from flight.planner.inputs import check_inputs_read_once, fix_to_input
from flight.planner.keysets import reduce_aggregate_inputs
from flight.planner.literal import literal_join, semi_rows
from flight.planner.notes import describe, join_text, moved_filters, repeatable, strategy_text, why_broadcast, why_shuffle
from flight.planner.optimize import prune_columns, push_filters
from flight.planner.place import colocated, could_colocate, grouped_below, grouped_in_place, joined_into_ranges, rotate_joins, split_for_groups
from flight.planner.ranges import filter_selectivity
from flight.planner.replicate import canonical_reads, replicable, replicate_small_broadcasts, without_stages
from flight.planner.reuse import align_task_counts, fingerprint, link_consumers, repeated_subtrees
from flight.planner.rowgroups import prune_runs
from flight.planner.scalar import push_scalar_comparisons
from flight.planner.semibuild import distinct_keys, reduced, reduces
from flight.planner.semijoin import push_semi_joins
from flight.planner.small import crowded_moves, crowded_note, scans_split, small_query, too_many_sources
from flight.planner.stages import FeedPlan, PlannerOptions, QueryPlan, StageSpec
from flight.planner.transitive import reduce_join_inputs
from flight.planner.windows import cut_window
from flight.sources.providers import FileListProvider

__all__ = ["plan_query"]


class _Planner:
    def __init__(self, max_tasks: int, options: PlannerOptions, colocate: bool = True) -> None:
        self.max_tasks = max_tasks
        self.colocate = colocate
        self.options = options
        self.stages: list[StageSpec] = []
        self.feed_ids: set[str] = set()
        self.rewrites: list[str] = []
        self.made: dict[bytes, int] = {}  # stage ids by fingerprint (flight.planner.reuse)
        self.finished: dict[bytes, int] = {}  # partial-aggregate stages broadcast for each reader to finish (``finish``)
        self.reused: set[int] = set()  # stages a cut handed out again (read by more than one use)
        self.once: dict[bytes, ShuffleReadNode] = {}  # a repeated subplan grouped in place, broadcast to each use
        self.behind: dict[bytes, Frag] = {}  # a repeated subplan whose scans are behind cuts, built once for every use
        self.first: dict[bytes, int] = {}  # each small broadcast's first stage, by fingerprint
        self.copies: dict[int, int] = {}  # small broadcast stage -> the first stage equal to it
        self.dropped: set[int] = set()  # copies no stage reads (their reader was found made already)
        self.repeated: set[int] = set()  # ids of the nodes each use of a CTE starts at
        self.crowded = False  # one task would hold too many sources (small.too_many_sources): every repeat is a stage
        self.hash_on: dict[int, list[str]] = {}  # an aggregate's shuffle keys, when the aggregate above groups by fewer

    def upper_tasks(self, rows: float | None) -> int:
        return self.max_tasks if rows is None else max(1, min(self.max_tasks, math.ceil(rows / self.options.rows_per_task)))

    def cut(self, frag: Frag, mode: str, keys: list[str] | None = None) -> ShuffleReadNode:
        read_mode = {"hash": "hash", "round_robin": "hash", "gather": "gather", "broadcast": "broadcast", "head": "gather"}[mode]
        small = mode == "broadcast" and replicable(frag.node, frag.feeds, frag.reads, self.options.replicate_rows)
        node, copies = canonical_reads(frag.node, frag.reads, self.copies)  # a small broadcast's copies seen as one
        same = None if frag.ranges or mode == "head" or small else fingerprint(node, frag.feeds, frag.tasks, mode, keys or [])
        if same in self.made:  # the same subplan again (a CTE used twice): read the stage it made
            self.reused.add(self.made[same])
            self.dropped.update(copies)  # the copies only it read: nothing reads them now
            self.rewrites.append(f"stage {self.made[same]} is computed once and read again (the same subplan twice)")
            return ShuffleReadNode(self.made[same], frag.node.schema, read_mode)
        stage_id = len(self.stages)
        if small:  # a stage per use, each read in place (``replicate``); the fingerprints above see the first
            self.copies[stage_id] = self.first.setdefault(fingerprint(frag.node, frag.feeds, frag.tasks, mode, keys or []), stage_id)
        if same is not None:
            self.made[same] = stage_id
        spec = StageSpec(stage_id, frag.node, frag.tasks, frag.feeds, frag.reads, output_mode=mode, output_keys=keys or [])
        spec.task_count = frag.tasks
        spec.output_rows, spec.output_bytes = frag.rows, frag_bytes(frag)
        inputs = [n for n in frag.node.walk() if isinstance(n, InputCallNode)]
        if inputs:
            fix_to_input(spec, frag, inputs)
        elif frag.ranges:
            spec.task_roots = [in_range(frag.node, frag.ranges, t) for t in range(frag.tasks)]
            spec.notes.append(f"co-located: {frag.tasks} tasks, each reading one key range of every scan (fixed count)")
            for feed_id, r in frag.ranges.items():
                cut = [t for t, s in enumerate(r.straddled) if s]
                spec.notes.append(
                    f"{feed_id}: tasks {cut} filter {r.column!r} to their range (a file there straddles a boundary)"
                    if cut else f"{feed_id}: no file straddles a boundary, so no task filters {r.column!r}"
                )
        self.stages.append(spec)
        return ShuffleReadNode(stage_id, frag.node.schema, read_mode)

    def consumer(self, node: Node, tasks: int, rows: float | None, reads: list[ShuffleReadNode], hashed: list[str] | None = None) -> Frag:
        return Frag(node, tasks, rows, [], reads, hashed=hashed)
    # ------------------------------------------------------------- the walk

    def build(self, node: Node) -> Frag:
        if id(node) in self.repeated:
            return self.shared(node)
        if isinstance(node, FeedScanNode):
            return self.scan(node)
        if isinstance(node, ValuesNode):
            return Frag(node, 1, float(node.table.num_rows))
        if isinstance(node, InputCallNode):  # one task per partition of the input, whatever the workers
            return Frag(node, node.partitions, None, leaf=True)
        if isinstance(node, ExchangeInputNode):
            raise PlanError("a plan reading exchange input is a map stage: run it with flight.map_batches or flight.spark.flight_map")
        if isinstance(node, FilterNode):
            f = self.build(node.input)
            rows = None if f.rows is None else f.rows * filter_selectivity(node)
            return self.wrap(f, grown(node, f.node), rows)
        if isinstance(node, (ProjectNode, UnnestNode)):  # row by row: in its input's tasks
            f = self.build(node.input)
            return self.wrap(f, grown(node, f.node), f.rows)
        if isinstance(node, LimitNode):
            return self.limit(node)
        if isinstance(node, SortNode):
            return self.sort(node, fetch=node.fetch)
        if isinstance(node, AggregateNode):
            return self.aggregate(node)
        if isinstance(node, JoinNode):
            return self.join(node)
        if isinstance(node, UnionNode):
            return self.union(node)
        if isinstance(node, WindowNode):
            return cut_window(self, node)
        raise PlanError(f"the planner does not know operator {type(node).__name__}")

    def shared(self, node: Node) -> Frag:
        """One use of a subplan the query holds more than once: its own stage when its scans would run in the use's
        tasks, made once and read by each use (``flight.planner.reuse``).

        One that groups rows in place (co-located key ranges) is made once in a stage of its own, broadcast to each use
        (TPC-H Q18's subquery, lineitem grouped by order key, grouped 60 million rows twice at SF 10 in each use)."""
        key = fingerprint(node, [], 0, "once", [])
        if key in self.once:
            read = self.once[key]
            return Frag(read, 1, None, [], [read])
        if key in self.behind:  # made before, its scans behind cuts: each use reads the same stages (lists of its own)
            self.rewrites.append(f"stage(s) {sorted({r.stage_id for r in self.behind[key].reads})} is computed once and read again (used again)")
            return self.behind[key].again()
        self.repeated.discard(id(node))
        try:
            f = self.build(node)
        finally:
            self.repeated.add(id(node))
        if f.ranges and any(isinstance(n, AggregateNode) for n in f.node.walk()):
            read = self.once[key] = self.cut(f, "broadcast")
            self.rewrites.append(f"stage {read.stage_id}: a subplan used more than once, grouped in place, is computed once "
                                 "and broadcast to each use instead of grouped again in every use's tasks")
            return Frag(read, 1, f.rows, [], [read])
        if f.ranges or (not self.crowded and (not f.feeds or f.tasks == 1 or repeatable(node))):
            if not f.feeds and f.reads and not f.ranges:  # scans behind cuts: the next uses read its stages (a small
                self.behind[key] = f  # broadcast below is a stage per use: a cut's fingerprint would differ); handed out
                self.reused.update(r.stage_id for r in f.reads)  # again, none of them may be dropped (``finish``)
            return f  # its scans are behind a cut (reused there), one task reads all, or reading again costs less than a stage
        read = self.cut(f, "round_robin")
        return self.consumer(read, f.tasks, f.rows, [read])

    @staticmethod
    def wrap(f: Frag, node: Node, rows: float | None) -> Frag:
        kept = f.hashed
        if kept is not None and isinstance(node, ProjectNode):
            exprs = dict(node.exprs)
            kept = kept if all(k in exprs and exprs[k].column_name() == k for k in kept) else None
        elif kept is not None and not set(kept) <= set(node.schema.names):
            kept = None
        return Frag(node, f.tasks, rows, f.feeds, f.reads, f.leaf, f.ranges, hashed=kept)

    def scan(self, node: FeedScanNode) -> Frag:
        provider = node.feed.inner()
        if node.feed.feed_id in self.feed_ids:  # the same source read again (a self-join): each read is a feed of its own
            node = node.with_inputs(feed=node.feed.again(self.feed_ids))
        self.feed_ids.add(node.feed.feed_id)
        rows = provider.estimated_rows()
        if provider.shared:
            return Frag(node, self.max_tasks, rows, [FeedPlan(node.feed, 1, shared=True)], leaf=True)
        declared = provider.partitions()
        if declared is not None and declared < 1:
            raise PlanError(f"feed {node.feed.feed_id!r}: partitions() returned {declared}; it must be at least 1")
        if isinstance(provider, FileListProvider) and declared is not None and declared < self.max_tasks:
            if provider.may_cut(self.options.cut_file_rows):  # as many partitions as tasks: the feed cuts its files
                declared = None
                self.rewrites.append(f"scan of {node.feed.feed_id}: {len(provider.paths)} Parquet file(s) cut into runs of row groups, one per task")
        tasks = min(self.max_tasks, declared) if declared is not None else self.max_tasks
        parts = 1 if self.max_tasks == 1 and provider.dealt else declared or tasks  # one task: one partition will do
        return Frag(node, tasks, rows, [FeedPlan(node.feed, parts)], leaf=True)

    def limit(self, node: LimitNode) -> Frag:
        if isinstance(node.input, SortNode):  # top-k: every task keeps only its first count + offset rows
            f = self.sort(node.input, fetch=node.count + node.offset)
            return self.wrap(f, LimitNode(f.node, node.count, node.offset), float(node.count))
        f = self.build(node.input)
        if f.tasks == 1:
            return self.wrap(f, LimitNode(f.node, node.count, node.offset), float(node.count))
        read = self.cut(self.wrap(f, LimitNode(f.node, node.count + node.offset, 0), f.rows), "gather")
        return self.consumer(LimitNode(read, node.count, node.offset), 1, float(node.count), [read])

    def sort(self, node: SortNode, fetch: int) -> Frag:
        f = self.build(node.input)
        if f.tasks == 1:
            return self.wrap(f, SortNode(f.node, node.keys, node.nulls_first, fetch), f.rows)
        read = self.cut(self.wrap(f, SortNode(f.node, node.keys, node.nulls_first, fetch), f.rows), "gather")
        return self.consumer(SortNode(read, node.keys, node.nulls_first, fetch), 1, f.rows, [read])

    def aggregate(self, node: AggregateNode) -> Frag:
        inner = grouped_below(node.input)
        if node.keys and inner is not None and set(node.keys) <= set(inner.keys):
            self.hash_on[id(inner)] = list(node.keys)  # shuffle it on these: this aggregate then needs none
        f = self.build(node.input)
        rows = aggregate_rows(node, f.rows, f.tasks)
        if f.tasks == 1 or node.partial:  # partial: a sunk pre-aggregate (flight.planner.eager), merged above
            return self.wrap(f, AggregateNode(f.node, node.keys, node.calls, node.label_text, partial=node.partial), rows)
        if node.keys and f.hashed and set(f.hashed) <= set(node.keys):  # every group is whole in one task already
            self.rewrites.append(f"{node.label_text or 'Aggregate'}{node.keys}: in place, nothing shuffled: its rows were "
                                 f"hash-partitioned on {f.hashed} to reach it")
            return self.wrap(f, AggregateNode(f.node, node.keys, node.calls, node.label_text), rows)
        f = split_for_groups(self, f, node.keys) or f
        whole = grouped_in_place(f, node.keys)
        if whole is not None:  # each group's rows are all in one task already: aggregate there, once
            self.rewrites.append(f"{node.label_text or 'Aggregate'}{node.keys}: in place, nothing shuffled: "
                                 f"the co-located stage's tasks each hold whole key ranges of {whole.column!r}")
            return self.wrap(f, AggregateNode(f.node, node.keys, node.calls, node.label_text), rows)
        mode = "hash" if node.keys else "gather"
        tasks = self.upper_tasks(f.rows) if node.keys else 1
        if any(c.function not in MERGEABLE for c in node.calls):  # no partial form: move the rows, aggregate once
            spread = spread_keys(f.node, node.keys)
            read = self.cut(f, mode, spread)
            return self.consumer(AggregateNode(read, node.keys, node.calls, node.label_text), tasks, rows, [read], hashed=spread or None)
        hash_keys = spread_keys(f.node, self.hash_on.pop(id(node), node.keys)) if node.keys else node.keys
        partial: list[AggCall] = []
        final: list[AggCall] = []
        outputs: list[tuple[str, object]] = [(k, col(k)) for k in node.keys]
        known: dict[tuple[str, bytes], str] = {}

        def part(function: str, expr: Expr | None) -> str:
            """The partial column computing ``function(expr)``; equal ones are computed once."""
            key = (function, b"" if expr is None else expr.wire())
            if key not in known:
                name = known[key] = f"__p{len(known)}"
                again = "sum" if function in ("count", "count_all", "sum") else function
                partial.append(AggCall(name, function, expr))
                final.append(AggCall(name, again, col(name)))
            return known[key]

        for c in node.calls:
            if c.function == "mean":  # a DECIMAL's summed as the DECIMAL: exact, and shared with its sum (exact_mean_input)
                total, n = (col(part(fn, exact_mean_input(c.expr, f.node.schema))).cast(pa.float64()) for fn in ("sum", "count"))
                outputs.append((c.name, if_else(n > 0, total / n, lit(None, pa.float64()))))
            else:  # a global count over no partial row at all (every task without a unit) is 0, not null
                p = col(part(c.function, c.expr))
                outputs.append((c.name, coalesce(p, lit(0, pa.int64())) if not node.keys and c.function in ("count", "count_all") else p))
        label = node.label_text or "Aggregate"
        pre = self.wrap(f, AggregateNode(f.node, node.keys, partial, f"Partial{label}", partial=True), aggregate_rows(node, f.rows, f.tasks, True))
        read = self.cut(pre, mode, hash_keys)
        merged = AggregateNode(read, node.keys, final, f"Final{label}")
        return self.consumer(ProjectNode(merged, outputs), tasks, rows, [read], hashed=hash_keys or None)  # type: ignore[arg-type]

    def join(self, node: JoinNode) -> Frag:  # rotated for co-location already (``rotate_joins``)
        left, right = self.build(node.left), self.build(node.right)
        rows = max(left.rows or 0.0, right.rows or 0.0) or None
        if node.join_type == "inner" and node.filter is not None and right.rows == 1 and left.rows is not None:
            rows = left.rows * selectivity(node.filter.to_proto())  # a comparison with a scalar subquery: a filter
        semi = node.join_type in ("left semi", "left anti")
        out_rows = semi_rows(node, left, right, self.max_tasks > 1) if semi else rows  # at most its left rows
        swappable = node.join_type in _SWAPPED and not set(left.node.schema.names) & set(right.node.schema.names)
        if left.tasks == 1 and right.tasks == 1:
            if swappable and smaller(left, right):
                ordered = self.swapped(node, left.node, right.node, "local", left, right)
                return Frag(ordered, 1, out_rows, right.feeds + left.feeds, right.reads + left.reads, left.leaf or right.leaf)
            merged = JoinNode(left.node, right.node, node.left_keys, node.right_keys, node.join_type, node.right_suffix, "local", node.filter)
            return Frag(merged, 1, out_rows, left.feeds + right.feeds, left.reads + right.reads, left.leaf or right.leaf)
        if right.node in self.once.values() and node.join_type in ("inner", "left outer", "left semi", "left anti"):
            merged = JoinNode(left.node, right.node, node.left_keys, node.right_keys, node.join_type, node.right_suffix, "broadcast", node.filter)
            return Frag(merged, left.tasks, out_rows, left.feeds, left.reads + right.reads, left.leaf, left.ranges, hashed=left.hashed)  # ``shared``
        placed = next((f for how in (literal_join, colocated, joined_into_ranges) if (f := how(self, node, left, right, out_rows, swappable))), None)
        if placed is not None:
            return placed
        keys_first = semi and reduces(self, node, left, right)
        if keys_first:
            right = reduced(self, node, left)
        distinct = distinct_keys(self, right, node) if semi and node.filter is None else None  # a filter reads more than keys
        if distinct is not None:
            right = distinct
            if keys_first and left.rows is not None and right.rows is not None:
                right.rows = min(right.rows, left.rows)  # no more distinct keys than the probe side has rows
        if self.may_broadcast(right, left) and node.join_type in ("inner", "left outer", "left semi", "left anti"):
            if distinct is not None:
                self.rewrites.append(f"{join_text(node)}: the build side is reduced to its distinct keys {node.right_keys} before it is broadcast")
            self.rewrites.append(strategy_text(node, "broadcast", size_text(right), size_text(left), left.tasks, why_broadcast(right, left)))
            finished = finished_in_each_task(self, right)
            reads = finished.reads if finished is not None else [self.cut(right, "broadcast")]
            build = finished.node if finished is not None else reads[0]
            merged = JoinNode(left.node, build, node.left_keys, node.right_keys, node.join_type, node.right_suffix, "broadcast", node.filter)
            # Its rows stay put, hash-partitioned as they came (an aggregate by those keys runs in place: TPC-H Q10).
            return Frag(merged, left.tasks, out_rows, left.feeds, left.reads + reads, left.leaf, left.ranges, hashed=left.hashed)
        if node.join_type == "inner" and swappable and self.may_broadcast(left, right):
            # An inner join is symmetric: broadcast the small left side into the right side's tasks,
            # then put the columns back in the order the query asked for.
            self.rewrites.append(strategy_text(node, "broadcast (of the left side)", size_text(left), size_text(right), right.tasks,
                                               why_broadcast(left, right)))
            read = self.cut(left, "broadcast")
            ordered = self.swapped(node, left.node, right.node, "broadcast", left, right, left_read=read)
            return Frag(ordered, right.tasks, out_rows, right.feeds, right.reads + [read], right.leaf, right.ranges, hashed=right.hashed)
        if distinct is not None:
            self.rewrites.append(f"{join_text(node)}: the build side is reduced to its distinct keys {node.right_keys} before it is shuffled")
        tasks = self.upper_tasks(rows)
        self.rewrites.append(strategy_text(node, "hash shuffle of both sides", size_text(right), size_text(left), tasks,
                                           why_shuffle(right, left, self.options.broadcast_bytes)))
        lread = self.cut(left, "hash", node.left_keys)
        rread = self.cut(right, "hash", node.right_keys)
        hashed = list(node.left_keys) if node.join_type in ("inner", "left outer", "left semi", "left anti") else None
        if swappable and smaller(left, right):
            ordered = self.swapped(node, lread, rread, "shuffle", left, right)
            return self.consumer(ordered, tasks, out_rows, [lread, rread], hashed)
        merged = JoinNode(lread, rread, node.left_keys, node.right_keys, node.join_type, node.right_suffix, "shuffle", node.filter)
        return self.consumer(merged, tasks, out_rows, [lread, rread], hashed)

    def may_broadcast(self, small: Frag, probe: Frag) -> bool:
        """Whether ``small`` may be broadcast into ``probe``'s tasks: no larger than ``probe``, below ``broadcast_bytes``
        and its copies moving no more than a shuffle of ``probe`` (unless few bytes, or files each task reads in place:
        ``replicate_small_broadcasts``), or up to ``LARGE_BROADCAST`` times that, its copies a tenth of ``probe``."""
        size, other = frag_bytes(small), frag_bytes(probe)
        probe_bytes = float("inf") if other is None else other
        if size is None or size > probe_bytes:
            return False
        if size > self.options.broadcast_bytes:  # one whose copies are a tenth of the other side still pays
            return size <= LARGE_BROADCAST * self.options.broadcast_bytes and broadcast_copies(size, probe.tasks) * 10 <= probe_bytes
        return broadcast_pays(size, probe.tasks, probe_bytes) or (
            bool(probe.feeds) and replicable(small.node, small.feeds, small.reads, self.options.replicate_rows))

    def swapped(
        self, node: JoinNode, left: Node, right: Node, strategy: str, lf: Frag, rf: Frag, left_read: Node | None = None
    ) -> Node:
        """``node`` over ``left`` and ``right`` with its sides swapped (the left one builds), columns in the query's order.

        ``left_read``: what the swapped join reads instead of ``left`` (its broadcast).
        """
        build = left_read if left_read is not None else left
        joined = JoinNode(
            right, build, node.right_keys, node.left_keys, _SWAPPED[node.join_type], node.right_suffix, f"{strategy}, sides swapped", node.filter
        )
        self.rewrites.append(
            f"{join_text(node)}: sides swapped, the left side ({size_text(lf)}) is estimated smaller "
            f"than the right ({size_text(rf)}), so it builds the hash table"
        )
        return ProjectNode(joined, [(n, col(n)) for n in node.schema.names])

    def union(self, node: UnionNode) -> Frag:
        frags = [self.build(n) for n in node.inputs]
        rows = None if any(f.rows is None for f in frags) else sum(f.rows or 0.0 for f in frags)
        if all(f.tasks == 1 for f in frags):
            return Frag(UnionNode([f.node for f in frags]), 1, rows, [fp for f in frags for fp in f.feeds], [r for f in frags for r in f.reads])
        merged = union_in_place(frags, rows) if not any(isinstance(n, InputCallNode) for n in node.walk()) else None
        if merged is not None:
            return merged
        reads = [self.cut(f, "round_robin") for f in frags]
        return self.consumer(UnionNode(list(reads)), max(f.tasks for f in frags), rows, reads)


_SWAPPED = {"inner": "inner", "left outer": "right outer", "right outer": "left outer", "full outer": "full outer"}
"""Join types whose sides may swap (Acero builds the right side), and the type after the swap."""


def plan_query(
    root: Node, max_tasks: int, options: PlannerOptions | None = None, *, colocate: bool = True, pushed: bool = False
) -> QueryPlan:
    """Cut ``root`` (its filters already pushed: ``pushed``) into stages; the head stage (what the caller reads) comes last.
    ``colocate=False``: no co-located joins, for callers that run ``StageSpec.root`` as is in every task (off their key ranges)."""
    if max_tasks < 1:
        raise PlanError("the resolver returned no worker URLs; start workers or check the resolver's source")
    root = root if pushed else push_filters(root)  # sized before the semi joins move: the coordinator sized this root
    small = small_query(root, max_tasks, (options or PlannerOptions()).small_query_bytes)  # a rewrite note, or ""
    root, semi_notes = push_semi_joins(root, copies=not small and max_tasks > 1)  # one task: none copied across a join
    planner = _Planner(max_tasks := 1 if small else max_tasks, options or PlannerOptions(), colocate)
    planner.rewrites += ([small] if small else []) + semi_notes
    if max_tasks > 1:  # one task's query computes a grouping set's input once already
        root, notes = merge_grouping_sets(root, lambda n: scans_split(n, planner.options.cut_file_rows))
        planner.rewrites.extend(notes)
    uses = repeated_subtrees(root)
    ctes = {id(n) for top in root.walk() if id(top) in uses for n in top.walk()}
    root, notes = reduce_aggregate_inputs(root, planner.options.broadcast_bytes, ctes)
    planner.rewrites.extend(notes)
    if max_tasks > 1:  # what they save is rows moved between tasks
        root, notes = reduce_join_inputs(root, planner.options.broadcast_bytes, ctes, lambda j: could_colocate(planner, j))
        planner.rewrites.extend(notes)
        root, notes = eager_aggregates(rotate_joins(root, planner))
        planner.rewrites.extend(notes)
    pruned = push_scalar_comparisons(prune_columns(root), planner.rewrites)  # after pruning: nothing above reads the scalar
    crowded = not planner.options.one_stage and too_many_sources(pruned)
    before = list(planner.rewrites)
    stages = _cut_all(planner, pruned, colocate, crowded)
    moved = crowded_moves(pruned, stages) if crowded else None
    if moved is not None:  # the crowded cut moves too much: each use computed in place, within one worker's threads
        planner = _Planner(max_tasks, planner.options, colocate)
        planner.rewrites = [*before, crowded_note(moved)]
        stages = _cut_all(planner, pruned, colocate, False)
    return QueryPlan(stages, moved_filters(stages) + planner.rewrites)


def _cut_all(planner: _Planner, pruned: Node, colocate: bool, crowded: bool) -> list[StageSpec]:
    """``pruned`` cut into stages by ``planner`` (``crowded``: every subplan it repeats is a stage of its own)."""
    planner.crowded = crowded
    planner.repeated = repeated_subtrees(pruned)
    frag = planner.build(pruned)
    planner.cut(frag, "head")
    planner.stages = without_stages(planner.stages, planner.dropped)
    link_consumers(planner.stages)
    stages = replicate_small_broadcasts(planner.stages, planner.options.replicate_rows, planner.rewrites, fixed=colocate)
    prune_runs(stages, planner.rewrites)  # a cut file's runs: of the row groups its filter can keep
    link_consumers(stages)
    align_task_counts(stages)
    check_inputs_read_once(stages)
    for stage in stages:
        describe(stage)
    return stages
