"""Expressions and operators as the worker reads them: built as messages, or written as bytes when they are
deeper or wider than a protobuf library would build (flat and nested encodings, whichever plan.proto has).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from benchmarks.fuzz.proto import FLAT_EXPRESSIONS, FLAT_OPERATORS, L, field_number, nest, nest_wrapper, pb_field, pb_int_field, ser, varint

__all__ = [
    "CHILD_FIELDS", "OPERATOR_KINDS", "Tree", "bad_reference_expression", "call", "chain_expression", "chain_operator", "col", "dag_expression",
    "expression", "lit", "node_bytes", "over_root", "plan_bytes", "tree_of", "wire", "with_nodes",
]


# ------------------------------------------------------------------- expressions

Tree = tuple[Any, ...]
"""("col", name) | ("lit", {Literal field: value}) | ("call", function, [Tree, ...], FunctionOptions | None)."""


def col(name: str) -> Tree:
    return ("col", name)


def lit(**value: Any) -> Tree:
    return ("lit", value)


def call(function: str, *args: Tree, options: Any = None) -> Tree:
    return ("call", function, list(args), options)


def _node(tree: Tree, args: list[Any]) -> dict[str, Any]:
    if tree[0] == "col":
        return {"field": L.FieldRef(name=tree[1])}
    if tree[0] == "lit":
        return {"literal": L.Literal(**tree[1])}
    message = L.Call(function=tree[1], args=args)
    if tree[3] is not None:
        message.options.CopyFrom(tree[3])
    return {"call": message}


def expression(tree: Tree) -> Any:
    """An ``Expression`` in whichever encoding plan.proto has: nested calls, or a flat post-order node list."""
    if not FLAT_EXPRESSIONS:
        args = [expression(a) for a in tree[2]] if tree[0] == "call" else []
        return L.Expression(**_node(tree, args))
    nodes: list[Any] = []
    _flatten(tree, nodes)
    return L.Expression(nodes=nodes)


def _flatten(tree: Tree, nodes: list[Any]) -> int:
    args = [_flatten(a, nodes) for a in tree[2]] if tree[0] == "call" else []
    nodes.append(L.ExprNode(**_node(tree, args)))
    return len(nodes) - 1


@functools.lru_cache(maxsize=64)
def chain_expression(depth: int, function: str, column: str, leaf_function: str = "", binary: bool = False) -> bytes:
    """``function`` applied ``depth`` times over a column (or ``leaf_function(column)``), serialized.

    With ``binary``, each level's second argument is the leaf again: ``f(f(leaf, leaf), leaf)``.
    """
    leaf = call(leaf_function, col(column)) if leaf_function else col(column)
    base = expression(leaf)
    if FLAT_EXPRESSIONS:
        first = len(base.nodes) - 1
        nodes_no, call_no, args_no = field_number(L.Expression, "nodes"), field_number(L.ExprNode, "call"), field_number(L.Call, "args")
        name = pb_field(field_number(L.Call, "function"), function.encode())
        second = varint(first) if binary else b""
        # Node i: {call: {function, args: [first + i (, first)]}}, args packed, written directly (100,000 of them).
        args_tag, call_tag, nodes_tag = varint(args_no << 3 | 2), varint(call_no << 3 | 2), varint(nodes_no << 3 | 2)
        parts = [ser(base)]
        for i in range(depth):
            args = varint(first + i) + second
            body = name + args_tag + varint(len(args)) + args
            node = call_tag + varint(len(body)) + body
            parts.append(nodes_tag + varint(len(node)) + node)
        return b"".join(parts)
    name = pb_field(field_number(L.Call, "function"), function.encode())
    after = pb_field(field_number(L.Call, "args"), ser(base)) if binary else b""
    return nest(ser(base), nest_wrapper(field_number(L.Expression, "call"), name, field_number(L.Call, "args"), after), depth)


def dag_expression(levels: int) -> bytes:
    """(flat encoding) each node adds the previous node to itself: 2**levels leaves once expanded."""
    nodes = [L.ExprNode(field=L.FieldRef(name="score"))]
    nodes += [L.ExprNode(call=L.Call(function="add", args=[i, i])) for i in range(levels)]
    return ser(L.Expression(nodes=nodes))


def bad_reference_expression(kind: str) -> bytes:
    """(flat encoding) a call whose argument index is not an earlier node."""
    index = {"self": 1, "forward": 5, "huge": 2**32 - 1, "cycle": 2}[kind]
    nodes = [L.ExprNode(field=L.FieldRef(name="score")), L.ExprNode(call=L.Call(function="negate", args=[index]))]
    if kind == "cycle":
        nodes.append(L.ExprNode(call=L.Call(function="negate", args=[1])))
        nodes[1].call.args[0] = 2
    return ser(L.Expression(nodes=nodes))


def chain_operator(core: bytes, depth: int, kind: str) -> bytes:
    """``depth`` Limit (or Filter) operators around the serialized operator ``core``."""
    if kind == "limit":
        after = pb_int_field(field_number(L.Limit, "count"), 5)
        wrap = nest_wrapper(field_number(L.Operator, "limit"), b"", field_number(L.Limit, "input"), after)
    else:
        predicate = ser(expression(call("is_valid", col("name"))))
        after = pb_field(field_number(L.Filter, "predicate"), predicate)
        wrap = nest_wrapper(field_number(L.Operator, "filter"), b"", field_number(L.Filter, "input"), after)
    return nest(core, wrap, depth)


def plan_bytes(root: bytes, plan: Any) -> bytes:
    """A StagePlan with ``root`` given as bytes (it may be deeper than protobuf can parse) and ``plan``'s other fields."""
    rest = L.StagePlan()
    rest.CopyFrom(plan)
    rest.ClearField("root")
    return pb_field(field_number(L.StagePlan, "root"), root) + ser(rest)


