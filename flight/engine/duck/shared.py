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
A smaller one inside a kept one counts once there, however often that one is used: TPC-DS q47's CTE
``v1`` (a window over an aggregate) is read whole by the month's row and, projected, by the two rows beside
it; the projection is kept for the two, and ``v1`` inside it for it and the month's row, so it is computed
once, where it was twice. Only subqueries that do work worth keeping: an aggregate (``GROUP BY``), or a join or window over more
than one source; a scan stays in place, where DuckDB pushes each use's own filters and join keys into it,
unless it is a filtered scan that reads many rows and keeps few (``selective_scans``): TPC-H Q2 and Q20
filter ``part``'s 200 thousand rows by a ``LIKE`` (in Q2 with a size) in the query and again in the
subquery's semi join, which DuckDB's own plan of the text reads once (its delim join); computed once, their
DuckDB queries took 0.87 and 0.91 of their time. Kept only when DuckDB estimates it to keep at most
``SCAN_KEEPS`` rows: so few that a join's filter could not have saved much reading them.
And only those that give far fewer rows than they read (``reducing``: DuckDB's own estimates, from
``EXPLAIN``): writing and reading a join's every row costs more than joining again. TPC-DS q23 joins all
of store_sales with customer twice; kept, that join's 2.9 million rows made the query 1.7 times as slow.

Exact: a subquery without volatile functions gives the same rows each time it is computed; the
translator writes none (no ``random()``, no ``now()``), and a text holding one is left as it is.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

from flight.wire.memo import Memo

__all__ = ["REDUCES", "SCAN_KEEPS", "SCAN_READS", "reducing", "selective_scans", "share_repeated_subqueries", "shared_text"]

REDUCES = 4.0
"""How many times fewer rows than its largest scan a subquery must be estimated to give to be kept."""

SCAN_READS = 100_000
"""Fewest rows a filtered scan must read to be computed once: reading it again costs more than writing and
reading what it keeps (TPC-DS's ``date_dim``, 73 thousand rows, and smaller dimensions stay; computed once they
changed DuckDB's join order, a tenth faster or slower by query, and saved no measurable reading)."""

SCAN_KEEPS = 100_000
"""Most rows DuckDB may estimate a filtered scan to keep for it to be computed once (``SCAN_READS``)."""

ASKED = 8
"""Most subqueries ``keep`` is asked about in one text (each is an ``EXPLAIN``, a few milliseconds)."""

_VOLATILE = re.compile(r"\b(random|uuid|gen_random_uuid|now|current_date|current_time|current_timestamp|nextval|setseed)\b", re.I)
_TOKENS = re.compile(r"""[()]|'[^']*(?:''[^']*)*'|"[^"]*(?:""[^"]*)*"|['"]""")
"""What ``_subqueries`` looks at: a parenthesis, a quoted string or name whole (its parentheses are not the query's),
or a quote no quote closes. One ``finditer`` over the text; a search per character of interest, each a call from
Python, was most of sharing a TPC-DS rollup's 41 KB text."""
_SOURCE = re.compile(r"read_parquet\(|__flight_[a-z_]*\d+")
_FILE_LIST = re.compile(r"read_parquet\((\[[^\]]*\])\)")


def shared_text(text: str, cursor: Any) -> str:
    """``share_repeated_subqueries`` of ``text`` with DuckDB (``cursor``) judging what is worth it (``reducing``,
    ``selective_scans``), remembered by the text's digest when it is at most ``REMEMBERED_TEXT`` characters.

    Why: the text names its files, so the same text is the same answer (the judges' answers are remembered by
    the same rule, ``_KEPT``), and finding a text's repeats cost 0.6 ms of a TPC-H query's task at every run
    (geomean), more than any other step between its units' arrival and its query. A judge that failed (an
    ``EXPLAIN`` DuckDB refused) said no, and that answer is kept too: the text is only ever computed as it
    was written."""
    if len(text) > REMEMBERED_TEXT:
        return share_repeated_subqueries(text, reducing(cursor), keep_scan=selective_scans(cursor))
    key = hashlib.sha256(text.encode()).digest()
    known = _SHARED.get(key)
    if known is None:
        known = share_repeated_subqueries(text, reducing(cursor), keep_scan=selective_scans(cursor))
        _SHARED.put(key, known)
    return known


