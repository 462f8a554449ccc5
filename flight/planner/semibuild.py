"""A semi or anti join's build side, made small before it crosses the network.

Only whether a build key occurs among the probe side's keys matters to such a join, so its build
side can shrink first: to the keys the probe side has (a second read of the probe side) and to its
distinct keys (in the tasks that produce it). Decisions for the cutter (``flight.planner.cut``).
"""

from __future__ import annotations

from typing import Protocol

import pyarrow as pa

from flight.plan.nodes import Node
from flight.plan.relnodes import AggregateNode, JoinNode
from flight.planner.colocate import distinct_bound
from flight.planner.cost import row_width
from flight.planner.frag import Frag, size_text
from flight.planner.notes import join_text, repeatable
from flight.planner.stages import PlannerOptions, StageSpec

__all__ = ["DISTINCT_FRACTION", "REDUCE_RATIO", "distinct_keys", "reduced", "reduces"]

REDUCE_RATIO = 5.0
"""How much larger (in rows) a semi or anti join's build side must be before ``reduces``. TPC-H Q22 at SF 10 on
two one-core hosts, ~1.5 million order keys against ~250,000 customers estimated (6 times; 190,000 kept):
0.79 -> 0.63 s reduced. At twice (its customers before their comparison with the average balance moved below
the anti join, ``flight.planner.scalar``) it was 16% slower at SF 1."""

DISTINCT_FRACTION = 0.1
"""Of a semi join's build-side rows, the share estimated distinct keys (as for a grouped aggregate)."""


class Builder(Protocol):
    """What these need of the cutter: its settings and rewrites, and how it builds and wraps fragments."""

    options: PlannerOptions
    rewrites: list[str]
    stages: list[StageSpec]

    def build(self, node: Node) -> Frag: ...

    @staticmethod
    def wrap(f: Frag, node: Node, rows: float | None) -> Frag: ...


def reduces(planner: Builder, node: JoinNode, left: Frag, right: Frag) -> bool:
    """Whether a semi or anti join's build side should first be reduced to the probe side's keys.

    Only whether a build key occurs among the probe side's keys matters, so the build rows
    whose key the probe side lacks can go before the build side's distinct keys are made and
    moved (TPC-H Q4: 1.4 million lineitem keys against 57,000 orders). It costs a second
    read of the probe side, and a stage before the build side's, so only when the build
    side's distinct keys (its rows, or fewer where its footers' key ranges bound them) are
    estimated at least ``REDUCE_RATIO`` times the probe side's rows, those are small enough to
    broadcast, and its feeds are repeatable (the second read must see the rows the first does).
    A probe side that reads stages reads them again, so only broadcasts (a scalar subquery's
    partial rows, made once: ``flight.planner.finish``), never a shuffle's partitions, and from
    at most two tasks: each reading task finishes the aggregate in the order the partial rows
    arrive, and floating-point sums of three or more in another order may differ in the last
    bit (a row exactly between would pass one read and not the other); two add alike either way.
    """
    if left.rows is None or right.rows is None or right.tasks == 1:
        return False
    if any(r.mode != "broadcast" or planner.stages[r.stage_id].task_count > 2 for r in left.reads):
        return False
    keys = min(right.rows, distinct_bound(node.right, node.right_keys) or right.rows)
    keys_bytes = left.rows * row_width(pa.schema([left.node.schema.field(k) for k in node.left_keys]))
    return left.rows * REDUCE_RATIO <= keys and keys_bytes <= planner.options.broadcast_bytes and repeatable(node.left)


def reduced(planner: Builder, node: JoinNode, left: Frag) -> Frag:
    """``node``'s build side semi-joined with a second read of its probe side, on the keys."""
    reducer = JoinNode(node.right, node.left, node.right_keys, node.left_keys, "left semi", node.right_suffix)
    frag = planner.build(reducer)
    planner.rewrites.append(
        f"{join_text(node)}: the build side is first reduced to the keys the probe side has "
        f"({size_text(left)}, read a second time for it)"
    )
    return frag


def distinct_keys(planner: Builder, f: Frag, node: JoinNode) -> Frag | None:
    """A semi or anti join's build side as its distinct keys, computed in the tasks that produce it.

    Only whether a key occurs matters to such a join, so every duplicate that
    would cross the network is waste. The consumer does not repeat the
    distinct: the join takes the few duplicates left (a key in several tasks).
    """
    keys = list(node.right_keys)
    if isinstance(f.node, AggregateNode) and not f.node.calls and set(f.node.keys) <= set(keys):
        return None  # already distinct on (a subset of) the keys
    distinct = AggregateNode(f.node, keys, [], "PartialDistinct", partial=True)
    rows = None if f.rows is None else max(1.0, f.rows * DISTINCT_FRACTION)
    return planner.wrap(f, distinct, rows)
