"""DuckDB SQL text for the IR's values: identifiers, types, literals and casts.

Nothing a peer sent reaches the text unescaped: identifiers are always quoted (``"`` doubled), literals are
rendered from their Arrow value by type (strings quoted with ``'`` doubled, decimals and dates from their
Python values, floats by ``repr``, binary as hex), never from text the peer wrote.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from decimal import Decimal

import pyarrow as pa

__all__ = ["Untranslatable", "cast_to", "column_list", "ident", "literal", "named", "sql_type", "string_literal", "uncast"]


class Untranslatable(Exception):
    """The plan uses something this translation does not express with the IR's meaning."""


def ident(name: str) -> str:
    """``name`` as a quoted SQL identifier."""
    if "\x00" in name:
        raise Untranslatable("an identifier holds a NUL character")
    return '"' + name.replace('"', '""') + '"'


def named(text: str, name: str) -> str:
    """``text AS "name"``, or ``text`` alone where it reads that column already (``"x"``, ``j0."x"``): DuckDB
    parses and binds a stage's text before it runs, and TPC-DS q66's was 36 KB, five times DuckDB's own, mostly
    ``"x" AS "x"`` (10 ms to parse, 14 to bind; DuckDB's text 3 and 7)."""
    quoted = ident(name)
    plain = text == quoted or (text.endswith("." + quoted) and text[: -len(quoted) - 1].isidentifier())
    return text if plain else f"{text} AS {quoted}"


_INTS = {pa.int8(): "TINYINT", pa.int16(): "SMALLINT", pa.int32(): "INTEGER", pa.int64(): "BIGINT",
         pa.uint8(): "UTINYINT", pa.uint16(): "USMALLINT", pa.uint32(): "UINTEGER", pa.uint64(): "UBIGINT"}
_TIMESTAMPS = {"s": "TIMESTAMP_S", "ms": "TIMESTAMP_MS", "us": "TIMESTAMP", "ns": "TIMESTAMP_NS"}


def sql_type(t: pa.DataType) -> str:
    """The DuckDB type holding Arrow type ``t`` exactly, or ``Untranslatable``."""
    if t in _INTS:
        return _INTS[t]
    if t == pa.float32():
        return "FLOAT"
    if t == pa.float64():
        return "DOUBLE"
    if t == pa.bool_():
        return "BOOLEAN"
    if t in (pa.string(), pa.large_string(), pa.string_view()):
        return "VARCHAR"
    if t in (pa.binary(), pa.large_binary(), pa.binary_view()):
        return "BLOB"
    if t == pa.date32():
        return "DATE"
    if pa.types.is_decimal(t) and t.precision <= 38:
        return f"DECIMAL({t.precision},{t.scale})"
    if pa.types.is_timestamp(t) and t.tz is None:
        return _TIMESTAMPS[t.unit]
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return f"{sql_type(t.value_type)}[]"
    if pa.types.is_struct(t) and t.num_fields:
        fields = ", ".join(f"{ident(t.field(i).name)} {sql_type(t.field(i).type)}" for i in range(t.num_fields))
        return f"STRUCT({fields})"
    raise Untranslatable(f"type {t} has no DuckDB translation here")


def literal(value: pa.Scalar) -> str:
    """One Arrow scalar as a typed SQL literal."""
    t = value.type
    kind = sql_type(t)
    if not value.is_valid:
        return f"CAST(NULL AS {kind})"
    v = value.as_py()
    if pa.types.is_boolean(t):
        return "TRUE" if v else "FALSE"
    if pa.types.is_integer(t):
        return f"CAST({int(v)} AS {kind})"
    if pa.types.is_floating(t):
        f = float(v)
        return f"CAST({_NAN if math.isnan(f) else _FLOAT_WORDS.get(f, repr(f))} AS {kind})"
    if pa.types.is_decimal(t):
        assert isinstance(v, Decimal)
        return f"CAST('{v}' AS {kind})"
    if kind == "VARCHAR":
        return string_literal(str(v))
    if kind == "BLOB":
        return f"unhex('{bytes(v).hex()}')"
    if pa.types.is_date32(t) and isinstance(v, dt.date):
        return f"DATE '{v.isoformat()}'"
    if pa.types.is_timestamp(t):
        count = int(value.cast(pa.int64()).as_py())  # since the epoch, in the type's unit
        if t.unit == "ns":
            return f"CAST(make_timestamp_ns(CAST({count} AS BIGINT)) AS {kind})"
        return f"CAST(make_timestamp(CAST({count * _US_PER[t.unit]} AS BIGINT)) AS {kind})"
    raise Untranslatable(f"no literal form for {t}")


_US_PER = {"s": 1_000_000, "ms": 1_000, "us": 1}
_FLOAT_WORDS, _NAN = {math.inf: "'inf'", -math.inf: "'-inf'"}, "'nan'"


def string_literal(text: str) -> str:
    if "\x00" in text:
        raise Untranslatable("a string literal holds a NUL character")
    return "'" + text.replace("'", "''") + "'"


# -------------------------------------------------------------- expressions


def cast_to(text: str, t: pa.DataType) -> str:
    """``text`` as type ``t``: cast, unless its outermost operation is that cast already."""
    return text if uncast(text, t) != text else f"CAST({text} AS {sql_type(t)})"


def uncast(text: str, t: pa.DataType) -> str:
    """``text`` without the outermost cast to ``t`` that ``_cast`` put there, if it did.

    Why: a decimal product is typed as Arrow types it (p1 + p2 + 1 digits: 128-bit in DuckDB)
    and then cast to the IR's narrower type (DuckDB's own, often 64-bit); the wide cast between
    is value-preserving and costs DuckDB its 64-bit arithmetic (TPC-H Q1: 1.7x slower)."""
    suffix = f" AS {sql_type(t)})"
    if not (text.startswith("CAST(") and text.endswith(suffix)):
        return text
    inner = text[len("CAST(") : -len(suffix)]
    depth = 0  # the stripped cast must be the outermost one: its parentheses balance inside
    for c in inner:
        depth += c == "("
        depth -= c == ")"
        if depth < 0:
            return text
    return inner if depth == 0 else text



def column_list(names: Sequence[str], qualifier: str = "") -> str:
    prefix = f"{qualifier}." if qualifier else ""
    return ", ".join(prefix + ident(n) for n in names)
