"""A join of two large tables on a composite key run first (flight.planner.composite): ``(A ⋈ B) ⋈ C`` as
``A ⋈ (B ⋈ C)``, with ``B ⋈ C`` settled as literal rows.

The tables here are TPC-DS q25's three in small: sales written in ticket order, returns of some of their lines
(customer, item, ticket), and catalog sales of which a few share a return's (customer, item). The rule is checked
on the plans, the answers on two real workers on their own addresses against DuckDB, both when the pair's rows fit
``adaptive_bytes`` and when they do not (the query then runs as first planned).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support import file_catalog, file_views, sorted_table

import flight
from flight.plan.relnodes import JoinNode
from flight.planner import adaptive, composite
from flight.planner.composite import composite_point
from flight.planner.optimize import push_filters
from flight.planner.semijoin import push_semi_joins

SPLIT = {"cut_file_rows": 1, "small_query_bytes": 0, "one_host_query_bytes": 0}
Q25 = ("select ss_item, count(*) as n, sum(ss_profit) as s, sum(sr_loss) as r, sum(cs_profit) as c "
       "from sales, returns, catalog "
       "where ss_customer = sr_customer and ss_item = sr_item and ss_ticket = sr_ticket "
       "and sr_customer = cs_customer and sr_item = cs_item group by ss_item")
DATED = Q25.replace("from sales, returns, catalog ", "from sales, returns, catalog, days ").replace(
    " group by", " and sr_day = d_sk and d_month = 1 group by")
"""Returns of one month of days only: a dimension joined above the pair, on the returns' column alone."""
AGAIN = ("select ss_item, count(*) as n, sum(sr_loss) as l from sales, returns r, catalog c, days, dims "
         "where ss_customer = sr_customer and ss_item = sr_item and ss_ticket = sr_ticket "
         "and sr_customer = cs_customer and sr_item = cs_item and r.k = c.k2 "
         "and sr_day = d_sk and days.k = x_sk and x_flag = 1 group by ss_item")
