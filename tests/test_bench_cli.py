"""The benchmark harness end to end: ``python -m benchmarks`` at a tiny scale factor, as a subprocess.

Runs all 22 TPC-H queries' SQL text on flight-exec (1 and 2 workers of a
LocalCluster), single-process Acero and DuckDB, one timed run each, and checks
the exit code, the results JSON (every cell present and matching DuckDB, times
and peak memory recorded) and the Markdown table. The chart is drawn only when
matplotlib (the ``bench`` extra) is installed. The peers (DataFusion, Polars, Sail
local and local-cluster) answer two queries at SF 0.01 like DuckDB, each when its
package is installed (the ``bench`` extra; CI's ``dev,spark`` has none of them).
``--suite tpcds`` runs two TPC-DS queries the same way, one that Acero cannot run
(marked, not failed), and its check (``tpcds_bench.TpcdsCheck``) is tried on small
tables: order along the text's ORDER BY, ties at a LIMIT.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pyarrow as pa
import pytest
from support import tpch_test_files

from benchmarks.engines import (
    DataFusionEngine,
    Engine,
    PolarsEngine,
    SailEngine,
    SailError,
)
from benchmarks.tpcds_bench import TpcdsCheck, order_keys
from benchmarks.tpch import tpchgen_cli
from benchmarks.tpch_queries import ORDERED, compare, duckdb_answer
from benchmarks.tpch_sql import ALL_QUERIES

REPO = Path(__file__).resolve().parent.parent
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
QUERIES = [1, 2, 6, 13, 15, 18, 19, 21]


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
    # Eight queries of every kind (scans, joins, subqueries, a view, top-k): all 22 are checked
    # against DuckDB in tests/sql/test_tpch_sql.py, and the harness's loop is the same for each.
    args = ["--sf", "0.01", "--engines", "flight,acero,duckdb", "--workers", "1,2", "--runs", "1",
            "--queries", ",".join(map(str, QUERIES)), "--out", str(out), "--plain"]
    proc = bench(*args, *([] if HAS_MATPLOTLIB else ["--no-chart"]))
    assert proc.returncode == 0, proc.stderr[-3000:]

    data = json.loads((out / "tpch-sf0.01.json").read_text())
    engines = {"flight[1]", "flight[2]", "acero", "duckdb"}
    assert set(data["engines"]) == engines
    cells = {(r["query"], r["engine"]): r for r in data["results"]}
    assert set(cells) == {(n, e) for n in QUERIES for e in engines}
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
    assert data["settings"]["flight_plans"] == "sql"
    assert data["engines"]["flight[2]"]["plans"] == "sql" and data["engines"]["flight[2]"]["planning_ms_median"] > 0
    assert "flight-exec planning (sql plans, text to stages): median" in proc.stdout

    table = (out / "tpch-sf0.01.md").read_text()
    assert "| Q19 |" in table and "**geomean**" in table and "matches DuckDB's" in table
    assert "| Q1 |" in proc.stdout  # the table is printed on stdout, progress on stderr
    assert "[bench]" in proc.stderr
    assert (out / "tpch-sf0.01.png").exists() == HAS_MATPLOTLIB


def test_builder_plans_cover_only_their_queries(tmp_path: Path) -> None:
    proc = bench("--flight-plans", "builder", "--queries", "2", "--out", str(tmp_path), timeout=60)
    assert proc.returncode == 2 and "queries [2] are not in the suite; it has 1,3,4,5,6,10,12,13,14,19" in proc.stderr


@pytest.mark.slow
def test_builder_plans_still_run(tmp_path: Path) -> None:
    try:
        tpchgen_cli()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    out = tmp_path / "results"
    proc = bench("--sf", "0.01", "--engines", "flight,duckdb", "--workers", "1", "--queries", "1,13", "--runs", "1",
                 "--flight-plans", "builder", "--no-chart", "--out", str(out), "--plain", "--stage-bars", "on")
    assert proc.returncode == 0, proc.stderr[-3000:]  # the warm-ups drew their stages' bars (rich, off a terminal: nothing shown)
    data = json.loads((out / "tpch-sf0.01.json").read_text())
    assert data["settings"]["flight_plans"] == "builder" and data["summary"]["ok"] is True


@pytest.mark.slow
def test_every_query_runs_by_default(tmp_path: Path) -> None:
    try:
        tpchgen_cli()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    proc = bench("--sf", "0.01", "--engines", "duckdb", "--runs", "1", "--out", str(tmp_path), "--plain", "--no-chart")
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "tpch-sf0.01.json").read_text())
    assert data["settings"]["queries"] == list(ALL_QUERIES)
    assert {r["query"] for r in data["results"]} == set(ALL_QUERIES) and data["summary"]["ok"] is True


def test_bad_arguments_are_usage_errors(tmp_path: Path) -> None:
    proc = bench("--engines", "flight,nosuch", "--out", str(tmp_path), timeout=60)
    assert proc.returncode == 2 and "engines" in proc.stderr
    proc = bench("--queries", "23", "--out", str(tmp_path), timeout=60)
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


# ------------------------------------------------------------- the peers

PEERS = {"datafusion": "datafusion", "polars": "polars", "sail": "pysail", "sail-cluster": "pysail"}
"""The peer engines and the package each needs (all in the ``bench`` extra)."""
PEER_QUERIES = (4, 13)
"""The queries whose SQL text leans most on the dialect: ``exists`` and ``interval '3' month`` (Q4), a left join
with a condition and a derived table's column aliases, ``as c_orders (c_custkey, c_count)`` (Q13)."""


