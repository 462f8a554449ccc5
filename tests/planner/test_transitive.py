"""A scan joined on a key that a filtered table elsewhere in the join bounds reads only that table's keys
(``flight.planner.transitive``).

Shapes (planned without workers), on TPC-H Q9's pattern (``items ⋈ parts ⋈ stock`` with
``s_part = i_part = p_part`` and parts filtered by name): the stock scan is semi-joined with the filtered
parts' key, the note says so, and TPC-H Q9 itself gets it on partsupp; nothing is added where the parts
are not filtered, where the filtered table is the join's own side (the join filters already), or for one
task. TPC-H Q5's chain (region -> nation -> supplier -> customer): customer, below other joins, reads only the
nations of the region, and the small tables reduced on the way are left as they were. Results: each query on
the session's two real workers, against DuckDB over the same files.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from support import sorted_table, tpch_test_files, write_halves

import flight
from benchmarks.tpch_queries import ORDERED, TABLES, compare, decimals_as_numbers, duckdb_answer
from benchmarks.tpch_sql import SQL
from flight.plan.nodes import FeedScanNode, FilterNode, Node, ProjectNode
from flight.plan.relnodes import JoinNode
from flight.planner import transitive
from flight.planner.cut import plan_query
from flight.planner.optimize import push_filters
from flight.planner.stages import PlannerOptions
from flight.planner.transitive import reduce_join_inputs

SPLIT = {"small_query_bytes": 0, "one_host_query_bytes": 0}
Q9ISH = """select p_name, sum(i_qty * s_cost) as total from items, parts, stock
           where p_part = i_part and s_part = i_part and p_name like '%green%' group by p_name"""
UNFILTERED = "select sum(i_qty * s_cost) as total from items, parts, stock where p_part = i_part and s_part = i_part"
DIRECT = "select sum(s_cost) as total from stock, parts where s_part = p_part and p_name like '%green%'"


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``items`` 200,000 rows and ``stock`` 40,000 over 10,000 parts, 1 in 50 named green; two files each."""
    root = tmp_path_factory.mktemp("transitive")
    tables = {
        "items": pa.table({"i_part": pa.array([(i * 7) % 10_000 for i in range(200_000)], pa.int64()),
                           "i_qty": pa.array([i % 50 for i in range(200_000)], pa.int64())}),
        "stock": pa.table({"s_part": pa.array([i % 10_000 for i in range(40_000)], pa.int64()),
                           "s_cost": pa.array([float(i % 13) for i in range(40_000)])}),
        "parts": pa.table({"p_part": pa.array(range(10_000), pa.int64()),
                           "p_name": [f"{'green' if i % 50 == 3 else 'red'} part {i % 7}" for i in range(10_000)]}),
    }
    return write_halves(root, tables, row_group_size=None)


def _is_reduction(n: Node) -> bool:
    """A semi join whose left side is a scan (under filters and projects) and right side a key projection."""
    if not (isinstance(n, JoinNode) and n.join_type == "left semi" and isinstance(n.right, ProjectNode)):
        return False
    left = n.left
    while isinstance(left, (ProjectNode, FilterNode)):
        left = left.input
    return isinstance(left, FeedScanNode)


def reductions(root: Node) -> list[JoinNode]:
    return [n for n in root.walk() if _is_reduction(n)]  # type: ignore[misc]


def test_the_stock_scan_reads_only_green_parts(catalog: flight.Catalog) -> None:
    root, notes = reduce_join_inputs(push_filters(flight.sql(Q9ISH, catalog).node), 32 << 20)
    found = reductions(root)
    assert [(n.left_keys, n.right_keys) for n in found] == [(["s_part"], ["p_part"])]
    assert any(isinstance(x, FilterNode) for x in found[0].right.walk())  # the parts as filtered
    assert len(notes) == 1 and "reads only the 'p_part' values of a filtered" in notes[0] and "'s_part' equals" in notes[0]
    plan = plan_query(flight.sql(Q9ISH, catalog).node, 2)
    assert any("reads only the 'p_part' values" in r for r in plan.rewrites)


def test_tpch_q9s_partsupp_reads_only_green_parts() -> None:
    files = tpch_test_files(0.05)
    catalog = flight.Catalog({t: flight.read_parquet([str(p) for p in files[t]]) for t in TABLES})
    root, notes = reduce_join_inputs(push_filters(flight.sql(SQL[9], catalog).node), 32 << 20)
    assert [(n.left_keys, n.right_keys) for n in reductions(root)] == [(["ps_partkey"], ["p_partkey"])], notes


