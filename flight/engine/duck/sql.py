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

import datetime as dt
import math
from collections.abc import Sequence
from decimal import Decimal

import pyarrow as pa

from flight.compute.expressions import bound_types, ipc_column, literal_value, to_pyarrow_nodes
from flight.wire._proto import plan_pb2

__all__ = ["MAX_SQL_CHARS", "MAX_SQL_NODES", "Untranslatable", "expression_sql", "ident", "literal", "sql_type"]

MAX_SQL_NODES = 500
"""Larger expressions stay on Acero: DuckDB's parser and binder recurse, and such plans are rare."""
MAX_SQL_CHARS = 64 << 10
"""An expression longer than this as SQL text (or costing eight times as much to write) stays on Acero:
a reused node is written at each use. TPC-H's longest predicate (Q19) is under 2 KiB."""

MAX_VALUE_SET = 10_000
"""Larger ``is_in`` value sets stay on Acero (they would become very long SQL text)."""


class Untranslatable(Exception):
    """The plan uses something this translation does not express with the IR's meaning."""


def ident(name: str) -> str:
    """``name`` as a quoted SQL identifier."""
    if "\x00" in name:
        raise Untranslatable("an identifier holds a NUL character")
    return '"' + name.replace('"', '""') + '"'


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
        return _string(str(v))
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


def _string(text: str) -> str:
    if "\x00" in text:
        raise Untranslatable("a string literal holds a NUL character")
    return "'" + text.replace("'", "''") + "'"


# -------------------------------------------------------------- expressions

