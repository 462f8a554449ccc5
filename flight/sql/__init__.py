"""SQL in, a ``flight.Query`` out: ``flight.sql(text, tables)``.

DataFusion's planner parses, resolves and optimizes the text (``frontend``); the plan it makes
is translated node by node into the project's IR (``translate``, ``joins``, ``exprs``), which
the distributed planner then cuts into stages like any builder plan. SQL text never crosses
the wire, and nothing reaches a worker until the whole text has planned. docs/sql.md has what
is taken, what is refused, and where the semantics (DuckDB's) differ from Spark SQL's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from flight.errors import PlanError
from flight.plan.query import Query
from flight.sql.catalog import Catalog, Source
from flight.sql.ctes import Cte, shared_ctes
from flight.sql.frontend import Statement, number_placeholders, plan_text, position
from flight.sql.rel import NEGATABLE_MARKS
from flight.sql.translate import Translator

__all__ = ["Catalog", "sql"]


def sql(
    text: str,
    tables: Mapping[str, Source] | Catalog | None = None,
    *,
    dialect: str = "duckdb",
    params: Sequence[object] | Mapping[str, object] | None = None,
) -> Query:
    """The query ``text`` asks, over ``tables`` (a ``Catalog``, or a mapping of names to sources).

    ``dialect``: ``duckdb`` (the default: the engine's own), ``postgres``, ``generic`` or
    ``spark`` (backtick identifiers). ``params``: values for the text's parameters, ``?`` or
    ``$1`` by position (a sequence) or ``$name`` by name (a mapping); they are bound as values
    while planning, never spliced into the text. Raises ``PlanError`` naming what is wrong and where.
    """
    if not isinstance(text, str):
        raise PlanError(f"flight.sql takes SQL text, not {type(text).__name__}")
    text = number_placeholders(text, backslash=dialect == "spark")
    values: dict[str, object] | None = None
    if params is not None:
        values = {str(k): v for k, v in params.items()} if isinstance(params, Mapping) else {str(i): v for i, v in enumerate(params, 1)}
    catalog = tables if isinstance(tables, Catalog) else Catalog(tables)
    words = {w.lower() for w in re.findall(r"\w+", text)}
    schemas = {name: catalog[name].schema for name in catalog if name.lower() in words}
    semantics = "spark" if dialect == "spark" else "duckdb"
    made: dict[str, Query] = {}
    split = shared_ctes(text, dialect) if values is None else None
    if split is not None:
        made, plan, statement = _planned_once(split, catalog, schemas, dialect, semantics)
    if not made:
        plan, statement = plan_text(text, schemas, dialect, list(catalog), values)
    marks = NEGATABLE_MARKS.set(not statement.in_subquery)
    try:
        query = Translator(lambda name: made[name] if name in made else catalog[name], semantics).query(plan)
    except PlanError as exc:
        message = str(exc)
        for word in ("over", "grouping", "rollup", "cube", "try_cast", "escape", "unnest", "filter"):
            if word in message.lower() and (where := position(statement, word)):
                raise PlanError(f"{message} (at {where})") from None
        raise
    finally:
        NEGATABLE_MARKS.reset(marks)
    query.logical_plan = "".join(f"CTE {name} (planned once, read by each use):\n{q.logical_plan}\n" for name, q in made.items())
    query.logical_plan += plan.display_indent()
    return query


def _planned_once(
    split: tuple[str, list[Cte]], catalog: Catalog, schemas: dict[str, pa.Schema], dialect: str, semantics: str
) -> tuple[dict[str, Query], Any, Statement]:
    """Each shared CTE planned and translated alone, then the text without them (``flight.sql.ctes``); nothing
    made if a piece does not plan: the text is then planned as it was, and its errors are its own."""
    text, ctes = split
    made: dict[str, Query] = {}
    known = dict(schemas)
    try:
        for cte in ctes:
            plan, piece = plan_text(cte.text, known, dialect, list(catalog))
            query = Translator(lambda name: made[name] if name in made else catalog[name], semantics).query(plan)
            query.logical_plan = plan.display_indent()
            typed = piece.schema
            if typed is None or len(typed) != len(query.schema):
                return {}, None, None  # type: ignore[return-value]
            made[cte.name] = query
            # The rest of the text sees the CTE's columns by its names, with the types DataFusion gave them: its plan
            # above them is the one it makes inlined (a union's casts of a DECIMAL quotient, TPC-DS q36).
            known[cte.name] = pa.schema([pa.field(n, f.type, f.nullable) for n, f in zip(query.schema.names, typed)])
        plan, statement = plan_text(text, known, dialect, list(catalog))
    except PlanError:
        return {}, None, None  # type: ignore[return-value]
    return made, plan, statement
