"""The one walk over a stage plan's operators, for every caller that looks inside one.

Why here: the coordinator (which stages a task reads), the worker (whether a task takes map
input) and both engines (sources, pruning, unit chains) all ask questions of the same
``plan_pb2.Operator`` tree; one walk means one idea of what an operator's inputs are.
"""

from __future__ import annotations

from collections.abc import Iterator

from google.protobuf.message import Message

from flight.wire._proto import plan_pb2

__all__ = ["PER_ROW_OPERATORS", "operators", "taggable", "unit_chain"]


def operators(root: plan_pb2.Operator) -> Iterator[plan_pb2.Operator]:
    """Every operator of the stage plan at ``root``, each before its inputs (an unset input is
    not one; a node of no kind is, for the callers that refuse it)."""
    stack = [root]
    while stack:
        op = stack.pop()
        yield op
        kind = op.WhichOneof("kind")
        if kind == "union":
            stack.extend(reversed(op.union.inputs))
        elif kind == "hash_join":
            stack.extend((op.hash_join.right, op.hash_join.left))
        elif kind is not None:
            node = getattr(op, kind)
            if hasattr(node, "input") and node.HasField("input"):
                stack.append(node.input)


PER_ROW_OPERATORS = ("filter", "project")
"""Operators that work row by row: a task of these over one feed scan can tag its rows with their unit."""


def unit_chain(root: plan_pb2.Operator) -> tuple[list[tuple[str, Message, str]], plan_pb2.Operator, str]:
    """The per-row operators from ``root`` down as (kind, body, field path), the operator below
    them and its field path (``TaskOptions.tag_units``: it must be a feed scan)."""
    chain: list[tuple[str, Message, str]] = []
    op, field = root, "plan.root"
    while (kind := op.WhichOneof("kind")) in PER_ROW_OPERATORS:
        body = getattr(op, kind)
        chain.append((kind, body, f"{field}.{kind}"))
        op, field = body.input, f"{field}.{kind}.input"
    return chain, op, field


def taggable(root: plan_pb2.Operator) -> bool:
    """Whether a stage's operators are filters and projections over one feed scan."""
    return unit_chain(root)[1].WhichOneof("kind") == "feed_scan"
