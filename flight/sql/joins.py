"""DataFusion's joins as ``JoinNode``s: keys, the condition beside them, and SQL's null rules.

- Equality keys become the join's keys; both sides are cast to one type when they differ
  (DataFusion compares an INT with a BIGINT, a hash join needs one type).
- The rest of the ON condition is the join's filter, evaluated on the joined row, so a semi or
  anti join with ``l2.l_suppkey <> l1.l_suppkey`` (TPC-H Q21) keeps its meaning.
- Keys compared with ``IS NOT DISTINCT FROM`` (``INTERSECT``, ``EXCEPT``) become a null flag and
  a non-null stand-in value each.
- ``NOT IN`` arrives as a null-aware anti join: no row survives a null in the list, and a null
  probe survives only an empty list. Two counts of the list (rows, non-null keys), joined in as
  one row, decide it.
- A join without keys (a cross join, ``ON true``) joins on a constant.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pyarrow as pa

from flight.plan import agg
from flight.plan.expr import Expr, coalesce, col, if_else, lit
from flight.plan.query import Query
from flight.sql.errors import unsupported
from flight.sql.exprs import ExprTranslator
from flight.sql.rel import Rel, Relations, fields_of, handles

__all__ = ["MARK", "TOO_MANY_ROWS", "join", "one_row"]

MARK = "__mark"
"""The stem of a mark join's column (``EXISTS`` or ``IN`` under ``OR``): true where the left row has a match."""

_HOW = {"Inner": "inner", "Left": "left", "Right": "right", "Full": "full", "LeftSemi": "semi", "LeftAnti": "anti"}


@handles("Join")
def join(tr: Relations, v: Any, plan: Any) -> Rel:
    kind = str(v.join_type())
    left, right = tr.relation(v.left()), tr.relation(v.right())
    pairs = list(v.on())
    if kind in ("RightSemi", "RightAnti"):
        left, right = right, left
        pairs = [(b, a) for a, b in pairs]
        kind = "Left" + kind[len("Right"):]
    if kind not in _HOW and kind != "LeftMark":
        raise unsupported(f"a {kind} join")
    if _alias(v.right()).startswith("__scalar_sq") and not at_most_one_row(v.right()) and not _one_per_key(v.right(), pairs):
        right = Rel(one_row(right.query, tr), right.fields)
    right = _disjoint(left, right, tr)
    lt = ExprTranslator(left.columns(), left.query.schema, tr.dialect)
    rt = ExprTranslator(right.columns(), right.query.schema, tr.dialect)
    lq, rq = left.query, right.query
    lkeys: list[str] = []
    rkeys: list[str] = []
    null_equal = bool(v.null_equals_null())
    for a, b in pairs:
        le, re_ = lt(a), rt(b)
        le, re_ = _one_type(le, re_, lt.type_of(le), rt.type_of(re_))
        if null_equal:
            flags = [(le.is_null(), re_.is_null())]
            values = [(coalesce(le, _stand_in(lt.type_of(le))), coalesce(re_, _stand_in(rt.type_of(re_))))]
            key_pairs = flags + values
        else:
            key_pairs = [(le, re_)]
        for x, y in key_pairs:
            lq, lk = _as_column(lq, x, tr)
            rq, rk = _as_column(rq, y, tr)
            lkeys.append(lk)
            rkeys.append(rk)
    if not lkeys:  # a cross join, or one on a condition that is not an equality
        lq, lk = _as_column(lq, lit(1), tr, force=True)
        rq, rk = _as_column(rq, lit(1), tr, force=True)
        lkeys, rkeys = [lk], [rk]
    condition = v.filter()
    both = ExprTranslator({**left.columns(), **right.columns()}, pa.schema([*lq.schema, *rq.schema]), tr.dialect)
    predicate = both(condition) if condition is not None else None
    if kind == "LeftMark":
        if predicate is not None:
            raise unsupported("EXISTS or IN under OR with a correlation other than equalities")
        marked, name = _mark(lq, rq, lkeys, rkeys, tr)
        return Rel(marked.select(*left.query.schema.names, name), left.fields + fields_of(plan)[-1:])
    how = _HOW[kind]
    null_aware = plan.display().rstrip().endswith("null_aware")
    if null_aware and (predicate is not None or len(pairs) != 1):
        raise unsupported("NOT IN over more than one column or with a further condition")
    joined = lq.join(rq, left_on=lkeys, right_on=rkeys, how=how, filter=predicate)
    kept = list(left.query.schema.names) + ([] if how in ("semi", "anti") else list(right.query.schema.names))
    if null_aware:
        joined = _null_aware(joined, rq, lkeys[0], rkeys[0], tr)
    if joined.schema.names != kept:
        joined = joined.select(*kept)
    fields = fields_of(plan)
    if len(fields) != len(kept):  # a side that reads no column holds a stand-in (a constant) DataFusion does not name
        fields = left.fields + ([] if how in ("semi", "anti") else right.fields)
    return Rel(joined, fields)


