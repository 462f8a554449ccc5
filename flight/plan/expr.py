"""The user-facing expression builder, compiled to the protobuf IR of ``plan.proto``.

Users write ``(col("price") * 2 > 10) & col("name").like("a%")``; the builder
records an immutable tree of nodes that name only whitelisted
``pyarrow.compute`` functions (``flight.wire.functions``) with typed options,
and ``to_proto`` flattens it into a ``plan_pb2.Expression`` (a list of nodes in
post-order), so a plan can cross the wire with nothing executable in it and no
depth of nesting in its protobuf messages. Arrow types and non-trivial
constants travel as Arrow IPC bytes, which keeps every Arrow type exact.

Composing is O(1): children are shared, never copied. ``&`` and ``|``
(``and_kleene`` / ``or_kleene``) are n-ary: ``a & b & c`` is one call of three
arguments, so ``functools.reduce(operator.or_, terms)`` over thousands of terms
is one shallow node. Nothing here recurses over an expression, so any depth
the worker accepts (``flight.compute.expressions.MAX_DEPTH``) and more can be
built, printed and compared.

Mistakes are caught on the coordinator, before any worker runs:
``call`` rejects unknown functions, wrong arity and unknown options, and
``typecheck.output_type`` type-checks an expression against an input schema by letting
pyarrow's own Acero bind it (no hand-written type inference).
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Iterable
from typing import NoReturn

import pyarrow as pa

from flight.errors import PlanError
from flight.plan.expr_nodes import (
    CallNode,
    FieldNode,
    LiteralNode,
    Node,
    canonical_id,
    flatten,
    nary_call,
    referenced_fields,
    render,
    unflatten,
)
from flight.plan.expr_options import options_message, scalar_bytes
from flight.wire._proto import plan_pb2
from flight.wire.functions import NARY_FUNCTIONS, lookup
from flight.wire.memo import Memo

__all__ = ["Expr", "call", "coalesce", "col", "if_else", "lit"]

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class Expr:
    """An immutable expression: a tree of nodes, flattened to a ``plan_pb2.Expression`` on demand.

    Build one with ``col``, ``lit``, ``call``, operators and methods. The
    comparison operators build expressions instead of comparing, so ``Expr`` is
    deliberately unhashable (``__hash__ = None``): no hash could agree with an
    ``==`` that returns an ``Expr``. Use ``equals`` for structural equality.
    """

    __slots__ = ("_fields", "_flat", "_node", "_wire")
    _node: Node
    _flat: plan_pb2.Expression | None
    _fields: frozenset[str] | None
    _wire: bytes | None
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, msg: plan_pb2.Expression) -> None:
        """An expression read from (a copy of) ``msg``; prefer ``Expr.from_proto`` or the builder functions.

        Raises ``ProtocolError`` when ``msg`` has no nodes or a call names a node that is not an earlier one.
        """
        if not isinstance(msg, plan_pb2.Expression):
            raise TypeError(f"Expr wraps a plan_pb2.Expression, not {msg.__class__.__name__}.")
        object.__setattr__(self, "_node", unflatten(msg))
        object.__setattr__(self, "_flat", None)
        object.__setattr__(self, "_fields", None)
        object.__setattr__(self, "_wire", None)

    @classmethod
    def _of(cls, node: Node) -> Expr:
        self = object.__new__(cls)
        object.__setattr__(self, "_node", node)
        object.__setattr__(self, "_flat", None)
        object.__setattr__(self, "_fields", None)
        object.__setattr__(self, "_wire", None)
        return self

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError("Expr is immutable; build a new expression instead.")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError("Expr is immutable; build a new expression instead.")

    # ---------------------------------------------------------------- proto

    @classmethod
    def from_proto(cls, msg: plan_pb2.Expression) -> Expr:
        """An ``Expr`` read from a copy of ``msg``.

        Only the flat structure is checked here (at least one node; each call's
        arguments are earlier nodes: ``ProtocolError`` naming ``expr.nodes[i].call.args``
        otherwise); ``output_type`` and the worker validate the rest.
        """
        return cls(msg)

    def to_proto(self) -> plan_pb2.Expression:
        """The wire form: a new ``plan_pb2.Expression`` (nodes in post-order, the root last)."""
        copy = plan_pb2.Expression()
        copy.CopyFrom(self._proto())
        return copy

    def _proto(self) -> plan_pb2.Expression:
        """The cached wire form; never hand it out or change it."""
        flat = self._flat
        if flat is None:
            flat = flatten(self._node)
            object.__setattr__(self, "_flat", flat)
        return flat

    def wire(self) -> bytes:
        """The wire form serialized (deterministically), kept: equal bytes for equal expressions, what the planner
        keys a projection's subtree by (``flight.planner.reuse``) without building its operator's message."""
        wire = self._wire
        if wire is None:
            wire = self._proto().SerializeToString(deterministic=True)
            object.__setattr__(self, "_wire", wire)
        return wire

    def equals(self, other: Expr) -> bool:
        """Whether ``other`` is structurally the same expression."""
        if not isinstance(other, Expr):
            return False
        if other._node is self._node:
            return True
        table: dict[tuple[object, ...], int] = {}
        return canonical_id(self._node, table) == canonical_id(other._node, table)

    def referenced_fields(self) -> set[str]:
        """The names of every column the expression reads."""
        fields = self._fields
        if fields is None:  # walked once: the planner asks each expression many times
            fields = frozenset(referenced_fields(self._node))
            object.__setattr__(self, "_fields", fields)
        return set(fields)

    def column_name(self) -> str | None:
        """The column's name if the expression is a bare column reference (``col(name)``), else None."""
        node = self._node
        return node.name if isinstance(node, FieldNode) else None

    def __repr__(self) -> str:
        return render(self._node)

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

    def round(self, ndigits: int = 0, mode: str = "half_to_even") -> Expr:
        """Round to ``ndigits`` decimal places: half to even, as Python's ``round``, or
        ``mode="half_towards_infinity"``, as SQL's ``ROUND``."""
        return call("round", self, ndigits=ndigits, **({} if mode == "half_to_even" else {"round_mode": mode}))

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
    return Expr._of(FieldNode(name))


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
    literal = plan_pb2.Literal()
    if type is not None:
        literal.arrow = _arrow_bytes(value, type)
    elif isinstance(value, bool):
        literal.bool_value = value
    elif isinstance(value, int) and _INT64_MIN <= value <= _INT64_MAX:
        literal.int_value = value
    elif isinstance(value, int) and 0 <= value < 2**64:
        literal.arrow = _arrow_bytes(value, pa.uint64())
    elif isinstance(value, float):
        literal.float_value = value
    elif isinstance(value, str):
        literal.string_value = value
    elif isinstance(value, (bytes, bytearray, memoryview)):
        literal.binary_value = bytes(value)
    else:
        literal.arrow = _arrow_bytes(value, None)
    return Expr._of(LiteralNode(literal))