def share_repeated_subqueries(
    text: str,
    keep: Callable[[str], bool] | None = None,
    prefix: str = "__flight_shared",
    keep_scan: Callable[[str], bool] | None = None,
) -> str:
    """``text`` with each largest repeated subquery that does work computed once (module doc); ``keep``
    says whether a subquery is worth it beside that (``reducing``), ``keep_scan`` whether a filtered scan
    is (``selective_scans``; without it, scans stay in place)."""
    groups, bare = _subqueries(text)
    if len(groups) < 2 or _VOLATILE.search(bare):
        return text
    nesting = _Nesting(groups, len(text))
    spans: dict[str, list[tuple[int, int]]] = {}
    for start, end in groups:
        spans.setdefault(text[start + 1 : end], []).append((start, end))
    chosen: list[tuple[int, int, int]] = []  # (open, close, index of the WITH item)
    bodies: list[str] = []  # each WITH item's body, reading the smaller ones chosen after it
    asked = 0
    for body, where in sorted(spans.items(), key=lambda kv: -len(kv[0])):
        works = _works(body)
        if len(where) < 2 or not works or (works == _SCAN and keep_scan is None):
            continue
        joined_once = not _self_joined(text, where, nesting)
        free = [s for s in where if not any(a <= s[0] and s[1] <= b for a, b, _ in chosen)
                and not (joined_once and _joined(text, s, nesting))]
        inside = sum(b.count(f"({body})") for b in bodies)  # in kept ones, each written once
        if len(free) + inside < 2 or asked >= ASKED:
            continue
        judge = keep_scan if works == _SCAN else keep
        if judge is not None:
            asked += 1
            if not judge(body):
                continue
        bodies = [b.replace(f"({body})", f"(SELECT * FROM {prefix}_{len(bodies)})") for b in bodies]
        chosen += [(a, b, len(bodies)) for a, b in free]
        bodies.append(body)
    if not bodies:
        return text
    out, last = [], 0
    for start, end, index in sorted(chosen):
        out += [text[last:start], f"(SELECT * FROM {prefix}_{index})"]
        last = end + 1
    out.append(text[last:])
    # The smaller ones first: a larger one may read them, never the other way round.
    items = ", ".join(f"{prefix}_{i} AS MATERIALIZED ({bodies[i]})" for i in reversed(range(len(bodies))))
    return f"WITH {items} {''.join(out)}"


class _Nesting:
    """Which subquery each of a text's subqueries is directly inside, and which are directly inside each, worked out
    once: the query itself, ``top``, holds the outermost. Why: ``_level`` and the walks up from a use looked through
    every subquery of the text each time, quadratic in them (a TPC-DS rollup's text of 41 KB, ~300 subqueries:
    12-15 ms of each run of q05, q77 and q80)."""

    def __init__(self, groups: list[tuple[int, int]], length: int) -> None:
        self.top = (-1, length)
        self.parent: dict[tuple[int, int], tuple[int, int]] = {}
        self.children: dict[tuple[int, int], list[tuple[int, int]]] = {self.top: []}
        stack = [self.top]
        for group in sorted(groups):  # by where each opens: an enclosing one comes first
            while stack[-1][1] < group[0]:  # closed before this one opens (the query's own end never is)
                stack.pop()
            self.parent[group] = stack[-1]
            self.children[stack[-1]].append(group)
            self.children[group] = []
            stack.append(group)

    def around(self, first: int, last: int, start: tuple[int, int]) -> tuple[int, int]:
        """The innermost subquery (or ``top``) holding ``first`` to ``last`` strictly, looked for up from ``start``
        (one that holds ``first``)."""
        at = start
        while at != self.top and not (at[0] < first and last < at[1]):
            at = self.parent[at]
        return at


