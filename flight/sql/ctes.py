"""A CTE the query names more than once, and that aggregates or joins, is planned once: every use reads one subplan.

Why: DataFusion inlines a CTE at each place it is named and then optimizes each copy on its own: it prunes
each copy to the columns its use reads and pushes each use's filters into it. The copies then differ, and
no later pass can see them as one (``flight.planner.reuse`` and ``flight.engine.duck.shared`` look for equal
subplans). DuckDB computes such a CTE once (it materializes a CTE named twice that does work): TPC-DS q27's
``results``, a join of five tables read by three aggregates, took DuckDB 83 ms computed once and 231 ms
inlined; q31 53 and 98; q14 192 and 498; q47 148 and 358.

How: the text's top-level ``WITH`` is read with sqlglot's tokenizer for the text's dialect (no parse, no
rewrite of anything else). Each CTE named at least twice (after ``FROM``, ``JOIN`` or a comma) whose body
aggregates, joins, or computes a window is cut out of the text and planned alone (with the CTEs before it
that stay); its plan is translated once, and the text without it is planned over a table of that name
and schema, whose query is the CTE's (``flight.sql.sql``). Each use then reads the same subplan: the planner
prunes equal subplans to what all their uses read, and computes them once where that is cheaper.

The rest of the text knows the CTE's columns with the types DataFusion gave them (``Statement.schema``), so
its plan above them is the one it makes with the CTE inlined (TPC-DS q36 unions a DECIMAL quotient of the CTE
with another: typed as translated, the union's type changed).

Left inlined: a text with parameters, a ``RECURSIVE`` text, a text with another ``WITH`` inside, a CTE with a
column list, a quoted name, ``NOT MATERIALIZED``, a volatile function (each use must compute its own), a body
that is a union (each use's filter on a branch's constant drops the other branches when inlined: TPC-DS
q04's ``year_total``), a CTE named in an ``IN`` or ``EXISTS`` subquery (a semi join's side, which DuckDB
filters as it runs: q95's ``ws_wh``), and any text whose cut pieces do not plan (``flight.sql.sql`` then plans
the text as it was, so its errors are the text's own).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Cte", "shared_ctes"]

_VOLATILE = frozenset({"random", "uuid", "gen_random_uuid", "now", "current_timestamp", "nextval", "setseed", "rand"})
_WORK = frozenset({"GROUP_BY", "DISTINCT", "OVER", "JOIN", "WINDOW"})


@dataclass(frozen=True)
class Cte:
    """A CTE planned alone: its name (as the planner knows it) and the text that plans it."""

    name: str
    text: str


@dataclass
class _Def:
    name: str
    start: int  # offset of the name in the text
    end: int  # offset just past the body's closing parenthesis
    body: tuple[int, int]  # the body's first token index, and one past its last
    simple: bool  # a plain name, no column list, not NOT MATERIALIZED


def shared_ctes(text: str, dialect: str) -> tuple[str, list[Cte]] | None:
    """The text without its shared CTEs, and those CTEs in order (module doc); None: nothing to share."""
    if "with" not in text.lower():
        return None
    tokens = _tokens(text, "postgres" if dialect == "generic" else dialect)
    if not tokens or tokens[0].token_type.name != "WITH" or any(t.token_type.name in ("WITH", "RECURSIVE") for t in tokens[1:]):
        return None
    defs, main = _definitions(tokens)
    if not defs or main >= len(tokens):
        return None
    shared = [d for d in defs if d.simple and _works(tokens, d) and _uses(tokens, d) >= 2 and not _union(tokens, d)]
    if not shared or len({d.name for d in defs}) != len(defs):
        return None
    kept = [d for d in defs if d not in shared]

    def with_kept(before: int) -> str:
        items = [text[d.start:d.end] for d in kept if d.end <= before]
        return f"WITH {', '.join(items)} " if items else ""

    pieces = [Cte(d.name, with_kept(d.start) + text[tokens[d.body[0]].start:tokens[d.body[1] - 1].end + 1]) for d in shared]
    return with_kept(len(text)) + text[tokens[main].start:], pieces


def _tokens(text: str, dialect: str) -> list[Any]:
    from sqlglot.dialects.dialect import Dialect
    from sqlglot.errors import SqlglotError

    try:
        return list(Dialect.get_or_raise(dialect).tokenize(text))
    except (SqlglotError, ValueError):
        return []


def _definitions(tokens: list[Any]) -> tuple[list[_Def], int]:
    """The top-level WITH's definitions, and the index of the first token of the query after them."""
    defs: list[_Def] = []
    i = 1
    while i < len(tokens):
        name = tokens[i]
        simple = name.token_type.name == "VAR" and name.text.isidentifier()
        i += 1
        if i < len(tokens) and tokens[i].token_type.name == "L_PAREN":  # a column list
            simple = False
            i = _close(tokens, i) + 1
        if i >= len(tokens) or tokens[i].token_type.name != "ALIAS":
            return [], len(tokens)
        i += 1
        while i < len(tokens) and tokens[i].token_type.name != "L_PAREN":  # [NOT] MATERIALIZED
            simple = simple and tokens[i].text.upper() == "MATERIALIZED"
            i += 1
        end = _close(tokens, i)
        if end >= len(tokens):
            return [], len(tokens)
        defs.append(_Def(name.text.lower(), name.start, tokens[end].end + 1, (i + 1, end), simple))
        i = end + 1
        if i < len(tokens) and tokens[i].token_type.name == "COMMA":
            i += 1
            continue
        return defs, i
    return [], len(tokens)


