"""Numbers written in Python beside a DECIMAL column, made decimals: ``col("price") > 100`` and
``1 - col("disc")`` just work, as in SQL.

Why: a Python ``int`` is an ``int64`` literal, and Arrow's kernels refuse ``decimal128(15, 2)``
beside ``int64`` (they would need 21 digits for any int64); a ``float`` beside a decimal makes
the result a float, no longer exact. DuckDB types such a literal by its digits, and so does
this: an integer becomes ``DECIMAL(digits, 0)``, a float with at most 18 significant digits
``DECIMAL`` of its shortest decimal form. Only literals that are an operand of an arithmetic or
comparison call whose other operand is a decimal change; the rest of the expression is kept.
"""

from __future__ import annotations

import decimal

import pyarrow as pa

from flight.plan.expr import Expr, lit
from flight.plan.expr_nodes import CallNode, LiteralNode, Node
from flight.plan.typecheck import output_type

__all__ = ["with_decimal_literals"]

_OPERATORS = frozenset({
    "add", "add_checked", "subtract", "subtract_checked", "multiply", "multiply_checked", "divide", "divide_checked",
    "equal", "not_equal", "less", "less_equal", "greater", "greater_equal",
})


def with_decimal_literals(expr: Expr, schema: pa.Schema) -> Expr:
    """``expr`` with each Python number beside a decimal operand made a decimal literal (``expr``
    itself when there is none)."""
    names = set(schema.names)
    if not any(pa.types.is_decimal(schema.field(n).type) for n in expr.referenced_fields() if n in names):
        return expr
    fixed = _fix(expr._node, schema)
    return expr if fixed is expr._node else Expr._of(fixed)


def _fix(node: Node, schema: pa.Schema) -> Node:
    if not isinstance(node, CallNode):
        return node
    args = [_fix(a, schema) for a in node.args]
    if node.function in _OPERATORS and len(args) == 2:
        numbers = [_number(a) for a in args]
        if any(n is not None for n in numbers):
            types = [None if n is not None else _type(a, schema) for a, n in zip(args, numbers)]
            if any(t is not None and pa.types.is_decimal(t) for t in types):
                args = [a if n is None else _decimal(n, a) for a, n in zip(args, numbers)]
    if all(a is b for a, b in zip(args, node.args)):
        return node
    return CallNode(node.function, args, node.options)


def _number(node: Node) -> float | None:
    """The Python number a literal node holds (an int64 or double literal from the builder), else None."""
    if not isinstance(node, LiteralNode):
        return None
    kind = node.literal.WhichOneof("value")
    if kind == "int_value":
        return int(node.literal.int_value)
    if kind == "float_value":
        return float(node.literal.float_value)
    return None


def _type(node: Node, schema: pa.Schema) -> pa.DataType | None:
    try:
        return output_type(Expr._of(node), schema)
    except Exception:  # noqa: BLE001 - an operand that does not bind: the caller's check names it
        return None


def _decimal(value: float, node: Node) -> Node:
    d = decimal.Decimal(repr(value)) if isinstance(value, float) else decimal.Decimal(value)
    if not d.is_finite():
        return node
    _, digits, exponent = d.as_tuple()
    scale = max(0, -int(exponent))
    precision = max(len(digits), scale + 1)
    if precision > 38 or (isinstance(value, float) and precision > 18):
        return node
    return lit(d, pa.decimal128(precision, scale))._node
