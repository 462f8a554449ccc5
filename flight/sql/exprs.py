"""DataFusion's expressions, as the front end typed and simplified them, in the project's own IR.

A DataFusion ``Expr`` becomes a ``flight.Expr`` of whitelisted ``pyarrow.compute`` calls, with
DuckDB's semantics where the two engines differ (the engine that runs them is DuckDB's):

- ``/`` divides as doubles (DuckDB's ``/`` on integers and decimals yields a DOUBLE);
- a decimal product has DuckDB's type (scale s1+s2, precision p1+p2, 18 when both fit in 18),
  made so with a checked cast, and a number literal in decimal arithmetic has the precision of
  its digits, so ``1 - l_discount`` and ``price * 0.2`` are exact DECIMALs as in DuckDB;
- ``CASE`` takes a null condition as false, ``IN`` and ``NOT IN`` keep SQL's three-valued logic,
  ``IS [NOT] DISTINCT FROM`` compares nulls as values.

A subquery DataFusion leaves inside an expression (one it could not make a join) is refused.
"""

from __future__ import annotations

import decimal
from typing import Any

import pyarrow as pa

from flight.errors import PlanError
from flight.plan.expr import Expr, call, coalesce, col, if_else, lit
from flight.plan.typecheck import output_type
from flight.sql.arithmetic import add, divide, fit, modulo, multiply
from flight.sql.dates import DAY_NS, shifted
from flight.sql.errors import unsupported
from flight.sql.functions import FUNCTIONS, arrow_type, cast_target
from flight.sql.rel import NEGATABLE_MARKS

__all__ = ["ExprTranslator", "converted", "unify"]

DFExpr = Any  # datafusion.Expr: the package is an optional dependency (the ``sql`` extra)