def _main_reductions(root: Node) -> list[JoinNode]:
    """``reductions`` of the plan itself, not inside the copies a reduction reads its keys from."""
    out: list[JoinNode] = []
    stack = [root]
    while stack:
        node = stack.pop()
        if _is_reduction(node):
            out.append(node)  # type: ignore[arg-type]
            stack.append(node.left)  # type: ignore[attr-defined]
        else:
            stack.extend(node.children())
    return out


def test_tpch_q5s_customer_reads_only_the_regions_nations_through_the_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transitive, "LARGE_ROWS", 5_000)  # SF 0.05's 7,500 customers count as large, nation and supplier not
    files = tpch_test_files(0.05)
    catalog = flight.Catalog({t: flight.read_parquet([str(p) for p in files[t]]) for t in TABLES})
    root, notes = reduce_join_inputs(push_filters(flight.sql(SQL[5], catalog).node), 32 << 20)
    kept = _main_reductions(root)
    assert [(n.left_keys, n.right_keys) for n in kept] == [(["c_nationkey"], ["n_nationkey"])], notes
    bound = kept[0].right
    assert any(isinstance(x, JoinNode) for x in bound.walk()), "the nations of the region: nation semi-joined with it"
    assert any(isinstance(x, FilterNode) for x in bound.walk()), "the region, filtered"
    assert len(notes) == 1 and "(below a join of its side)" in notes[0] and "'c_nationkey' equals" in notes[0]


@pytest.mark.parametrize("q", [5, 7, 8, 9])
def test_tpch_answers_with_the_reductions_match_duckdb(cluster: flight.LocalCluster, q: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transitive, "LARGE_ROWS", 5_000)
    files = tpch_test_files(0.05)
    catalog = flight.Catalog({t: flight.read_parquet([str(p) for p in files[t]]) for t in TABLES})
    ex = flight.DistributedExec(flight.sql(SQL[q], catalog), cluster.urls, **SPLIT)
    got = ex.to_table()
    assert compare(got, decimals_as_numbers(duckdb_answer(q, files)), ORDERED.get(q)) is None
    if q in (5, 7):  # Q7's join with the customers' nation has a condition beside its keys: the keys still bound
        assert any("reads only the 'n_nationkey' values" in r for r in ex.plan.rewrites), ex.plan.rewrites


@pytest.mark.parametrize("text", [UNFILTERED, DIRECT])
def test_nothing_is_added_without_a_filtered_table_beyond_the_join(catalog: flight.Catalog, text: str) -> None:
    root, notes = reduce_join_inputs(push_filters(flight.sql(text, catalog).node), 32 << 20)
    assert notes == [] and reductions(root) == []


def test_one_task_plans_are_left_alone(catalog: flight.Catalog) -> None:
    plan = plan_query(flight.sql(Q9ISH, catalog).node, 1)
    assert not any("reads only the 'p_part' values" in r for r in plan.rewrites)


@pytest.mark.parametrize("text", [Q9ISH, UNFILTERED, DIRECT])
def test_results_match_duckdb(cluster: flight.LocalCluster, catalog: flight.Catalog, con: duckdb.DuckDBPyConnection, text: str) -> None:
    got = flight.DistributedExec(flight.sql(text, catalog), cluster.urls, **SPLIT).to_table()
    want = con.sql(text).to_arrow_table()
    assert sorted_table(got).to_pylist() == sorted_table(want.cast(got.schema)).to_pylist()


def _star(monkeypatch: pytest.MonkeyPatch) -> tuple[flight.Catalog, str, dict[str, Path]]:
    """TPC-DS q17 at the TPC-DS tests' scale, with its fact tables counting as large and any ratio enough."""
    from tpcds_support import tables as tpcds_tables
    from tpcds_support import texts as tpcds_texts

    monkeypatch.setattr(transitive, "LARGE_ROWS", 1_000)
    monkeypatch.setattr(transitive, "DEEP_RATIO", 1.0)
    paths = tpcds_tables()
    return flight.Catalog({t: flight.read_parquet([str(p)]) for t, p in paths.items()}), tpcds_texts()[17], paths


