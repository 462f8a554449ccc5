"""How the shell shows things: result tables, the progress line, errors. Pure: text in, text out.

Tables are drawn by ``rich`` (alignment, wide characters, cut cells), one line a row: numbers to the
right, NULL as ``NULL``, each column's type under its name, as DuckDB's shell does. A result longer
than the row limit shows its first and last rows around a ``…`` row, and says so in its footer.
"""

from __future__ import annotations

import io
import re
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

__all__ = ["clean_error", "csv_text", "footer", "progress_line", "table_text"]

_NUMERIC = (pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal)
_ADBC_ERROR = re.compile(r"^[A-Z_]+: \[FlightSQL\] (?P<text>.*?)(?: \((?:[A-Za-z]+); [^()]*(?:\([^()]*\)[^()]*)*\))?$", re.DOTALL)


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bytes):
        return "\\x" + value.hex()
    return str(value)


def table_text(table: pa.Table, width: int | None, max_rows: int) -> str:
    """``table`` drawn for a terminal ``width`` wide (None: as wide as it needs, for a file or a pipe)."""
    grid = Table(box=box.ROUNDED, show_lines=False, header_style="bold", pad_edge=True)
    for field in table.schema:
        right = any(check(field.type) for check in _NUMERIC)
        # Text, never markup: names and values are the data's words, and "[b]" in one must stay as it is.
        grid.add_column(Text.assemble(field.name, "\n", (str(field.type), "dim")), justify="right" if right else "left", no_wrap=True,
                        overflow="ellipsis")
    rows = table.num_rows
    shown = range(rows) if rows <= max_rows else [*range(max_rows // 2), -1, *range(rows - (max_rows - max_rows // 2), rows)]
    columns = [table.column(i) for i in range(table.num_columns)]
    for i in shown:
        if i < 0:
            grid.add_row(*("…" for _ in columns))
        else:
            grid.add_row(*(Text(_cell(c[i].as_py())) for c in columns))
    out = io.StringIO()
    console = Console(file=out, width=width or 100_000, force_terminal=False, color_system=None, highlight=False, soft_wrap=False)
    console.print(grid)
    text = out.getvalue()
    return "\n".join(line.rstrip() for line in text.splitlines())


def footer(rows: int, seconds: float, max_rows: int) -> str:
    """``25 rows in 0.27 s``; with the rows a long result left out."""
    count = f"{rows:,} row{'s' if rows != 1 else ''}"
    if rows > max_rows:
        count += f" ({max_rows // 2} first and {max_rows - max_rows // 2} last shown; .maxrows N to see more)"
    return f"{count} in {seconds:.2f} s"


def csv_text(table: pa.Table) -> str:
    out = io.BytesIO()
    pacsv.write_csv(table, out)
    return out.getvalue().decode()


def progress_line(progress: dict[str, Any], seconds: float) -> str:
    """What a running statement has done: ``stages 3/5 · tasks 6/8 · 1,801,717 rows · 2.4 s · Ctrl-C cancels``.

    Rows are those the finished tasks made (a task reports its count when it ends)."""
    parts = []
    if progress.get("stages"):
        parts += [f"stages {progress['stages_done']}/{progress['stages']}", f"tasks {progress['tasks_done']}/{progress['tasks']}",
                  f"{progress['rows']:,} rows"]
    else:
        parts.append("planning" if progress.get("state") == "unknown" else str(progress.get("state", "")))
    return " · ".join([*parts, f"{seconds:.1f} s", "Ctrl-C cancels"])


def clean_error(message: str) -> str:
    """An ADBC error as its service's words: ``UNKNOWN: [FlightSQL] SQL: ... (Unknown; ExecuteQuery)`` is ``SQL: ...``."""
    found = _ADBC_ERROR.match(message.strip())
    text = found.group("text").strip() if found else message.strip()
    return re.sub(r"\. Detail: [A-Za-z]+$", "", text)  # the driver's word for the status, which said it already
