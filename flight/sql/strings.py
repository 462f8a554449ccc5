"""Text functions built from regular expressions: ``split_part``, ``strpos`` / ``instr``, the ``regexp_*`` family.

Why regular expressions: the IR's functions are ``pyarrow.compute``'s, which has no split-and-pick,
no character position and no capture-group extraction, and both engines run RE2 (pyarrow's
``replace_substring_regex`` and ``match_substring_regex``, DuckDB's ``regexp_replace`` and
``regexp_matches``). Each function here is one anchored pattern whose first group is the answer:
replacing the whole text by that group gives it, and a match test says whether there is one. So
every function below runs on either engine, row by row, with no list or struct in between.

The patterns are built here from constants (a delimiter, an index, the user's pattern); a
non-constant one is refused by name.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from flight.plan.expr import Expr, call, if_else, lit
from flight.sql.errors import unsupported
from flight.sql.rel import Scalars, constant

__all__ = ["FUNCTIONS", "escaped"]

DFExpr = Any

MAX_PART = 1000
"""The largest ``split_part`` index taken: RE2's bound on a counted repetition."""

_SPECIAL = frozenset("\\.^$|?*+()[]{}-/#&~!,:;<=>@%'\"` ")


def escaped(text: str) -> str:
    """``text`` as an RE2 pattern that matches it literally (control characters as ``\\x{..}``)."""
    out = []
    for c in text:
        if c in _SPECIAL:
            out.append("\\" + c)
        elif ord(c) < 32 or ord(c) == 127:
            out.append(f"\\x{{{ord(c):x}}}")
        else:
            out.append(c)
    return "".join(out)


def _group(text: Expr, pattern: str, group: int = 1) -> Expr:
    """Group ``group`` of ``pattern``'s match of the whole text, or '' where it does not match."""
    found = call("replace_substring_regex", text, pattern=pattern, replacement=f"\\{group}", max_replacements=1)
    return if_else(call("match_substring_regex", text, pattern=pattern), found, lit(""))


def _split_part(t: Scalars, args: list[DFExpr], e: DFExpr) -> Expr:
    """The n-th field of the text split at the delimiter (from the end when n < 0); '' past the last.

    Group 1 of ``^(?:.*?D){n-1}(.*?)(?:D.*)?$``: n-1 delimiters skipped (lazily: the first ones), then
    the shortest text followed by a delimiter or the end."""
    text = t.as_text(t(args[0]))
    delimiter = constant(args, 1, "SPLIT_PART's delimiter")
    n = constant(args, 2, "SPLIT_PART's index")
    if delimiter is None or n is None:
        return lit(None, pa.string())
    n = int(n)
    if delimiter == "":
        raise unsupported("split_part() with an empty delimiter")
    if n == 0:
        if t.dialect == "spark":
            raise unsupported("split_part() of field 0 (Spark's fields count from 1, or from -1 at the end)")
        return if_else(call("is_valid", text), lit(""), lit(None, pa.string()))  # DuckDB's ''
    if abs(n) > MAX_PART:
        raise unsupported(f"split_part() of field {n} (at most {MAX_PART} from either end)")
    if n < 0:  # the same, counted on the reversed text
        if any(delimiter[:k] == delimiter[-k:] for k in range(1, len(delimiter))):
            # 'aa' in 'aaa': DuckDB splits left to right, then counts from the end; the reversed text would split
            # from the right. Only a delimiter that can overlap itself tells the two apart.
            raise unsupported(f"split_part() from the end at a delimiter that can overlap itself ({delimiter!r})")
        text, delimiter = call("utf8_reverse", text), delimiter[::-1]
    d = escaped(delimiter)
    part = _group(text, f"(?s)^(?:.*?{d}){{{abs(n) - 1}}}(.*?)(?:{d}.*)?$")
    return call("utf8_reverse", part) if n < 0 else part


