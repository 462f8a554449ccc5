"""Nested data in SQL: a struct's fields, a list's elements and length.

Structs and lists read from Parquet reach the IR as Arrow's own types; these builders turn DataFusion's
access functions into pyarrow's: ``get_field`` (``s.a``, ``s['a']``) into ``struct_field`` by the field's
position, ``array_element`` (``l[i]``, from 1; Spark's ``l[i]`` from 0 arrives here from 1 too) into the
element of a one-long fixed-size slice (pyarrow's ``list_element`` fails past a list's end, where DuckDB
gives NULL; Spark's ANSI answer there is an error, made so), ``cardinality`` / ``array_length`` into
``list_value_length``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from flight.plan.expr import Expr, call, if_else, lit
from flight.sql.errors import unsupported
from flight.sql.rel import Scalars, constant

__all__ = ["FUNCTIONS"]

DFExpr = Any


def _get_field(t: Scalars, args: list[DFExpr], e: DFExpr) -> Expr:
    """A field of a struct, or of a struct in it (``s.c.d`` is one call with the path ``c``, ``d``)."""
    value = t(args[0])
    vt = t.type_of(value)
    path = []
    for i in range(1, len(args)):
        name = constant(args, i, "a field's name")
        if not pa.types.is_struct(vt):
            raise unsupported(f"a field of a {vt} (get_field of {name!r})")
        index = vt.get_field_index(str(name))
        if index < 0:
            raise unsupported(f"the field {name!r} of {vt}: it has {', '.join(vt.field(k).name for k in range(vt.num_fields))}")
        path.append(index)
        vt = vt.field(index).type
    return call("struct_field", value, indices=path)


def _array_element(t: Scalars, args: list[DFExpr], e: DFExpr) -> Expr:
    """The i-th element (from 1), or NULL past the end."""
    value = t(args[0])
    vt = t.type_of(value)
    if not (pa.types.is_list(vt) or pa.types.is_large_list(vt)):
        raise unsupported(f"an element of a {vt}")
    index = constant(args, 1, "a list's index")
    if index is None:
        return lit(None, vt.value_type)
    i = int(index)
    if i < 1:
        raise unsupported(f"the list element {i} (elements count from 1; from the end is not taken)")
    element = call("list_element", call("list_slice", value, start=i - 1, stop=i), lit(0, pa.int64()))
    if t.dialect != "spark":
        return element
    # Spark (ANSI) fails an index past the end. The IR has no call that raises: text that is not a number, cast
    # to one, fails in either engine with the text in its message (flight.sql.joins.one_row's way).
    short = call("list_value_length", value).cast(pa.int64()) < lit(i, pa.int64())
    message = f"SQL: [INVALID_ARRAY_INDEX] the index {i - 1} (from 0) is out of bounds of the array"
    check = if_else(short, lit(message), lit("0")).cast(pa.int32())
    return if_else(check == lit(0, pa.int32()), element, lit(None, vt.value_type))


def _length(t: Scalars, args: list[DFExpr], e: DFExpr) -> Expr:
    """A list's length: DuckDB's BIGINT, Spark's INT; NULL for a NULL list (of its first dimension: the only one)."""
    if len(args) > 1 and constant(args, 1, "ARRAY_LENGTH's dimension") != 1:
        raise unsupported("array_length() of a dimension other than 1")
    value = t(args[0])
    vt = t.type_of(value)
    if not (pa.types.is_list(vt) or pa.types.is_large_list(vt)):
        raise unsupported(f"the length of a {vt}")
    return call("list_value_length", value).cast(pa.int32() if t.dialect == "spark" else pa.int64())


FUNCTIONS: dict[str, Callable[[Scalars, list[DFExpr], DFExpr], Expr]] = {
    "get_field": _get_field,
    "array_element": _array_element,
    "cardinality": _length,
    "array_length": _length,
}
"""Nested-data functions by DataFusion's name."""