def test_a_star_schemas_facts_read_only_their_dates_before_a_shuffled_join(monkeypatch: pytest.MonkeyPatch) -> None:
    # store_sales meets store_returns, then catalog_sales, by keys too many to broadcast; each fact's date is bounded
    # by a filtered date_dim only after those joins. Where they shuffle, each fact reads only its dates first.
    catalog, text, _ = _star(monkeypatch)
    root, notes = reduce_join_inputs(push_filters(flight.sql(text, catalog).node), 100 << 10)  # a date_dim key column, not a fact
    assert [n.left_keys[0] for n in _main_reductions(root)] == ["ss_sold_date_sk"], notes  # the others' dates: too many here
    assert len(notes) == 1 and "reads only the 'd_date_sk' values" in notes[0] and "(below a join of its side)" in notes[0]
    # Where the fact beside could be broadcast, the larger fact stays as read: its join meets the dates in one query.
    root, notes = reduce_join_inputs(push_filters(flight.sql(text, catalog).node), 1 << 40)
    assert "ss_sold_date_sk" not in [n.left_keys[0] for n in _main_reductions(root)], notes


def test_the_star_schemas_answer_with_the_reductions_matches_duckdb(monkeypatch: pytest.MonkeyPatch) -> None:
    catalog, text, paths = _star(monkeypatch)
    with flight.LocalCluster(2, data_roots=[next(iter(paths.values())).parent]) as cluster:
        ex = flight.DistributedExec(flight.sql(text, catalog), cluster.urls, broadcast_bytes=100 << 10, **SPLIT)
        got = ex.to_table()
    assert any("reads only the 'd_date_sk' values" in r for r in ex.plan.rewrites), ex.plan.rewrites
    con = duckdb.connect()
    for t, p in paths.items():
        con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet('{p}')")
    want = con.sql(text).to_arrow_table()
    assert sorted(map(str, got.to_pylist())) == sorted(map(str, want.cast(got.schema).to_pylist()))