def _arrow_bytes(value: object, type: pa.DataType | None) -> bytes:
    """``scalar_bytes(value, type)``, remembered for plain Python values (numbers, text, decimals, dates).

    Why: writing the stream costs ~30 us, and a SQL query's plan makes one per decimal or date
    literal each time it is planned. Keyed by the value's class and ``repr`` (``0.05`` and ``0.050``
    are equal decimals of different types; ``0.0`` and ``-0.0`` equal floats of different bits)."""
    text = repr(value) if isinstance(value, _PLAIN) else ""
    if not text or len(text) > 256:
        return scalar_bytes(value, type)
    key = (value.__class__, text, type)
    if (known := _SCALARS.get(key)) is None:
        known = scalar_bytes(value, type)
        _SCALARS.put(key, known)
    return known


_PLAIN = (bool, int, float, str, decimal.Decimal, datetime.date, datetime.time, datetime.timedelta)
"""Values whose ``repr`` says exactly what they are (a ``datetime`` is a ``date``: its repr names its zone)."""
_SCALARS: Memo[tuple[type, str, pa.DataType | None], bytes] = Memo(4096)


def call(function: str, *args: object, **options: object) -> Expr:
    """A call of whitelisted ``pyarrow.compute`` function ``function``.

    Non-``Expr`` arguments are wrapped with ``lit``. ``options`` are the fields
    of the function's options message, e.g. ``call("round", col("x"), ndigits=2)``,
    ``call("is_in", col("x"), value_set=[1, 2], skip_nulls=True)``.
    ``and_kleene`` and ``or_kleene`` take two or more arguments, and an argument
    that is itself a call of the same function is spliced in (they are associative).
    """
    try:
        spec = lookup(function)
    except ValueError as exc:
        raise PlanError(str(exc)) from exc
    if not spec.accepts_arity(len(args)):
        raise PlanError(f"Function {function!r} takes {spec.arity_text()} arguments, not {len(args)}.")
    nodes = [_as_expr(arg)._node for arg in args]
    message = options_message(spec, options)
    if function in NARY_FUNCTIONS and message is None:
        return Expr._of(nary_call(function, nodes))
    return Expr._of(CallNode(function, nodes, message))


def if_else(cond: object, then: object, otherwise: object) -> Expr:
    """``then`` where ``cond`` is true, ``otherwise`` where it is false, null where it is null."""
    return call("if_else", cond, then, otherwise)


def coalesce(*exprs: object) -> Expr:
    """The first non-null value of ``exprs``, row by row."""
    return call("coalesce", *exprs)


# ------------------------------------------------------------------ internals

def _as_expr(value: object) -> Expr:
    return value if isinstance(value, Expr) else lit(value)
