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

from collections.abc import Iterable
from typing import NoReturn

import pyarrow as pa
import pyarrow.acero as acero

from flight._proto import plan_pb2
from flight.engine.expressions import to_pyarrow
from flight.errors import PlanError, ProtocolError
from flight.plan._wire import _fill_options, _render, _scalar_bytes, _value_set_bytes
from flight.plan.functions import lookup

__all__ = ["Expr", "call", "coalesce", "col", "if_else", "lit", "output_type"]

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_BIND_ERRORS = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, KeyError)

# Calls rendered as operators by repr(); the functions Expr's operators emit.


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