def _alias(plan: Any) -> str:
    v = plan.to_variant()
    return str(v.alias()) if type(v).__name__ == "SubqueryAlias" else ""


def at_most_one_row(plan: Any) -> bool:
    """Whether ``plan`` returns at most one row whatever the data: a global aggregate, a LIMIT 1."""
    while True:
        v = plan.to_variant()
        kind = type(v).__name__
        if kind == "Aggregate":
            return not list(v.group_by_exprs())
        if kind == "Limit":
            fetch = v.fetch()
            fetch = fetch.python_value().as_py() if hasattr(fetch, "python_value") else fetch
            return isinstance(fetch, int) and fetch <= 1
        if kind == "Sort" and v.get_fetch_val() is not None:
            return bool(v.get_fetch_val() <= 1)
        if kind == "EmptyRelation":
            return True
        if kind not in ("Projection", "SubqueryAlias", "Filter", "Sort"):
            return False
        plan = plan.inputs()[0]


def _one_per_key(plan: Any, pairs: list[tuple[Any, Any]]) -> bool:
    """Whether a scalar subquery's plan has one row per value of its join keys: a correlated subquery,
    which DataFusion makes an aggregate grouped by the correlated columns and joins on them."""
    keys = {_bare(b.canonical_name()) for _, b in pairs}
    while True:
        v = plan.to_variant()
        kind = type(v).__name__
        if kind == "Aggregate":
            groups = fields_of(plan)[: len(list(v.group_by_exprs()))]
            return bool(groups) and all(_bare(g) in keys for g in groups)
        if kind not in ("Projection", "SubqueryAlias", "Filter", "Sort"):
            return False
        plan = plan.inputs()[0]