def _sales(root: Path, returns_sorted: bool) -> flight.Catalog:
    """``sales`` 40,000 rows and ``returns`` 20,000, sorted by ticket (``returns`` shuffled unless ``returns_sorted``),
    1,000 dates and 50 stores; two files each: sales meets returns by ticket, and its dates (and stores) are filtered
    above that join."""
    n = 40_000
    tickets = [i // 2 for i in range(n)]
    sales = pa.table({"s_ticket": pa.array(tickets, pa.int64()), "s_date": pa.array([i % 1000 for i in range(n)], pa.int64()),
                      "s_amount": pa.array([float(i % 97) for i in range(n)]), "s_store": pa.array([i % 50 for i in range(n)], pa.int64())})
    returned = list(range(0, n // 2)) if returns_sorted else [(i * 7919) % (n // 2) for i in range(n // 2)]
    returns = pa.table({"r_ticket": pa.array(returned, pa.int64()), "r_qty": pa.array([i % 5 for i in range(n // 2)], pa.int64())})
    dates = pa.table({"d": pa.array(range(1000), pa.int64()), "year": pa.array([2000 + d // 200 for d in range(1000)], pa.int64())})
    stores = pa.table({"st": pa.array(range(50), pa.int64()), "region": pa.array(["east" if i % 5 == 0 else "west" for i in range(50)])})
    paths = write_halves(root, {"sales": sales, "returns": returns, "dates": dates, "stores": stores}, row_group_size=2_000)
    return flight.Catalog({t: flight.read_parquet(sorted(str(p) for p in d.iterdir())) for t, d in paths.items()})


SALES = """select year, sum(s_amount * r_qty) as total from sales, returns, dates
           where s_ticket = r_ticket and s_date = d and year = 2001 group by year"""


@pytest.mark.parametrize("returns_sorted", [False, True], ids=["shuffled", "co-located"])
def test_a_fact_reads_only_its_dates_before_a_shuffle_not_before_a_co_located_join(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cluster: flight.LocalCluster, returns_sorted: bool
) -> None:
    monkeypatch.setattr(transitive, "LARGE_ROWS", 1_000)
    monkeypatch.setattr(transitive, "DEEP_RATIO", 1.0)
    catalog = _sales(tmp_path, returns_sorted)
    options = {"broadcast_bytes": 64 << 10}  # returns (~320 KB) is shuffled or co-located, never broadcast
    plan = plan_query(flight.sql(SALES, catalog).node, 2, PlannerOptions(**options))
    reduced = [r for r in plan.rewrites if "reads only the 'd' values" in r]
    co_located = any("co-located" in n for s in plan.stages for n in s.notes)
    assert co_located == returns_sorted, plan.rewrites
    assert bool(reduced) != returns_sorted, plan.rewrites  # sales moves to meet returns: it reads its year's dates first
    got = flight.DistributedExec(flight.sql(SALES, catalog), cluster.urls, **options, **SPLIT).to_table()
    con = duckdb.connect()
    for t in ("sales", "returns", "dates"):
        con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet('{tmp_path / t}/*.parquet')")
    assert got.to_pylist() == [dict(zip(("year", "total"), row)) for row in con.sql(SALES).fetchall()]


STARS = """select year, sum(s_amount * r_qty) as total from sales, returns, dates, stores
           where s_ticket = r_ticket and s_date = d and s_store = st and year = 2001 and region = 'east' group by year"""


def test_a_fact_reads_only_the_keys_of_each_filtered_dimension_before_a_shuffle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cluster: flight.LocalCluster
) -> None:
    # TPC-DS q72: catalog_sales meets inventory by item (too large to broadcast), then its household profiles and its
    # dates of one year; reduced by the profiles alone it still carried four years (34.7 s at SF 10 on two hosts), by
    # both 1.9 s. Each filtered dimension bounds its own key: the semi joins stack on the one scan.
    monkeypatch.setattr(transitive, "LARGE_ROWS", 1_000)
    monkeypatch.setattr(transitive, "DEEP_RATIO", 1.0)
    catalog = _sales(tmp_path, returns_sorted=False)
    options = {"broadcast_bytes": 64 << 10}
    plan = plan_query(flight.sql(STARS, catalog).node, 2, PlannerOptions(**options))
    assert any("reads only the 'd' values" in r for r in plan.rewrites), plan.rewrites
    assert any("reads only the 'st' values" in r for r in plan.rewrites), plan.rewrites
    semis = [n for s in plan.stages for n in s.root.walk() if isinstance(n, JoinNode) and n.join_type == "left semi"]
    assert sorted(k for n in semis for k in n.left_keys if k in ("s_date", "s_store")) == ["s_date", "s_store"]
    got = flight.DistributedExec(flight.sql(STARS, catalog), cluster.urls, **options, **SPLIT).to_table()
    con = duckdb.connect()
    for t in ("sales", "returns", "dates", "stores"):
        con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet('{tmp_path / t}/*.parquet')")
    assert got.to_pylist() == [dict(zip(("year", "total"), row)) for row in con.sql(STARS).fetchall()]


OUTER = """select year, sum(s_amount) as sales, count(r_qty) as returned from sales left join returns on s_ticket = r_ticket
           join dates on s_date = d where year = 2001 group by year"""
OUTER_TWICE = """with s as (select year, s_amount, r_qty from sales left join returns on s_ticket = r_ticket
                                join dates on s_date = d where year = 2001)
                 select 'sales' as what, sum(s_amount) as total from s union all select 'returned', sum(r_qty) from s"""


@pytest.mark.parametrize("text", [OUTER, OUTER_TWICE], ids=["once", "in a subplan used twice"])
@pytest.mark.parametrize("budget", [64 << 10, 128 << 10], ids=["returns shuffled", "returns broadcast"])
def test_a_left_outer_joins_kept_side_reads_only_its_dates_when_the_join_is_shuffled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cluster: flight.LocalCluster, text: str, budget: int
) -> None:
    # TPC-DS q80: store_sales left-joined with store_returns (too large to broadcast), then with 30 days' dates,
    # inside the ROLLUP's repeated input: all of store_sales was shuffled to meet its returns (3.7 GB at SF 10 on two
    # hosts, 13.2 s); read for those days first, 525 MB and 3.5 s. Where the returns would be broadcast (up to
    # LARGE_BROADCAST times broadcast_bytes), the sales stay as read: a reduction there only adds a stage (q40).
    monkeypatch.setattr(transitive, "LARGE_ROWS", 1_000)
    monkeypatch.setattr(transitive, "DEEP_RATIO", 1.0)
    catalog = _sales(tmp_path, returns_sorted=False)  # returns: ~320 KB estimated, over 4 x 64 KB, under 4 x 128 KB
    plan = plan_query(flight.sql(text, catalog).node, 2, PlannerOptions(broadcast_bytes=budget))
    reduced = [r for r in plan.rewrites if "reads only the 'd' values" in r]
    assert bool(reduced) == (budget == 64 << 10), plan.rewrites
    got = flight.DistributedExec(flight.sql(text, catalog), cluster.urls, broadcast_bytes=budget, **SPLIT).to_table()
    con = duckdb.connect()
    for t in ("sales", "returns", "dates"):
        con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet('{tmp_path / t}/*.parquet')")
    want = con.sql(text).to_arrow_table()
    assert sorted(map(str, got.to_pylist())) == sorted(map(str, want.cast(got.schema).to_pylist()))
