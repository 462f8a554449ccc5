"""TPC-DS data and query texts from ``benchmarks/tpcds.py``.

The fast tests check the cache rules without the TPC-DS venv (its generator is replaced by a fake
that writes what ``dsdgen`` would): a complete cache is reused, a half or stale one is made again,
a failed run leaves the old cache as it was, and a directory holding other files is never deleted.
The slow test makes the venv (pip install from PyPI, the first time only), generates SF 0.01 into the
benchmarks' cache and runs all 99 query texts in this venv's DuckDB over the Parquet files.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import duckdb
import pytest

from benchmarks import tpcds


def _no_venv(*args: object, **kwargs: object) -> Path:
    raise tpcds.TpcdsError("the venv was asked for")


def _fake_generator(calls: list[dict[str, object]], *, fail: bool = False) -> Callable[[Sequence[str], float, str], str]:
    """Stands for ``_run`` of the generator script: writes each table file and the row counts, or fails half-way."""

    def run(cmd: Sequence[str], timeout: float, what: str) -> str:
        args = json.loads(cmd[-1])
        calls.append(args)
        for i, table in enumerate(args["tables"]):
            if fail and i == 5:
                raise tpcds.TpcdsError(f"{what}: killed")
            (Path(args["out"]) / f"{table}.parquet").write_bytes(b"new")
        Path(args["result"]).write_text(json.dumps(dict.fromkeys(args["tables"], 1)))
        return ""

    return run


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, object]]:
    calls: list[dict[str, object]] = []
    monkeypatch.setattr(tpcds, "ensure_tpcds_venv", lambda *a, **k: Path("/nonexistent/python"))
    monkeypatch.setattr(tpcds, "_run", _fake_generator(calls))
    return calls


def test_a_complete_cache_is_reused_and_a_half_one_is_made_again(tmp_path: Path, fake: list[dict[str, object]]) -> None:
    out = tmp_path / "sf0.5"
    files = tpcds.generate(0.5, out)
    assert set(files) == set(tpcds.TABLES) and len(files) == 24 and len(fake) == 1
    assert all(p == out / f"{t}.parquet" and p.read_bytes() == b"new" for t, p in files.items())
    marker = json.loads((out / ".complete").read_text())
    assert marker["sf"] == 0.5 and marker["generator"] == tpcds.GENERATOR
    assert tpcds.generate(0.5, out) == files and len(fake) == 1  # cached
    files["inventory"].unlink()
    tpcds.generate(0.5, out)
    assert len(fake) == 2 and files["inventory"].exists()  # a missing table: made again
    assert not tpcds.table_ready(0.25, out)  # another scale factor
    tpcds.generate(0.25, out)
    assert len(fake) == 3 and json.loads((out / ".complete").read_text())["sf"] == 0.25
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == ["sf0.5"]  # no scratch left


def test_a_failed_run_leaves_the_old_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake: list[dict[str, object]]) -> None:
    out = tmp_path / "data"
    tpcds.generate(0.5, out)
    monkeypatch.setattr(tpcds, "_run", _fake_generator(fake, fail=True))
    with pytest.raises(tpcds.TpcdsError, match="killed"):
        tpcds.generate(0.25, out)
    assert tpcds.table_ready(0.5, out) and not tpcds.table_ready(0.25, out)
    assert not list(tmp_path.glob(".data.tmp-*"))


def test_a_directory_of_other_files_is_never_deleted(tmp_path: Path, fake: list[dict[str, object]]) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(tpcds.TpcdsError, match=r"notes\.txt"):
        tpcds.generate(0.5, tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine" and not (tmp_path / "store_sales.parquet").exists()


def test_cached_query_texts_answer_without_the_venv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tpcds, "ensure_tpcds_venv", _no_venv)
    texts = {str(n): f"SELECT {n}" for n in range(1, 100)}
    (tmp_path / f"queries-{tpcds.TPCDS_VERSION}.json").write_text(json.dumps(texts))
    assert tpcds.queries(tmp_path) == {n: f"SELECT {n}" for n in range(1, 100)}
    (tmp_path / f"queries-{tpcds.TPCDS_VERSION}.json").write_text(json.dumps({"1": "SELECT 1"}))  # not all 99: read again
    with pytest.raises(tpcds.TpcdsError, match="the venv was asked for"):
        tpcds.queries(tmp_path)


def test_a_bad_scale_factor_is_refused(tmp_path: Path) -> None:
    for sf in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="scale factor"):
            tpcds.generate(sf, tmp_path / "x")


@pytest.mark.slow
@pytest.mark.timeout(900)  # the first run makes the TPC-DS venv (pip install duckdb 1.5.5 and the extension)
def test_the_99_queries_run_in_duckdb_over_sf_0_01() -> None:
    """All 99 texts run in this venv's DuckDB (>= 2.0) over the Parquet files ``dsdgen`` 1.5.5 wrote; most
    return rows even at SF 0.01 (27 are empty there, 18 at SF 0.1, 1 at SF 1)."""
    files = tpcds.generate(0.01)
    texts = tpcds.queries()
    assert sorted(texts) == list(range(1, 100))
    con = duckdb.connect()
    for table, path in files.items():
        con.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet('{path}')")
    types = dict(con.execute("SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'store_sales'").fetchall())
    assert types["ss_net_profit"] == "DECIMAL(7,2)" and types["ss_sold_date_sk"] == "BIGINT"
    # fetchall, not fetchone: DuckDB 2 refuses other work on a connection while a result is unfinished
    assert con.execute("SELECT data_type FROM information_schema.columns WHERE column_name = 'd_date'").fetchall() == [("DATE",)]
    assert con.execute("SELECT count(*) FROM store_sales").fetchall() == [(28_810,)]
    failed: dict[int, str] = {}
    empty = []
    for n, text in texts.items():
        try:
            rows = con.sql(text).fetchall()
        except duckdb.Error as e:
            failed[n] = str(e)[:200]
            continue
        if not rows:
            empty.append(n)
    assert not failed, failed
    assert len(empty) <= 30, empty
