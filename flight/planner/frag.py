"""A fragment: operators the cutter (``flight.planner.cut``) has grown that will run in the same
tasks, not yet cut into a stage, with the sizes its choices compare.

Apart from the cutter so that its helpers (``flight.planner.windows``) can make and read fragments
without importing it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from flight.plan.nodes import FeedScanNode, FilterNode, Node, ProjectNode, UnnestNode, ValuesNode
from flight.plan.relnodes import JoinNode, ShuffleReadNode, UnionNode
from flight.planner.colocate import KeyRanges
from flight.planner.cost import row_width
from flight.planner.stages import FeedPlan

__all__ = ["Frag", "frag_bytes", "grown", "size_text", "smaller", "union_in_place"]


@dataclass
class Frag:
    """Operators that will run in the same tasks, not yet cut into a stage."""

    node: Node
    tasks: int  # at most this many; 1 means certainly one task
    rows: float | None
    feeds: list[FeedPlan] = field(default_factory=list)
    reads: list[ShuffleReadNode] = field(default_factory=list)
    leaf: bool = False  # sized by its feeds rather than by rows
    ranges: dict[str, KeyRanges] = field(default_factory=dict)
    """Co-located scans by feed id: task t keeps key range t."""
    hashed: list[str] | None = None
    """Columns the rows were hash-partitioned on to reach these tasks (equal values are in one
    task), while they pass through unchanged; None when unknown."""


    def again(self) -> Frag:
        """This fragment for one more use: the same operators and stages, its lists of its own (a caller may add
        to them)."""
        return replace(self, feeds=list(self.feeds), reads=list(self.reads), ranges=dict(self.ranges))


def frag_bytes(f: Frag) -> float | None:
    return None if f.rows is None else f.rows * row_width(f.node.schema)


def smaller(left: Frag, right: Frag) -> bool:
    """Whether the left side is estimated smaller than the right, in bytes (unknown: no)."""
    lb, rb = frag_bytes(left), frag_bytes(right)
    return lb is not None and rb is not None and lb < rb


def size_text(f: Frag) -> str:
    size = frag_bytes(f)
    return "?" if f.rows is None or size is None else f"~{f.rows:,.0f} rows, {size / (1 << 20):,.1f} MiB"


def grown(node: FilterNode | ProjectNode | UnnestNode, built: Node) -> Node:
    """A row-by-row ``node`` over ``built``, what its input became in its fragment: when that has the same
    columns (the input itself, or a read of the stage computing it), the output's types are kept, not worked
    out again (typing the projections again was a twentieth of planning TPC-DS). Else it is made, and checked, anew."""
    if built.schema.equals(node.input.schema):
        return node.with_inputs(input=built)
    return replace(node, input=built)


_PER_ROW_JOINS = ("inner", "left semi", "left anti", "left outer")


def _per_row(f: Frag) -> bool:
    """Whether ``f`` gives the same rows in all however its feeds' partitions are dealt over tasks: scans of
    partitioned feeds, filters, projections, and joins of its rows with a broadcast (read whole in every task)."""
    if f.ranges or any(fp.shared for fp in f.feeds):
        return False
    for node in f.node.walk():
        if isinstance(node, JoinNode):
            if node.join_type not in _PER_ROW_JOINS or any(isinstance(n, FeedScanNode) for n in node.right.walk()):
                return False
        elif isinstance(node, ShuffleReadNode):
            if node.mode != "broadcast":
                return False
        elif not isinstance(node, (FeedScanNode, FilterNode, ProjectNode)):
            return False
    return True


def union_in_place(frags: list[Frag], rows: float | None) -> Frag | None:
    """The union of ``frags`` in their own tasks, none of its rows moved, when each input gives its rows there:
    in as many tasks as the union has (task t doing what it would alone, a hash read's partition t included), or
    from rows that may be dealt over any tasks (``_per_row``); None otherwise (a global aggregate, a gathered
    input, a shared-queue feed: the inputs are shuffled round-robin into the union's tasks instead).

    Why: a union's rows need no particular task, and the operators above it (a join with a broadcast, a partial
    aggregate) run where they are; moving every input row first cost TPC-DS q05 at SF 10 on two hosts 6.8 GB
    between the workers, its six fact tables whole."""
    tasks = max(f.tasks for f in frags)
    if any(fp.shared for f in frags for fp in f.feeds) or not all(f.tasks == tasks or _per_row(f) or _once(f) for f in frags):
        return None
    ranges = {k: v for f in frags for k, v in f.ranges.items()}
    return Frag(UnionNode([f.node for f in frags]), tasks, rows, [fp for f in frags for fp in f.feeds],
                [r for f in frags for r in f.reads], all(f.leaf for f in frags if not _once(f)), ranges)


def _once(f: Frag) -> bool:
    """Whether ``f`` is literal rows its stage's task 0 alone emits (``ValuesNode``, projected or filtered): once
    in a union's tasks however many there are (flight.planner.gsets' row for a grand total over no rows)."""
    return f.tasks == 1 and not f.feeds and not f.reads and all(
        isinstance(n, (ProjectNode, FilterNode)) or (isinstance(n, ValuesNode) and not n.every_task) for n in f.node.walk())
