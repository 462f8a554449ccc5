"""The user-facing expression builder, compiled to the protobuf IR of ``plan.proto``.

Users write ``(col("price") * 2 > 10) & col("name").like("a%")``; the builder
records a ``plan_pb2.Expression`` tree that names only whitelisted
``pyarrow.compute`` functions (``flight.plan.functions``) with typed options,
so a plan can cross the wire with nothing executable in it. Arrow types and
non-trivial constants travel as Arrow IPC bytes, which keeps every Arrow type
exact.

Mistakes are caught on the coordinator, before any worker runs:
``call`` rejects unknown functions, wrong arity and unknown options, and
``output_type`` type-checks an expression against an input schema by letting
pyarrow's own Acero bind it (no hand-written type inference).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import NoReturn, TypeVar

import pyarrow as pa
import pyarrow.acero as acero

from flight._proto import plan_pb2
from flight.engine.expressions import to_pyarrow
from flight.errors import PlanError, ProtocolError
from flight.plan.functions import FunctionSpec, lookup

__all__ = ["Expr", "call", "coalesce", "col", "if_else", "lit", "output_type"]

_T = TypeVar("_T")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_ARROW_ERRORS = (pa.ArrowException, OSError, TypeError, ValueError, OverflowError)
_BIND_ERRORS = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, KeyError)

# Calls rendered as operators by repr(); the functions Expr's operators emit.
_INFIX = {
    "equal": "==", "not_equal": "!=", "less": "<", "less_equal": "<=", "greater": ">", "greater_equal": ">=",
    "and_kleene": "&", "or_kleene": "|",
    "add_checked": "+", "subtract_checked": "-", "multiply_checked": "*", "divide_checked": "/",
}
_PREFIX = {"invert": "~", "negate_checked": "-"}


class Expr:
    """An immutable expression: a wrapper around a ``plan_pb2.Expression``.

    Build one with ``col``, ``lit``, ``call``, operators and methods. The
    comparison operators build expressions instead of comparing, so ``Expr`` is
    deliberately unhashable (``__hash__ = None``): no hash could agree with an
    ``==`` that returns an ``Expr``. Use ``equals`` for structural equality.
    """

    __slots__ = ("_msg",)
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, msg: plan_pb2.Expression) -> None:
        """Wrap a copy of ``msg``; prefer ``Expr.from_proto`` or the builder functions."""
        if not isinstance(msg, plan_pb2.Expression):
            raise TypeError(f"Expr wraps a plan_pb2.Expression, not {msg.__class__.__name__}.")
        copy = plan_pb2.Expression()
        copy.CopyFrom(msg)
        object.__setattr__(self, "_msg", copy)

    @classmethod
    def _own(cls, msg: plan_pb2.Expression) -> Expr:
        """Wrap ``msg`` without copying it; for messages nobody else holds."""
        self = object.__new__(cls)
        object.__setattr__(self, "_msg", msg)
        return self

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError("Expr is immutable; build a new expression instead.")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError("Expr is immutable; build a new expression instead.")

    # ---------------------------------------------------------------- proto

    @classmethod
    def from_proto(cls, msg: plan_pb2.Expression) -> Expr:
        """An ``Expr`` over a copy of ``msg`` (not validated; ``output_type`` and the worker do that)."""
        return cls(msg)

    def to_proto(self) -> plan_pb2.Expression:
        """A copy of the underlying message."""
        copy = plan_pb2.Expression()
        copy.CopyFrom(self._msg)
        return copy

    def equals(self, other: Expr) -> bool:
        """Whether ``other`` is structurally the same expression."""
        return isinstance(other, Expr) and self._msg == other._msg

    def referenced_fields(self) -> set[str]:
        """The names of every column the expression reads."""
        names: set[str] = set()
        stack = [self._msg]
        while stack:
            msg = stack.pop()
            kind = msg.WhichOneof("kind")
            if kind == "field":
                names.add(msg.field.name)
            elif kind == "call":
                stack.extend(msg.call.args)
        return names

    def __repr__(self) -> str:
        return _render(self._msg)

    def __bool__(self) -> NoReturn:
        raise TypeError(
            "An Expr has no truth value: combine conditions with & | ~ instead of and / or / not, "
            "and parenthesise each comparison, e.g. (col('a') > 1) & (col('b') < 2)."
        )

    # ------------------------------------------------------------ operators

    def __eq__(self, other: object) -> Expr:  # type: ignore[override]
        return call("equal", self, other)

    def __ne__(self, other: object) -> Expr:  # type: ignore[override]
        return call("not_equal", self, other)

    def __lt__(self, other: object) -> Expr:
        return call("less", self, other)

    def __le__(self, other: object) -> Expr:
        return call("less_equal", self, other)

    def __gt__(self, other: object) -> Expr:
        return call("greater", self, other)

    def __ge__(self, other: object) -> Expr:
        return call("greater_equal", self, other)

    def __and__(self, other: object) -> Expr:
        return call("and_kleene", self, other)

    def __rand__(self, other: object) -> Expr:
        return call("and_kleene", other, self)

    def __or__(self, other: object) -> Expr:
        return call("or_kleene", self, other)

    def __ror__(self, other: object) -> Expr:
        return call("or_kleene", other, self)

    def __invert__(self) -> Expr:
        return call("invert", self)

    def __add__(self, other: object) -> Expr:
        return call("add_checked", self, other)

    def __radd__(self, other: object) -> Expr:
        return call("add_checked", other, self)

    def __sub__(self, other: object) -> Expr:
        return call("subtract_checked", self, other)

    def __rsub__(self, other: object) -> Expr:
        return call("subtract_checked", other, self)

    def __mul__(self, other: object) -> Expr:
        return call("multiply_checked", self, other)

    def __rmul__(self, other: object) -> Expr:
        return call("multiply_checked", other, self)

    def __truediv__(self, other: object) -> Expr:
        return call("divide_checked", self, other)

    def __rtruediv__(self, other: object) -> Expr:
        return call("divide_checked", other, self)

    def __neg__(self) -> Expr:
        return call("negate_checked", self)

    # -------------------------------------------------------------- methods

    def isin(self, values: Iterable[object] | pa.Array | pa.ChunkedArray, skip_nulls: bool = False) -> Expr:
        """Whether each value is in ``values`` (a null matches a null in the set unless ``skip_nulls``)."""
        return call("is_in", self, value_set=values, skip_nulls=skip_nulls)

    def like(self, pattern: str, ignore_case: bool = False) -> Expr:
        """SQL ``LIKE``: ``%`` matches any run of characters, ``_`` any one character."""
        return call("match_like", self, pattern=pattern, ignore_case=ignore_case)

    def contains(self, substring: str, ignore_case: bool = False) -> Expr:
        """Whether ``substring`` occurs in each string."""
        return call("match_substring", self, pattern=substring, ignore_case=ignore_case)

    def startswith(self, prefix: str, ignore_case: bool = False) -> Expr:
        return call("starts_with", self, pattern=prefix, ignore_case=ignore_case)

    def endswith(self, suffix: str, ignore_case: bool = False) -> Expr:
        return call("ends_with", self, pattern=suffix, ignore_case=ignore_case)

    def is_null(self, nan_is_null: bool = False) -> Expr:
        return call("is_null", self, nan_is_null=nan_is_null)

    def is_not_null(self) -> Expr:
        return call("is_valid", self)

    def cast(self, type: pa.DataType, safe: bool = True) -> Expr:
        """Convert to ``type``; with ``safe`` a lossy conversion fails instead of truncating."""
        return call("cast", self, target_type=type, safe=safe)

    def substr(self, start: int, stop: int | None = None) -> Expr:
        """The code units ``[start, stop)`` of each string, 0-based like Python slicing."""
        return call("utf8_slice_codeunits", self, start=start, stop=stop)

    def upper(self) -> Expr:
        return call("utf8_upper", self)

    def lower(self) -> Expr:
        return call("utf8_lower", self)

    def length(self) -> Expr:
        """The number of characters of each string."""
        return call("utf8_length", self)

    def round(self, ndigits: int = 0) -> Expr:
        """Round half to even to ``ndigits`` decimal places, as Python's ``round``."""
        return call("round", self, ndigits=ndigits)

    def year(self) -> Expr:
        return call("year", self)

    def month(self) -> Expr:
        return call("month", self)

    def day(self) -> Expr:
        return call("day", self)

    def day_of_week(self) -> Expr:
        """Monday = 0 ... Sunday = 6."""
        return call("day_of_week", self)

    def day_of_year(self) -> Expr:
        return call("day_of_year", self)

    def quarter(self) -> Expr:
        return call("quarter", self)

    def hour(self) -> Expr:
        return call("hour", self)

    def minute(self) -> Expr:
        return call("minute", self)

    def second(self) -> Expr:
        return call("second", self)

    def between(self, lo: object, hi: object) -> Expr:
        """``lo <= self <= hi``, both ends included."""
        return (self >= lo) & (self <= hi)