def _strpos(t: Scalars, args: list[DFExpr], e: DFExpr) -> Expr:
    """The first position (in characters, from 1) of the searched text; 0 when it is not there.

    pyarrow's ``find_substring`` counts bytes; the characters before the first match (group 1 of
    ``^(.*?)T``) count characters."""
    text = t.as_text(t(args[0]))
    needle = constant(args, 1, "the text searched for (STRPOS, INSTR, POSITION)")
    out = pa.int32() if t.dialect == "spark" else pa.int64()  # Spark's INT, DuckDB's BIGINT
    if needle is None:
        return lit(None, out)
    pattern = f"(?s)^(.*?){escaped(str(needle))}"
    before = call("replace_substring_regex", text, pattern=f"{pattern}.*$", replacement="\\1", max_replacements=1)
    position = call("add", call("utf8_length", before).cast(out), lit(1, out))
    return if_else(call("match_substring_regex", text, pattern=pattern), position, lit(0, out))


def _flags(args: list[DFExpr], i: int, name: str) -> bool:
    """Whether a ``regexp_*`` call's flags (argument ``i``, if given) ask to ignore case; others are refused."""
    flags = str(constant(args, i, f"{name}'s flags")) if len(args) > i else ""
    if set(flags) - {"i", "c"}:
        raise unsupported(f"{name}() with the flags {flags!r} (i and c are taken)")
    return flags.replace("c", " ").rstrip().endswith("i")  # the last of i and c wins (DuckDB's rule)


def _pattern(args: list[DFExpr], name: str) -> str:
    pattern = constant(args, 1, f"{name}'s pattern")
    if pattern is None:
        raise unsupported(f"{name}() with a NULL pattern")
    return str(pattern)


def _regexp_like(name: str, whole: bool = False) -> Callable[[Scalars, list[DFExpr], DFExpr], Expr]:
    """Whether the pattern matches somewhere in the text (``whole``: all of it)."""
    def make(t: Scalars, args: list[DFExpr], e: DFExpr) -> Expr:
        pattern = _pattern(args, name)
        if whole:
            pattern = f"^(?:{pattern})$"
        return call("match_substring_regex", t.as_text(t(args[0])), pattern=pattern, ignore_case=_flags(args, 2, name))

    return make


def _regexp_extract(t: Scalars, args: list[DFExpr], e: DFExpr) -> Expr:
    """The text of group ``idx`` (0: the whole match) of the pattern's first match; '' when there is none.

    Group ``idx + 1`` of ``^.*?((?:P)).*$``: the lazy prefix finds the leftmost match, as a search would.
    Spark's default group is 1, DuckDB's 0."""
    pattern = _pattern(args, "regexp_extract")
    group = constant(args, 2, "REGEXP_EXTRACT's group") if len(args) > 2 else (1 if t.dialect == "spark" else 0)
    if group is None:
        return lit(None, pa.string())
    group = int(group)
    try:
        groups = re.compile(pattern).groups
    except re.error:
        groups = None  # RE2's syntax, not Python's: the engine checks it
    if group < 0 or (groups is not None and group > groups):
        raise unsupported(f"regexp_extract() of group {group}: the pattern has {groups} groups")
    # (?s) lets the prefix and the rest span lines; the user's pattern keeps RE2's default, where '.' stops at one.
    return _group(t.as_text(t(args[0])), f"(?s)^.*?((?-s:{pattern})).*$", group + 1)


def _regexp_count(t: Scalars, args: list[DFExpr], e: DFExpr) -> Expr:
    """How many times the pattern matches, not overlapping (Spark's INT, DataFusion's BIGINT)."""
    if len(args) > 2:
        raise unsupported("regexp_count() with a start or flags")
    found = call("count_substring_regex", t.as_text(t(args[0])), pattern=_pattern(args, "regexp_count"))
    return found.cast(pa.int32() if t.dialect == "spark" else pa.int64())


FUNCTIONS: dict[str, Callable[[Scalars, list[DFExpr], DFExpr], Expr]] = {
    "split_part": _split_part,
    "strpos": _strpos,
    "instr": _strpos,
    "position": _strpos,
    "regexp_like": _regexp_like("regexp_like"),
    "regexp_matches": _regexp_like("regexp_matches"),
    "regexp_full_match": _regexp_like("regexp_full_match", whole=True),
    "regexp_extract": _regexp_extract,
    "regexp_count": _regexp_count,
}
"""Text functions by DataFusion's name (and by DuckDB's, for those declared in ``flight.sql.library``)."""
