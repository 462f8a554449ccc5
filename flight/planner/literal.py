"""Joins with literal rows on one side: the rows go into each task's plan, and a semi join by them is
sized from their exact keys.

Why: the adaptive planner (``flight.planner.adaptive``) settles a join side whose size was a guess by
running it first; its rows come back as a ``ValuesNode``. Cut as a stage of its own, they would be one
more task start and one more hop to every reader; in each reader's plan they cost nothing to move (a
settled side is at most ``ExecOptions.adaptive_bytes``). And a semi join keeping the rows whose key is
among them (TPC-H Q18's orders and lineitem, kept to the ~6,000 orders whose quantity passes 300) keeps
at most what the keys can match: the side's rows times the share of its distinct keys they hold, the
distinct keys bounded by the rows of the scan the key comes from and, for integers, by the width of its
range in the Parquet footers (``colocate.distinct_bound``). Without that the estimate stays the scan's whole size, and the joins above still shuffle.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

import pyarrow.compute as pc

from flight.plan.nodes import FilterNode, Node, ProjectNode, ValuesNode
from flight.plan.relnodes import JoinNode
from flight.planner.colocate import distinct_bound, key_scan
from flight.planner.frag import Frag, size_text
from flight.planner.notes import strategy_text
from flight.planner.stages import PlannerOptions

__all__ = ["LITERAL_BYTES", "literal_join", "literal_rows", "semi_rows"]

LITERAL_BYTES = 16 << 20
"""Literal rows of at most this many bytes go into each reading task's plan (a worker takes a task
header of up to 64 MiB) instead of being a stage of their own."""

_BUILDS = ("inner", "left outer", "left semi", "left anti")
"""Join types whose right side may be built in each of the left side's tasks."""


class Planner(Protocol):
    """What this needs of the cutter (``flight.planner.cut``)."""

    options: PlannerOptions
    rewrites: list[str]

    def swapped(self, node: JoinNode, left: Node, right: Node, strategy: str, lf: Frag, rf: Frag, left_read: Node | None = None) -> Node: ...


def literal_rows(f: Frag, limit: int) -> bool:
    """Whether ``f`` is literal rows (values, projected or filtered) of at most ``limit`` and ``LITERAL_BYTES``
    bytes: any task computes them from its plan alone."""
    if f.feeds or f.reads or not all(isinstance(n, (ValuesNode, ProjectNode, FilterNode)) for n in f.node.walk()):
        return False
    return sum(n.table.nbytes for n in f.node.walk() if isinstance(n, ValuesNode)) <= min(limit, LITERAL_BYTES)


def literal_join(planner: Planner, node: JoinNode, left: Frag, right: Frag, rows: float | None, swappable: bool) -> Frag | None:
    """``node`` in the other side's tasks when one side is literal rows, the rows in each task's plan; None otherwise."""
    limit = planner.options.broadcast_bytes
    if left.tasks == 1 and right.tasks == 1:
        return None  # one task either way: the cutter's local join
    if node.join_type in _BUILDS and literal_rows(right, limit):
        planner.rewrites.append(strategy_text(node, "literal rows", size_text(right), size_text(left), left.tasks,
                                              "they go into each task's plan"))
        build = _in_every_task(right.node)
        merged = JoinNode(left.node, build, node.left_keys, node.right_keys, node.join_type, node.right_suffix, "broadcast", node.filter)
        return Frag(merged, left.tasks, rows, left.feeds, left.reads, left.leaf, left.ranges, hashed=left.hashed)
    if node.join_type == "inner" and swappable and literal_rows(left, limit):
        planner.rewrites.append(strategy_text(node, "literal rows (the left side)", size_text(left), size_text(right), right.tasks,
                                              "they go into each task's plan"))
        ordered = planner.swapped(node, left.node, right.node, "broadcast", left, right, left_read=_in_every_task(left.node))
        return Frag(ordered, right.tasks, rows, right.feeds, right.reads, right.leaf, right.ranges, hashed=right.hashed)
    return None


def _in_every_task(node: Node) -> Node:
    """``node`` (literal rows, projected or filtered) with its values emitted by every task, not task 0 alone."""
    if isinstance(node, ValuesNode):
        return replace(node, every_task=True)
    assert isinstance(node, (ProjectNode, FilterNode))
    return replace(node, input=_in_every_task(node.input))


def semi_rows(node: JoinNode, left: Frag, right: Frag, estimated: bool = True) -> float | None:
    """The rows a semi or anti join keeps: for a semi join by one key, the share of its left side's rows that the
    right side's keys can match (their exact count for literal rows, else, when ``estimated``, at most the right
    side's rows); otherwise its left side's.

    ``estimated=False`` for a plan of one task: there the estimate only orders the task's own joins, and TPC-H
    Q18 on one host took 1.7 times as long when its semi-joined lineitem (estimated 200,000 rows, 399 actual)
    became the build side of its join with orders (the customers of 57 orders), DuckDB no longer filtering the
    lineitem scan by that small side's keys."""
    if left.rows is None or node.join_type != "left semi" or len(node.right_keys) != 1:
        return left.rows
    if isinstance(right.node, ValuesNode):
        distinct: float | None = float(pc.count_distinct(right.node.table.column(node.right_keys[0])).as_py())
    else:
        distinct = right.rows if estimated else None
    if distinct is None:
        return left.rows
    found = key_scan(left.node, node.left_keys[0])
    known = [] if found is None else [found[0].feed.inner().estimated_rows(), distinct_bound(left.node, node.left_keys)]
    bound = min((b for b in known if b is not None), default=None)  # the scan's rows, and its key range's width
    if bound is None or bound <= 0:
        return left.rows
    return max(1.0, min(left.rows, left.rows * distinct / bound))