def _peer(name: str, files: dict[str, list[Path]]) -> Engine:
    if name == "datafusion":
        return DataFusionEngine(files)
    if name == "polars":
        return PolarsEngine(files)
    return SailEngine(files, 2 if name == "sail-cluster" else None)


@pytest.mark.timeout(600)  # the first Sail run makes the Sail venv (pip install, about a minute)
@pytest.mark.parametrize("name", [pytest.param(name, marks=[pytest.mark.slow] if name.startswith("sail") else [])
                                  for name in PEERS])
def test_a_peer_answers_like_duckdb(name: str) -> None:
    """Each peer runs the suite's SQL text over the same Parquet files and gets DuckDB's answer."""
    pytest.importorskip(PEERS[name])
    files = tpch_test_files(0.01)
    with closing(_peer(name, files)) as engine:
        assert engine.key == name
        for n in PEER_QUERIES:
            got = engine.run(n)
            assert compare(got, duckdb_answer(n, files), ORDERED.get(n)) is None, (name, n)
        if isinstance(engine, SailEngine):
            pids = engine.pids()
            assert len(pids) == 3 and all(Path(f"/proc/{p}").exists() for p in pids)  # harness, client, server
            server = engine.server
    if name.startswith("sail"):
        assert server is not None and server.poll() is not None  # close() stopped the server


def test_datafusion_reads_exactly_the_listed_files(tmp_path: Path) -> None:
    """DataFusion registers a directory, not a list: a table given as some of a directory's files reads only those."""
    pytest.importorskip("datafusion")
    import pyarrow.parquet as pq

    from benchmarks.tpch_queries import TABLES

    files = tpch_test_files(0.01)
    some = files["lineitem"][:2]
    assert len(files["lineitem"]) > 2
    with closing(DataFusionEngine({"lineitem": some})) as engine:
        rows = engine.ctx.sql("select count(*) as n from lineitem").to_arrow_table().column(0)[0].as_py()
        assert engine.tables["lineitem"] != str(some[0].parent)  # the links directory, not the table's own
    assert rows == sum(pq.ParquetFile(p).metadata.num_rows for p in some)
    with closing(DataFusionEngine({t: files[t] for t in TABLES})) as engine:
        assert engine.tables["lineitem"] == str(files["lineitem"][0].parent.resolve())


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_cli_runs_the_peers_and_checks_them(tmp_path: Path) -> None:
    """flight-bench --engines with every installed peer: each cell matches DuckDB, in the JSON and the table."""
    peers = [name for name, package in PEERS.items() if importlib.util.find_spec(package) is not None]
    if not peers:
        pytest.skip("none of datafusion, polars, pysail is installed (the bench extra)")
    tpch_test_files(0.01)
    out = tmp_path / "results"
    proc = bench("--sf", "0.01", "--engines", ",".join(["duckdb", *peers]), "--queries", "1,13", "--runs", "1",
                 "--workers", "2", "--out", str(out), "--plain", "--no-chart", timeout=540)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((out / "tpch-sf0.01.json").read_text())
    assert set(data["engines"]) == {"duckdb", *peers}
    assert {(r["query"], r["engine"]) for r in data["results"]} == {(n, e) for n in (1, 13) for e in ["duckdb", *peers]}
    assert all(r["status"] == "ok" for r in data["results"]), data["results"]
    if "sail-cluster" in peers:
        described = data["engines"]["sail-cluster"]
        assert described["mode"] == "local-cluster" and described["env"]["SAIL_CLUSTER__WORKER_INITIAL_COUNT"] == "2"
        run = next(r for r in data["results"] if r["engine"] == "sail-cluster")["runs"][0]
        if run["peak_rss_bytes"] is not None:  # Linux: harness, client, server
            assert len(run["peak_rss_by_process"]) == 3
    assert "| Q13 |" in proc.stdout and "matches DuckDB's" in proc.stdout


