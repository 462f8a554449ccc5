"""``flight-sql`` used as a person uses it: in a real terminal (tmux), keys typed, the screen read back.

Two sessions: one with workers of its own (``--table``: no service to start first), where a statement
typed over three lines, ``.tables``, ``.schema``, ``EXPLAIN``, an error and the history are tried and
the rows on the screen are compared with DuckDB's; and one connected to a ``flight-coordinator``,
where Ctrl-C in the middle of a statement that would compute for minutes cancels it, its tasks end on
every worker, and the shell goes on. That session's screen is kept under ``.ci/artifacts/``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import duckdb
import pytest
from support import running_tasks, wait_until

import flight
from benchmarks.tpch_queries import TABLES
from tests.service.test_flightsql import start_service, stop_service
from tests.shell.tmux import TMUX, Pane

pytestmark = [
    pytest.mark.required,
    pytest.mark.skipif(TMUX is None, reason="needs tmux (the README's test command installs it)"),
]

SHELL = [sys.executable, "-m", "flight.shell"]
ARTIFACTS = Path(__file__).resolve().parents[2] / ".ci" / "artifacts"
SLOW = "select count(*) as n from lineitem a join lineitem b on a.l_linenumber = b.l_linenumber;"
PROMPT = r"^flight>"


def _rows(screen: str, after: str) -> list[list[str]]:
    """The body rows of the first table drawn after the line containing ``after``."""
    lines = screen[screen.rindex(after):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("├"))
    body = []
    for line in lines[start + 1:]:
        if line.startswith("╰"):
            return body
        body.append([cell.strip() for cell in line.strip("│").split("│")])
    raise AssertionError(f"no end of the table after {after!r}")


def test_a_session_with_its_own_workers(files: dict[str, list[Path]], con: duckdb.DuckDBPyConnection, tmp_path: Path) -> None:
    tables = [a for t in ("nation", "region") for a in ("--table", f"{t}={files[t][0].parent}")]
    pane = Pane([*SHELL, "--history", str(tmp_path / "history"), "--local-workers", "2", *tables], cwd=tmp_path)
    try:
        pane.wait_for(PROMPT, 60)
        pane.line("select r_name, count(*) as nations")
        pane.line("from nation join region on n_regionkey = r_regionkey")
        pane.line("group by r_name order by r_name;")
        screen = pane.wait_for(r"^5 rows in [0-9.]+ s")
        assert "...> from nation join region" in screen  # one statement over three lines
        want = con.sql("select r_name, count(*) from nation join region on n_regionkey = r_regionkey group by 1 order by 1").fetchall()
        assert _rows(screen, "group by r_name") == [[name, str(n)] for name, n in want]
        pane.line(".tables")
        pane.wait_for(r"^nation\nregion\n")
        pane.line(".schema nation")
        assert re.search(r"│ n_regionkey\s+│ int64", pane.wait_for(r"│ n_comment"))
        pane.line("explain select count(*) from region;")
        pane.wait_for(r"^Stage 1 \[upper, head\]")
        pane.line("select nope from nation;")
        pane.wait_for(r"^Error: SQL: unknown column 'nope' at line 1:8")
        pane.key("Up")  # the history: the statement before the last comes back, and runs again
        pane.key("Up")
        pane.key("Enter")
        pane.wait_for(r"^Stage 1 \[upper, head\]", count=2)
        pane.key("C-d")
        pane.wait_for(r"\[flight-sql exited 0\]")
    finally:
        pane.close()
    assert "explain select count(*) from region;" in (tmp_path / "history").read_text()


def test_ctrl_c_cancels_a_running_statement_and_keeps_the_shell(files: dict[str, list[Path]], cluster: flight.LocalCluster,
                                                                 tmp_path: Path) -> None:
    tables = [a for t in TABLES for a in ("--table", f"{t}={files[t][0].parent}")]
    proc, url = start_service("--workers", ",".join(cluster.urls), *tables)
    pane = Pane([*SHELL, url, "--history", str(tmp_path / "history")], cwd=tmp_path)
    try:
        pane.wait_for(PROMPT, 60)
        pane.line(SLOW)
        running = pane.wait_for(r"stages \d+/\d+ · tasks \d+/\d+ · [\d,]+ rows · [\d.]+ s · Ctrl-C cancels", 60)  # the progress line
        assert running_tasks(cluster.urls) > 0
        pane.key("C-c")
        pane.wait_for(r"^Cancelled after [\d.]+ s: its tasks were ended on the workers\.", 30)
        wait_until(lambda: running_tasks(cluster.urls) == 0, 10.0, "the workers to end the cancelled statement's tasks")
        pane.line("select count(*) as n from region;")
        screen = pane.wait_for(r"^1 row in [0-9.]+ s")
        assert _rows(screen, "from region;") == [["5"]]
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        (ARTIFACTS / "flight-sql-session.txt").write_text(f"{running.rstrip()}\n\n--- after Ctrl-C ---\n\n{pane.screen()}")
    finally:
        pane.close()
        assert stop_service(proc) == 0