_COMPARE = {"equal": "=", "not_equal": "<>", "less": "<", "less_equal": "<=", "greater": ">", "greater_equal": ">="}
_ARITH = {"add": "+", "subtract": "-", "multiply": "*", "bit_wise_and": "&", "bit_wise_or": "|", "shift_left": "<<", "shift_right": ">>"}
_PARTS = {"year": "year", "month": "month", "day": "day", "day_of_year": "dayofyear", "quarter": "quarter",
          "hour": "hour", "minute": "minute", "second": "second", "iso_year": "isoyear"}


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
    """
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
            sql_in = _if_else(nodes, call, texts, types, types[i]) if call.function == "if_else" else None
            if sql_in is not None:
                texts.append(sql_in)
            elif call.function == "is_in" and i in truthy:
                texts.append(_is_in(call, args[0], arg_types[0], truthy=True))
            else:
                texts.append(_call(call, args, arg_types, types[i]))
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


def _cast(text: str, t: pa.DataType) -> str:
    target = sql_type(t)
    if text.startswith("CAST(") and text.endswith(f" AS {target})"):
        return text  # already that type
    return f"CAST({text} AS {target})"


def _uncast(text: str, t: pa.DataType) -> str:
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


def _call(call: plan_pb2.Call, a: list[str], ts: list[pa.DataType], out: pa.DataType) -> str:
    """A call as SQL with pyarrow's meaning (``a``: its arguments' SQL, ``ts``: their types, ``out``: its type)."""
    for translate in (_logic_call, _arithmetic_call, _text_call, _other_call):
        sql = translate(call, a, ts, out)
        if sql is not None:
            return sql
    raise Untranslatable(f"function {call.function!r} over {ts}")


def _logic_call(call: plan_pb2.Call, a: list[str], ts: list[pa.DataType], out: pa.DataType) -> str | None:
    """Comparisons and boolean logic; None for any other function."""
    fn = call.function
    if fn in _COMPARE:
        plain = f"({a[0]} {_COMPARE[fn]} {a[1]})"
        nans = [f"isnan({x})" for x, t in zip(a, ts) if pa.types.is_floating(t)]
        if not nans:
            return plain
        # IEEE, as pyarrow: NaN equals nothing and orders with nothing (DuckDB: NaN = NaN, NaN > all).
        return f"(CASE WHEN {' OR '.join(nans)} THEN {'TRUE' if fn == 'not_equal' else 'FALSE'} ELSE {plain} END)"
    if fn == "and_kleene":
        return "(" + " AND ".join(a) + ")"
    if fn == "or_kleene":
        return "(" + " OR ".join(a) + ")"
    if fn == "and_not_kleene":
        return f"({a[0]} AND NOT {a[1]})"
    if fn in ("and", "or", "and_not"):  # null if either side is null (not Kleene logic)
        op = {"and": f"{a[0]} AND {a[1]}", "or": f"{a[0]} OR {a[1]}", "and_not": f"{a[0]} AND NOT {a[1]}"}[fn]
        return f"(CASE WHEN {a[0]} IS NULL OR {a[1]} IS NULL THEN NULL ELSE ({op}) END)"
    if fn == "xor":
        return f"({a[0]} <> {a[1]})"
    if fn == "invert":
        return f"(NOT {a[0]})"
    return None

def _arithmetic_call(call: plan_pb2.Call, a: list[str], ts: list[pa.DataType], out: pa.DataType) -> str | None:
    """Arithmetic and rounding, typed as pyarrow types them; None for any other function."""
    fn = call.function
    base = fn.removesuffix("_checked")
    if base in _ARITH:
        if pa.types.is_integer(out) or pa.types.is_floating(out):
            return f"({_cast(a[0], out)} {_ARITH[base]} {_cast(a[1], out)})"
        if pa.types.is_decimal(out):
            return _cast(f"({a[0]} {_ARITH[base]} {a[1]})", out)
        raise Untranslatable(f"{fn} over {out}")
    if base == "divide":
        if pa.types.is_integer(out):
            return f"({_cast(a[0], out)} // {_cast(a[1], out)})"
        if pa.types.is_floating(out):
            quotient = f"({_cast(a[0], out)} / {_cast(a[1], out)})"
            if fn == "divide":  # IEEE: x / 0 is inf or nan, as DuckDB also computes it
                return quotient
            return f"(CASE WHEN {a[1]} = 0 THEN error('divide by zero') ELSE {quotient} END)"
        raise Untranslatable(f"{fn} over {out}")  # decimal division rounds differently
    if base == "power" and pa.types.is_floating(out) and fn == "power":
        return _cast(f"pow({a[0]}, {a[1]})", out)
    if base == "negate" and (pa.types.is_floating(out) or pa.types.is_decimal(out) or pa.types.is_signed_integer(out)):
        return _cast(f"(-{a[0]})", out)
    if base == "abs" and (pa.types.is_floating(out) or pa.types.is_decimal(out) or pa.types.is_integer(out)):
        return _cast(f"abs({a[0]})", out)
    if fn == "sqrt" and pa.types.is_floating(out):  # pyarrow: NaN below zero
        return _cast(f"(CASE WHEN {a[0]} < 0 THEN CAST('nan' AS DOUBLE) ELSE sqrt({a[0]}) END)", out)
    if fn in ("floor", "ceil") and (pa.types.is_floating(out) or pa.types.is_decimal(out)):
        return _cast(f"{fn}({a[0]})", out)
    if fn == "round" and (pa.types.is_floating(out) or pa.types.is_decimal(out)):
        digits = call.options.round.ndigits if call.options.HasField("round") else 0
        away = call.options.HasField("round") and call.options.round.round_mode == "half_towards_infinity"
        return _cast(f"{'round' if away else 'round_even'}({a[0]}, {int(digits)})", out)
    return None

def _text_call(call: plan_pb2.Call, a: list[str], ts: list[pa.DataType], out: pa.DataType) -> str | None:
    """Set membership, matching and string functions; None for any other function."""
    fn = call.function
    if fn == "is_in":
        return _is_in(call, a[0], ts[0])
    if fn in ("match_like", "match_substring", "starts_with", "ends_with", "match_substring_regex"):
        return _match(fn, call.options.match_substring, a[0])
    if fn == "utf8_slice_codeunits":
        opts = call.options.slice
        if opts.step not in (0, 1) or opts.start < 0 or (opts.HasField("stop") and opts.stop < 0):
            raise Untranslatable("a slice from the end or with a step")
        if not opts.HasField("stop"):
            return f"substr({a[0]}, {int(opts.start) + 1})"
        return f"substr({a[0]}, {int(opts.start) + 1}, {max(0, int(opts.stop) - int(opts.start))})"
    if fn in ("utf8_upper", "utf8_lower"):
        return f"{fn.removeprefix('utf8_')}({a[0]})"
    if fn == "utf8_length":
        return _cast(f"length({a[0]})", out)
    if fn == "binary_length":
        return _cast(f"octet_length(CAST({a[0]} AS BLOB))", out)
    if fn == "binary_join_element_wise":  # null if any part is null, as || is
        *parts, sep = a
        return "(" + f" || {sep} || ".join(parts) + ")" if parts else "''"
    return None

def _other_call(call: plan_pb2.Call, a: list[str], ts: list[pa.DataType], out: pa.DataType) -> str | None:
    """Casts, date parts, conditionals and null tests; None for any other function."""
    fn = call.function
    if fn == "cast":
        return _cast_call(call, a[0], ts[0], out)
    if fn in _PARTS and _temporal(ts[0]):
        return _cast(f"{_PARTS[fn]}({a[0]})", out)
    if fn == "day_of_week" and _temporal(ts[0]):
        return _cast(f"(isodow({a[0]}) - 1)", out)
    if fn == "if_else":
        return _cast(f"(CASE WHEN {a[0]} IS NULL THEN NULL WHEN {a[0]} THEN {a[1]} ELSE {a[2]} END)", out)
    if fn == "coalesce":
        return _cast(f"coalesce({', '.join(a)})", out) if len(a) > 1 else a[0]
    if fn == "is_null":
        nan = call.options.null.nan_is_null if call.options.HasField("null") else False
        if nan and pa.types.is_floating(ts[0]):
            return f"({a[0]} IS NULL OR isnan({a[0]}))"
        return f"({a[0]} IS NULL)"
    if fn == "is_valid":
        return f"({a[0]} IS NOT NULL)"
    if fn == "is_nan" and pa.types.is_floating(ts[0]):
        return f"isnan({a[0]})"
    if fn == "true_unless_null":
        return f"(CASE WHEN {a[0]} IS NULL THEN NULL ELSE TRUE END)"
    return None

def _temporal(t: pa.DataType) -> bool:
    return pa.types.is_date32(t) or (pa.types.is_timestamp(t) and t.tz is None)


def _if_else(nodes: Sequence[plan_pb2.ExprNode], call: plan_pb2.Call, texts: list[str], types: list[pa.DataType], out: pa.DataType) -> str | None:
    """A plain ``CASE`` when the condition cannot be null (SQL's CASE: the front end wrote ``coalesce(c, FALSE)``), as
    the null branch cost DuckDB a second evaluation of it (Q14's ``LIKE``: 6% of its query); else ``_sql_in``'s."""
    cond = nodes[call.args[0]]
    if cond.WhichOneof("kind") == "call" and cond.call.function == "coalesce" and len(cond.call.args) > 1:
        last = nodes[cond.call.args[-1]]
        if last.WhichOneof("kind") == "literal" and last.literal.WhichOneof("value") == "bool_value":
            return _cast(f"(CASE WHEN {texts[call.args[0]]} THEN {texts[call.args[1]]} ELSE {texts[call.args[2]]} END)", out)
    return _sql_in(nodes, call, texts, types)


def _sql_in(nodes: Sequence[plan_pb2.ExprNode], call: plan_pb2.Call, texts: list[str], types: list[pa.DataType]) -> str | None:
    """SQL's ``x IN (…)`` for ``if_else(is_null(x), null, is_in(x, …))``, what the SQL front end makes of it,
    when the set holds no null (or nulls are skipped): the same values, null for a null ``x``. None otherwise.
    Why: rendered as it is, ``x`` is computed four times per row inside a CASE (TPC-H Q22's
    ``substring(c_phone, 1, 2) IN (…)`` over 150,000 customers: 16.3 ms against 11.3 on one thread)."""
    cond, then, other = (nodes[a] for a in call.args)
    if not (cond.WhichOneof("kind") == "call" and cond.call.function == "is_null" and len(cond.call.args) == 1):
        return None
    if cond.call.options.HasField("null") and cond.call.options.null.nan_is_null:
        return None
    if not (then.WhichOneof("kind") == "literal" and not literal_value(then.literal, "literal").is_valid):
        return None
    if not (other.WhichOneof("kind") == "call" and other.call.function == "is_in" and len(other.call.args) == 1):
        return None
    x, y = cond.call.args[0], other.call.args[0]
    if texts[x] != texts[y]:
        return None
    items, has_null = _value_set(other.call, types[y])
    if not items or (has_null and not other.call.options.set_lookup.skip_nulls):
        return None
    return f"({texts[x]} IN ({', '.join(items)}))"


def _value_set(call: plan_pb2.Call, t: pa.DataType) -> tuple[list[str], bool]:
    """An ``is_in`` call's values as SQL literals of type ``t`` (its nulls left out), and whether it holds a null."""
    values = ipc_column(call.options.set_lookup.value_set, "value_set", "value set")
    if len(values) > MAX_VALUE_SET:
        raise Untranslatable("a large value set")
    if values.type != t:
        values = values.cast(t)
    return [literal(v) for v in values if v.is_valid], values.null_count > 0


def _is_in(call: plan_pb2.Call, arg: str, t: pa.DataType, truthy: bool = False) -> str:
    """pyarrow's ``is_in`` (never null); ``truthy``: where a null result may stand for false."""
    texts, has_null = _value_set(call, t)
    if truthy and texts and not (has_null and not call.options.set_lookup.skip_nulls):
        return f"({arg} IN ({', '.join(texts)}))"
    inside = f"coalesce({arg} IN ({', '.join(texts)}), FALSE)" if texts else "FALSE"
    if has_null and not call.options.set_lookup.skip_nulls:
        return f"({arg} IS NULL OR {inside})"  # pyarrow: a null matches a null in the set
    return f"({arg} IS NOT NULL AND {inside})"  # pyarrow's is_in is never null


def _match(fn: str, opts: plan_pb2.MatchSubstringOptions, arg: str) -> str:
    pattern = _string(opts.pattern)
    if fn == "match_like":
        # pyarrow's backslash escapes; DuckDB's LIKE has no escape character unless told. ESCAPE
        # only when the pattern has a backslash: with it, DuckDB matches row by row, without it
        # '%a%b%' becomes substring searches (TPC-H Q13's orders scan: 153 -> 117 ms).
        escape = " ESCAPE '\\'" if "\\" in opts.pattern else ""
        return f"({arg} {'ILIKE' if opts.ignore_case else 'LIKE'} {pattern}{escape})"
    if fn == "match_substring_regex":
        return f"regexp_matches({arg}, {pattern}{', ' + repr('i') if opts.ignore_case else ''})"
    if opts.ignore_case:
        raise Untranslatable(f"{fn} ignoring case")
    name = {"match_substring": "contains", "starts_with": "starts_with", "ends_with": "ends_with"}[fn]
    return f"{name}({arg}, {pattern})"


def _cast_call(call: plan_pb2.Call, arg: str, source: pa.DataType, target: pa.DataType) -> str:
    """Casts whose results agree in both engines; the rest stay on Acero."""
    if not call.options.cast.safe:
        raise Untranslatable("an unsafe cast")
    if source == target:
        return arg
    numeric = (pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal)
    s_num = any(f(source) for f in numeric)
    t_num = any(f(target) for f in numeric)
    if s_num and t_num:
        if pa.types.is_floating(source) and pa.types.is_integer(target):
            raise Untranslatable("a cast from floating point to an integer")  # pyarrow refuses truncation; DuckDB rounds
        # To a DECIMAL, pyarrow rounds a tie to even and DuckDB away from zero: SQL's front end rounds first (flight.sql.exprs).
        if pa.types.is_decimal(source) and pa.types.is_decimal(target):
            arg = _uncast(arg, source)  # a checked cast to the target follows: the wide one between adds nothing
        return _cast(arg, target)
    if pa.types.is_date32(source) and pa.types.is_timestamp(target) and target.tz is None:
        return _cast(arg, target)
    if pa.types.is_string(target) and (pa.types.is_integer(source) or pa.types.is_string(source) or pa.types.is_date32(source)):
        return _cast(arg, target)
    if pa.types.is_string(source) and (pa.types.is_integer(target) or pa.types.is_date32(target)):
        return _cast(arg, target)
    raise Untranslatable(f"a cast from {source} to {target}")


def column_list(names: Sequence[str], qualifier: str = "") -> str:
    prefix = f"{qualifier}." if qualifier else ""
    return ", ".join(prefix + ident(n) for n in names)
