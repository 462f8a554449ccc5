"""A translated relation: its query, and DataFusion's name for each of its columns.

DataFusion names a column by its qualifier and name (``l1.l_orderkey``, ``__scalar_sq_1.x``);
the IR names it uniquely within its relation. ``Rel`` keeps both, in order, so a column
reference resolves by position and a self-join needs no suffixes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from flight.plan.query import Query

__all__ = ["DFPlan", "Rel", "fields_of", "output_names"]

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


def fields_of(plan: DFPlan) -> list[str]:
    return list(plan.to_variant().schema().field_names())


_QUALIFIER = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\.(?=[A-Za-z_\"])")


def output_names(fields: list[str]) -> list[str]:
    """The names a user sees: DataFusion's without table qualifiers, made unique as DuckDB does."""
    out: list[str] = []
    for f in fields:
        name = _QUALIFIER.sub("", f)
        base, n = name, 0
        while name in out:
            n += 1
            name = f"{base}_{n}"
        out.append(name)
    return out