def test_a_sail_that_cannot_start_fails_its_cells_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When the Sail venv cannot be made, both Sail columns report why and the other engines still run."""
    from benchmarks import cli

    def no_venv(*args: object, **kwargs: object) -> Path:
        raise SailError("pip install ... exited with code 1: no network")

    tpch_test_files(0.01)
    monkeypatch.setattr(cli, "NEEDS", {name: (lambda: True, what) for name, (_, what) in cli.NEEDS.items()})
    monkeypatch.setattr(cli, "sail_venv_info", lambda *a, **k: {})
    monkeypatch.setattr(cli, "ensure_sail_venv", no_venv)
    out = tmp_path / "results"
    code = cli.main(["--sf", "0.01", "--engines", "duckdb,sail,sail-cluster", "--queries", "6", "--runs", "1",
                     "--out", str(out), "--plain", "--no-chart"])
    assert code == 1
    data = json.loads((out / "tpch-sf0.01.json").read_text())
    status = {r["engine"]: r for r in data["results"]}
    assert status["duckdb"]["status"] == "ok"
    for name in ("sail", "sail-cluster"):
        assert status[name]["status"] == "error" and "no network" in status[name]["problem"], status[name]
    assert "no network" in data["engines"]["sail"]["error"]


# ------------------------------------------------------------- TPC-DS


@pytest.mark.timeout(300)  # a first TPC-DS run makes the TPC-DS venv (pip install) and SF 0.01's data
def test_tpcds_suite_runs_and_checks(tmp_path: Path) -> None:
    """flight-bench --suite tpcds: q03 (joins, a group, a LIMIT) and q12 (a window function, which Acero cannot
    run: its cell is marked unsupported, the run goes on and succeeds), each answer checked against DuckDB's."""
    out = tmp_path / "results"
    proc = bench("--suite", "tpcds", "--sf", "0.01", "--engines", "flight,acero,duckdb", "--workers", "2", "--runs", "1",
                 "--queries", "3,12", "--out", str(out), "--plain", "--no-chart", timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((out / "tpcds-sf0.01.json").read_text())
    assert data["settings"]["suite"] == "tpcds" and data["settings"]["queries"] == [3, 12]
    assert "write='spark'" in data["settings"]["texts"]["spark"]
    status = {(r["query"], r["engine"]): r["status"] for r in data["results"]}
    assert status == {(3, "flight[2]"): "ok", (3, "acero"): "ok", (3, "duckdb"): "ok",
                      (12, "flight[2]"): "ok", (12, "acero"): "unsupported", (12, "duckdb"): "ok"}
    assert data["summary"]["ok"] is True and data["summary"]["geomean_common"]["queries"] == [3]
    assert data["summary"]["answered"]["acero"] == {"ok": 1, "unsupported": 1}
    table = (out / "tpcds-sf0.01.md").read_text()
    assert table.startswith("TPC-DS SF 0.01") and "| Q12 |" in proc.stdout
    assert "**geomean** (1 of 2 queries)" in table and "geomean, each engine's own" in table
    assert "Not run (the engine refuses the query's text):" in table and "window functions" in table


def test_tpcds_usage_errors(tmp_path: Path) -> None:
    proc = bench("--suite", "tpcds", "--queries", "100", "--out", str(tmp_path), timeout=60)
    assert proc.returncode == 2 and "queries [100] are not in the suite" in proc.stderr
    proc = bench("--suite", "tpcds", "--flight-plans", "builder", "--out", str(tmp_path), timeout=60)
    assert proc.returncode == 2 and "builder has TPC-H's queries only" in proc.stderr


def test_tpcds_check_orders_along_the_texts_keys() -> None:
    """Columns by position; rows in the order of the text's ORDER BY (ordinals and expressions of the output
    included), rows tied on it as a multiset; at a LIMIT, the last tied rows may be any of the tied ones."""
    check = TpcdsCheck({1: "select a, b from t order by a limit 3;", 2: "select a, b from t order by a;",
                        3: "select a, b, c from t order by a - b, 1 limit 2;"})
    want = pa.table({"a": [1, 2, 2], "b": ["x", "y", "z"]})
    assert check(1, pa.table({"A": [1, 2, 2], "b": ["x", "z", "w"]}), want) is None  # 'w' tied with 'z' at the cut
    assert "sort key" in (check(1, pa.table({"a": [2, 1, 2], "b": ["y", "x", "z"]}), want) or "")
    assert "column b" in (check(1, pa.table({"a": [1, 2, 2], "b": ["q", "y", "z"]}), want) or "")
    assert check(2, pa.table({"a": [1, 2, 2], "b": ["x", "z", "y"]}), want) is None  # ties in any order
    assert "column b" in (check(2, pa.table({"a": [1, 2, 2], "b": ["x", "z", "w"]}), want) or "")  # no LIMIT: all rows
    assert "columns" in (check(2, pa.table({"a": [1, 2, 2]}), want) or "")
    assert order_keys("select a, b, c from t order by a - b, 1 limit 2", ["a", "b", "c"]) == (["c0 - c1", "c0"], 2)
    wide = pa.table({"a": [5, 1], "b": [4, 1], "c": [1.0, 2.0]})
    assert check(3, pa.table({"x": [5, 1], "y": [4, 1], "z": [1.0, 2.0]}), wide) is None
    assert "sort key" in (check(3, pa.table({"x": [1, 5], "y": [1, 4], "z": [2.0, 1.0]}), wide) or "")
