"""A CTE named twice that joins or aggregates is planned once, its uses one subplan (``flight.sql.ctes``).

Which CTEs are cut out is a function of the text (checked on texts written here). The plans: the uses of a
join each read other columns of, which DataFusion pruned apart when inlined, are equal subplans once pruned
(``flight.planner.prune``). Answers: each statement on two real workers against DuckDB over the same files,
with the types the text has inlined."""

from __future__ import annotations

import importlib
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from support import difference, write_halves

import flight
from benchmarks.tpch_queries import duckdb_table
from flight.plan.nodes import OWN_KEY, FeedScanNode
from flight.plan.relnodes import AggregateNode, JoinNode
from flight.planner.optimize import prune_columns, push_filters
from flight.planner.prune import scan_columns
from flight.planner.reuse import repeated_subtrees, subtree_keys
from flight.sql.ctes import shared_ctes

JOINED = ("WITH r AS (SELECT k, region, kind, v, p FROM facts JOIN dim ON k = dk WHERE kind <> 'k3') "
          "SELECT region, kind, avg(v) AS a, sum(p) AS s FROM r GROUP BY region, kind "
          "UNION ALL SELECT region, NULL, avg(v), sum(p) FROM r GROUP BY region "
          "UNION ALL SELECT NULL, NULL, avg(v), sum(p) FROM r")
"""TPC-DS q27's shape: a join read by three aggregates, each needing fewer of its columns."""

STATEMENTS = {
    "a join read by three aggregates": JOINED,
    "an aggregate joined with itself": (
        "WITH t AS (SELECT region, sum(v) AS s, count(*) AS c FROM facts JOIN dim ON k = dk GROUP BY region) "
        "SELECT a.region, a.s, b.c FROM t a JOIN t b ON a.region = b.region WHERE a.s > 0"
    ),
    "a decimal quotient unioned with another": (
        "WITH t AS (SELECT kind, sum(p) * 1.0000 / sum(v) AS m FROM facts JOIN dim ON k = dk GROUP BY kind), "
        "u AS (SELECT m, kind FROM t UNION SELECT sum(p) / 7, NULL FROM facts) "
        "SELECT * FROM u UNION ALL SELECT m, kind FROM t"
    ),
}


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    n = 12_000
    facts = pa.table({
        "k": pa.array([None if i % 97 == 0 else i % 20 for i in range(n)], pa.int64()),
        "v": pa.array([(i * 7) % 1000 + 1 for i in range(n)], pa.int64()),
        "p": pa.array([f"{(i * 13) % 997}.{i % 100:02d}" for i in range(n)], pa.string()).cast(pa.decimal128(7, 2)),
    })
    dim = pa.table({"dk": pa.array(range(20), pa.int64()), "region": [f"r{i % 3}" for i in range(20)], "kind": [f"k{i % 4}" for i in range(20)]})
    return write_halves(tmp_path_factory.mktemp("ctes"), {"facts": facts, "dim": dim})


def names(text: str) -> list[str]:
    split = shared_ctes(text, "duckdb")
    return [c.name for c in split[1]] if split else []


def test_a_cte_named_twice_that_joins_or_aggregates_is_cut_out() -> None:
    main, ctes = shared_ctes(JOINED, "duckdb") or ("", [])
    assert [c.name for c in ctes] == ["r"] and main.startswith("SELECT region, kind") and "AS (" not in main
    assert ctes[0].text.startswith("SELECT k, region") and ctes[0].text.endswith("kind <> 'k3'")
    # The CTEs before it that stay are planned with it.
    text = "WITH a AS (SELECT * FROM dim), b AS (SELECT dk, count(*) AS c FROM a GROUP BY dk) SELECT * FROM b x, b y"
    main, ctes = shared_ctes(text, "duckdb") or ("", [])
    assert [c.name for c in ctes] == ["b"] and ctes[0].text.startswith("WITH a AS (SELECT * FROM dim) SELECT dk")
    assert main == "WITH a AS (SELECT * FROM dim) SELECT * FROM b x, b y"


