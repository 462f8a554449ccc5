"""The plan IR as DuckDB SQL text: types, literals, identifiers and expressions.

Nothing a peer sent reaches the text unescaped. Identifiers are always quoted (``"`` doubled); literals are
rendered from their Arrow value by type (strings quoted with ``'`` doubled, decimals and dates from their Python
values, floats by ``repr``, binary as hex), never from text the peer wrote; function names and type names come
from this module's own tables. Anything this module cannot express with the IR's meaning raises
``Untranslatable``, and the task runs on Acero instead (``flight.engine.duck.engine``).

The IR's meaning is pyarrow's (``flight.wire.functions``), so where DuckDB differs the translation bridges it:
``is_in`` never yields null, ``if_else`` with a null condition is null, ``round`` rounds half to even,
``day_of_week`` counts Monday as 0, LIKE escapes with a backslash, and every call whose result type matters is
cast to the type Acero binds it to. What is left over (integer overflow raises instead of wrapping, for one) is
listed in docs/engine.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from flight.compute.expressions import bound_types, column_types, literal_value, referenced_fields, to_pyarrow_nodes
from flight.engine.duck.calls import call_sql, if_else_sql, is_in_sql
from flight.engine.duck.sqltext import Untranslatable, cast_to, column_list, ident, literal, sql_type
from flight.wire._proto import plan_pb2
from flight.wire.memo import Memo

__all__ = ["MAX_SQL_CHARS", "MAX_SQL_NODES", "Untranslatable", "column_list", "expression_sql", "ident", "literal", "sql_type"]

MAX_SQL_NODES = 500
"""Larger expressions stay on Acero: DuckDB's parser and binder recurse, and such plans are rare."""
MAX_SQL_CHARS = 64 << 10
"""An expression longer than this as SQL text (or costing eight times as much to write) stays on Acero:
a reused node is written at each use. TPC-H's longest predicate (Q19) is under 2 KiB."""


def node_types(msg: plan_pb2.Expression, schema: pa.Schema, field: str) -> list[pa.DataType]:
    """The type of every node of ``msg`` over ``schema``, as Acero binds them (one run over no rows)."""
    if len(msg.nodes) == 1 and msg.nodes[0].WhichOneof("kind") == "field":
        return [schema.field(msg.nodes[0].field.name).type]  # a column passed through
    return bound_types("nodes", msg, schema, lambda: to_pyarrow_nodes(msg, field))


def expression_sql(
    msg: plan_pb2.Expression, schema: pa.Schema, field: str, qualifier: str = "", *, predicate: bool = False
) -> str:
    """``msg`` (already checked by the decoder) as SQL over columns of ``schema``.

    ``predicate``: ``msg`` is a filter's predicate, where null and false both drop the row.

    Remembered by the message's bytes and the types of the columns it reads (what the text depends on; a
    translation that fails is not remembered): every run of a query writes the same expressions, and writing
    them was a third of translating a TPC-DS task (q66's 72 sums of CASEs). Small ones only, at most ``_WRITTEN``'s.
    """
    wire = msg.SerializeToString(deterministic=True)
    if len(wire) > _WRITTEN_KEY_BYTES:
        return _expression_sql(msg, schema, field, qualifier, predicate)
    key = (wire, column_types(schema, referenced_fields(msg)), qualifier, predicate)
    known = _WRITTEN.get(key)
    if known is None:
        known = _expression_sql(msg, schema, field, qualifier, predicate)
        _WRITTEN.put(key, known)
    return known


_WRITTEN: Memo[tuple[bytes, tuple[tuple[str, pa.DataType | None], ...], str, bool], str] = Memo(2048)
_WRITTEN_KEY_BYTES = 4 << 10


