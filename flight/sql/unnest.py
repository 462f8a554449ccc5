"""DataFusion's ``Unnest`` node (SQL's ``UNNEST(l)``, Spark's ``explode``) as the IR's ``Query.unnest``.

DataFusion names the list column to unnest only in its plan's display (``Unnest: lists[c|depth=1]
structs[]``: its Python API gives the node's input and schema, no more); the output keeps the input's
columns in order, the list replaced by its element. One list, one level deep, is taken; unnesting a
struct, several lists at once, or a list of lists is refused by name.
"""

from __future__ import annotations

import re
from typing import Any

from flight.plan.expr import col
from flight.sql.errors import unsupported
from flight.sql.rel import DFPlan, Rel, Relations, fields_of, handles

__all__ = ["unnest"]

_LISTS = re.compile(r"^Unnest: lists\[(.*)\] structs\[(.*)\]")


@handles("Unnest")
def unnest(tr: Relations, v: Any, plan: DFPlan) -> Rel:
    line = plan.display_indent().splitlines()[0].strip()
    found = _LISTS.match(line)
    if found is None:
        raise unsupported(f"an UNNEST DataFusion shows as {line[:120]!r}")
    lists, structs = found.group(1), found.group(2)
    if structs:
        raise unsupported("UNNEST of a struct")
    items = [x for x in lists.split(", ") if x]
    if len(items) != 1:
        raise unsupported(f"UNNEST of {len(items)} lists in one SELECT (one is taken)")
    column, _, depth = items[0].rpartition("|depth=")
    if depth != "1":
        raise unsupported("UNNEST of a list of lists more than one level deep")
    rel = tr.relation(plan.inputs()[0])
    columns = rel.columns()
    if column not in columns:
        raise unsupported(f"UNNEST of {column!r}, which is not a column of its input")
    element = tr.fresh("element")
    query = rel.query.unnest(columns[column], element)
    out = fields_of(plan)
    if len(out) != len(rel.fields):
        raise unsupported(f"an UNNEST whose output has {len(out)} columns for an input of {len(rel.fields)}")
    sources = [element if f == column else columns[f] for f in rel.fields]
    names = [tr.fresh("u") for _ in out]
    return Rel(query.select(**{n: col(source) for n, source in zip(names, sources)}), out)