# -------------------------------------------------------- a plan's operators on the wire

OPERATOR_KINDS = [f.name for f in L.Operator.DESCRIPTOR.oneofs_by_name["kind"].fields]
CHILD_FIELDS = {
    kind: tuple(f.name for f in L.Operator.DESCRIPTOR.fields_by_name[kind].message_type.fields if f.message_type is L.Operator.DESCRIPTOR)
    for kind in OPERATOR_KINDS
}
"""Each operator kind's fields that hold its inputs (``HashJoin``: left, right; ``Union``: inputs), from plan.proto."""


def _inputs_of(op: Any) -> list[Any]:
    kind = op.WhichOneof("kind")
    if kind is None:
        return []
    body = getattr(op, kind)
    out: list[Any] = []
    for name in CHILD_FIELDS[kind]:
        fd = body.DESCRIPTOR.fields_by_name[name]
        out += list(getattr(body, name)) if fd.is_repeated else [getattr(body, name)] if body.HasField(name) else []
    return out


def wire(plan: Any) -> bytes:
    """What ``TaskHeader.plan`` carries for ``plan``, a StagePlan whose operators are a tree in ``root``: with flat
    operators, the tree as ``OperatorNode``s in post-order, each naming its inputs by index, the root last."""
    if not FLAT_OPERATORS:
        return ser(plan)
    out = L.StagePlan()
    out.CopyFrom(plan)
    out.ClearField("root")
    if not plan.HasField("root"):
        return ser(out)
    order: list[Any] = []
    inputs: list[list[int]] = []
    stack = [(plan.root, -1)]  # pre-order, each operator's inputs as positions
    while stack:
        op, parent = stack.pop()
        order.append(op)
        inputs.append([])
        if parent >= 0:
            inputs[parent].append(len(order) - 1)
        stack.extend((child, len(order) - 1) for child in reversed(_inputs_of(op)))
    number, walk_ = [0] * len(order), [[0, 0]]
    while walk_:  # post-order: a node once its inputs have theirs
        top = walk_[-1]
        if top[1] < len(inputs[top[0]]):
            top[1] += 1
            walk_.append([inputs[top[0]][top[1] - 1], 0])
            continue
        walk_.pop()
        op, node = order[top[0]], out.operators.add()
        kind = op.WhichOneof("kind")
        if kind is not None:
            getattr(node, kind).CopyFrom(getattr(op, kind))  # seeds are shallow: copying the subtree costs little
            for name in CHILD_FIELDS[kind]:
                getattr(node, kind).ClearField(name)
            node.inputs.extend(number[i] for i in inputs[top[0]])
        number[top[0]] = len(out.operators) - 1
    return ser(out)


def tree_of(plan: Any) -> Any:
    """``plan`` as received (flat operators) with its operators as a tree in ``root`` again, leniently: an input
    index that is not an earlier node, or a node already used, is left out (a mutation may have made either)."""
    if not FLAT_OPERATORS:
        return plan
    tree = L.StagePlan()
    tree.CopyFrom(plan)
    tree.ClearField("operators")
    nodes, used = plan.operators, set()
    stack = [(len(nodes) - 1, tree.root)] if len(nodes) else []
    while stack:
        i, target = stack.pop()
        node = nodes[i]
        kind = node.WhichOneof("kind")
        if kind is None:
            continue
        body = getattr(target, kind)
        body.CopyFrom(getattr(node, kind))
        fields = [(name, body.DESCRIPTOR.fields_by_name[name].is_repeated) for name in CHILD_FIELDS[kind]]
        for k, j in enumerate(node.inputs):
            name, repeated = fields[min(k, len(fields) - 1)] if fields else ("", False)
            if j >= i or j in used or not name or (k >= len(fields) and not repeated):
                continue
            used.add(j)
            stack.append((j, getattr(body, name).add() if repeated else getattr(body, name)))
    return tree


def node_bytes(kind: str, body: bytes, inputs: Sequence[int] = ()) -> bytes:
    """One ``OperatorNode`` written directly (a body may hold an expression of 100,000 nodes): ``kind`` with the
    serialized ``body`` (no inputs in it), naming ``inputs`` by index."""
    packed = b"".join(varint(i) for i in inputs)
    return pb_field(field_number(L.OperatorNode, kind), body) + (pb_field(field_number(L.OperatorNode, "inputs"), packed) if inputs else b"")


def with_nodes(plan: Any, nodes: Sequence[bytes]) -> bytes:
    """The (flat) ``plan`` as bytes with serialized ``nodes`` appended: the last one is the new root."""
    number = field_number(L.StagePlan, "operators")
    return ser(plan) + b"".join(pb_field(number, n) for n in nodes)


def over_root(plan: Any, kind: str, body: bytes) -> bytes:
    """``plan`` (as received) with one more operator over its root: ``kind`` of ``body`` (serialized, without its
    input), taking the old root as its input."""
    if FLAT_OPERATORS:
        return with_nodes(plan, [node_bytes(kind, body, [max(0, len(plan.operators) - 1)])])
    inner = L.Operator.DESCRIPTOR.fields_by_name[kind].message_type
    return plan_bytes(pb_field(field_number(L.Operator, kind), pb_field(inner.fields_by_name["input"].number, ser(plan.root)) + body), plan)
