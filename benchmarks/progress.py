"""Progress on stderr: ``rich`` bars when stderr is a terminal, plain ``[bench]`` lines otherwise.

Results (tables, figures) go to stdout; everything here goes to stderr, so
``flight-bench > table.txt`` keeps a clean table and a CI log gets one line per
step instead of redrawn bars.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from types import TracebackType
from typing import Any

__all__ = ["Progress"]


class Progress:
    """A few bars (``add``/``advance``) and messages (``log``, ``warn``, ``error``) on stderr."""

    def __init__(self, live: bool | None = None) -> None:
        self.live = sys.stderr.isatty() if live is None else live
        self._rich: Any = None
        self._console: Any = None
        if self.live:
            try:
                from rich.console import Console
                from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
                from rich.progress import Progress as RichProgress
            except ImportError:  # rich is in the bench extra; without it, plain lines
                self.live = False
            else:
                self._console = Console(stderr=True)
                self._rich = RichProgress(
                    SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=self._console, transient=False,
                )

    def __enter__(self) -> Progress:
        if self._rich is not None:
            self._rich.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._rich is not None:
            self._rich.stop()

    # ------------------------------------------------------------- bars

    def add(self, description: str, total: float) -> int:
        """A new bar; plain mode just says what starts."""
        if self._rich is not None:
            return int(self._rich.add_task(description, total=total))
        self.log(description)
        return 0

    def advance(self, bar: int, amount: float = 1.0, description: str | None = None) -> None:
        if self._rich is not None:
            fields = {} if description is None else {"description": description}
            self._rich.update(bar, advance=amount, **fields)

    def finish(self, bar: int, description: str | None = None) -> None:
        if self._rich is not None:
            task = self._rich.tasks[[t.id for t in self._rich.tasks].index(bar)]
            self._rich.update(bar, completed=task.total, **({} if description is None else {"description": description}))
        elif description is not None:
            self.log(description)

    @contextlib.contextmanager
    def suspended(self, active: bool = True) -> Iterator[None]:
        """Take the bars off the terminal while another live display draws (a flight-exec query's own stage
        bars: rich shows one live display at a time), and put them back after."""
        if not (active and self._rich is not None):
            yield
            return
        self._rich.stop()
        try:
            yield
        finally:
            self._rich.start()

    # --------------------------------------------------------- messages

    def log(self, message: str) -> None:
        if self._console is not None:
            self._console.print(message, markup=False, highlight=False)
        else:
            print(f"[bench] {message}", file=sys.stderr, flush=True)

    def warn(self, message: str) -> None:
        if self._console is not None:
            self._console.print(f"[bold yellow]warning:[/] {_escape(message)}")
        else:
            print(f"[bench] WARNING: {message}", file=sys.stderr, flush=True)

    def error(self, message: str) -> None:
        if self._console is not None:
            self._console.print(f"[bold red]ERROR:[/] {_escape(message)}")
        else:
            print(f"[bench] ERROR: {message}", file=sys.stderr, flush=True)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