def _joined(text: str, span: tuple[int, int], nesting: _Nesting) -> bool:
    """Whether the subquery at ``span`` is (through projections, filters and aggregates) a side of a join.

    Such a use is left as it is: DuckDB filters it by the keys of the join's other side as it runs (its
    join filters reach the scans beneath), which a kept subquery, computed first, cannot have. TPC-DS q23's
    frequent items, used under two ``IN`` joins, grouped 66 thousand of store_sales' rows each where kept
    they grouped all 2 million (0.20 s against 0.30)."""
    while span != nesting.top:
        parent = nesting.parent[span]  # the innermost around it, or the query
        top, children = _level(text, parent, nesting)
        if " JOIN " in top or " AS j0, " in top:
            return True
        if children != 1 or " UNION " in top:
            return False  # one of a union's inputs (a rollup's sets): no join filters it
        span = parent  # through projections, filters and aggregates, which join filters pass too
    return False


def _self_joined(text: str, where: list[tuple[int, int]], nesting: _Nesting) -> bool:
    """Whether the uses at ``where`` meet first in a join (of the subquery with itself, through what each use
    does to it): the join then reads every use whole, and no other side's keys filter them. TPC-DS q02 joins
    its weekly sales of one year with the next's, q59 alike, q47 and q57 each month with the month before and
    after: computed once 0.56, 0.58, 0.73 and 0.81 of their time. A semi join counts: a correlated comparison
    with the CTE's own aggregate (q01, q30, q81: a customer's returns above 1.2 times their store's or state's
    average) meets the aggregate's use there, which reads every row; computed once, q65 took 0.47 of its time,
    q01 0.81, q30 0.87, q81 0.94 (its DuckDB query alone, A/B interleaved). Uses that meet in a union (q23's
    frequent items, each under a join with another channel's sales) are each filtered by their own join."""
    first, last = min(a for a, _ in where), max(b for _, b in where)
    meet = nesting.around(first, last, min(where))  # the innermost group holding every use
    top, _ = _level(text, meet, nesting)
    return (" JOIN " in top or " AS j0, " in top) and " UNION " not in top and " ANTI JOIN " not in top


def _level(text: str, span: tuple[int, int], nesting: _Nesting) -> tuple[str, int]:
    """The text of the subquery at ``span`` outside the subqueries in it, and how many those are at its level."""
    level, at = [], span[0] + 1
    for a, b in nesting.children[span]:
        level.append(text[at:a])
        at = b + 1
    level.append(text[at : span[1]])
    return " ".join(level), len(nesting.children[span])


_SCAN = "scan"


def _works(body: str) -> bool | str:
    """Whether computing ``body`` once saves work: it aggregates, or joins (or windows) more than one source;
    or ``_SCAN``, a filter of one file list's rows, which may (``selective_scans``)."""
    if " GROUP BY " in body:
        return True
    sources = len(_SOURCE.findall(body))
    if sources > 1:
        return " JOIN " in body or " OVER (" in body or " WHERE " in body
    return _SCAN if " WHERE " in body and " OVER (" not in body and _FILE_LIST.search(body) else False


def _subqueries(text: str) -> tuple[list[tuple[int, int]], str]:
    """(open, close) positions of each parenthesized ``SELECT`` of ``text`` outside quotes ('...' strings,
    "..." names, a doubled quote escaping one), and the text outside quotes (for ``_VOLATILE``)."""
    groups: list[tuple[int, int]] = []
    bare: list[str] = []
    stack: list[int] = []
    pos = 0  # the first character not yet copied to ``bare``
    for m in _TOKENS.finditer(text):  # a parenthesis, or a whole quoted string or name: one match each
        c, at = m.group(), m.start()
        if c == "(":
            stack.append(at)
        elif c == ")":
            if stack:
                start = stack.pop()
                if text.startswith("(SELECT ", start):
                    groups.append((start, at))
        elif len(c) == 1:  # a quote that is never closed
            return [], text  # not our text: left alone
        else:
            bare.append(text[pos:at])
            pos = m.end()
    bare.append(text[pos:])
    return groups, " ".join(bare)