# ------------------------------------------------------------------ builders


def col(name: str) -> Expr:
    """A reference to the input column ``name``."""
    if not isinstance(name, str) or not name:
        raise PlanError(f"A column name must be a non-empty string, not {name!r}.")
    msg = plan_pb2.Expression()
    msg.field.name = name
    return Expr._own(msg)


def lit(value: object, type: pa.DataType | None = None) -> Expr:
    """A constant. ``type`` fixes its Arrow type; otherwise Arrow infers it.

    bool, int (within int64), float, str and bytes use the typed fields of
    ``Literal``; anything else (None, dates, datetimes, Decimal, ints beyond
    int64 as uint64, an explicit ``type``) travels as a one-row Arrow IPC stream.
    """
    if isinstance(value, Expr):
        raise PlanError("lit() takes a Python value, not an Expr; use expr.cast(type) to change a type.")
    if type is not None and not isinstance(type, pa.DataType):
        raise PlanError(f"lit() takes a pyarrow DataType as its type, not {type!r}.")
    msg = plan_pb2.Expression()
    literal = msg.literal
    if type is not None:
        literal.arrow = _scalar_bytes(value, type)
    elif isinstance(value, bool):
        literal.bool_value = value
    elif isinstance(value, int) and _INT64_MIN <= value <= _INT64_MAX:
        literal.int_value = value
    elif isinstance(value, int) and 0 <= value < 2**64:
        literal.arrow = _scalar_bytes(value, pa.uint64())
    elif isinstance(value, float):
        literal.float_value = value
    elif isinstance(value, str):
        literal.string_value = value
    elif isinstance(value, (bytes, bytearray, memoryview)):
        literal.binary_value = bytes(value)
    else:
        literal.arrow = _scalar_bytes(value, None)
    return Expr._own(msg)