class ExprTranslator:
    """Translates expressions over one input relation.

    ``columns`` maps DataFusion's (qualified) field names to the IR's column names; ``schema`` is
    the IR input's schema (types decide decimal arithmetic)."""

    def __init__(self, columns: dict[str, str], schema: pa.Schema, dialect: str = "duckdb") -> None:
        self.columns = columns
        self.schema = schema
        self.dialect = dialect

    # ------------------------------------------------------------- dispatch

    def __call__(self, e: DFExpr) -> Expr:
        kind = e.variant_name()
        handler = getattr(self, f"_{kind}", None)
        if kind == "Placeholder":
            raise PlanError(f"SQL: the parameter {_text(e)} has no value; pass it in params (a prepared statement binds it)")
        if handler is None:
            raise unsupported(f"the expression {_text(e)} ({kind})")
        result: Expr = handler(e)
        return result

    def type_of(self, e: Expr) -> pa.DataType:
        return output_type(e, self.schema)

    def _Alias(self, e: DFExpr) -> Expr:
        return self(e.to_variant().expr())

    def _Column(self, e: DFExpr) -> Expr:
        v = e.to_variant()
        name = self.column(v.qualified_name(), v.name())
        return col(name)

    def column(self, qualified: str, bare: str) -> str:
        found = self.columns.get(qualified)
        if found is None:
            matches = [ir for df, ir in self.columns.items() if df.rsplit(".", 1)[-1] == bare]
            if len(matches) != 1:
                raise PlanError(f"SQL: column {qualified!r} is not in the input ({', '.join(self.columns)})")
            found = matches[0]
        return found

    def _Literal(self, e: DFExpr) -> Expr:
        return literal(e.python_value())

    # ------------------------------------------------------------ operators

    def _BinaryExpr(self, e: DFExpr) -> Expr:
        v = e.to_variant()
        op = v.op()
        if op in ("AND", "OR"):
            parts = [self(x) for x in _flatten(e, op)]
            return call("and_kleene" if op == "AND" else "or_kleene", *parts)
        left, right = self(v.left()), self(v.right())
        simple = _BINARY.get(op)
        if simple is not None:
            return call(simple, *fit(self, left, right, 0))
        if op in ("+", "-"):
            dated = self._dates(v, left, right, op)
            if dated is not None:
                return dated
            return add(self, left, right, op)
        if op == "*":
            return multiply(self, left, right)
        if op == "/":
            return divide(self, left, right)
        if op == "%":
            return modulo(self, left, right, _text(e))
        if op in _BITWISE:
            return call(_BITWISE[op], left, right)
        if op == "||":
            return call("binary_join_element_wise", self.as_text(left), self.as_text(right), lit(""))
        if op in ("~", "~*", "!~", "!~*"):  # a regular expression (Spark's RLIKE), RE2 in both engines
            pattern = v.right()
            if pattern.variant_name() != "Literal":
                raise unsupported(f"a regular expression that is not a constant ({_text(e)})")
            found = call("match_substring_regex", left, pattern=pattern.python_value().as_py(), ignore_case="*" in op)
            return ~found if op.startswith("!") else found
        if op == "IS DISTINCT FROM":
            return distinct_from(left, right)
        if op == "IS NOT DISTINCT FROM":
            return ~distinct_from(left, right)
        raise unsupported(f"the operator {op} ({_text(e)})")

    def _dates(self, v: Any, left: Expr, right: Expr, op: str) -> Expr | None:
        """Date arithmetic: a date plus or minus days (an integer: a DATE), a date or a timestamp plus or
        minus an interval (``flight.sql.dates``: a TIMESTAMP in DuckDB; a DATE in Spark when the interval
        has no time), a date minus a date (days, as DuckDB's BIGINT); None when neither side is a date."""
        lt, rt = self.type_of(left), self.type_of(right)
        if pa.types.is_date32(lt) and pa.types.is_date32(rt) and op == "-":
            return left.cast(pa.int32()).cast(pa.int64()) - right.cast(pa.int32()).cast(pa.int64())
        if pa.types.is_date32(lt) and pa.types.is_integer(rt):
            shifted_days = call("add_checked" if op == "+" else "subtract_checked", left.cast(pa.int32()), right.cast(pa.int32()))
            return shifted_days.cast(pa.date32())
        if not (pa.types.is_date32(lt) or pa.types.is_timestamp(lt)) or rt != pa.month_day_nano_interval():
            return None
        value = v.right().python_value().as_py() if v.right().variant_name() == "Literal" else None
        if value is None:
            raise unsupported("an interval that is not a constant added to a date or a timestamp")
        sign = 1 if op == "+" else -1
        days, nanos = value.days + value.nanoseconds // DAY_NS, value.nanoseconds % DAY_NS
        out = shifted(left, lt, sign * value.months, sign * days, sign * nanos)
        if self.dialect == "spark" and pa.types.is_date32(lt) and not nanos:
            return out.cast(pa.date32())
        return out

    def as_double(self, e: Expr) -> Expr:
        t = self.type_of(e)
        return e if pa.types.is_floating(t) else e.cast(pa.float64())

    def as_text(self, e: Expr) -> Expr:
        t = self.type_of(e)
        return e if pa.types.is_string(t) or pa.types.is_large_string(t) else e.cast(pa.string())

    def _Not(self, e: DFExpr) -> Expr:
        inner = self(e.to_variant().expr())
        if any(name.startswith("__mark") for name in inner.referenced_fields()) and not NEGATABLE_MARKS.get():
            raise unsupported(f"NOT IN under OR ({_text(e)})")  # flight.sql.joins: an IN's mark is never null
        return ~inner

    def _Negative(self, e: DFExpr) -> Expr:
        return call("negate_checked", self(e.to_variant().expr()))

    def _IsNull(self, e: DFExpr) -> Expr:
        return self(e.to_variant().expr()).is_null()

    def _IsNotNull(self, e: DFExpr) -> Expr:
        return self(e.to_variant().expr()).is_not_null()

    def _IsTrue(self, e: DFExpr) -> Expr:
        return coalesce(self(e.to_variant().expr()), lit(False))

    def _IsFalse(self, e: DFExpr) -> Expr:
        return coalesce(~self(e.to_variant().expr()), lit(False))

    def _IsNotTrue(self, e: DFExpr) -> Expr:
        return ~self._IsTrue(e)

    def _IsNotFalse(self, e: DFExpr) -> Expr:
        return ~self._IsFalse(e)

    def _IsUnknown(self, e: DFExpr) -> Expr:
        return self(e.to_variant().expr()).is_null()

    def _IsNotUnknown(self, e: DFExpr) -> Expr:
        return self(e.to_variant().expr()).is_not_null()

    def _Between(self, e: DFExpr) -> Expr:
        v = e.to_variant()
        x = self(v.expr())
        inside = (x >= self(v.low())) & (x <= self(v.high()))
        return ~inside if v.negated() else inside

    def _Like(self, e: DFExpr) -> Expr:
        return self._like(e, ignore_case=False)

    def _ILike(self, e: DFExpr) -> Expr:
        return self._like(e, ignore_case=True)

    def _like(self, e: DFExpr, ignore_case: bool) -> Expr:
        v = e.to_variant()
        pattern = v.pattern()
        if pattern.variant_name() != "Literal":
            raise unsupported(f"LIKE with a pattern that is not a constant ({_text(e)})")
        text = pattern.python_value().as_py()
        if text is None:
            return lit(None, pa.bool_())
        text = like_pattern(text, v.escape_char() or ("\\" if self.dialect == "spark" else None))  # Spark escapes with \ unless told
        case_insensitive = ignore_case or "ilike" in str(e.rex_call_operator()).lower()
        matched = self(v.expr()).like(text, ignore_case=case_insensitive)
        return ~matched if v.negated() else matched

    def _InList(self, e: DFExpr) -> Expr:
        v = e.to_variant()
        x = self(v.expr())
        items = list(v.list())
        if all(i.variant_name() == "Literal" for i in items) and items:
            values = [i.python_value() for i in items]
            found = in_values(x, [s for s in values if s.is_valid], any(not s.is_valid for s in values))
        else:
            found = call("or_kleene", *[x == self(i) for i in items]) if len(items) > 1 else x == self(items[0])
        return ~found if v.negated() else found

    def _Case(self, e: DFExpr) -> Expr:
        v = e.to_variant()
        base = v.expr()
        subject = self(base) if base is not None else None
        otherwise = v.else_expr()
        pairs = [(self(w), self(t)) for w, t in v.when_then_expr()]
        values = self.common([t for _, t in pairs] + ([self(otherwise)] if otherwise is not None else []))
        result = values[-1] if otherwise is not None else lit(None, self.type_of(values[0]))
        for (when, _), then in reversed(list(zip(pairs, values))):
            cond = (subject == when) if subject is not None else when
            result = if_else(coalesce(cond, lit(False)), then, result)
        return result

    def common(self, exprs: list[Expr]) -> list[Expr]:
        """``exprs`` cast to one type where theirs differ, as SQL unifies the branches of a CASE.

        Said explicitly because Acero's binding of ``if_else`` types a decimal result by its
        last argument (a ``0`` literal's DECIMAL(5,4)), where its kernel widens."""
        types = [self.type_of(e) for e in exprs]
        target = unify(types, self.dialect)
        return [e if t == target or pa.types.is_null(target) else converted(e, t, target) for e, t in zip(exprs, types)]

    def _Cast(self, e: DFExpr) -> Expr:
        v = e.to_variant()
        target = arrow_type(cast_target(e))
        inner = v.expr()
        if inner.variant_name() == "Literal":
            value = inner.python_value()
            if pa.types.is_decimal(target) and value.is_valid and isinstance(value.as_py(), (int, decimal.Decimal)):
                return lit(decimal.Decimal(value.as_py()), target)  # the CAST's type, not the digits' (literal())
        source = self(inner)
        have = self.type_of(source)
        if self.dialect == "spark" and target == pa.int32() and "__grouping_id" in str(inner):
            target = pa.int8()  # GROUPING(x): DataFusion's INT, Spark's TINYINT
        if pa.types.is_integer(target) and (pa.types.is_floating(have) or pa.types.is_decimal(have)):
            # pyarrow refuses to drop a fraction: Spark truncates it; DuckDB rounds (a DOUBLE's tie to even).
            mode = "towards_zero" if self.dialect == "spark" else "half_to_even" if pa.types.is_floating(have) else "half_towards_infinity"
            return source.round(0, mode).cast(target)
        if pa.types.is_decimal(target) and pa.types.is_decimal(have) and target.scale < have.scale:
            return converted(source, have, target)  # rounded half away from zero, as DuckDB and Spark cast
        if pa.types.is_decimal(target) and pa.types.is_floating(self.type_of(source)):
            # DuckDB rounds half away from zero (pyarrow's cast to even): rounded first, both engines agree.
            # Also where DataFusion's coercion casts an AVG, a DECIMAL there and a DOUBLE here (as in DuckDB).
            return source.round(target.scale, "half_towards_infinity").cast(target)
        if pa.types.is_decimal(target) and pa.types.is_integer(t := self.type_of(source)):
            digits = len(str(2 ** (t.bit_width - 1)))
            if target.precision - target.scale < digits:  # Arrow wants room for any value; DuckDB checks the values
                return source.cast(pa.decimal128(min(38, digits + target.scale), target.scale)).cast(target)
        return source.cast(target)

    def _TryCast(self, e: DFExpr) -> Expr:
        raise unsupported(f"TRY_CAST ({_text(e)})")

    def _ScalarFunction(self, e: DFExpr) -> Expr:
        name = str(e.rex_call_operator()).lower()
        args = list(e.rex_call_operands())
        make = FUNCTIONS.get(name)
        if make is None:
            raise unsupported(f"the function {name}() ({_text(e)})")
        return make(self, args, e)


