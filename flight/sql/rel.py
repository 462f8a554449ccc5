"""A translated relation, and what the translation's parts may ask of each other.

DataFusion names a column by its qualifier and name (``l1.l_orderkey``, ``__scalar_sq_1.x``);
the IR names it uniquely within its relation. ``Rel`` keeps both, in order, so a column
reference resolves by position and a self-join needs no suffixes.

The translation is cut by what it translates: ``translate`` walks the plan and looks up a handler
by node kind (``HANDLERS``: ``joins`` and ``windows`` register theirs), ``exprs`` translates
expressions and looks up a function's builder by name (``functions``, ``aggregates``). A handler
or a builder sees its caller only through the protocols here (``Relations``, ``Scalars``), so no
module imports the one that calls it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa

from flight.plan.expr import Expr
from flight.plan.query import Query
from flight.sql.errors import unsupported

__all__ = [
    "HANDLERS", "NEGATABLE_MARKS", "DFPlan", "Handler", "Rel", "Relations", "Scalars", "constant", "fields_of", "handles",
    "output_names", "schema_of", "unique",
]

DFPlan = Any  # datafusion.LogicalPlan: the package is an optional dependency (the ``sql`` extra)


@dataclass(frozen=True)
class Rel:
    """A translated relation: its query, and DataFusion's name for each of its columns, in order."""

    query: Query
    fields: list[str]

    def columns(self) -> dict[str, str]:
        return dict(zip(self.fields, self.query.schema.names))

    def renamed(self, fields: list[str]) -> Rel:
        return Rel(self.query, fields)


class Relations(Protocol):
    """What a node's handler may ask of the plan's translation: its inputs, fresh names, the dialect."""

    dialect: str

    def relation(self, plan: DFPlan) -> Rel: ...

    def fresh(self, stem: str) -> str: ...


class Scalars(Protocol):
    """What a function's builder may ask of the expression translation over one relation."""

    dialect: str  # "duckdb" or "spark": whose types and answers (flight.sql.arithmetic)

    def __call__(self, e: Any) -> Expr: ...

    def type_of(self, e: Expr) -> pa.DataType: ...

    def as_double(self, e: Expr) -> Expr: ...

    def as_text(self, e: Expr) -> Expr: ...

    def common(self, exprs: list[Expr]) -> list[Expr]: ...


NEGATABLE_MARKS: ContextVar[bool] = ContextVar("negatable_marks", default=False)
"""Whether the statement being translated may negate a mark join's mark (``NOT EXISTS`` under ``OR``): true when it
holds no ``IN (subquery)``, so every mark is an EXISTS's, exactly SQL's value (``flight.sql.frontend.Statement``)."""

Handler = Callable[[Relations, Any, DFPlan], "Rel"]
HANDLERS: dict[str, Handler] = {}
"""Node handlers by the kind of DataFusion plan node they translate (``type(plan.to_variant()).__name__``)."""


def handles(kind: str) -> Callable[[Handler], Handler]:
    """Register the decorated function as the handler of plan nodes of ``kind``."""

    def register(handler: Handler) -> Handler:
        HANDLERS[kind] = handler
        return handler

    return register


def constant(args: list[Any], i: int, what: str) -> Any:
    """Argument ``i`` of a function call as a Python value; refused by name (``what``) unless it is a constant."""
    if len(args) <= i or args[i].variant_name() != "Literal":
        raise unsupported(f"{what} that is not a constant")
    return args[i].python_value().as_py()


def fields_of(plan: DFPlan) -> list[str]:
    return list(plan.to_variant().schema().field_names())


def schema_of(plan: DFPlan) -> list[tuple[str, str]]:
    """Each output field of ``plan`` as (name, type as DataFusion prints it).

    Read from the plan's display: DataFusion's Python API names a plan's fields but gives no
    types (needed where a relation has no rows to say them: ``WHERE false``, ``LIMIT 0``)."""
    line = plan.display_indent_schema().splitlines()[0]
    inner = line[_schema_start(line) : -1] if line.endswith("]") else ""
    items, depth, start = [], 0, 0
    for i, c in enumerate(inner):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0 and inner[i + 1 : i + 2] == " ":
            items.append(inner[start:i])
            start = i + 2
    if inner:
        items.append(inner[start:])
    out = []
    for item in items:
        name, _, rest = item.rpartition(":")
        out.append((name, rest.split(";")[0]))
    return out


def _schema_start(line: str) -> int:
    """Where the schema's fields start in a plan's display line: after the ``[`` that the line's last ``]``
    closes (a field's name may hold brackets itself: ``string_agg(...) ORDER BY [x ASC NULLS LAST]``), brackets
    in a quoted literal (``Utf8("[%")``) not counted; where they do not balance, after the last ``" ["``."""
    depth, quoted = 0, False
    for i in range(len(line) - 1, -1, -1):
        if line[i] == '"':
            quoted = not quoted
        elif not quoted:
            depth += {"]": 1, "[": -1}.get(line[i], 0)
            if depth == 0:
                return i + 1
    return line.rindex(" [") + 2 if " [" in line else len(line)


_QUALIFIER = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\.(?=[A-Za-z_\"])")


def output_names(fields: list[str]) -> list[str]:
    """The names a user sees: DataFusion's without table qualifiers, made unique as DuckDB does."""
    taken: set[str] = set()
    return [unique(_QUALIFIER.sub("", f), taken, first=1) for f in fields]


def unique(name: str, taken: set[str], first: int = 2) -> str:
    """``name``, or ``name_<k>`` for the first k from ``first`` not in ``taken``; added to ``taken``."""
    out, k = name, first
    while out in taken:
        out = f"{name}_{k}"
        k += 1
    taken.add(out)
    return out