def call(function: str, *args: object, **options: object) -> Expr:
    """A call of whitelisted ``pyarrow.compute`` function ``function``.

    Non-``Expr`` arguments are wrapped with ``lit``. ``options`` are the fields
    of the function's options message, e.g. ``call("round", col("x"), ndigits=2)``,
    ``call("is_in", col("x"), value_set=[1, 2], skip_nulls=True)``.
    """
    try:
        spec = lookup(function)
    except ValueError as exc:
        raise PlanError(str(exc)) from exc
    if not spec.accepts_arity(len(args)):
        raise PlanError(f"Function {function!r} takes {spec.arity_text()} arguments, not {len(args)}.")
    msg = plan_pb2.Expression()
    msg.call.function = function
    for arg in args:
        msg.call.args.add().CopyFrom(_as_expr(arg)._msg)
    _fill_options(msg.call, spec, options)
    return Expr._own(msg)


def if_else(cond: object, then: object, otherwise: object) -> Expr:
    """``then`` where ``cond`` is true, ``otherwise`` where it is false, null where it is null."""
    return call("if_else", cond, then, otherwise)


def coalesce(*exprs: object) -> Expr:
    """The first non-null value of ``exprs``, row by row."""
    return call("coalesce", *exprs)


def output_type(expr: Expr, schema: pa.Schema) -> pa.DataType:
    """The type ``expr`` produces over input ``schema``; ``PlanError`` when it does not fit.

    Binds the decoded expression with Acero over an empty table of ``schema``.
    """
    missing = sorted(expr.referenced_fields() - set(schema.names))
    if missing:
        available = ", ".join(repr(n) for n in schema.names) or "none"
        raise PlanError(f"Column {missing[0]!r} is not in the input; available columns: {available}.")
    try:
        return _bind(expr._msg, schema)
    except _BIND_ERRORS as exc:
        failing = _failing_call(expr._msg, schema)
        if failing is None:
            raise PlanError(f"The expression {expr!r} does not fit the input schema: {exc}") from exc
        function, arg_types = failing
        types = ", ".join(str(t) for t in arg_types)
        raise PlanError(f"Function {function!r} cannot be applied to argument types ({types}): {exc}") from exc


# ------------------------------------------------------------------ internals


def _as_expr(value: object) -> Expr:
    return value if isinstance(value, Expr) else lit(value)


def _bind(msg: plan_pb2.Expression, schema: pa.Schema) -> pa.DataType:
    try:
        expression = to_pyarrow(msg)
    except ProtocolError as exc:
        raise PlanError(f"The expression is malformed at {exc.field}: {exc}") from exc
    source = acero.Declaration("table_source", acero.TableSourceNodeOptions(schema.empty_table()))
    project = acero.Declaration("project", acero.ProjectNodeOptions([expression], ["out"]))
    return acero.Declaration.from_sequence([source, project]).to_table().schema.field(0).type


def _failing_call(msg: plan_pb2.Expression, schema: pa.Schema) -> tuple[str, list[pa.DataType]] | None:
    """The innermost call that does not bind and the types of its arguments (None: not a call)."""
    if msg.WhichOneof("kind") != "call":
        return None
    arg_types = []
    for arg in msg.call.args:
        try:
            arg_types.append(_bind(arg, schema))
        except _BIND_ERRORS:
            return _failing_call(arg, schema)
    return msg.call.function, arg_types


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
        if isinstance(values, (str, bytes, Expr)) or not isinstance(values, Iterable):
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
