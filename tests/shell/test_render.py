"""How the shell shows results, progress and errors (no sockets): the text a user reads."""

from __future__ import annotations

import decimal

import pyarrow as pa

from flight.shell.render import clean_error, csv_text, footer, progress_line, table_text


def _table() -> pa.Table:
    return pa.table({
        "name": ["a", "[red]x", None],
        "n": pa.array([1, 22, None], pa.int64()),
        "d": pa.array([decimal.Decimal("1.5"), decimal.Decimal("2"), decimal.Decimal("30.25")], pa.decimal128(10, 2)),
    })


def test_a_table_has_names_types_and_aligned_values_with_null_and_markup_kept_as_text() -> None:
    lines = table_text(_table(), None, 40).splitlines()
    assert "name" in lines[1] and "n" in lines[1] and "d" in lines[1]
    assert "string" in lines[2] and "int64" in lines[2] and "decimal128(10, 2)" in lines[2]
    body = lines[4:7]
    assert "[red]x" in body[1]  # data is never read as rich's markup
    assert "NULL" in body[2]
    # Numbers to the right: the shorter value ends where the longer does.
    assert body[0].index("1.50") + 4 == body[2].index("30.25") + 5
    assert len({len(line) for line in lines}) == 1  # every line as wide as the others


def test_a_long_result_shows_its_first_and_last_rows_and_says_so() -> None:
    table = pa.table({"i": list(range(100))})
    lines = table_text(table, None, 6).splitlines()
    values = [line.strip("│ ") for line in lines[4:-1]]
    assert values == ["0", "1", "2", "…", "97", "98", "99"]
    assert footer(100, 1.234, 6) == "100 rows (3 first and 3 last shown; .maxrows N to see more) in 1.23 s"
    assert footer(1, 0.5, 40) == "1 row in 0.50 s"


def test_a_narrow_terminal_cuts_cells_instead_of_wrapping_rows() -> None:
    table = pa.table({"text": ["x" * 200, "y"]})
    lines = table_text(table, 40, 40).splitlines()
    assert all(len(line) <= 40 for line in lines)
    assert len(lines) == 7  # top, name, type, rule, two rows, bottom: no row took two lines


def test_csv_is_pyarrows() -> None:
    assert csv_text(pa.table({"a": [1, None], "b": ["x,y", "z"]})).splitlines() == ['"a","b"', '1,"x,y"', ',"z"']


def test_the_progress_line_counts_stages_tasks_and_rows() -> None:
    line = progress_line({"state": "running", "stages": 5, "stages_done": 3, "tasks": 8, "tasks_done": 6, "rows": 1801717}, 2.44)
    assert line == "stages 3/5 · tasks 6/8 · 1,801,717 rows · 2.4 s · Ctrl-C cancels"
    assert progress_line({"state": "unknown"}, 0.6) == "planning · 0.6 s · Ctrl-C cancels"


def test_an_adbc_error_reads_as_the_services_words() -> None:
    message = "UNKNOWN: [FlightSQL] SQL: unknown column 'nope' at line 1:8; columns: a, b. Detail: Failed (Unknown; Prepare)"
    assert clean_error(message) == "SQL: unknown column 'nope' at line 1:8; columns: a, b"
    nested = 'CANCELLED: [FlightSQL] task q/4/0 on grpc://h:1: task cancelled (Canceled; DoGet: endpoint 0: [uri:"grpc://h:1"])'
    assert clean_error(nested) == "task q/4/0 on grpc://h:1: task cancelled"
    assert clean_error("something else entirely") == "something else entirely"
