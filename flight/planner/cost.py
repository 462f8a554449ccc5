"""Textbook estimates the planner sizes stages with: how many rows a predicate keeps, how wide a row is.

Plain functions of the plan's own messages and schemas, apart from the planner's walk.
"""

from __future__ import annotations

import math

import pyarrow as pa

from flight.wire._proto import plan_pb2

__all__ = ["BROADCAST_ALWAYS_BYTES", "LARGE_BROADCAST", "broadcast_copies", "broadcast_pays", "row_width", "selectivity"]

_SELECTIVITY = {
    "equal": 0.1,
    "not_equal": 0.9,
    "less": 1 / 3,
    "less_equal": 1 / 3,
    "greater": 1 / 3,
    "greater_equal": 1 / 3,
    "match_like": 0.1,
    "match_substring": 0.1,
    "match_substring_regex": 0.1,
    "starts_with": 0.1,
    "ends_with": 0.1,
    "is_null": 0.05,
    "is_valid": 0.95,
}


def selectivity(expr: plan_pb2.Expression) -> float:
    """The fraction of rows a predicate keeps, by the textbook defaults (System R's).

    Computed over the flat node list in order (a call's arguments come before it), so
    no expression is too deep for it.
    """
    values: list[float] = []
    for node in expr.nodes:
        if node.WhichOneof("kind") != "call":
            values.append(0.5)
            continue
        call = node.call
        args = [values[i] for i in call.args if i < len(values)]
        values.append(_call_selectivity(call.function, args))
    return values[-1] if values else 0.5


def _call_selectivity(function: str, args: list[float]) -> float:
    if function in ("and", "and_kleene") and args:
        return math.prod(args)
    if function in ("or", "or_kleene") and args:
        return 1 - math.prod(1 - a for a in args)
    if function == "invert" and args:
        return 1 - args[0]
    if function == "and_not" or function == "and_not_kleene":
        return args[0] * (1 - args[1]) if len(args) == 2 else 0.5
    if function == "is_in":
        return 0.25
    return _SELECTIVITY.get(function, 0.5)


def row_width(schema: pa.Schema) -> int:
    """Bytes a row of ``schema`` takes, about: fixed widths as they are, 32 for each variable one."""
    width = 0
    for f in schema:
        try:
            width += max(1, f.type.bit_width // 8)
        except ValueError:  # variable width: strings, binaries, nested
            width += 32
    return width


BROADCAST_ALWAYS_BYTES = 4 << 20
"""Copies of a broadcast that move at most this many bytes in all are always worth it: a shuffle
instead costs a stage boundary (its tasks' start, a hop) that such a transfer does not."""


LARGE_BROADCAST = 4
"""A join side over ``broadcast_bytes`` (up to this many times it) is still broadcast when its copies move at most a
tenth of the other side: TPC-DS q72's catalog_sales at SF 10 on two hosts (~88 MiB, filtered) against inventory's
133 million rows (~3.5 GB), which a shuffle moved to meet it. Bounded, as each task of the other side holds it."""


def broadcast_pays(small_bytes: float, probe_tasks: int, probe_bytes: float) -> bool:
    """Whether broadcasting a join side of ``small_bytes`` into the other side's ``probe_tasks`` tasks
    moves no more than shuffling that side (``probe_bytes``) would: each copy but the local one
    crosses the network, so at four tasks the small side must be at most a third of the other,
    where at two it may be as large. Shuffling both sides would move the small side too; that
    share is left out, so a tie goes to the broadcast, which keeps the probe side in place."""
    copies = broadcast_copies(small_bytes, probe_tasks)
    return copies <= probe_bytes or copies <= BROADCAST_ALWAYS_BYTES


def broadcast_copies(small_bytes: float, probe_tasks: int) -> float:
    """The bytes a broadcast of ``small_bytes`` moves into ``probe_tasks`` tasks: a copy to each but the local one."""
    return small_bytes * max(probe_tasks - 1, 1)
