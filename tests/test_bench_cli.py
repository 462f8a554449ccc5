"""The benchmark harness end to end: ``python -m benchmarks`` at a tiny scale factor, as a subprocess.

Runs every TPC-H query of the suite on flight-exec (1 and 2 workers of a
LocalCluster), single-process Acero and DuckDB, one timed run each, and checks
the exit code, the results JSON (every cell present and matching DuckDB, times
and peak memory recorded) and the Markdown table. The chart is drawn only when
matplotlib (the ``bench`` extra) is installed.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.tpch import tpchgen_cli
from benchmarks.tpch_queries import QUERY_NUMBERS

REPO = Path(__file__).resolve().parent.parent
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def bench(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tiny_run_writes_checked_results(tmp_path: Path) -> None:
    try:
        tpchgen_cli()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    out = tmp_path / "results"
    args = ["--sf", "0.01", "--engines", "flight,acero,duckdb", "--workers", "1,2", "--runs", "1",
            "--out", str(out), "--plain"]
    proc = bench(*args, *([] if HAS_MATPLOTLIB else ["--no-chart"]))
    assert proc.returncode == 0, proc.stderr[-3000:]

    data = json.loads((out / "tpch-sf0.01.json").read_text())
    engines = {"flight[1]", "flight[2]", "acero", "duckdb"}
    assert set(data["engines"]) == engines
    cells = {(r["query"], r["engine"]): r for r in data["results"]}
    assert set(cells) == {(n, e) for n in QUERY_NUMBERS for e in engines}
    for r in cells.values():
        assert r["status"] == "ok", r
        assert len(r["runs"]) == 1 and r["runs"][0]["seconds"] > 0
        assert r["median_seconds"] == r["runs"][0]["seconds"]
    flight2 = cells[(1, "flight[2]")]["runs"][0]
    if flight2["peak_rss_bytes"] is not None:  # Linux: coordinator + 2 workers
        assert len(flight2["peak_rss_by_process"]) == 3
    assert data["summary"]["ok"] is True and data["summary"]["ratios_to"] == "flight[2]"
    assert set(data["summary"]["geomean_ratio"]) == {"flight[1]", "acero", "duckdb"}
    assert data["settings"]["sf"] == 0.01 and data["versions"]["pyarrow"]

    table = (out / "tpch-sf0.01.md").read_text()
    assert "| Q19 |" in table and "**geomean**" in table and "matches DuckDB's" in table
    assert "| Q1 |" in proc.stdout  # the table is printed on stdout, progress on stderr
    assert "[bench]" in proc.stderr
    assert (out / "tpch-sf0.01.png").exists() == HAS_MATPLOTLIB


def test_bad_arguments_are_usage_errors(tmp_path: Path) -> None:
    proc = bench("--engines", "flight,nosuch", "--out", str(tmp_path), timeout=60)
    assert proc.returncode == 2 and "engines" in proc.stderr
    proc = bench("--queries", "2", "--out", str(tmp_path), timeout=60)
    assert proc.returncode == 2 and "not in the suite" in proc.stderr
    proc = bench("micro", "nosuch", "--out", str(tmp_path), timeout=60)
    assert proc.returncode == 2 and "unknown micro benchmark" in proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_secured_run_checks_every_result(tmp_path: Path) -> None:
    """flight-bench --secure: TLS and a token on every worker, TPC-H results still checked against DuckDB."""
    try:
        tpchgen_cli()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    out = tmp_path / "results"
    proc = bench("--sf", "0.01", "--engines", "flight,duckdb", "--queries", "1,3,6", "--runs", "1",
                 "--out", str(out), "--plain", "--no-chart", "--secure")
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((out / "tpch-sf0.01.json").read_text())
    assert all(r["status"] == "ok" for r in data["results"]), data["results"]
    assert any(u.startswith("grpc+tls://") for e in data["engines"].values() for u in e.get("workers", []))
