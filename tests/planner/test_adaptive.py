"""Adaptive planning (flight.planner.adaptive, flight.coordinator.adaptive): a join side whose size is a guess
runs first, and the query is planned again from its actual rows.

Decisions, without sockets: TPC-H Q18's ``HAVING sum(l_quantity) > 300`` subquery is the side chosen, and
nothing is chosen where no filter reads an aggregate's output; once settled, it is replaced wherever it is
(both semi joins), its rows go into each task's plan (``Values.every_task``), the semi joins by them are
sized from their keys, and nothing is hash-shuffled.

Runs, on two real workers at 127.0.0.2 and .3 (the planner sees two hosts) and DuckDB as the oracle: Q18
answers exactly, ``explain()`` gives the side's estimate and its actual rows (DuckDB's count of the
subquery); a side past ``adaptive_bytes`` is dropped and the planned query runs, still exact; 0 turns it
off. Literal rows in every task are checked on both engines (Acero and DuckDB workers) with a join of
Parquet files and ``flight.from_arrow`` keys, each of two tasks holding matches.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support import sorted_table, tpch_test_files

import flight
from benchmarks.tpch_queries import TABLES
from benchmarks.tpch_sql import SQL
from flight.plan.nodes import FeedScanNode, FilterNode, Node, ValuesNode
from flight.plan.relnodes import JoinNode
from flight.planner import adaptive
from flight.planner.adaptive import find_point, key_filters, settled, uncertain
from flight.planner.cut import plan_query
from flight.planner.optimize import push_filters
from flight.planner.semijoin import push_semi_joins

SF = 0.05
SPLIT = {"small_query_bytes": 0, "one_host_query_bytes": 0}  # two tasks a stage, however small the tables
HAVING = "select l_orderkey from lineitem group by l_orderkey having sum(l_quantity) > 300"


@pytest.fixture(scope="module")
def files() -> dict[str, list]:
    return tpch_test_files(SF)


@pytest.fixture(scope="module")
def catalog(files: dict[str, list]) -> flight.Catalog:
    return flight.Catalog({t: flight.read_parquet([str(p) for p in files[t]]) for t in TABLES})


@pytest.fixture(scope="module")
def oracle(files: dict[str, list]) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    for t in TABLES:
        con.sql(f"create view {t} as select * from read_parquet({[str(p) for p in files[t]]})")
    return con


@pytest.fixture(scope="module", params=["duckdb", "acero"])
def two_hosts(request: pytest.FixtureRequest, data_roots: list[Path]) -> Iterator[flight.LocalCluster]:
    """Two workers on their own loopback addresses, running plans on ``request.param``'s engine."""
    with flight.LocalCluster(2, hosts=["127.0.0.2", "127.0.0.3"], data_roots=data_roots,
                             worker_args=["--engine", request.param]) as c:
        yield c


def pushed(catalog: flight.Catalog, text: str) -> Node:
    root, _ = push_semi_joins(push_filters(flight.sql(text, catalog).node))
    return root


def test_q18s_having_subquery_is_the_side_run_first(catalog: flight.Catalog) -> None:
    point = find_point(pushed(catalog, SQL[18]))
    assert point is not None
    assert point.join.join_type == "left semi" and point.side.schema.names == ["l_orderkey"]
    assert uncertain(point.side)
    assert "adaptive:" in point.text() and "a guess" in point.text()


@pytest.mark.parametrize("q", [1, 3, 5, 9, 10, 21])
def test_no_side_is_run_first_without_a_filter_on_an_aggregate(catalog: flight.Catalog, q: int) -> None:
    assert find_point(pushed(catalog, SQL[q])) is None


def test_a_filter_on_group_keys_alone_is_no_guess(catalog: flight.Catalog) -> None:
    by_key = flight.sql("select l_orderkey, sum(l_quantity) s from lineitem group by l_orderkey having l_orderkey > 3", catalog)
    assert not uncertain(push_filters(by_key.node))
    assert uncertain(push_filters(flight.sql(HAVING, catalog).node))



GROUPED = ("with t as (select l_orderkey, l_linenumber, l_partkey, sum(l_quantity) q, max(l_comment) c, sum(l_extendedprice) p "
           "from lineitem group by l_orderkey, l_linenumber, l_partkey) ")


@pytest.mark.parametrize(("other", "runs_first"), [
    ("t a", False),  # the same grouping on both sides: the plan groups once and reads it twice
    ("lineitem a", True),
], ids=["shared-aggregate", "own-aggregate"])
def test_a_side_whose_aggregate_the_rest_of_the_query_also_computes_is_not_run_first(
        catalog: flight.Catalog, monkeypatch: pytest.MonkeyPatch, other: str, runs_first: bool) -> None:
    # TPC-DS q39's shape (and q04's, q11's, q74's, q64's): one grouped CTE on both sides of a join, one side filtered
    # on its sums. Run first, that side would group the table a second time (q39 at SF 10: 0.66 s of its 1.5 s).
    monkeypatch.setattr(adaptive, "PARTNER_BYTES", 1 << 18)  # this data's sides are small: the rule, not its threshold
    text = GROUPED + f"select a.l_orderkey, a.l_partkey, b.q from {other} join t b on a.l_orderkey = b.l_orderkey where b.q > 30"
    point = find_point(pushed(catalog, text))
    assert (point is not None) == runs_first, point and point.text()
    if point is not None:
        assert point.side.schema.names == ["l_orderkey___1", "q"], point.side.schema.names



