"""DataFusion's optimized logical plan, node by node, as a ``flight.Query``.

DataFusion has already resolved names, coerced types, decorrelated subqueries into joins and
pushed filters down; what is left here is to say each node in the project's IR:

- every column of a relation has an IR name unique within it (``Rel``); DataFusion's qualified
  names (``l1.l_orderkey``) map to them, so self-joins need no suffixes;
- a join's equality keys become ``JoinNode`` keys and its other condition the join's filter;
  keys compared with ``IS NOT DISTINCT FROM`` (``INTERSECT``, ``EXCEPT``) become a null flag and
  a non-null value each, and a ``NOT IN`` (DataFusion's null-aware anti join) keeps SQL's rule
  that a null in the list excludes every row;
- a join without equality keys (a cross join; an uncorrelated scalar subquery, which DataFusion
  is set to make a join) joins on a constant key, so the subquery is computed once, on a worker,
  as part of the same plan.

Anything else is a ``PlanError`` naming the construct. Nothing runs here.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from flight.plan import agg
from flight.plan.expr import Expr, col, lit
from flight.plan.query import Query, from_arrow
from flight.sql import joins, unnest, windows  # noqa: F401 - each registers its node handler (rel.HANDLERS)
from flight.sql.aggregates import Derived, aggregate_call, aggregated
from flight.sql.errors import unsupported
from flight.sql.exprs import DFExpr, ExprTranslator, converted, unify
from flight.sql.functions import arrow_type
from flight.sql.grouping import grouping_sets, grouping_union
from flight.sql.rel import HANDLERS, DFPlan, Rel, fields_of, output_names, schema_of, unique

__all__ = ["Translator"]


class Translator:
    """Translates one statement's plan; ``source`` gives the query of a table by name, ``dialect``
    whose types and answers (DuckDB's or Spark's: ``flight.sql.arithmetic``)."""

    def __init__(self, source: Callable[[str], Query], dialect: str = "duckdb") -> None:
        self.source = source
        self.dialect = dialect
        self._fresh = itertools.count(1)

    def fresh(self, stem: str) -> str:
        return f"__{stem}{next(self._fresh)}"

    def query(self, plan: DFPlan) -> Query:
        """The whole statement, its columns named as the user sees them."""
        rel = self.relation(plan)
        names = output_names(rel.fields)
        if names == rel.query.schema.names:
            return rel.query
        return rel.query.select(**{n: col(c) for n, c in zip(names, rel.query.schema.names)})

    def relation(self, plan: DFPlan) -> Rel:
        v = plan.to_variant()
        kind = type(v).__name__
        registered = HANDLERS.get(kind)
        if registered is not None:
            return registered(self, v, plan)
        handler = getattr(self, f"_{kind}", None)
        if handler is None:
            raise unsupported(_KINDS.get(kind, f"the plan node {kind}"))
        rel: Rel = handler(v, plan)
        return rel

    def exprs(self, rel: Rel) -> ExprTranslator:
        return ExprTranslator(rel.columns(), rel.query.schema, self.dialect)

    # ---------------------------------------------------------------- nodes

    def _TableScan(self, v: Any, plan: DFPlan) -> Rel:
        table = v.table_name()
        base = self.source(table)
        names = [name for _, name in v.projection()]
        if names:
            rel = Rel(base.select(*names) if names != base.schema.names else base, fields_of(plan))
        else:  # count(*) reads no column: one constant stands in, the rows are what counts
            row = self.fresh("row")
            rel = Rel(base.select(**{row: lit(1)}), [row])
        for f in v.filters():
            rel = Rel(rel.query.filter(self.exprs(rel)(f)), rel.fields)
        if v.fetch() is not None:
            rel = Rel(rel.query.limit(int(v.fetch())), rel.fields)
        return rel

    def _SubqueryAlias(self, v: Any, plan: DFPlan) -> Rel:
        return self.relation(plan.inputs()[0]).renamed(fields_of(plan))

    def _Filter(self, v: Any, plan: DFPlan) -> Rel:
        rel = self.relation(plan.inputs()[0])
        return Rel(rel.query.filter(self.exprs(rel)(v.predicate())), rel.fields)

    def _Projection(self, v: Any, plan: DFPlan) -> Rel:
        rel = self.relation(plan.inputs()[0])
        t = self.exprs(rel)
        fields = fields_of(plan)
        items: list[tuple[str, Expr]] = []
        taken: set[str] = set()
        for e in v.projections():
            expr = t(e)
            name = unique(_stem(e, expr), taken)
            items.append((name, expr))
        if not items:  # no column is read above (a count(*)): one constant stands in, as for a scan
            row = self.fresh("row")
            return Rel(rel.query.select(**{row: lit(1)}), [row])
        return Rel(rel.query.select(**dict(items)), fields)

    def _Aggregate(self, v: Any, plan: DFPlan) -> Rel:
        rel = self.relation(plan.inputs()[0])
        t = self.exprs(rel)
        groups = list(v.group_by_exprs())
        sets: list[list[int]] | None = None
        if any(g.variant_name() == "GroupingSet" for g in groups):
            if len(groups) != 1:
                raise unsupported("a GROUP BY with several grouping sets")
            groups, sets = grouping_sets(groups[0])
        extra: dict[str, Expr] = {}
        keys: list[str] = []
        taken = set(rel.query.schema.names)
        for g in groups:
            expr = t(g)
            name = expr.column_name()
            if name is None or name in keys:
                name = unique(_stem(g, expr), taken)
                extra[name] = expr
            keys.append(name)
        query = rel.query.with_columns(**extra) if extra else rel.query
        made: dict[str, agg.Agg | Derived] = {}
        out_taken = set(keys) | {"__grouping_id"}
        for a in v.aggregate_exprs():
            made[unique(_stem(a, None), out_taken)] = aggregate_call(a, t)
        if sets is None:
            return Rel(aggregated(query, keys, made, lambda q, calls: q.aggregate(keys, calls)), fields_of(plan))
        gid = dict(schema_of(plan))["__grouping_id"]
        every = self.dialect == "spark"  # Spark's grand total of no rows is no row (its sets are groups of an expanded input)
        return Rel(aggregated(query, keys, made, lambda q, calls: grouping_union(q, keys, sets, calls, arrow_type(gid), every)), fields_of(plan))

    def _Sort(self, v: Any, plan: DFPlan) -> Rel:
        """ORDER BY: keys that are expressions become hidden columns; a key whose nulls go the other
        way than the sort's (NULLS LAST) is preceded by its null flag, which has no nulls."""
        rel = self.relation(plan.inputs()[0])
        t = self.exprs(rel)
        keys: list[str] = []
        descending: list[bool] = []
        extra: dict[str, Expr] = {}
        for s in v.sort_exprs():
            expr = t(s.expr())
            name = expr.column_name()
            if name is None:
                name = self.fresh("sort")
                extra[name] = expr
            desc = not s.ascending()
            if bool(s.nulls_first()):  # the flag (true for a null) sorts descending: nulls first
                flag = self.fresh("nulls")
                extra[flag] = expr.is_null()
                keys.append(flag)
                descending.append(True)
            keys.append(name)
            descending.append(desc)
        query = rel.query.with_columns(**extra) if extra else rel.query
        query = query.sort(keys, descending, nulls="last")
        fetch = v.get_fetch_val()
        if fetch is not None:
            query = query.limit(int(fetch))
        if extra:
            query = query.select(*rel.query.schema.names)
        return Rel(query, rel.fields)

    def _Limit(self, v: Any, plan: DFPlan) -> Rel:
        rel = self.relation(plan.inputs()[0])
        skip, fetch = _constant(v.skip(), "OFFSET"), _constant(v.fetch(), "LIMIT")
        count = fetch if fetch is not None else 2**62
        return Rel(rel.query.limit(count, skip or 0), rel.fields)

    def _Distinct(self, v: Any, plan: DFPlan) -> Rel:
        rel = self.relation(plan.inputs()[0])
        return Rel(rel.query.distinct(), rel.fields)

    def _Union(self, v: Any, plan: DFPlan) -> Rel:
        """The inputs' rows, each column of the type all inputs' values meet in (a DECIMAL wide
        enough for every input's, as DuckDB types a UNION), named as the first input names it."""
        inputs = [self.relation(p) for p in plan.inputs()]
        names = inputs[0].query.schema.names
        targets = [unify([rel.query.schema.field(i).type for rel in inputs], self.dialect) for i in range(len(names))]
        aligned = []
        for rel in inputs:
            items = {}
            for name, source, target in zip(names, rel.query.schema.names, targets):
                expr, have = col(source), rel.query.schema.field(source).type
                if have != target and not pa.types.is_null(target):
                    expr = converted(expr, have, target)
                items[name] = expr
            same = list(items) == rel.query.schema.names and all(e.column_name() == n for n, e in items.items())
            aligned.append(rel.query if same else rel.query.select(**items))
        return Rel(aligned[0].union(*aligned[1:]), fields_of(plan))

    def _EmptyRelation(self, v: Any, plan: DFPlan) -> Rel:
        if v.produce_one_row():  # SELECT without FROM: one row, no columns (one stands in)
            name = self.fresh("row")
            return Rel(from_arrow(pa.table({name: pa.array([None], pa.int32())})), [name])
        fields = fields_of(plan)  # WHERE false, LIMIT 0: no rows, of the plan's types
        types = [arrow_type(t) for _, t in schema_of(plan)]
        names = [f"c{i}" for i in range(len(fields))]
        return Rel(from_arrow(pa.schema(list(zip(names, types))).empty_table()), fields)

    def _Values(self, v: Any, plan: DFPlan) -> Rel:
        fields = fields_of(plan)
        rows = v.values()
        columns: list[list[object]] = [[] for _ in fields]
        types: list[pa.DataType | None] = [None] * len(fields)
        for row in rows:
            for i, e in enumerate(row):
                while e.variant_name() in ("Alias", "Cast"):
                    e = e.to_variant().expr()
                if e.variant_name() != "Literal":
                    raise unsupported("VALUES with an expression that is not a constant")
                scalar = e.python_value()
                columns[i].append(scalar.as_py())
                if scalar.is_valid:
                    types[i] = types[i] or scalar.type
        names = [f"column{i + 1}" for i in range(len(fields))]
        arrays = [pa.array(c, _values_type(t)) for c, t in zip(columns, types)]
        return Rel(from_arrow(pa.table(dict(zip(names, arrays)))), fields)



