"""The interactive prompt: prompt_toolkit's line editor, with history, completion and multi-line statements.

Enter runs the text once it ends with a finished statement (``;`` outside strings and comments) or is
a dot command, and otherwise starts a new line (``text.complete``); Alt-Enter (Esc, Enter) always
starts one. History is kept in a file, a statement an entry, and searched with Ctrl-R.
"""

from __future__ import annotations

from pathlib import Path

from prompt_toolkit import PromptSession
from prompt_toolkit.completion import WordCompleter
from prompt_toolkit.history import FileHistory, InMemoryHistory
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent

from flight.shell.text import complete

__all__ = ["make_prompt"]

KEYWORDS = ("select", "from", "where", "group by", "order by", "having", "limit", "join", "left join", "on", "as", "with",
            "union all", "count", "sum", "avg", "min", "max", "distinct", "case", "when", "then", "else", "end", "and", "or",
            "not", "in", "exists", "between", "like", "is null", "explain", "explain analyze", ".tables", ".schema", ".mode",
            ".maxrows", ".help", ".quit")


def make_prompt(history: Path | None, dialect: str, names: list[str]) -> PromptSession[str]:
    """A prompt whose Enter runs finished statements; ``names`` (tables) and SQL's words complete with Tab."""
    keys = KeyBindings()

    @keys.add("enter")
    def _enter(event: KeyPressEvent) -> None:
        buffer = event.current_buffer
        if complete(buffer.text, dialect):
            buffer.validate_and_handle()
        else:
            buffer.insert_text("\n")

    @keys.add("escape", "enter")
    def _newline(event: KeyPressEvent) -> None:
        event.current_buffer.insert_text("\n")

    if history is not None:
        history.parent.mkdir(parents=True, exist_ok=True)
    return PromptSession(
        history=FileHistory(str(history)) if history is not None else InMemoryHistory(),
        multiline=True,
        key_bindings=keys,
        prompt_continuation=lambda width, line, wrapped: "...> ".rjust(width),
        completer=WordCompleter([*names, *KEYWORDS], ignore_case=True, WORD=True),
        complete_while_typing=False,
        enable_history_search=False,
    )