def reducing(cursor: Any) -> Callable[[str], bool]:
    """Whether DuckDB (``cursor``) estimates a subquery to give ``REDUCES`` times fewer rows than its largest
    scan reads (``EXPLAIN (FORMAT json)``: planned, not run). A subquery it cannot plan is not kept."""

    def keep(body: str) -> bool:
        key = hashlib.sha256(body.encode()).digest()
        known = _KEPT.get(key)
        if known is not None:
            return known
        try:
            plan = json.loads(cursor.execute(f"EXPLAIN (FORMAT json) {body}").fetchall()[0][1])
        except Exception:  # noqa: BLE001 - not kept: the query itself reports what is wrong
            return False
        out, scans = _estimates(plan[0] if isinstance(plan, list) and plan else {})
        _KEPT.put(key, kept := out is not None and bool(scans) and out * REDUCES <= max(scans))
        return kept

    return keep


def selective_scans(cursor: Any) -> Callable[[str], bool]:
    """Whether a filtered scan of one file list reads at least ``SCAN_READS`` rows (the files' footers) and
    DuckDB (``cursor``) estimates it to keep at most ``SCAN_KEEPS`` of them, and a ``REDUCES``-th of what it
    reads; a scan it cannot plan is not kept."""

    def keep(body: str) -> bool:
        key = hashlib.sha256(b"scan:" + body.encode()).digest()
        known = _KEPT.get(key)
        if known is not None:
            return known
        listed = _FILE_LIST.search(body)
        try:
            reads = cursor.execute(f"SELECT sum(num_rows) FROM parquet_file_metadata({listed.group(1)})").fetchall()[0][0] if listed else 0
            kept = bool(reads) and reads >= SCAN_READS
            if kept:
                plan = json.loads(cursor.execute(f"EXPLAIN (FORMAT json) {body}").fetchall()[0][1])
                out, _ = _estimates(plan[0] if isinstance(plan, list) and plan else {})
                kept = out is not None and out <= SCAN_KEEPS and out * REDUCES <= reads
        except Exception:  # noqa: BLE001 - not kept: the query itself reports what is wrong
            return False
        _KEPT.put(key, kept)
        return kept

    return keep


REMEMBERED_TEXT = 1 << 16
"""Longest text ``shared_text`` remembers (characters): 256 of them, 16 MiB at most with their answers."""

_SHARED: Memo[bytes, str] = Memo(256)
"""``shared_text``'s answers by the text's digest."""

_KEPT: Memo[bytes, bool] = Memo(1024)
"""``reducing``'s answers by the subquery's digest: its text names its files, so the same text is the same
estimate; each ``EXPLAIN`` costs a few milliseconds, and every run of a query asks the same (TPC-DS q18's
rollup: 10 ms of its task)."""


def _estimates(node: dict[str, Any]) -> tuple[float | None, list[float]]:
    """The estimated cardinality nearest the top of a DuckDB JSON plan (down its first inputs), and its
    leaves' estimates."""
    top: float | None = None
    at: dict[str, Any] | None = node
    while at is not None and top is None:
        top = _rows(at)
        children = at.get("children") or []
        at = children[0] if children else None
    scans: list[float] = []
    stack = [node]
    while stack:
        n = stack.pop()
        children = n.get("children") or []
        rows = _rows(n)
        if not children and rows is not None:
            scans.append(rows)
        stack += children
    return top, scans


def _rows(node: dict[str, Any]) -> float | None:
    try:
        return float((node.get("extra_info") or {})["Estimated Cardinality"])
    except (KeyError, TypeError, ValueError):
        return None