_KINDS = {
    "Subquery": "a correlated subquery that could not be turned into a join",
    "Unnest": "UNNEST",
    "RecursiveQuery": "WITH RECURSIVE",
    "Explain": "EXPLAIN (call .explain() on the query)",
    "Analyze": "EXPLAIN ANALYZE",
    "Extension": "this statement",
    "CopyTo": "COPY",
    "Dml": "INSERT, UPDATE and DELETE",
    "Ddl": "this statement (only CREATE VIEW and DROP VIEW are taken)",
    "Repartition": "DISTRIBUTE BY",
}

def _constant(value: Any, what: str) -> int | None:
    """A LIMIT's or OFFSET's count: DataFusion gives an int, an expression, or None (no limit)."""
    if value is None or isinstance(value, int):
        return value
    if hasattr(value, "variant_name") and value.variant_name() == "Literal":
        number = value.python_value().as_py()
        if number is None or (isinstance(number, int) and number >= 0):
            return number
    raise unsupported(f"a {what} that is not a constant count")


def _values_type(t: pa.DataType | None) -> pa.DataType:
    if t is None:
        return pa.null()
    if pa.types.is_string_view(t):
        return pa.string()
    return t


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def _stem(e: DFExpr, expr: Expr | None) -> str:
    """A readable IR name for an expression's column: its alias or column name, else a generic one."""
    if e.variant_name() == "Alias":
        name = e.to_variant().alias()
        if _IDENT.fullmatch(name):
            return str(name)
    if expr is not None and (column := expr.column_name()) is not None:
        return column
    if e.variant_name() == "Column":
        return str(e.to_variant().name())
    return "_expr"