# ----------------------------------------------------------------- helpers


def literal(value: pa.Scalar) -> Expr:
    """A constant of DataFusion's, typed as DuckDB types one: a decimal gets the precision of its digits."""
    t = value.type
    if not value.is_valid:  # an untyped NULL is an INTEGER, as in DuckDB
        return lit(None, t if not pa.types.is_null(t) else pa.int32())
    if pa.types.is_decimal(t) and t.scale < 0:  # 1e3: a number with an exponent is a DOUBLE in DuckDB
        return lit(float(value.as_py()))
    if pa.types.is_decimal(t):
        d = value.as_py()
        digits = max(len(str(abs(int(d)))) if int(d) else 1, 1)
        return lit(d, pa.decimal128(min(38, digits + t.scale), t.scale))
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return lit(value.as_py())
    if pa.types.is_integer(t):
        v = value.as_py()
        return lit(v, pa.int32() if -(2**31) <= v < 2**31 else pa.int64())
    return lit(value.as_py(), t)


_INT_DIGITS = {8: 3, 16: 5, 32: 10, 64: 19}


def converted(e: Expr, source: pa.DataType, target: pa.DataType) -> Expr:
    """``e`` cast from ``source`` to ``target``; a DECIMAL that loses digits after the point is rounded
    HALF_UP first (a cast would refuse to drop them)."""
    if pa.types.is_decimal(source) and pa.types.is_decimal(target) and target.scale < source.scale:
        return e.round(target.scale, "half_towards_infinity").cast(target)
    return e.cast(target)


