"""The scale-out benchmark (``benchmarks/micro/scaleout.py``) at a tiny size: its answers checked, its figures printed.

The benchmark's numbers are not asserted (speed lives in ``benchmarks/``); what is: each suite's queries run on
two workers on their own addresses, pinned to their own cores, every answer equal to DuckDB's (the script's own
check, exit code 0), and the figure lines a reader of the log looks for are there, named for the suite.
"""

from __future__ import annotations

import os
import re

import pytest
from support import tpch_test_files
from tpcds_support import SF as TPCDS_SF
from tpcds_support import tables as tpcds_tables

from benchmarks.micro import scaleout

pytestmark = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="two workers pinned to a core each need two cores")


def _figures(out: str) -> dict[str, float]:
    return {m[1]: float(m[2]) for m in re.finditer(r"^(\w+): ([0-9.]+)$", out, re.M)}


def test_tpch_scaleout_checks_every_answer(capsys: pytest.CaptureFixture[str]) -> None:
    tpch_test_files(0.01)  # made here, or the test is skipped saying why
    assert scaleout.main(["--sf", "0.01", "--queries", "18", "--runs", "1"]) == 0
    out = capsys.readouterr().out
    assert "answers: 1/1 equal DuckDB's" in out
    assert re.search(r"^\s+Q18\s", out, re.M)
    figures = _figures(out)
    assert {"scaleout_duckdb_own_speedup", "scaleout_speedup_geomean", "scaleout_vs_duckdb_all_cores"} <= figures.keys()
    assert any(name.startswith("scaleout_min_q") for name in figures)


def test_tpcds_scaleout_checks_every_answer(capsys: pytest.CaptureFixture[str]) -> None:
    tpcds_tables()  # generated once for the TPC-DS tests, at their scale factor
    assert scaleout.main(["--suite", "tpcds", "--sf", f"{TPCDS_SF:g}", "--queries", "3,14", "--runs", "1"]) == 0
    out = capsys.readouterr().out
    assert "answers: 2/2 equal DuckDB's" in out
    assert re.search(r"^\s+q03\s", out, re.M) and re.search(r"^\s+q14\s", out, re.M)
    figures = _figures(out)
    assert {"scaleout_tpcds_duckdb_own_speedup", "scaleout_tpcds_speedup_geomean", "scaleout_tpcds_vs_duckdb_all_cores"} <= figures.keys()


def test_bytes_moved_at_more_workers_are_counted(capsys: pytest.CaptureFixture[str]) -> None:
    tpcds_tables()
    assert scaleout.main(["--suite", "tpcds", "--sf", f"{TPCDS_SF:g}", "--queries", "3", "--bytes-at", "3"]) == 0
    assert "scaleout_tpcds_bytes_moved_mb_at_3:" in capsys.readouterr().out


def test_an_unknown_query_number_is_refused() -> None:
    tpch_test_files(0.01)
    with pytest.raises(SystemExit, match=r"TPC-H has no queries \[23\]"):
        scaleout.main(["--sf", "0.01", "--queries", "23"])
