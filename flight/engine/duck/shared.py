"""A subquery a stage's query repeats is computed once: a ``WITH ... AS MATERIALIZED`` of the query.

Why: the SQL front end inlines each use of a CTE or a view, and a TPC-DS text often writes a rollup as
a union of aggregates over one CTE. A stage run as one DuckDB query (``Translator``'s ``whole``) then
computes that input once per use: TPC-DS q18's rollup joined catalog_sales with five tables five times
over, where DuckDB's own plan of the text joins them once (0.39 s, computed once 0.20; q36, q70 alike).
The planner keeps such copies in one task on purpose when a stage per copy would move more rows than
computing them again costs (``small.CROWDED_MOVES_BYTES``); inside that task they need not be computed
again.

The copies are equal texts once the scans' files are filled in (``duck_units.whole_feeds``): the same
operators over the same files, pruned alike (``flight.planner.prune``), with aliases that do not count
(``Translator.sub``). So the text itself is searched: each parenthesized ``SELECT``, the largest that
occur more than once (not inside another chosen one) named once in a ``WITH`` and read where they were.
Only subqueries that do work worth keeping: an aggregate (``GROUP BY``), or a join or window over more
than one source; a scan stays in place, where DuckDB pushes each use's own filters and join keys into it.

Exact: a subquery without volatile functions gives the same rows each time it is computed; the
translator writes none (no ``random()``, no ``now()``), and a text holding one is left as it is.
"""

from __future__ import annotations

import re

__all__ = ["share_repeated_subqueries"]

_VOLATILE = re.compile(r"\b(random|uuid|gen_random_uuid|now|current_date|current_time|current_timestamp|nextval|setseed)\b", re.I)
_SPECIAL = re.compile(r"[()'\"]")
_SOURCE = re.compile(r"read_parquet\(|__flight_[a-z_]*\d+")


def share_repeated_subqueries(text: str, prefix: str = "__flight_shared") -> str:
    """``text`` with each largest repeated subquery that does work computed once (module doc)."""
    groups, bare = _subqueries(text)
    if len(groups) < 2 or _VOLATILE.search(bare):
        return text
    spans: dict[str, list[tuple[int, int]]] = {}
    for start, end in groups:
        spans.setdefault(text[start + 1 : end], []).append((start, end))
    chosen: list[tuple[int, int, int]] = []  # (open, close, index of the WITH item)
    bodies: list[str] = []
    for body, where in sorted(spans.items(), key=lambda kv: -len(kv[0])):
        if len(where) < 2 or not _works(body):
            continue
        free = [s for s in where if not any(a <= s[0] and s[1] <= b for a, b, _ in chosen)]
        if len(free) < 2:
            continue
        chosen += [(a, b, len(bodies)) for a, b in free]
        bodies.append(body)
    if not bodies:
        return text
    out, last = [], 0
    for start, end, index in sorted(chosen):
        out += [text[last:start], f"(SELECT * FROM {prefix}_{index})"]
        last = end + 1
    out.append(text[last:])
    items = ", ".join(f"{prefix}_{i} AS MATERIALIZED ({body})" for i, body in enumerate(bodies))
    return f"WITH {items} {''.join(out)}"


def _works(body: str) -> bool:
    """Whether computing ``body`` once saves work: it aggregates, or joins (or windows) more than one source."""
    if " GROUP BY " in body:
        return True
    return (" JOIN " in body or " OVER (" in body or " WHERE " in body) and len(_SOURCE.findall(body)) > 1


def _subqueries(text: str) -> tuple[list[tuple[int, int]], str]:
    """(open, close) positions of each parenthesized ``SELECT`` of ``text`` outside quotes ('...' strings,
    "..." names, a doubled quote escaping one), and the text outside quotes (for ``_VOLATILE``)."""
    groups: list[tuple[int, int]] = []
    bare: list[str] = []
    stack: list[int] = []
    pos = 0  # the first character not yet copied to ``bare``
    i = 0
    while (m := _SPECIAL.search(text, i)) is not None:
        at, c = m.start(), m.group()
        if c == "(":
            stack.append(at)
            i = at + 1
        elif c == ")":
            if stack:
                start = stack.pop()
                if text.startswith("(SELECT ", start):
                    groups.append((start, at))
            i = at + 1
        else:  # a quote: skip to its end
            bare.append(text[pos:at])
            j = at + 1
            while True:
                j = text.find(c, j)
                if j < 0:
                    return [], text  # not our text: left alone
                if text.startswith(c + c, j):
                    j += 2
                    continue
                break
            i = pos = j + 1
    bare.append(text[pos:])
    return groups, " ".join(bare)
