"""A plan a worker saw before (``flight.engine.seen``): typed and translated from memory, still checked against its task.

Each test runs a one-task plan the way a worker compiles it (``select.compile_task``, in this process) more than
once, and compares the rows with an oracle that is not the code under test (DuckDB over the same files, or Python).
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import flight
from flight import col, lit
from flight.dev.local import _LocalInputs
from flight.engine import seen
from flight.engine.confine import ANY_PATH
from flight.engine.duck.engine import configure, settings
from flight.engine.select import compile_task
from flight.errors import ProtocolError
from flight.planner.cut import plan_query
from flight.wire._proto import plan_pb2


def _files(tmp_path: Path, table: pa.Table, name: str, parts: int = 2) -> list[Path]:
    paths = []
    for i in range(parts):
        paths.append(tmp_path / f"{name}{i}.parquet")
        pq.write_table(table.slice(i * table.num_rows // parts, table.num_rows // parts + (i == parts - 1) * (table.num_rows % parts)), paths[-1])
    return paths


def _plan(query: flight.Query) -> tuple[plan_pb2.StagePlan, dict[str, tuple[object, int]]]:
    stage = plan_query(query.node, 1).head
    return plan_pb2.StagePlan(root=stage.root.to_proto()), {f.feed.feed_id: (f.feed, f.partitions) for f in stage.feeds}


def _run(plan: plan_pb2.StagePlan, feeds: dict[str, tuple[object, int]]) -> pa.Table:
    with compile_task(plan, _LocalInputs(feeds), 1 << 16, roots=ANY_PATH, engine="duckdb", whole_query=True) as reader:  # type: ignore[arg-type]
        return reader.read_all()


def test_a_plan_seen_before_answers_the_same_and_is_still_checked_against_its_task(tmp_path: Path) -> None:
    n = 20_000
    facts = pa.table({"k": pa.array([i % 53 for i in range(n)], pa.int64()), "v": pa.array([float(i % 7) for i in range(n)])})
    dims = pa.table({"k": pa.array(range(53), pa.int64()), "g": pa.array([f"g{i % 5}" for i in range(53)])})
    f, d = _files(tmp_path, facts, "f"), _files(tmp_path, dims, "d", 1)
    text = "SELECT g, count(*) AS n, sum(v) AS s FROM f JOIN d ON f.k = d.k WHERE d.k > 3 GROUP BY g ORDER BY g"
    listed = lambda ps: ", ".join(f"'{p}'" for p in ps)  # noqa: E731
    oracle = text.replace("FROM f", f"FROM read_parquet([{listed(f)}]) f").replace("JOIN d", f"JOIN read_parquet([{listed(d)}]) d")
    want = duckdb.sql(oracle).fetchall()
    query = flight.sql(text, {"f": flight.read_parquet(f), "d": flight.read_parquet(d)})
    plan, feeds = _plan(query)
    key = seen.plan_digest(plan)
    assert key is not None
    for run in range(3):  # the first compiles and translates it; the others recall both
        assert [tuple(r.values()) for r in _run(plan, feeds).to_pylist()] == want, run
        assert seen.recall(key) is not None
    # Remembered by the plan, not the task: a task that was not given the plan's feeds is refused as before.
    with pytest.raises(ProtocolError) as refused:
        _run(plan, {})
    assert refused.value.field == "header.feeds"


def test_a_plan_seen_before_that_duckdb_declines_runs_on_acero_again(tmp_path: Path) -> None:
    """DuckDB declines a NUL in a string literal; the plan's Acero declaration, not made on a recall, is made then."""
    words = ["a\x00b", "a", "b", "a\x00b", None] * 400
    table = pa.table({"s": pa.array(words), "v": pa.array(range(len(words)), pa.int64())})
    query = flight.read_parquet(_files(tmp_path, table, "t")).filter(col("s") == lit("a\x00b"))
    query = query.aggregate([], n=flight.agg.count_all(), total=flight.agg.sum(col("v")))
    want = [sum(1 for w in words if w == "a\x00b"), sum(i for i, w in enumerate(words) if w == "a\x00b")]
    plan, feeds = _plan(query)
    for run in range(2):
        got = _run(plan, feeds)
        assert [got.column("n")[0].as_py(), got.column("total")[0].as_py()] == want, run
    assert seen.recall(seen.plan_digest(plan)) is not None


def test_new_engine_settings_forget_what_was_worked_out(tmp_path: Path) -> None:
    table = pa.table({"k": pa.array([1, 2, 2, 3], pa.int64())})
    plan, feeds = _plan(flight.read_parquet(_files(tmp_path, table, "t")).aggregate(["k"], n=flight.agg.count_all()))
    assert sorted(_run(plan, feeds).to_pylist(), key=lambda r: r["k"]) == [{"k": 1, "n": 1}, {"k": 2, "n": 2}, {"k": 3, "n": 1}]
    assert seen.recall(seen.plan_digest(plan)) is not None
    configure(settings())
    assert seen.recall(seen.plan_digest(plan)) is None


def test_a_plan_past_the_bound_is_not_kept() -> None:
    plan = plan_pb2.StagePlan(output_schema=b"x" * (seen.MAX_PLAN_BYTES + 1))
    assert seen.plan_digest(plan) is None
    assert seen.recall(None) is None


def test_a_self_join_planned_again_is_the_same_plan(tmp_path: Path) -> None:
    """A second read of a source is a feed of its own, named after the first (``WorkUnitFeed.again``), not drawn at
    random: the same text planned again sends the same bytes, which is what a worker recalls a plan by."""
    table = pa.table({"k": pa.array([1, 2, 3, 4], pa.int64()), "p": pa.array([None, 1, 1, 2], pa.int64())})
    files = _files(tmp_path, table, "t")
    catalog = flight.Catalog({"t": flight.read_parquet(files)})
    text = "SELECT a.k, b.k AS parent FROM t a JOIN t b ON a.p = b.k JOIN t c ON b.p = c.k ORDER BY a.k"
    plans = [_plan(flight.sql(text, catalog)) for _ in range(2)]
    assert plans[0][0].SerializeToString(deterministic=True) == plans[1][0].SerializeToString(deterministic=True)
    ids = list(plans[0][1])
    assert len(ids) == len(set(ids)) == 3
    assert all(i.startswith(ids[0].split(".")[0]) for i in ids)
    con = duckdb.connect()
    con.execute(f"CREATE VIEW t AS SELECT * FROM read_parquet([{', '.join(repr(str(p)) for p in files)}])")
    assert [tuple(r.values()) for r in _run(*plans[1]).to_pylist()] == con.sql(text).fetchall()


def test_a_read_again_never_takes_a_name_a_plan_already_has() -> None:
    """A source named ``t`` read three times in a plan that also reads a source named ``t.2``: every read's id differs."""

    class Rows(flight.WorkUnitFeedProvider):
        def feed(self, partition: int, ctx: flight.FeedContext):  # type: ignore[no-untyped-def]
            return iter([])

    from flight.sources.feed import WorkUnitFeed

    t = WorkUnitFeed(Rows(), "t")
    taken = {"t", "t.2"}
    again = t.again(taken)
    assert again.feed_id == "t.3" and again.inner() is t.inner()
    taken.add(again.feed_id)
    assert t.again(taken).feed_id == "t.4"
    long = WorkUnitFeed(Rows(), "x" * 128)  # no room for a suffix: an id drawn at random, as before
    assert long.again({long.feed_id}).feed_id not in {long.feed_id} and len(long.again({long.feed_id}).feed_id) <= 128
