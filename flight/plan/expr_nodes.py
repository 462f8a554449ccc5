"""How expressions are encoded: the node tree, its flat wire form, and readable text
(Arrow IPC constants and typed function options: ``flight.plan.expr_options``).

Private helpers of ``flight.plan.expr``, kept apart so the builder itself stays short.

An ``Expr`` holds an immutable tree of ``Node`` objects (children shared, never
copied), so composing expressions costs O(1) whatever their size. On the wire
an expression is flat (``plan.proto``: ``Expression.nodes`` in post-order, a
call naming its arguments by index), so its depth never nests protobuf
messages. Every walk here is iterative: no expression depth reaches Python's
recursion limit.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pyarrow as pa

from flight.errors import ProtocolError
from flight.wire._proto import plan_pb2
from flight.wire.functions import NARY_FUNCTIONS

_ARROW_ERRORS = (pa.ArrowException, OSError, TypeError, ValueError, OverflowError)
_INFIX = {
    "equal": "==", "not_equal": "!=", "less": "<", "less_equal": "<=", "greater": ">", "greater_equal": ">=",
    "and_kleene": "&", "or_kleene": "|",
    "add_checked": "+", "subtract_checked": "-", "multiply_checked": "*", "divide_checked": "/",
}
_PREFIX = {"invert": "~", "negate_checked": "-"}


# -- the node tree


class FieldNode:
    """A column reference."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class LiteralNode:
    """A constant; ``literal`` is owned by the node and never changed."""

    __slots__ = ("literal",)

    def __init__(self, literal: plan_pb2.Literal) -> None:
        self.literal = literal


class UnsetNode:
    """A wire node that set no kind (only ``Expr.from_proto`` makes one; the worker rejects it)."""

    __slots__ = ()


_GROW = threading.Lock()


class CallNode:
    """A function call; ``options`` is owned by the node and never changed.

    The arguments are the first ``_count`` items of ``_buf``. Extending an n-ary
    call whose buffer nobody has extended yet appends in place (the old node
    keeps seeing only its own prefix), so folding ``a | b | c | ...`` one term at
    a time costs O(1) per term instead of copying every argument each time.
    """

    __slots__ = ("_buf", "_count", "function", "options")

    def __init__(self, function: str, args: list[Node], options: plan_pb2.FunctionOptions | None = None) -> None:
        self.function = function
        self.options = options
        self._buf = args  # owned: callers pass a fresh list
        self._count = len(args)

    @property
    def args(self) -> list[Node]:
        return self._buf[: self._count]

    def extended(self, more: list[Node]) -> CallNode:
        """This call with ``more`` arguments appended (a new node; this one is unchanged)."""
        with _GROW:
            if len(self._buf) == self._count:
                buf = self._buf
                buf.extend(more)
            else:
                buf = self._buf[: self._count] + more
            node = CallNode(self.function, buf, self.options)
            node._count = self._count + len(more)
        return node


Node = FieldNode | LiteralNode | CallNode | UnsetNode


def nary_call(function: str, args: list[Node]) -> CallNode:
    """A call of associative ``function`` (``NARY_FUNCTIONS``), flattening arguments that are calls of it."""
    spliced: list[Node] = []
    for arg in args[1:]:
        if isinstance(arg, CallNode) and arg.function == function and arg.options is None:
            spliced.extend(arg.args)
        else:
            spliced.append(arg)
    first = args[0]
    if isinstance(first, CallNode) and first.function == function and first.options is None:
        return first.extended(spliced)
    return CallNode(function, [first, *spliced])


def postorder(root: Node) -> Iterator[Node]:
    """Every distinct node under ``root`` once, arguments before their call, left to right."""
    seen: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if id(node) in seen:
            continue
        if expanded or not isinstance(node, CallNode):
            seen.add(id(node))
            yield node
            continue
        stack.append((node, True))
        stack.extend((arg, False) for arg in reversed(node.args) if id(arg) not in seen)


def flatten(root: Node) -> plan_pb2.Expression:
    """The wire form: nodes in post-order, a node shared by several calls emitted once."""
    msg = plan_pb2.Expression()
    nodes = msg.nodes
    index: dict[int, int] = {}
    for node in postorder(root):
        out = nodes.add()
        if isinstance(node, FieldNode):
            out.field.name = node.name
        elif isinstance(node, LiteralNode):
            out.literal.CopyFrom(node.literal)
        elif isinstance(node, CallNode):
            out.call.function = node.function
            out.call.args.extend([index[id(arg)] for arg in node.args])
            if node.options is not None:
                out.call.options.CopyFrom(node.options)
        index[id(node)] = len(index)
    return msg


