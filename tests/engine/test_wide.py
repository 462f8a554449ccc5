"""Whole-query tasks on every core (``TaskOptions.whole_query``; ``duck.engine``'s wide database).

DuckDB's thread count belongs to its database, not to a query: a worker whose engine threads are a
share of the machine's cores (workers that share a machine) keeps a second database with every core
for tasks that are their query's only one, and splits its memory limit with it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import flight
from flight.engine.confine import ANY_PATH
from flight.engine.duck.engine import _database, configure, settings, wide_threads
from flight.engine.settings import EngineSettings

CORES = len(os.sched_getaffinity(0))
GIB = 1 << 30


@pytest.fixture
def one_thread_share() -> Iterator[None]:
    before = settings()
    configure(EngineSettings(memory_limit=4 * GIB, threads=1))
    try:
        yield
    finally:
        configure(before)


def _setting(con: duckdb.DuckDBPyConnection, name: str) -> str:
    ((value,),) = con.cursor().sql(f"SELECT current_setting('{name}')").fetchall()
    return str(value)


@pytest.mark.skipif(CORES < 2, reason="one core: there is no share smaller than the machine")
def test_a_whole_query_runs_on_every_core_with_half_the_memory(one_thread_share: None) -> None:
    assert wide_threads() == CORES
    main, wide = _database(ANY_PATH), _database(ANY_PATH, wide=True)
    assert main is not wide
    assert (_setting(main, "threads"), _setting(wide, "threads")) == ("1", str(CORES))
    assert (_setting(main, "memory_limit"), _setting(wide, "memory_limit")) == ("2.0 GiB", "2.0 GiB")


def test_with_every_core_already_a_tasks_whole_queries_share_its_database() -> None:
    before = settings()
    configure(EngineSettings(memory_limit=4 * GIB, threads=CORES))
    try:
        assert wide_threads() is None
        assert _database(ANY_PATH, wide=True) is _database(ANY_PATH)
        assert _setting(_database(ANY_PATH), "memory_limit") == "4.0 GiB"
    finally:
        configure(before)


def test_a_small_query_is_marked_whole_and_answers_as_duckdb(tmp_path: Path) -> None:
    """On two workers sharing this machine (one engine thread each), a query planned as one task runs on the
    wide database: its answer is DuckDB's, and a two-stage plan of the same query (not whole) agrees."""
    n = 50_000
    table = pa.table({"k": pa.array([i % 97 for i in range(n)], pa.int64()), "v": pa.array([i * 0.5 for i in range(n)])})
    paths = []
    for i in range(4):
        paths.append(tmp_path / f"t{i}.parquet")
        pq.write_table(table.slice(i * n // 4, n // 4), paths[-1], row_group_size=2_000)
    text = "SELECT k, count(*) AS n, sum(v) AS s FROM t GROUP BY k ORDER BY k"
    listed = ", ".join(f"'{p}'" for p in paths)
    want = duckdb.sql(text.replace("FROM t", f"FROM read_parquet([{listed}])")).arrow().read_all()
    catalog = flight.Catalog({"t": flight.read_parquet(paths)})
    with flight.LocalCluster(2, data_roots=[tmp_path]) as cluster:
        for small in (64 << 20, 0):
            ex = flight.DistributedExec(flight.sql(text, catalog), cluster.urls, small_query_bytes=small)
            assert ex.to_table().to_pylist() == want.to_pylist(), small
            assert ex.metrics is not None and (len(ex.metrics.tasks) == 1) == (small > 0)


def test_a_worker_with_little_memory_keeps_one_database() -> None:
    before = settings()
    configure(EngineSettings(memory_limit=512 << 20, threads=1))
    try:
        assert wide_threads() is None
        assert _database(ANY_PATH, wide=True) is _database(ANY_PATH)
    finally:
        configure(before)


def _whole(query: flight.Query) -> pa.Table:
    """``query`` as a query's only task runs it on a worker (``whole_query``), in this process."""
    from flight.dev.local import _LocalInputs
    from flight.engine.select import compile_task
    from flight.planner.cut import plan_query
    from flight.wire._proto import plan_pb2

    stage = plan_query(query.node, 1).head
    inputs = _LocalInputs({f.feed.feed_id: (f.feed, f.partitions) for f in stage.feeds})
    plan = plan_pb2.StagePlan(root=stage.root.to_proto())
    with compile_task(plan, inputs, 1 << 16, roots=ANY_PATH, engine="duckdb", whole_query=True) as reader:
        return reader.read_all()


def test_a_whole_querys_inner_joins_are_one_join_list_and_answer_as_duckdb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inner joins (through projections that pick columns) are one ``FROM a, b, c WHERE ...`` list, so DuckDB
    orders them as its own SQL; an outer join, or a join with a condition beside its keys, stays as written."""
    from flight.engine.duck import translate

    ints = lambda xs: pa.array(xs, pa.int64())  # noqa: E731
    tables = {
        "a": pa.table({"k": ints([1, 2, 3, None, 5]), "x": ints([10, 20, 30, 40, 50])}),
        "b": pa.table({"k": ints([1, 1, 2, None, 7]), "y": ints([5, 25, 15, 0, 1]), "z": ints([100, 200, 100, 300, None])}),
        "c": pa.table({"z": ints([100, 200, 400]), "x": ints([7, 8, 9])}),
    }
    for name, table in tables.items():
        pq.write_table(table, tmp_path / f"{name}.parquet")
    catalog = flight.Catalog({name: flight.read_parquet([tmp_path / f"{name}.parquet"]) for name in tables})
    flat: list[str] = []
    joins = translate.Translator.joins
    monkeypatch.setattr(translate.Translator, "joins", lambda self, *a: flat.append(joins(self, *a)) or flat[-1])
    con = duckdb.connect()
    for name in tables:
        con.execute(f"CREATE VIEW {name} AS SELECT * FROM '{tmp_path / name}.parquet'")
    for text, lists in (
        ("SELECT a.x, b.y, c.x AS cx FROM a JOIN b ON a.k = b.k JOIN c ON b.z = c.z ORDER BY 1, 2, 3", 1),
        ("SELECT a.x, b.y, c.x AS cx FROM a JOIN b ON a.k = b.k LEFT JOIN c ON b.z = c.z ORDER BY 1, 2, 3", 1),
        ("SELECT a.x, b.y FROM a JOIN b ON a.k = b.k AND a.x > b.y * 2 ORDER BY 1, 2", 0),
    ):
        flat.clear()
        got = _whole(flight.sql(text, catalog))
        assert got.to_pylist() == con.sql(text).arrow().read_all().to_pylist(), text
        assert len(flat) == lists, (text, flat)
        assert all(" JOIN " not in f.split(" WHERE ")[0] for f in flat), flat  # a join list, not JOIN ... ON