"""The pair's key ``r.k`` is dropped above it, and ``days.k``, under the same name, joins dims later (from a review)."""


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("composite")
    rng = random.Random(25)
    tickets = [t for t in range(10_000) for _ in range(3)]
    sales = {"ss_ticket": tickets, "ss_customer": [t % 500 for t in tickets],
             "ss_item": [(t * 7 + j) % 300 for t in range(10_000) for j in range(3)],
             "ss_profit": [rng.randrange(100) for _ in tickets]}
    kept = list(range(0, len(tickets), 50))
    rng.shuffle(kept)  # returns in no ticket order: sales and returns are not co-located by ticket (sales are cut)
    returns = {"sr_ticket": [sales["ss_ticket"][i] for i in kept], "sr_customer": [sales["ss_customer"][i] for i in kept],
               "sr_item": [sales["ss_item"][i] for i in kept], "sr_loss": [rng.randrange(50) for _ in kept],
               "sr_day": [rng.randrange(30) for _ in kept], "k": [rng.randrange(5) for _ in kept]}
    catalog = {"cs_customer": [rng.randrange(500) for _ in range(20_000)], "cs_item": [rng.randrange(300) for _ in range(20_000)],
               "cs_profit": [rng.randrange(100) for _ in range(20_000)], "k2": [rng.randrange(5) for _ in range(20_000)]}
    days = {"d_sk": list(range(30)), "d_month": [d // 10 for d in range(30)], "k": [d % 5 for d in range(30)]}
    dims = {"x_sk": list(range(10)), "x_flag": [d % 2 for d in range(10)]}
    order = list(range(10_000))
    rng.shuffle(order)  # in no ticket order: not co-located with sales
    tick = {"t_sk": order, "t_flag": [int(t // 100 == 30) for t in order]}  # tickets 3000-3099
    tables = {"sales": sales, "returns": returns, "catalog": catalog, "days": days, "dims": dims, "tick": tick}
    out = {name: base / f"{name}.parquet" for name in tables}
    for name, columns in tables.items():
        pq.write_table(pa.table({k: pa.array(v, pa.int64()) for k, v in columns.items()}), out[name], row_group_size=1_000)
    return out


@pytest.fixture(scope="module")
def catalog(paths: dict[str, Path]) -> flight.Catalog:
    return file_catalog(paths)


@pytest.fixture(scope="module")
def oracle(paths: dict[str, Path]) -> duckdb.DuckDBPyConnection:
    return file_views(paths)


@pytest.fixture
def large(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tables are small: any size counts as two large tables and a side worth sparing."""
    monkeypatch.setattr(composite, "COMPOSITE_SIDE_ROWS", 1)
    monkeypatch.setattr(composite, "PARTNER_BYTES", 1)


@pytest.fixture(scope="module", params=["duckdb", "acero"])
def two_hosts(request: pytest.FixtureRequest, data_roots: list[Path]) -> Iterator[flight.LocalCluster]:
    with flight.LocalCluster(2, hosts=["127.0.0.2", "127.0.0.3"], data_roots=data_roots, worker_args=["--engine", request.param]) as c:
        yield c


def pushed(catalog: flight.Catalog, text: str) -> flight.Query:
    root, _ = push_semi_joins(push_filters(flight.sql(text, catalog).node))
    return root


@pytest.mark.usefixtures("large")
def test_the_returns_and_catalog_pair_becomes_the_side_run_first(catalog: flight.Catalog) -> None:
    found = composite_point(pushed(catalog, Q25))
    assert found is not None
    rotated, point = found
    assert isinstance(point.side, JoinNode) and point.side.left_keys == ["sr_customer", "sr_item"]
    assert {"sr_ticket", "cs_profit"} <= set(point.side.schema.names)
    assert any(n is point.side for n in rotated.walk())  # the side is in the rotated plan, where it is settled
    assert rotated.schema.names == flight.sql(Q25, catalog).node.schema.names
    assert "composite key" in point.text() and "runs first" in point.text()


@pytest.mark.usefixtures("large")
@pytest.mark.parametrize("where", [
    "ss_customer = sr_customer and ss_item = sr_item and ss_ticket = sr_ticket and ss_customer = cs_customer and sr_item = cs_item",
    "ss_customer = sr_customer and ss_item = sr_item and ss_ticket = sr_ticket and sr_item = cs_item",
])
def test_no_pair_when_the_outer_keys_reach_the_first_table_or_are_one(catalog: flight.Catalog, where: str) -> None:
    """A key of the sales side (the pair would not be a join of its own), or one key (its estimate is no guess)."""
    assert composite_point(pushed(catalog, f"select count(*) as n from sales, returns, catalog where {where}")) is None


@pytest.mark.usefixtures("large")
def test_the_pair_keeps_only_the_returns_a_dimension_joined_above_keeps(catalog: flight.Catalog) -> None:
    found = composite_point(pushed(catalog, DATED))
    assert found is not None
    returns = found[1].side.left
    assert isinstance(returns, JoinNode) and returns.join_type == "left semi" and returns.left_keys == ["sr_day"]
    assert any("d_month" in line for line in returns.right.explain_lines())  # the filtered days, nothing else


@pytest.mark.usefixtures("large")
def test_a_name_the_pair_dropped_is_not_its_column_when_another_table_brings_it_back(catalog: flight.Catalog) -> None:
    found = composite_point(pushed(catalog, AGAIN))
    assert found is not None
    semis = [n for n in found[1].side.walk() if isinstance(n, JoinNode) and n.join_type == "left semi"]
    assert [n.left_keys for n in semis] == [["sr_day"]]  # not ["k"]: that k is days', joined with dims


@pytest.mark.usefixtures("large")
def test_a_dimension_joined_above_through_an_outer_join_keeps_every_return(catalog: flight.Catalog) -> None:
    """A left join keeps the rows its dimension does not match: no semi join may drop them before."""
    text = ("select ss_item, sum(sr_loss) as r, max(d_month) as m from sales join returns on ss_customer = sr_customer "
            "and ss_item = sr_item and ss_ticket = sr_ticket join catalog on sr_customer = cs_customer and sr_item = cs_item "
            "left join days on sr_day = d_sk and d_month = 1 group by ss_item")
    found = composite_point(pushed(catalog, text))
    assert found is not None
    assert not any(isinstance(n, JoinNode) and n.join_type == "left semi" for n in found[1].side.walk())


def test_no_pair_below_the_size_of_two_large_tables(catalog: flight.Catalog) -> None:
    assert composite_point(pushed(catalog, Q25)) is None  # 600 and 20,000 rows: under COMPOSITE_SIDE_ROWS


@pytest.mark.usefixtures("large")
@pytest.mark.parametrize("limit", [64 << 20, 1])
@pytest.mark.parametrize("text", [Q25, DATED, AGAIN], ids=["q25", "dated", "again"])
def test_the_query_answers_as_duckdb_whether_the_pair_settles_or_not(
    two_hosts: flight.LocalCluster, catalog: flight.Catalog, oracle: duckdb.DuckDBPyConnection, limit: int, text: str
) -> None:
    ex = flight.DistributedExec(flight.sql(text, catalog), two_hosts.urls, adaptive_bytes=limit, **SPLIT)
    assert ex.adaptive is not None and ex.adaptive.why is not None
    got = ex.to_table()
    want = oracle.sql(text).to_arrow_table()
    assert sorted_table(got).equals(sorted_table(want.cast(got.schema)))
    notes = "\n".join(ex.plan.rewrites)
    if limit > 1:
        assert "actual" in notes and "planned again" in notes and "dynamic filter" in notes, notes
    else:
        assert "passed adaptive_bytes" in notes, notes


@pytest.mark.usefixtures("large")
def test_a_pair_that_does_not_fit_leaves_the_plan_unrotated_for_the_points_after_it(
    two_hosts: flight.LocalCluster, catalog: flight.Catalog, oracle: duckdb.DuckDBPyConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pair's rows pass ``adaptive_bytes``, a small side run first for its keys' range (one hundred tickets,
    ``prune_points``) fits: it settles into the plan as first made, not into the rotated one (from a review: the
    rotated plan ran then, and a wrong rotation would have shown)."""
    monkeypatch.setattr(adaptive, "PRUNE_BAND_ROWS", 1)
    text = AGAIN.replace("days, dims ", "days, dims, tick ").replace(" group by", " and ss_ticket = t_sk and t_flag = 1 group by")
    ex = flight.DistributedExec(flight.sql(text, catalog), two_hosts.urls, adaptive_bytes=1_000, **SPLIT)  # 18 pairs: ~1.4 KB
    assert ex.adaptive is not None and ex.adaptive.why is not None and len(ex.prunes) == 1
    got = ex.to_table()
    want = oracle.sql(text).to_arrow_table()
    assert sorted_table(got).equals(sorted_table(want.cast(got.schema)))
    notes = "\n".join(ex.plan.rewrites)
    assert "passed adaptive_bytes" in notes and "planned again" in notes, notes
    assert not any(isinstance(n, JoinNode) and n.join_type == "left semi" and n.left_keys == ["sr_day"]
                   for s in ex.stages for n in s.root.walk()), "the rotated plan's semi join ran"
