"""An expression's output type over an input schema: pyarrow's own Acero binds it, over an empty table.

Why apart from ``expr``: building expressions needs no engine; typing them runs Acero (no
hand-written type inference). The nodes call this when they are made, so a plan that does
not fit its schema fails on the coordinator with the function and argument types named.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import acero

from flight.compute.expressions import to_pyarrow_nodes
from flight.errors import PlanError, ProtocolError
from flight.plan.expr_nodes import FieldNode
from flight.wire._proto import plan_pb2
from flight.wire.memo import Memo

if TYPE_CHECKING:
    from flight.plan.expr import Expr

__all__ = ["output_type"]

_BIND_ERRORS = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, KeyError)


def output_type(expr: Expr, schema: pa.Schema) -> pa.DataType:
    """The type ``expr`` produces over input ``schema``; ``PlanError`` when it does not fit.

    Binds the decoded expression with Acero over an empty table of ``schema``.
    """
    node = expr._node
    if isinstance(node, FieldNode):  # most of a plan's expressions: nothing to bind
        index = schema.get_field_index(node.name)
        if index >= 0:
            return schema.field(index).type
    used = expr.referenced_fields()
    missing = sorted(used - set(schema.names))
    if missing:
        available = ", ".join(repr(n) for n in schema.names) or "none"
        raise PlanError(f"Column {missing[0]!r} is not in the input; available columns: {available}.")
    msg = expr._proto()
    if len(msg.nodes) == 1 and msg.nodes[0].WhichOneof("kind") == "field":
        return schema.field(msg.nodes[0].field.name).type  # a column: nothing to bind
    # The type depends on the types of the columns it reads only; hashing the whole schema would
    # cost microseconds per column, for every expression of every node the planner builds.
    key = (expr.wire(), tuple((n, _type_of(schema, n)) for n in sorted(used)))
    known = _TYPED.get(key)
    if known is not None:
        return known
    decoded = _decode(msg)
    try:
        typed = _types([decoded[-1]], schema)[0]
        _TYPED.put(key, typed)
        return typed
    except _BIND_ERRORS as exc:
        failing = _failing_call(msg, decoded, schema)
        if failing is None:
            raise PlanError(f"The expression {expr!r} does not fit the input schema: {exc}") from exc
        function, arg_types = failing
        types = ", ".join(str(t) for t in arg_types)
        raise PlanError(f"Function {function!r} cannot be applied to argument types ({types}): {exc}") from exc


def _type_of(schema: pa.Schema, name: str) -> pa.DataType | None:
    """Column ``name``'s type; None when the name is not one column (the bind then says why)."""
    index = schema.get_field_index(name)
    return schema.field(index).type if index >= 0 else None


_TYPED: Memo[tuple[bytes, tuple[tuple[str, pa.DataType | None], ...]], pa.DataType] = Memo(4096)
"""Types already bound: the optimizer rebuilds nodes, and each node types its expressions again."""


def _decode(msg: plan_pb2.Expression) -> list[pc.Expression]:
    try:
        return to_pyarrow_nodes(msg)
    except ProtocolError as exc:
        raise PlanError(f"The expression is malformed at {exc.field}: {exc}") from exc


def _types(expressions: list[pc.Expression], schema: pa.Schema) -> list[pa.DataType]:
    """The types ``expressions`` yield over ``schema``, bound together by one Acero project."""
    source = acero.Declaration("table_source", acero.TableSourceNodeOptions(schema.empty_table()))
    names = [f"out{i}" for i in range(len(expressions))]
    project = acero.Declaration("project", acero.ProjectNodeOptions(expressions, names))
    return list(acero.Declaration.from_sequence([source, project]).to_table().schema.types)


def _failing_call(
    msg: plan_pb2.Expression, decoded: list[pc.Expression], schema: pa.Schema
) -> tuple[str, list[pa.DataType]] | None:
    """The innermost call that does not bind and the types of its arguments (None: not a call).

    Walks down from the root (which does not bind) into its first argument that
    does not bind, until a call whose arguments all bind.
    """
    index = len(msg.nodes) - 1
    while True:
        node = msg.nodes[index]
        if node.WhichOneof("kind") != "call":
            return None
        refs = list(node.call.args)
        try:
            return node.call.function, _types([decoded[ref] for ref in refs], schema)
        except _BIND_ERRORS:
            pass
        for ref in refs:
            try:
                _types([decoded[ref]], schema)
            except _BIND_ERRORS:
                index = ref
                break
        else:  # each argument binds alone, yet not all together: nothing more precise to say
            return None