@pytest.mark.parametrize("text", [
    "WITH r AS (SELECT dk, count(*) AS c FROM dim GROUP BY dk) SELECT * FROM r",  # named once
    "WITH r AS (SELECT dk FROM dim WHERE dk > 3) SELECT * FROM r a, r b",  # no work: a scan, each use filters it
    "WITH r AS (SELECT dk, random() AS x FROM dim GROUP BY dk) SELECT * FROM r a, r b",  # volatile
    "WITH r AS NOT MATERIALIZED (SELECT dk, count(*) AS c FROM dim GROUP BY dk) SELECT * FROM r a, r b",
    "WITH r(x, y) AS (SELECT dk, count(*) FROM dim GROUP BY dk) SELECT * FROM r a, r b",  # a column list
    "WITH RECURSIVE r AS (SELECT 1 AS n UNION ALL SELECT n + 1 FROM r WHERE n < 3) SELECT * FROM r a, r b",
    "WITH r AS (SELECT k, sum(v) AS s FROM facts GROUP BY k UNION ALL SELECT dk, 0 FROM dim) SELECT * FROM r a, r b",
    "WITH r AS (SELECT k FROM facts JOIN dim ON k = dk) SELECT * FROM facts WHERE k IN (SELECT k FROM r) AND v IN (SELECT k FROM r)",
    'WITH "R" AS (SELECT dk, count(*) AS c FROM dim GROUP BY dk) SELECT * FROM "R" a, "R" b',
])
def test_other_ctes_stay_inlined(text: str) -> None:
    assert names(text) == []


def planned(text: str, catalog: flight.Catalog, share: bool) -> flight.Query:
    """``flight.sql(text)``, its CTEs shared or (``share`` false) all inlined."""
    module = importlib.import_module("flight.sql")  # the module: ``flight.sql`` the attribute is the function
    module.shared_ctes = shared_ctes if share else (lambda text, dialect: None)
    try:
        return flight.sql(text, catalog)
    finally:
        module.shared_ctes = shared_ctes


def test_the_uses_of_a_join_are_one_subplan_once_pruned(catalog: flight.Catalog) -> None:
    def joins(share: bool) -> set[bytes]:
        node = prune_columns(push_filters(planned(JOINED, catalog, share).node))
        keys = subtree_keys(node)
        tops = [n for n in node.walk() if isinstance(n, AggregateNode)]
        return {keys[id(next(j for j in a.walk() if isinstance(j, JoinNode)))] for a in tops}

    assert len(joins(False)) == 3  # inlined, DataFusion pruned each copy to its own columns
    assert len(joins(True)) == 1
    assert names(JOINED) == ["r"]


def test_a_plan_is_pruned_and_searched_for_repeats_once_and_each_caller_gets_its_own_set(catalog: flight.Catalog) -> None:
    node = push_filters(planned(JOINED, catalog, True).node)
    pruned = prune_columns(node)
    assert prune_columns(node) is pruned  # kept on the plan: a node never changes once made
    assert prune_columns(node, {"region"}) is not pruned  # pruned for fewer columns: worked out, not kept
    assert prune_columns(node).to_proto() == prune_columns(push_filters(planned(JOINED, catalog, True).node)).to_proto()
    first = repeated_subtrees(pruned)
    assert len(first) == 3  # the join under each of the three aggregates
    first.clear()  # the cutter changes its set as it goes (``_Planner.shared``)
    assert len(repeated_subtrees(pruned)) == 3


@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_kept_operator_keys_are_the_keys_worked_out_afresh(name: str, catalog: flight.Catalog) -> None:
    """The copies rewrites and pruning make keep their operators' keys (``OWN_KEY``); a plan keyed through those
    copies has the keys it gets with nothing kept."""
    node = prune_columns(push_filters(planned(STATEMENTS[name], catalog, False).node))
    kept = subtree_keys(node)
    for n in node.walk():
        n.__dict__.pop(OWN_KEY, None)
        n.__dict__.pop("_subtree_key", None)
    assert subtree_keys(node) == kept


@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_scan_columns_are_the_columns_the_pruned_plan_reads(name: str, catalog: flight.Catalog) -> None:
    for share in (False, True):
        node = push_filters(planned(STATEMENTS[name], catalog, share).node)
        reads = [(n.feed.inner(), n.schema.names) for n in prune_columns(node).walk() if isinstance(n, FeedScanNode)]
        assert [(n.feed.inner(), columns) for n, columns in scan_columns(node)] == reads


def test_an_unplannable_piece_leaves_the_text_its_own_error(catalog: flight.Catalog) -> None:
    text = "WITH r AS (SELECT dk, count(*) AS c FROM dim GROUP BY dk) SELECT nope FROM r a, r b"
    with pytest.raises(flight.PlanError, match="nope"):
        flight.sql(text, catalog)


@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_answers_on_workers_match_duckdb(name: str, catalog: flight.Catalog, con: duckdb.DuckDBPyConnection, cluster: flight.LocalCluster) -> None:
    text = STATEMENTS[name]
    assert names(text), "a statement whose CTE is cut out"
    query = flight.sql(text, catalog)
    assert query.schema == planned(text, catalog, False).schema  # the types it has inlined
    want = duckdb_table(con, text)
    got = flight.DistributedExec(query, cluster.urls).to_table()
    why = difference(got, want, ordered=False)
    assert why is None, f"{text}\n{why}"