def unify(types: list[pa.DataType], dialect: str = "duckdb") -> pa.DataType:
    """The one type values of ``types`` meet in (SQL's rule for CASE branches, COALESCE and UNION).

    Decimals past 38 digits: DuckDB's keep their scale; Spark's keep their integer digits and give up
    scale (Spark 4's rule, ``retainFractionDigitsOnTruncate`` off)."""
    known = [t for t in types if not pa.types.is_null(t)]
    if not known:
        return pa.null()
    if all(t == known[0] for t in known):
        return known[0]
    if all(pa.types.is_integer(t) for t in known):
        return pa.int64()
    if all(pa.types.is_decimal(t) or pa.types.is_integer(t) for t in known):
        scale = max(t.scale for t in known if pa.types.is_decimal(t))
        digits = max(t.precision - t.scale if pa.types.is_decimal(t) else _INT_DIGITS[t.bit_width] for t in known)
        if dialect == "spark" and digits + scale > 38:
            scale = max(0, 38 - digits)
        return pa.decimal128(min(38, digits + scale), scale)
    if all(pa.types.is_integer(t) or pa.types.is_decimal(t) or pa.types.is_floating(t) for t in known):
        return pa.float64()
    if all(pa.types.is_string(t) or pa.types.is_large_string(t) for t in known):
        return pa.string()
    raise PlanError(f"SQL: values of types {', '.join(sorted({str(t) for t in known}))} do not meet in one type")


def like_pattern(pattern: str, escape: str | None) -> str:
    """A SQL LIKE pattern in Arrow's spelling, where a backslash escapes: without ESCAPE, SQL has
    no escape character (a backslash is itself); with one, that character escapes."""
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if escape and c == escape and i + 1 < len(pattern):
            out.append("\\" + pattern[i + 1])
            i += 2
            continue
        out.append("\\\\" if c == "\\" else c)
        i += 1
    return "".join(out)


def distinct_from(a: Expr, b: Expr) -> Expr:
    """``a IS DISTINCT FROM b``: unequal values, or exactly one of them null."""
    return coalesce(a != b, a.is_null() != b.is_null())


def in_values(x: Expr, values: list[pa.Scalar], has_null: bool) -> Expr:
    """SQL's ``x IN (values)``: null when x is null, or when nothing matched and the list holds a null."""
    if not values:
        return if_else(x.is_null(), lit(None, pa.bool_()), lit(None, pa.bool_()) if has_null else lit(False))
    found = if_else(x.is_null(), lit(None, pa.bool_()), x.isin([v.as_py() for v in values], skip_nulls=True))
    if has_null:
        found = if_else(found, lit(True), lit(None, pa.bool_()))
    return found


def _flatten(e: DFExpr, op: str) -> list[DFExpr]:
    """The operands of a chain of one associative operator (``a AND b AND c``), without recursion."""
    out, stack = [], [e]
    while stack:
        x = stack.pop()
        while x.variant_name() == "Alias":
            x = x.to_variant().expr()
        if x.variant_name() == "BinaryExpr" and x.to_variant().op() == op:
            v = x.to_variant()
            stack += [v.right(), v.left()]
        else:
            out.append(x)
    return out


def _text(e: DFExpr) -> str:
    text = e.canonical_name() if hasattr(e, "canonical_name") else str(e)
    return text if len(text) <= 120 else text[:117] + "..."


_BITWISE = {"&": "bit_wise_and", "|": "bit_wise_or", "#": "bit_wise_xor", "<<": "shift_left", ">>": "shift_right"}

_BINARY = {
    "=": "equal", "!=": "not_equal", "<>": "not_equal", "<": "less", "<=": "less_equal",
    ">": "greater", ">=": "greater_equal",
}
