"""A fragment: operators the cutter (``flight.planner.cut``) has grown that will run in the same
tasks, not yet cut into a stage, with the sizes its choices compare.

Apart from the cutter so that its helpers (``flight.planner.windows``) can make and read fragments
without importing it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from flight.plan.nodes import FilterNode, Node, ProjectNode, UnnestNode
from flight.plan.relnodes import ShuffleReadNode
from flight.planner.colocate import KeyRanges
from flight.planner.cost import row_width
from flight.planner.stages import FeedPlan

__all__ = ["Frag", "frag_bytes", "grown", "size_text", "smaller"]


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