def test_a_side_named_twice_is_not_run_first_but_a_copied_semi_join_side_is(
        catalog: flight.Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    # A CTE named twice is two equal subtrees, and settling replaces only the side's own object: the other copy
    # would still be computed (TPC-DS q23's best_ss_customer in both legs of its union, q64's cs_ui). Q18's semi join
    # copied onto lineitem shares its build side object: settled everywhere, so it still runs first.
    monkeypatch.setattr(adaptive, "PARTNER_BYTES", 1 << 18)
    twice = ("with big as (select l_orderkey from lineitem group by l_orderkey having sum(l_quantity) > 300) "
             "select o_orderkey from orders where o_orderkey in (select l_orderkey from big) "
             "union all select l_orderkey from lineitem where l_orderkey in (select l_orderkey from big)")
    assert find_point(pushed(catalog, twice)) is None
    assert find_point(pushed(catalog, SQL[18])) is not None


def test_settled_q18_puts_literal_rows_in_every_task_and_shuffles_nothing(catalog: flight.Catalog) -> None:
    root = pushed(catalog, SQL[18])
    point = find_point(root)
    assert point is not None
    keys = pa.table({"l_orderkey": pa.array([7, 70, 700], pa.int64())})
    new = settled(root, point.side, keys)
    values = [n for n in new.walk() if isinstance(n, ValuesNode)]
    assert len(values) == 2 and all(v.table.equals(keys) for v in values)  # both semi joins' build side
    assert not any(n is point.side for n in new.walk())
    plan = plan_query(new, 2, pushed=True)
    assert not [s.stage_id for s in plan.stages if s.output_mode == "hash"]
    literal = [n for s in plan.stages for n in s.root.walk() if isinstance(n, ValuesNode)]
    assert len(literal) == 2 and all(v.every_task for v in literal)
    semis = [n for s in plan.stages for n in s.root.walk() if isinstance(n, JoinNode) and n.join_type == "left semi"]
    assert semis and all(n.strategy == "broadcast" for n in semis)
    assert any("literal rows into 2 task(s), build side ~3 rows" in r for r in plan.rewrites)
    # Sized from their three keys, not as the whole scan: orders keeps ~3 rows where it holds 75,000.
    assert all(s.output_rows is not None and s.output_rows < 1_000 for s in plan.stages)


def test_literal_keys_bound_the_other_sides_scans(catalog: flight.Catalog) -> None:
    """Dynamic filtering: the settled keys' range lands on the orders and lineitem scans, under their semi joins."""
    root = pushed(catalog, SQL[18])
    point = find_point(root)
    assert point is not None
    new, notes = key_filters(settled(root, point.side, pa.table({"l_orderkey": pa.array([700, 7, 70], pa.int64())})))
    assert sorted(notes) == sorted(f"dynamic filter: HashJoin[left semi, {k}=l_orderkey]'s literal keys bound '{k}' to [7, 700] on its other side"
                                   for k in ("o_orderkey", "l_orderkey"))
    plan = plan_query(new, 2)
    scanned = [n for s in plan.stages for n in s.root.walk()
               if isinstance(n, FilterNode) and isinstance(n.input, FeedScanNode) and {"o_orderkey", "l_orderkey"} & n.predicate.referenced_fields()]
    assert len(scanned) == 2, [s.root.label() for s in plan.stages]
    assert all("7" in str(n.predicate) and "700" in str(n.predicate) for n in scanned)


def test_empty_or_unordered_literal_keys_bound_nothing(catalog: flight.Catalog) -> None:
    root = pushed(catalog, SQL[18])
    point = find_point(root)
    assert point is not None
    _, notes = key_filters(settled(root, point.side, pa.table({"l_orderkey": pa.array([], pa.int64())})))
    assert notes == []



def test_literal_keys_bound_the_other_side_after_the_filters_on_them(catalog: flight.Catalog) -> None:
    """A use's own filter pushed onto the literal rows (TPC-DS q39: one month's dates of the two that ran first)
    narrows the range to the rows it keeps (none kept: no range, the join keeps nothing either)."""
    orders = flight.sql("select * from orders", catalog).node
    rows = pa.table({"k": pa.array([7, 70, 700, 7000], pa.int64()), "m": pa.array([1, 1, 2, 2], pa.int32())})
    month = flight.col("m")
    for predicate, bound in ((month == flight.lit(1, pa.int32()), "[7, 70]"), (month == flight.lit(2, pa.int32()), "[700, 7000]"),
                             (month > flight.lit(5, pa.int32()), None)):
        join = JoinNode(orders, FilterNode(ValuesNode(rows, every_task=True), predicate), ["o_orderkey"], ["k"], "inner", "___1", "auto", None)
        _, notes = key_filters(join)
        note = f"dynamic filter: HashJoin[inner, o_orderkey=k]'s literal keys bound 'o_orderkey' to {bound} on its other side"
        want = [] if bound is None else [note]
        assert notes == want, (str(predicate), notes)


def test_q18_runs_its_guess_first_and_answers_as_duckdb(
    two_hosts: flight.LocalCluster, catalog: flight.Catalog, oracle: duckdb.DuckDBPyConnection
) -> None:
    ex = flight.DistributedExec(flight.sql(SQL[18], catalog), two_hosts.urls, **SPLIT)
    assert "runs first as a query of its own" in ex.explain()
    got = ex.to_table()
    assert got.to_pylist() == oracle.sql(SQL[18]).to_arrow_table().to_pylist()
    actual = oracle.sql(f"select count(*) from ({HAVING})").fetchall()[0][0]
    text = ex.explain(analyze=True)
    assert f"actual {actual:,} rows" in text and "planned again with those rows as literal input" in text
    assert "Values[" in text and "in every task]" in text
    assert "dynamic filter: HashJoin[left semi, o_orderkey=l_orderkey]'s literal keys bound 'o_orderkey'" in text
    assert not [s.stage_id for s in ex.stages if s.output_mode == "hash"]


def test_a_side_past_adaptive_bytes_is_dropped_and_the_planned_query_runs(
    two_hosts: flight.LocalCluster, catalog: flight.Catalog, oracle: duckdb.DuckDBPyConnection
) -> None:
    ex = flight.DistributedExec(flight.sql(SQL[18], catalog), two_hosts.urls, adaptive_bytes=1, **SPLIT)
    got = ex.to_table()
    assert got.to_pylist() == oracle.sql(SQL[18]).to_arrow_table().to_pylist()
    assert "its rows passed adaptive_bytes (0.0 MiB), so the query runs as planned" in ex.explain()
    assert not any(isinstance(n, ValuesNode) for s in ex.stages for n in s.root.walk())


def test_adaptive_bytes_0_plans_once(two_hosts: flight.LocalCluster, catalog: flight.Catalog) -> None:
    ex = flight.DistributedExec(flight.sql(SQL[18], catalog), two_hosts.urls, adaptive_bytes=0, **SPLIT)
    assert ex.adaptive is None and "adaptive" not in ex.explain()


def test_literal_keys_are_joined_in_every_task(two_hosts: flight.LocalCluster, tmp_path: Path) -> None:
    """Keys from ``flight.from_arrow`` joined with two files, one per task, each holding matches: every task
    builds the keys (``Values.every_task``), so no task's matches are lost."""
    paths = []
    for i in range(2):
        paths.append(tmp_path / f"part{i}.parquet")
        pq.write_table(pa.table({"k": pa.array(range(i * 100, i * 100 + 100), pa.int64()), "v": [f"r{j}" for j in range(100)]}), paths[-1])
    keys = pa.table({"k": pa.array([5, 50, 105, 150, 999], pa.int64()), "w": [1, 2, 3, 4, 5]})
    query = flight.read_parquet([str(p) for p in paths]).join(flight.from_arrow(keys), on="k")
    ex = flight.DistributedExec(query, two_hosts.urls, **SPLIT)
    got = ex.to_table()
    con = duckdb.connect()
    con.register("keys", keys)
    want = con.sql(f"select * from read_parquet({[str(p) for p in paths]}) join keys using (k)").to_arrow_table()
    assert sorted_table(got.select(want.column_names)).equals(sorted_table(want.cast(got.select(want.column_names).schema)))
    joining = [s.stage_id for s in ex.stages if any(isinstance(n, ValuesNode) and n.every_task for n in s.root.walk())]
    assert len(joining) == 1 and ex.metrics is not None
    outs = [t.rows_out for t in ex.metrics.tasks if int(t.stage_key.split("/")[1]) == joining[0]]
    assert len(outs) == 2 and all(outs), outs  # both tasks found their matches
    assert any("literal rows" in r for r in ex.plan.rewrites)


def test_workers_on_one_host_are_left_alone(cluster: flight.LocalCluster, catalog: flight.Catalog) -> None:
    """The session's two workers share 127.0.0.1: a shuffle between them is a local copy, not worth the wait."""
    ex = flight.DistributedExec(flight.sql(SQL[18], catalog), cluster.urls, **SPLIT)
    assert max(s.task_count for s in ex.stages) == 2  # split, yet
    assert ex.adaptive is None and "adaptive" not in ex.explain()
