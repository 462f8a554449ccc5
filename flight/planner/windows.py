"""Where a window runs: its rows moved by the partition keys, so every partition is whole in one task.

Without partition keys the window sees all rows: one task gathers them. Apart from ``cut``
for its size budget; it uses only the cutter's public steps (build, cut, wrap, consumer).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from flight.plan.window import WindowNode
from flight.planner.frag import Frag

__all__ = ["cut_window"]


def cut_window(planner: Any, node: WindowNode) -> Frag:
    """The fragment computing ``node`` (``planner``: the cut's planner)."""
    f: Frag = planner.build(node.input)
    if f.tasks == 1:
        return planner.wrap(f, replace(node, input=f.node), f.rows)
    if node.partition_by:
        read = planner.cut(f, "hash", list(node.partition_by))
        tasks = planner.upper_tasks(f.rows)
    else:
        read = planner.cut(f, "gather")
        tasks = 1
    return planner.consumer(replace(node, input=read), tasks, f.rows, [read])