def _bare(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _disjoint(left: Rel, right: Rel, tr: Relations) -> Rel:
    """``right`` with its IR names renamed where they are also ``left``'s."""
    taken = set(left.query.schema.names)
    if not taken & set(right.query.schema.names):
        return right
    items: dict[str, Expr] = {}
    for name in right.query.schema.names:
        new = name
        while new in taken or new in items:
            new = f"{name}{tr.fresh('_')}"
        items[new] = col(name)
    return Rel(right.query.select(**items), right.fields)


def _as_column(query: Query, expr: Expr, tr: Relations, force: bool = False) -> tuple[Query, str]:
    name = expr.column_name()
    if name is not None and not force:
        return query, name
    name = tr.fresh("key")
    return query.with_columns(**{name: expr}), name


def _one_type(a: Expr, b: Expr, ta: pa.DataType, tb: pa.DataType) -> tuple[Expr, Expr]:
    if ta == tb:
        return a, b
    if pa.types.is_integer(ta) and pa.types.is_integer(tb):
        return a.cast(pa.int64()), b.cast(pa.int64())
    if pa.types.is_decimal(ta) and pa.types.is_decimal(tb):
        scale = max(ta.scale, tb.scale)
        digits = max(ta.precision - ta.scale, tb.precision - tb.scale)
        common = pa.decimal128(min(38, digits + scale), scale)
        return a.cast(common), b.cast(common)
    if {_family(ta), _family(tb)} == {"string"}:
        return a.cast(pa.string()), b.cast(pa.string())
    if _family(ta) == _family(tb) == "number":
        return a.cast(pa.float64()), b.cast(pa.float64())
    raise unsupported(f"a join of {ta} with {tb}")


def _family(t: pa.DataType) -> str:
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "number"
    return str(t)


def _stand_in(t: pa.DataType) -> Expr:
    """A non-null value of type ``t``, standing for a null key beside its null flag."""
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return lit("").cast(t)
    if pa.types.is_boolean(t):
        return lit(False)
    if pa.types.is_decimal(t):
        return lit(Decimal(0), t)
    if pa.types.is_date32(t):
        return lit(0).cast(pa.int32()).cast(t)
    if pa.types.is_temporal(t):
        return lit(0).cast(t)
    return lit(0).cast(t)


def _null_aware(anti: Query, list_side: Query, probe: str, key: str, tr: Relations) -> Query:
    """``x NOT IN (list)`` from the anti join on ``x``: no row when the list holds a null, and a
    null ``x`` only when the list is empty."""
    rows, keys, one, one2 = tr.fresh("rows"), tr.fresh("keys"), tr.fresh("one"), tr.fresh("one")
    counts = list_side.aggregate([], {rows: agg.count_all(), keys: agg.count(col(key))})
    counts = counts.select(**{one2: lit(1), rows: col(rows), keys: col(keys)})
    with_counts = anti.with_columns(**{one: lit(1)}).join(counts, left_on=one, right_on=one2, how="left")
    keep = (col(rows) == lit(0)) | (col(probe).is_not_null() & (col(rows) == col(keys)))
    return with_counts.filter(coalesce(keep, lit(False))).select(*anti.schema.names)


def _mark(left: Query, right: Query, lkeys: list[str], rkeys: list[str], tr: Relations) -> tuple[Query, str]:
    """DataFusion's mark join (``a > 3 OR EXISTS (...)``): the left rows, each with a column that is true
    where the right side holds its keys and false where it does not; the right side's distinct keys
    are what the left rows are joined with, so no left row is repeated.

    The mark is never null: ``x IN (subquery)`` under OR is false where SQL says unknown (x null, or no
    match and a null in the list). Both filter a row alike, so the translation refuses a mark under NOT
    (``flight.sql.exprs``), the one place where they differ in a predicate, unless the statement holds no
    IN subquery (``rel.NEGATABLE_MARKS``): an EXISTS's mark is exactly SQL's, so NOT EXISTS under OR is taken."""
    name, found = tr.fresh(MARK.strip("_")), tr.fresh("found")
    keys = right.select(*rkeys).distinct().with_columns(**{found: lit(True)})
    joined = left.join(keys, left_on=lkeys, right_on=rkeys, how="left")
    return joined.with_columns(**{name: coalesce(col(found), lit(False))}), name


TOO_MANY_ROWS = "more than one row returned by a subquery used as an expression"


def one_row(query: Query, tr: Relations) -> Query:
    """A scalar subquery's one row, or an error when it has several (as in DuckDB and Spark); no row
    gives a row of nulls.

    The rows are counted beside each column's value (its minimum, the value when there is one row).
    Where the count passes one, each value goes through a cast of this module's message to a number,
    which fails in either engine with the message in its text: the IR has no call that raises."""
    n = tr.fresh("rows")
    calls = {n: agg.count_all(), **{name: agg.min(col(name)) for name in query.schema.names}}
    counted = query.aggregate([], calls)
    check = if_else(col(n) > lit(1), lit(TOO_MANY_ROWS), lit("0")).cast(pa.int32())
    return counted.select(**{
        name: if_else(check == lit(0), col(name), lit(None, query.schema.field(name).type)) for name in query.schema.names
    })
