"""A corpus of focused SQL statements (``corpus.py``), each run by flight-exec and by DuckDB.

Every construct docs/sql.md lists has statements here, over tables the test makes (nulls,
decimals of two scales, dates, unicode, an empty table), written to Parquet and read by both
engines. flight-exec runs each with ``run_local`` on both of its engines (DuckDB per task, and
Acero). The answers must be equal: rows as a multiset (in order where the statement orders
them), decimals digit for digit where DuckDB's answer is a DECIMAL, floats within 1e-9
relative. A statement the front end refuses fails here too: refusals are tested by their text
in ``test_sql_errors.py``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
from corpus import CORPUS, tables
from support import difference as same

import flight
from benchmarks.tpch_queries import duckdb_table
from flight.sql.frontend import split_statements

CASES = [(group, i, text) for group, texts in CORPUS.items() for i, text in enumerate(texts)]


def test_the_corpus_is_large() -> None:
    assert len(CASES) >= 250, f"{len(CASES)} statements"


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each table as a directory of three Parquet files, so scans have several tasks and rows move."""
    root = tmp_path_factory.mktemp("sql-corpus")
    out = {}
    for name, table in tables().items():
        out[name] = root / name
        out[name].mkdir()
        step = max(1, -(-table.num_rows // 3))
        for part in range(3):
            pq.write_table(table.slice(part * step, step), out[name] / f"part-{part}.parquet", row_group_size=16)
    return out


@pytest.fixture(scope="module")
def catalog(paths: dict[str, Path]) -> flight.Catalog:
    return flight.Catalog({name: str(path) for name, path in paths.items()})


@pytest.fixture(scope="module")
def con(paths: dict[str, Path]) -> Iterator[duckdb.DuckDBPyConnection]:
    c = duckdb.connect()
    for name, path in paths.items():
        c.execute(f"create view {name} as select * from read_parquet('{path}/*.parquet')")
    yield c
    c.close()


DUCKDB_ONLY = re.compile(r" over \(|\b(median|quantile\w*|percentile_\w+|string_agg|array_agg|unnest)\(")
"""Windows, medians, quantiles and ordered aggregates run on the DuckDB engine only (``flight.engine.select.duckdb_only``)."""

ENGINES = [
    pytest.param(engine, group, i, text, id=f"{group.split()[0]}-{i}-{engine}")
    for group, i, text in CASES
    for engine in (("duckdb",) if DUCKDB_ONLY.search(text) else ("duckdb", "acero"))
]


@pytest.mark.parametrize(("engine", "group", "i", "text"), ENGINES)
def test_statement_matches_duckdb(
    group: str, i: int, text: str, engine: str, catalog: flight.Catalog, con: duckdb.DuckDBPyConnection
) -> None:
    want = duckdb_table(con, text)
    got = flight.run_local(flight.sql(text, catalog), engine=engine).read_all()
    last = split_statements(text)[-1].text.lower()
    ordered = re.search(r"order by [^)]*$", last) is not None  # the statement's own ORDER BY, not a window's
    difference = same(got, want, ordered)
    assert difference is None, f"{text}\n{difference}"


SPREAD = ("windows", "joins", "aggregates", "set operations", "exists and scalar subqueries", "ctes and views", "medians and quantiles",
          "ordered aggregates", "nested data", "grouping sets")
DISTRIBUTED = [(g, i, text) for g, i, text in CASES if g in SPREAD]


@pytest.fixture(scope="module")
def corpus_cluster(data_roots: list[Path]) -> Iterator[flight.LocalCluster]:
    with flight.LocalCluster(2, data_roots=data_roots) as c:
        yield c


@pytest.mark.slow
@pytest.mark.parametrize(("group", "i", "text"), DISTRIBUTED, ids=[f"{g.split()[0]}-{i}" for g, i, _ in DISTRIBUTED])
def test_statement_on_workers_matches_duckdb(
    group: str, i: int, text: str, catalog: flight.Catalog, con: duckdb.DuckDBPyConnection, corpus_cluster: flight.LocalCluster
) -> None:
    """Planned for two workers with every join shuffled and a task per worker above the scans:
    windows move rows by their partition keys, joins and aggregates by theirs."""
    want = duckdb_table(con, text)
    ex = flight.DistributedExec(flight.sql(text, catalog), corpus_cluster.urls, broadcast_bytes=0, rows_per_task=1)
    last = split_statements(text)[-1].text.lower()
    difference = same(ex.to_table(), want, re.search(r"order by [^)]*$", last) is not None)
    assert difference is None, f"{text}\n{difference}\n{ex.explain()}"


STAGED = [(g, i, text) for g, i, text in CASES if g in ("ctes and views", "grouping sets")]


@pytest.mark.slow
@pytest.mark.parametrize(("group", "i", "text"), STAGED, ids=[f"{g.split()[0]}-{i}" for g, i, _ in STAGED])
def test_statement_forced_into_stages_matches_duckdb(
    group: str, i: int, text: str, catalog: flight.Catalog, con: duckdb.DuckDBPyConnection, corpus_cluster: flight.LocalCluster
) -> None:
    """The CTEs' and grouping sets' statements with every plan forced into stages (on one host, small queries are one
    task): a CTE's uses share one subplan with what all of them ask pushed into it, cut into stages that each use reads;
    a union of sets over an input several tasks read is one aggregate over the sets' rows (``flight.planner.gsets``)."""
    want = duckdb_table(con, text)
    ex = flight.DistributedExec(flight.sql(text, catalog), corpus_cluster.urls, one_host_query_bytes=0, small_query_bytes=0)
    last = split_statements(text)[-1].text.lower()
    difference = same(ex.to_table(), want, re.search(r"order by [^)]*$", last) is not None)
    assert difference is None, f"{text}\n{difference}\n{ex.explain()}"