def _close(tokens: list[Any], i: int) -> int:
    """The index of the parenthesis that closes the one at ``i`` (``len(tokens)``: none does)."""
    depth = 0
    for j in range(i, len(tokens)):
        kind = tokens[j].token_type.name
        if kind == "L_PAREN":
            depth += 1
        elif kind == "R_PAREN":
            depth -= 1
            if depth == 0:
                return j
    return len(tokens)


def _works(tokens: list[Any], d: _Def) -> bool:
    """Whether the body aggregates, joins or computes a window, and calls nothing volatile."""
    body = tokens[d.body[0]:d.body[1]]
    if any(t.text.lower() in _VOLATILE for t in body):
        return False
    if any(t.token_type.name in _WORK for t in body):
        return True
    return any(t.token_type.name == "COMMA" and _in_from(body, k) for k, t in enumerate(body))


def _in_from(body: list[Any], k: int) -> bool:
    """Whether the comma at ``k`` separates two FROM items at the body's own level (a join)."""
    depth = 0
    for t in reversed(body[:k]):
        kind = t.token_type.name
        if kind == "R_PAREN":
            depth += 1
        elif kind == "L_PAREN":
            depth -= 1
            if depth < 0:
                return False
        elif depth == 0 and kind in ("SELECT", "WHERE", "GROUP_BY", "HAVING", "ORDER_BY", "ON"):
            return False
        elif depth == 0 and kind == "FROM":
            return True
    return False


def _uses(tokens: list[Any], d: _Def) -> int:
    """How many times the text after the definition names it as a table; 0 if one of them is in an ``IN`` or
    ``EXISTS`` subquery. Such a use is a semi join's side, which DuckDB filters by the other side's keys as it
    runs: TPC-DS q95's ``ws_wh``, a join named by two ``IN`` subqueries, took 1.5 times as long planned once."""
    after = [k for k, t in enumerate(tokens) if t.start >= d.end]
    uses = [k for k in after if tokens[k].text.lower() == d.name and tokens[k - 1].token_type.name in ("FROM", "JOIN", "COMMA")]
    return 0 if any(_in_subquery(tokens, k) for k in uses) else len(uses)


def _in_subquery(tokens: list[Any], k: int) -> bool:
    depth = 0
    for j in range(k - 1, 0, -1):
        kind = tokens[j].token_type.name
        if kind == "R_PAREN":
            depth += 1
        elif kind == "L_PAREN":
            if depth == 0 and tokens[j - 1].token_type.name in ("IN", "EXISTS"):
                return True
            depth = max(0, depth - 1)
    return False


def _union(tokens: list[Any], d: _Def) -> bool:
    """Whether the body is a union at its own level. Each use's filters on a constant of one branch
    (TPC-DS q04's ``sale_type = 's'``) drop the other branches when it is inlined: planned once, every
    use computed all of them (q04 1.17 times as long)."""
    depth = 0
    for t in tokens[d.body[0]:d.body[1]]:
        kind = t.token_type.name
        depth += kind == "L_PAREN"
        depth -= kind == "R_PAREN"
        if depth == 0 and kind in ("UNION", "INTERSECT", "EXCEPT"):
            return True
    return False