def _expression_sql(msg: plan_pb2.Expression, schema: pa.Schema, field: str, qualifier: str, predicate: bool) -> str:
    nodes = msg.nodes
    if len(nodes) > MAX_SQL_NODES:
        raise Untranslatable(f"{field} has {len(nodes)} nodes")
    types = node_types(msg, schema, field)
    truthy = _truthy(nodes) if predicate else set()
    texts: list[str] = []
    written = 0  # characters written for all nodes so far: what rendering costs
    prefix = f"{qualifier}." if qualifier else ""
    for i, node in enumerate(nodes):
        kind = node.WhichOneof("kind")
        if kind == "field":
            texts.append(prefix + ident(node.field.name))
        elif kind == "literal":
            texts.append(literal(_scalar(node.literal, types[i])))
        else:
            call = node.call
            args = [texts[a] for a in call.args]
            arg_types = [types[a] for a in call.args]
            sql_in = if_else_sql(nodes, call, texts, types, types[i]) if call.function == "if_else" else None
            if sql_in is not None:
                texts.append(sql_in)
            elif call.function == "is_in" and i in truthy:
                texts.append(is_in_sql(call, args[0], arg_types[0], truthy=True))
            elif _integral_cast(nodes, call, arg_types, types[i]):
                texts.append(cast_to(args[0], types[i]))
            else:
                texts.append(call_sql(call, args, arg_types, types[i]))
        written += len(texts[-1])
        if len(texts[-1]) > MAX_SQL_CHARS or written > 8 * MAX_SQL_CHARS:
            # A node used by several others is written out at each use: a deep DAG grows exponentially as text,
            # and rendering such plans held the GIL for minutes (fuzz: "and-chain of 100", "nested 10 deep"). Acero runs them.
            raise Untranslatable(f"{field} is longer than {MAX_SQL_CHARS >> 10} KiB as SQL text")
    return texts[-1]


def _truthy(nodes: Sequence[plan_pb2.ExprNode]) -> set[int]:
    """The nodes of a predicate whose null may read as false: the root, and the operands of a
    Kleene AND or OR that is one (either way the row goes when they are not true), each used once.

    Why: pyarrow's ``is_in`` is never null, so it translates to ``(x IS NOT NULL AND
    coalesce(x IN (…), FALSE))``, which DuckDB cannot push into a Parquet scan; where null
    and false mean the same, plain ``x IN (…)`` is exact and pushed (TPC-H Q12: 71 → 63 ms
    on one thread for a task's half of SF 1).
    """
    uses = [0] * len(nodes)
    for node in nodes:
        if node.WhichOneof("kind") == "call":
            for a in node.call.args:
                uses[a] += 1
    truthy = {len(nodes) - 1}
    for i in range(len(nodes) - 1, -1, -1):
        node = nodes[i]
        if i in truthy and node.WhichOneof("kind") == "call" and node.call.function in ("and_kleene", "or_kleene"):
            truthy.update(a for a in node.call.args if uses[a] == 1)
    return truthy


def _scalar(msg: plan_pb2.Literal, t: pa.DataType) -> pa.Scalar:
    value = literal_value(msg, "literal")
    return value if value.type == t else value.cast(t)



_INTEGRAL = ("floor", "ceil", "trunc")


def _integral_cast(nodes: Sequence[plan_pb2.ExprNode], call: plan_pb2.Call, ts: list[pa.DataType], out: pa.DataType) -> bool:
    """Whether ``call`` is a checked cast to an integer of a float that is already a whole number (a ``round`` to
    no digits, a ``floor``, a ``ceil``, a ``trunc``). pyarrow refuses to truncate a fraction and DuckDB rounds it
    (``calls``: such casts run on Acero), but a whole number has none: both give it, and both fail on one out of
    range or not a number. TPC-DS q54's ``CAST(ROUND(revenue / 50) AS INT)`` kept the query on Acero."""
    if call.function != "cast" or not call.options.cast.safe or len(call.args) != 1:
        return False
    if not (pa.types.is_floating(ts[0]) and pa.types.is_integer(out)):
        return False
    inner = nodes[call.args[0]]
    if inner.WhichOneof("kind") != "call":
        return False
    fn = inner.call.function
    if fn == "round":
        return not inner.call.options.HasField("round") or inner.call.options.round.ndigits == 0
    return fn in _INTEGRAL
