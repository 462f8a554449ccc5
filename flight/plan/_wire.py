"""How expressions are encoded: Arrow IPC constants, typed function options, and readable text.

Private helpers of ``flight.plan.expr``, kept apart so the builder itself stays short.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

import pyarrow as pa

from flight._proto import plan_pb2
from flight.errors import PlanError
from flight.plan.functions import FunctionSpec

_T = TypeVar("_T")

_ARROW_ERRORS = (pa.ArrowException, OSError, TypeError, ValueError, OverflowError)
_INFIX = {
    "equal": "==", "not_equal": "!=", "less": "<", "less_equal": "<=", "greater": ">", "greater_equal": ">=",
    "and_kleene": "&", "or_kleene": "|",
    "add_checked": "+", "subtract_checked": "-", "multiply_checked": "*", "divide_checked": "/",
}
_PREFIX = {"invert": "~", "negate_checked": "-"}


def _is_expr(value: object) -> bool:
    from flight.plan.expr import Expr  # the builder imports this module first

    return isinstance(value, Expr)


def _ipc_stream(array: pa.Array) -> bytes:
    batch = pa.record_batch([array], names=["value"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _scalar_bytes(value: object, type: pa.DataType | None) -> bytes:
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
    return _ipc_stream(values)


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


def _fill_round(out: plan_pb2.FunctionOptions, o: _Options) -> None:
    out.round.SetInParent()
    out.round.ndigits = o.get("ndigits", int, 0)


def _fill_null(out: plan_pb2.FunctionOptions, o: _Options) -> None:
    out.null.SetInParent()
    out.null.nan_is_null = o.get("nan_is_null", bool, False)


_FILLERS: dict[str, tuple[tuple[str, ...], Callable[[plan_pb2.FunctionOptions, _Options], None]]] = {
    "cast": (("target_type", "safe"), _fill_cast),
    "set_lookup": (("value_set", "skip_nulls"), _fill_set_lookup),
    "match_substring": (("pattern", "ignore_case"), _fill_match_substring),
    "slice": (("start", "stop", "step"), _fill_slice),
    "round": (("ndigits",), _fill_round),
    "null": (("nan_is_null",), _fill_null),
}


def _fill_options(out: plan_pb2.Call, spec: FunctionSpec, given: Mapping[str, object]) -> None:
    if spec.options is None:
        if given:
            raise PlanError(f"Function {spec.name!r} takes no options, but got {', '.join(sorted(given))}.")
        return
    if not given and not spec.options_required:
        return
    keys, fill = _FILLERS[spec.options]
    unknown = sorted(set(given) - set(keys))
    if unknown:
        raise PlanError(
            f"Function {spec.name!r} does not take the option(s) {', '.join(unknown)}; it takes {', '.join(keys)}."
        )
    fill(out.options, _Options(spec.name, given))


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


def _render(msg: plan_pb2.Expression) -> str:
    kind = msg.WhichOneof("kind")
    if kind == "field":
        return f"col({_quote(msg.field.name)})"
    if kind == "literal":
        return _render_literal(msg.literal)
    if kind != "call":
        return "<unset expression>"
    function = msg.call.function
    args = [_render(arg) for arg in msg.call.args]
    if function in _INFIX and len(args) == 2:
        return f"({args[0]} {_INFIX[function]} {args[1]})"
    if function in _PREFIX and len(args) == 1:
        return f"{_PREFIX[function]}{args[0]}"
    return f"{function}({', '.join(args + _render_options(msg.call.options))})"
