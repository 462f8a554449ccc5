"""What the shell's user typed: SQL statements ended by ``;``, and dot commands (``.tables``).

Statements are split with sqlglot's tokenizer for the session's dialect, so a ``;`` inside a string,
a quoted name or a comment does not end one, and an unterminated string or comment means "not
finished yet": the Enter key then adds a line instead of running it. A dot command is one line that
starts with ``.``, given where a statement would start.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import TokenError
from sqlglot.tokens import TokenType

__all__ = ["Command", "Item", "complete", "items"]

QUIT_WORDS = frozenset({"quit", "exit", "\\q"})
_COMMENTS = re.compile(r"(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/)*", re.DOTALL)


@dataclass(frozen=True)
class Command:
    """A dot command: ``.schema orders`` is ``Command("schema", ("orders",))``."""

    name: str
    args: tuple[str, ...]


Item = str | Command
"""A statement's text (without its ``;``), or a dot command."""


def _tokens(text: str, dialect: str) -> list[tuple[TokenType, int, int]] | None:
    """``(type, start, end)`` of each token; None while a string or a comment is open."""
    try:
        return [(t.token_type, t.start, t.end) for t in Dialect.get_or_raise(dialect).tokenize(text)]
    except TokenError:
        return None


def _dot(line: str) -> Command:
    words = line.strip().rstrip(";").strip()[1:].split()
    return Command(words[0].lower() if words else "", tuple(words[1:]))


def _first_end(text: str, dialect: str) -> int | None:
    """Where the first statement of ``text`` ends, when its text is whole but a later one's is not."""
    at = text.find(";")
    while at >= 0:
        tokens = _tokens(text[:at + 1], dialect)
        if tokens and tokens[-1][0] == TokenType.SEMICOLON and tokens[-1][1] == at:
            return at
        at = text.find(";", at + 1)
    return None


def items(text: str, dialect: str = "duckdb") -> tuple[list[Item], str]:
    """The finished statements and dot commands in ``text``, in order, and what is left unfinished."""
    out: list[Item] = []
    rest = text
    while True:
        stripped = rest[_COMMENTS.match(rest).end():]  # type: ignore[union-attr]  # the pattern matches any text, if emptily
        if not stripped:
            return out, ""
        if stripped.startswith(".") or stripped.split(None, 1)[0].rstrip(";").lower() in QUIT_WORDS:
            line, _, rest = stripped.partition("\n")
            out.append(_dot(line) if line.startswith(".") else Command("quit", ()))
            continue
        tokens = _tokens(stripped, dialect)
        if tokens is None:  # a string or comment is open at the end: a statement may still end before it
            end = _first_end(stripped, dialect)
            if end is None:
                return out, stripped
        else:
            end = next((start for kind, start, _ in tokens if kind == TokenType.SEMICOLON), None)
            if end is None:
                # Only comments after the last statement: nothing is left to run.
                return out, stripped if tokens else ""
        statement = stripped[:end].strip()
        if statement:
            out.append(statement)
        rest = stripped[end + 1:]


def complete(text: str, dialect: str = "duckdb") -> bool:
    """Whether Enter should run ``text``: it ends with a finished statement or a dot command (or is empty)."""
    return not items(text, dialect)[1]
