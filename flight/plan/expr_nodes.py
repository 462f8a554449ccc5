"""How expressions are encoded: the node tree, its flat wire form, Arrow IPC constants,
typed function options, and readable text.

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
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TypeVar

import pyarrow as pa

from flight.errors import PlanError, ProtocolError
from flight.wire._proto import plan_pb2
from flight.wire.functions import NARY_FUNCTIONS, FunctionSpec

_T = TypeVar("_T")

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


def _is_expr(value: object) -> bool:
    """Whether ``value`` is an ``Expr`` (it holds its tree in ``_node``; ``expr`` builds on this module)."""
    return isinstance(getattr(value, "_node", None), Node)


def _ipc_stream(array: pa.Array) -> bytes:
    batch = pa.record_batch([array], names=["value"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def scalar_bytes(value: object, type: pa.DataType | None) -> bytes:
    try:
        if isinstance(value, pa.Scalar) and type is not None:
            value = value.cast(type)
        return _ipc_stream(pa.array([value], type=type))
    except _ARROW_ERRORS as exc:
        as_type = f" of type {type}" if type is not None else ""
        raise PlanError(f"Cannot make a literal{as_type} from {value!r}: {exc}") from exc


def _value_set_bytes(function: str, values: object) -> bytes:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not isinstance(values, pa.Array):
        if isinstance(values, (str, bytes)) or _is_expr(values) or not isinstance(values, Iterable):
            raise PlanError(f"The value_set of {function!r} must be a collection of values, not {values!r}.")
        try:
            values = pa.array(list(values))
        except _ARROW_ERRORS as exc:
            raise PlanError(f"The value_set of {function!r} cannot be made an Arrow array: {exc}") from exc
    return _ipc_stream(values)  # type: ignore[arg-type]  # pa.array above made it an Array


# -- options: one filler per FunctionOptions kind, keyed by the oneof field name


class _Options:
    """The keyword options of one ``call``, read with type checks."""

    def __init__(self, function: str, given: Mapping[str, object]) -> None:
        self.function = function
        self.given = given

    def require(self, key: str, kind: type[_T]) -> _T:
        if self.given.get(key) is None:
            raise PlanError(f"Function {self.function!r} requires the option {key}.")
        return self._check(key, kind)

    def get(self, key: str, kind: type[_T], default: _T) -> _T:
        return default if key not in self.given else self._check(key, kind)

    def optional(self, key: str, kind: type[_T]) -> _T | None:
        return None if self.given.get(key) is None else self._check(key, kind)

    def _check(self, key: str, kind: type[_T]) -> _T:
        value = self.given[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise PlanError(
                f"Option {key} of {self.function!r} must be {kind.__name__}, not {value.__class__.__name__}."
            )
        return value


def _fill_cast(out: plan_pb2.FunctionOptions, o: _Options) -> None:
    target = o.require("target_type", pa.DataType)
    out.cast.target_type = pa.schema([pa.field("t", target)]).serialize().to_pybytes()
    out.cast.safe = o.get("safe", bool, True)


def _fill_set_lookup(out: plan_pb2.FunctionOptions, o: _Options) -> None:
    out.set_lookup.value_set = _value_set_bytes(o.function, o.require("value_set", object))
    out.set_lookup.skip_nulls = o.get("skip_nulls", bool, False)


def _fill_match_substring(out: plan_pb2.FunctionOptions, o: _Options) -> None:
    out.match_substring.pattern = o.require("pattern", str)
    out.match_substring.ignore_case = o.get("ignore_case", bool, False)


def _fill_slice(out: plan_pb2.FunctionOptions, o: _Options) -> None:
    out.slice.start = o.require("start", int)
    stop = o.optional("stop", int)
    if stop is not None:
        out.slice.stop = stop
    step = o.get("step", int, 1)
    if step == 0:
        raise PlanError(f"Option step of {o.function!r} must not be 0.")
    out.slice.step = step


ROUND_MODES = ("", "half_to_even", "half_towards_infinity")


def _fill_round(out: plan_pb2.FunctionOptions, o: _Options) -> None:
    out.round.SetInParent()
    out.round.ndigits = o.get("ndigits", int, 0)
    mode = o.get("round_mode", str, "")
    if mode not in ROUND_MODES:
        raise PlanError(f"Option round_mode of {o.function!r} must be one of {ROUND_MODES}, not {mode!r}.")
    out.round.round_mode = mode


def _fill_null(out: plan_pb2.FunctionOptions, o: _Options) -> None:
    out.null.SetInParent()
    out.null.nan_is_null = o.get("nan_is_null", bool, False)


_FILLERS: dict[str, tuple[tuple[str, ...], Callable[[plan_pb2.FunctionOptions, _Options], None]]] = {
    "cast": (("target_type", "safe"), _fill_cast),
    "set_lookup": (("value_set", "skip_nulls"), _fill_set_lookup),
    "match_substring": (("pattern", "ignore_case"), _fill_match_substring),
    "slice": (("start", "stop", "step"), _fill_slice),
    "round": (("ndigits", "round_mode"), _fill_round),
    "null": (("nan_is_null",), _fill_null),
}


def options_message(spec: FunctionSpec, given: Mapping[str, object]) -> plan_pb2.FunctionOptions | None:
    """The typed options of a call of ``spec`` with keyword options ``given`` (None: the call sets none)."""
    if spec.options is None:
        if given:
            raise PlanError(f"Function {spec.name!r} takes no options, but got {', '.join(sorted(given))}.")
        return None
    if not given and not spec.options_required:
        return None
    keys, fill = _FILLERS[spec.options]
    unknown = sorted(set(given) - set(keys))
    if unknown:
        raise PlanError(
            f"Function {spec.name!r} does not take the option(s) {', '.join(unknown)}; it takes {', '.join(keys)}."
        )
    out = plan_pb2.FunctionOptions()
    fill(out, _Options(spec.name, given))
    return out


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
