"""Simple terms read off an expression's wire form: columns, literals, comparisons, conjuncts.

For pruning by table metadata on the coordinator (Iceberg's planner, Delta's file statistics):
the parts of a filter that compare a column with a constant. Anything else is "unknown" to
the callers, which then prune nothing for it; the filter itself always runs on the rows.
"""

from __future__ import annotations

from typing import Any

from flight.plan.expr import Expr
from flight.wire._proto import plan_pb2
from flight.wire.ipc import read_ipc_stream

__all__ = ["MIRROR", "comparison", "conjuncts", "field_name", "literal_value", "set_values"]

MIRROR = {"equal": "equal", "not_equal": "not_equal", "less": "greater", "less_equal": "greater_equal",
          "greater": "less", "greater_equal": "less_equal"}
"""Each comparison, and the one it becomes when its sides are swapped."""


def field_name(nodes: Any, i: int) -> str | None:
    """The column node ``i`` names, if it is a column."""
    node = nodes[i]
    return node.field.name if node.WhichOneof("kind") == "field" else None


def literal_value(nodes: Any, i: int) -> Any:
    """Node ``i``'s constant as a Python value (numbers, text, dates and times), else None."""
    node = nodes[i]
    if node.WhichOneof("kind") != "literal":
        return None
    lit: plan_pb2.Literal = node.literal
    which = lit.WhichOneof("value")
    if which is None or which == "binary_value":
        return None
    if which == "arrow":
        try:
            value = read_ipc_stream(lit.arrow, "literal").column(0).to_pylist()[0]
        except Exception:  # noqa: BLE001 - a literal that cannot be read is no reason to prune
            return None
        return value if isinstance(value, (int, float, str)) or hasattr(value, "isoformat") else None
    return getattr(lit, which)


def set_values(options: plan_pb2.FunctionOptions) -> list[Any]:
    """An ``is_in``'s values (nulls left out), or [] when they cannot be read."""
    if options.WhichOneof("kind") != "set_lookup":
        return []
    try:
        values = read_ipc_stream(options.set_lookup.value_set, "value_set").column(0).to_pylist()
    except Exception:  # noqa: BLE001
        return []
    return [v for v in values if v is not None]


def comparison(nodes: Any, i: int) -> tuple[str, str, Any] | None:
    """Node ``i`` as (column, comparison, constant) with the column first, if it is one."""
    node = nodes[i]
    if node.WhichOneof("kind") != "call" or node.call.function not in MIRROR or len(node.call.args) != 2:
        return None
    a, b = node.call.args
    op = node.call.function
    if (name := field_name(nodes, a)) is not None and (value := literal_value(nodes, b)) is not None:
        return name, op, value
    if (name := field_name(nodes, b)) is not None and (value := literal_value(nodes, a)) is not None:
        return name, MIRROR[op], value
    return None


def conjuncts(expr: Expr) -> list[Expr]:
    """The top-level AND terms of ``expr``, each an expression of its own."""
    proto = expr.to_proto()
    root = proto.nodes[-1]
    if root.WhichOneof("kind") == "call" and root.call.function in ("and", "and_kleene"):
        return [c for arg in root.call.args for c in conjuncts(_subtree(proto, arg))]
    return [expr]


def _subtree(proto: plan_pb2.Expression, index: int) -> Expr:
    """The expression rooted at node ``index`` of ``proto`` (post-order), on its own."""
    order: list[int] = []

    def visit(i: int) -> None:
        node = proto.nodes[i]
        if node.WhichOneof("kind") == "call":
            for arg in node.call.args:
                visit(arg)
        order.append(i)

    visit(index)
    renumber = {old: new for new, old in enumerate(order)}
    out = plan_pb2.Expression()
    for old in order:
        node = out.nodes.add()
        node.CopyFrom(proto.nodes[old])
        if node.WhichOneof("kind") == "call":
            node.call.args[:] = [renumber[a] for a in node.call.args]
    return Expr.from_proto(out)
