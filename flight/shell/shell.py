"""The shell itself: statements and dot commands run against a ``Session``, shown on a console.

``Shell.run_item`` runs one statement or dot command and says whether it succeeded; ``run_script``
runs a text of them, stopping at the first error (``-c``, ``-f`` and piped input: a script's exit
code is non-zero on error); ``interactive`` reads them from a prompt_toolkit prompt with line
editing, history and completion, where Enter runs what is finished and adds a line otherwise, and
Ctrl-C cancels a running statement (or clears the line) and keeps the shell.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import pyarrow as pa
from rich.console import Console
from rich.live import Live
from rich.text import Text

from flight.shell.render import csv_text, footer, progress_line, table_text
from flight.shell.session import Cancelled, Session, StatementError
from flight.shell.text import Command, Item, items

__all__ = ["HELP", "Quit", "Settings", "Shell"]

HELP = """\
SQL statements end with ';' and may span lines. Dot commands:
  .tables            the tables, from the service's metadata
  .schema NAME       a table's columns and types
  .mode table|csv    how results are shown (table: aligned, with types; csv: for other programs)
  .maxrows N         rows a table shows before it elides the middle (default 40)
  .help              this text
  .quit              leave (also: quit, exit, Ctrl-D)
EXPLAIN stmt; shows the plan's stages; EXPLAIN ANALYZE stmt; runs it and shows what each task did.
Ctrl-C cancels the running statement (its tasks end on the workers); at the prompt it clears the line."""

PROGRESS_AFTER_S = 0.5
"""A statement gets a progress line once it has run this long (quicker ones would only flicker)."""


@dataclass
class Settings:
    mode: str = "table"
    max_rows: int = 40


class Quit(Exception):
    """``.quit``."""


class Shell:
    def __init__(self, session: Session, out: TextIO | None = None, err: TextIO | None = None, *, progress: bool = True) -> None:
        self.session = session
        self.out = out or sys.stdout
        self.err = Console(file=err or sys.stderr, highlight=False, soft_wrap=True)
        self.settings = Settings()
        self.progress = progress
        self.cancelled = False  # the last statement was cancelled (Ctrl-C): a script exits 130

    # ------------------------------------------------------------ one statement or command

    def run_item(self, item: Item) -> bool:
        """Run one statement or dot command, showing its result or its error; whether it succeeded."""
        self.cancelled = False
        try:
            if isinstance(item, Command):
                self._command(item)
            else:
                self._statement(item)
            return True
        except StatementError as exc:
            self.err.print(Text(f"Error: {exc}", style="red"))
            return False
        except Cancelled as exc:
            self.cancelled = True
            how = "its tasks were ended on the workers" if exc.ended else "the service had already ended it"
            self.err.print(Text(f"Cancelled after {exc.seconds:.1f} s: {how}.", style="yellow"))
            return False

    def _statement(self, text: str) -> None:
        live: Live | None = None

        def shown(progress: dict[str, Any], seconds: float) -> None:
            nonlocal live
            if seconds < PROGRESS_AFTER_S:
                return
            line = Text(progress_line(progress, seconds), style="dim")
            if live is None:
                live = Live(line, console=self.err, transient=True, auto_refresh=False)
                live.start()
            live.update(line, refresh=True)

        try:
            result = self.session.run(text, shown if self.progress and self.err.is_terminal else None)
        finally:
            if live is not None:
                live.stop()
        self._show(result.table, result.seconds)

    def _show(self, table: pa.Table, seconds: float) -> None:
        if table.schema.names == ["plan"] and table.schema.field(0).type == pa.string():  # EXPLAIN: its lines as they are
            self._write("\n".join(str(x) for x in table.column(0).to_pylist()) + "\n")
            return
        if self.settings.mode == "csv":
            self._write(csv_text(table))
            return
        width = self.err.width if self.out.isatty() else None
        self._write(table_text(table, width, self.settings.max_rows) + "\n")
        self.err.print(Text(footer(table.num_rows, seconds, self.settings.max_rows), style="dim"))

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def _command(self, command: Command) -> None:
        name, args = command.name, command.args
        if name in ("quit", "exit", "q"):
            raise Quit
        if name == "help":
            self._write(HELP + "\n")
        elif name == "tables":
            names = sorted(t if s in ("", "public") else f"{s}.{t}" for _, s, t in self.session.tables())
            self._write(("\n".join(names) if names else "(no tables)") + "\n")
        elif name == "schema" and len(args) == 1:
            schema = self.session.schema(args[0])
            rows = pa.table({"column": schema.names, "type": [str(f.type) for f in schema],
                             "nullable": [f.nullable for f in schema]})
            self._write(table_text(rows, self.err.width if self.out.isatty() else None, 10_000) + "\n")
        elif name == "mode" and args in (("table",), ("csv",)):
            self.settings.mode = args[0]
        elif name == "maxrows" and len(args) == 1 and args[0].isdigit() and int(args[0]) > 0:
            self.settings.max_rows = int(args[0])
        else:
            raise StatementError(f"unknown or malformed command .{name} {' '.join(args)}".rstrip() + " (.help lists them)")

    # ------------------------------------------------------------ many

    def run_script(self, text: str) -> int:
        """Run every statement and command of ``text``, stopping at the first error; the exit code (0, 1, or 130 on Ctrl-C)."""
        found, rest = items(text, self.session.dialect)
        if rest.strip():
            found.append(rest.strip())  # a last statement without its ';'
        for item in found:
            try:
                if not self.run_item(item):
                    return 130 if self.cancelled else 1
            except Quit:
                return 0
            except KeyboardInterrupt:
                return 130
        return 0

    def interactive(self, history: Path | None) -> int:
        """The prompt, until ``.quit`` or Ctrl-D."""
        from flight.shell.prompt import make_prompt

        prompt = make_prompt(history, self.session.dialect, self._words())
        self.err.print(Text(f"Connected to {self.session.url}. .help for help; statements end with ';'.", style="dim"))
        while True:
            try:
                text = prompt.prompt("flight> ")
            except KeyboardInterrupt:
                continue
            except EOFError:
                return 0
            found, rest = items(text, self.session.dialect)
            try:
                for item in [*found, *([rest] if rest.strip() else [])]:
                    self.run_item(item)
            except Quit:
                return 0
            except KeyboardInterrupt:
                continue

    def _words(self) -> list[str]:
        try:
            tables = self.session.tables()
        except Exception:  # noqa: BLE001 - completion is a convenience: without it the shell still works
            return []
        return sorted({t for _, _, t in tables})