def unflatten(msg: plan_pb2.Expression, field: str = "expr") -> Node:
    """The node tree of a wire expression (copied); ``ProtocolError`` when its indexes are wrong."""
    built: list[Node] = []
    for i, wire in enumerate(msg.nodes):
        kind = wire.WhichOneof("kind")
        node: Node
        if kind == "field":
            node = FieldNode(wire.field.name)
        elif kind == "literal":
            literal = plan_pb2.Literal()
            literal.CopyFrom(wire.literal)
            node = LiteralNode(literal)
        elif kind == "call":
            refs = list(wire.call.args)
            for position, ref in enumerate(refs):
                if ref >= i:
                    raise ProtocolError(
                        f"Argument {position} of node {i} names node {ref}; a call's arguments must be earlier nodes.",
                        field=f"{field}.nodes[{i}].call.args",
                    )
            options = None
            if wire.call.HasField("options"):
                options = plan_pb2.FunctionOptions()
                options.CopyFrom(wire.call.options)
            node = CallNode(wire.call.function, [built[ref] for ref in refs], options)
        else:
            node = UnsetNode()
        built.append(node)
    if not built:
        raise ProtocolError("The expression has no nodes.", field=f"{field}.nodes")
    return built[-1]


def canonical_id(root: Node, table: dict[tuple[object, ...], int]) -> int:
    """A number that two structurally equal expressions share when numbered with the same ``table``."""
    ids: dict[int, int] = {}
    key: tuple[object, ...]
    for node in postorder(root):
        if isinstance(node, FieldNode):
            key = ("field", node.name)
        elif isinstance(node, LiteralNode):
            key = ("literal", node.literal.SerializeToString(deterministic=True))
        elif isinstance(node, CallNode):
            options = None if node.options is None else node.options.SerializeToString(deterministic=True)
            key = ("call", node.function, tuple(ids[id(arg)] for arg in node.args), options)
        else:
            key = ("unset",)
        ids[id(node)] = table.setdefault(key, len(table))
    return ids[id(root)]


def referenced_fields(root: Node) -> set[str]:
    return {node.name for node in postorder(root) if isinstance(node, FieldNode)}


# -- values


# -- repr


def _quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _peek_column(data: bytes) -> pa.ChunkedArray | None:
    try:
        table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
        return table.column(0) if table.num_columns == 1 else None
    except _ARROW_ERRORS:
        return None


def _peek_type(data: bytes) -> str:
    try:
        return str(pa.ipc.read_schema(pa.py_buffer(data)).field(0).type)
    except (*_ARROW_ERRORS, IndexError):
        return f"<{len(data)} bytes>"


def _render_literal(literal: plan_pb2.Literal) -> str:
    kind = literal.WhichOneof("value")
    if kind == "string_value":
        return _quote(literal.string_value)
    if kind == "arrow":
        column = _peek_column(literal.arrow)
        if column is None or len(column) != 1:
            return f"lit(<{len(literal.arrow)} bytes>)"
        return f"lit({column[0].as_py()!r}, {column.type})"
    return repr(getattr(literal, kind)) if kind else "<unset literal>"


def _render_options(options: plan_pb2.FunctionOptions) -> list[str]:
    kind = options.WhichOneof("kind")
    if kind is None:
        return []
    sub = getattr(options, kind)
    parts = []
    for field in sub.DESCRIPTOR.fields:
        if field.has_presence and not sub.HasField(field.name):
            continue
        value = getattr(sub, field.name)
        if field.name == "target_type":
            parts.append(f"{field.name}={_peek_type(value)}")
        elif field.name == "value_set":
            column = _peek_column(value)
            parts.append(f"value_set={column.to_pylist() if column is not None else f'<{len(value)} bytes>'}")
        else:
            parts.append(f"{field.name}={value!r}")
    return parts


def render(root: Node) -> str:
    """Readable text, built from a stack of nodes and text pieces (no recursion)."""
    parts: list[str] = []
    leaves: dict[int, str] = {}
    stack: list[Node | str] = [root]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            parts.append(item)
        elif isinstance(item, FieldNode):
            parts.append(f"col({_quote(item.name)})")
        elif isinstance(item, LiteralNode):
            text = leaves.get(id(item))
            if text is None:
                text = leaves[id(item)] = _render_literal(item.literal)
            parts.append(text)
        elif isinstance(item, CallNode):
            stack.extend(reversed(_call_pieces(item)))
        else:
            parts.append("<unset expression>")
    return "".join(parts)


def _call_pieces(node: CallNode) -> list[Node | str]:
    function, args = node.function, node.args
    if function in _INFIX and (len(args) == 2 or (function in NARY_FUNCTIONS and len(args) > 2)):
        pieces: list[Node | str] = ["("]
        for i, arg in enumerate(args):
            if i:
                pieces.append(f" {_INFIX[function]} ")
            pieces.append(arg)
        pieces.append(")")
        return pieces
    if function in _PREFIX and len(args) == 1:
        return [_PREFIX[function], args[0]]
    items: list[Node | str] = [*args, *(_render_options(node.options) if node.options is not None else [])]
    pieces = [f"{function}("]
    for i, item in enumerate(items):
        if i:
            pieces.append(", ")
        pieces.append(item)
    pieces.append(")")
    return pieces
