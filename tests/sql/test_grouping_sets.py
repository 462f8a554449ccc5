"""Grouping sets over few key values are aggregated by all the keys first (``flight.sql.grouping``), and the
copies of a grouping set's input stay equal through pruning (``flight.planner.prune``).

Shapes (planned without workers): a rollup of a fact table by a small dimension's columns reads the facts in
one aggregate, which every set aggregates again; a rollup by a key with as many values as the facts have
rows aggregates the facts once per set, over copies of its input pruned alike. Answers: each statement on two
real workers against DuckDB over the same files (sums, counts, means, minima and maxima; null keys; a
filter that keeps no row, whose grand total is still a row)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from support import difference, write_halves

import flight
from benchmarks.tpch_queries import duckdb_table
from flight.plan.relnodes import AggregateNode
from flight.planner.optimize import prune_columns, push_filters
from flight.planner.reuse import subtree_keys


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``facts``: 20,000 rows over 20 dimension keys (some null); ``dim``: 20 rows, two attributes."""
    root = tmp_path_factory.mktemp("grouping")
    n = 20_000
    facts = pa.table({
        "id": pa.array(range(n), pa.int64()),
        "k": pa.array([None if i % 101 == 0 else i % 20 for i in range(n)], pa.int64()),
        "v": pa.array([None if i % 37 == 0 else (i * 7) % 1000 for i in range(n)], pa.int64()),
        "p": pa.array([f"{(i * 13) % 997}.{i % 100:02d}" for i in range(n)], pa.string()).cast(pa.decimal128(7, 2)),
        "f": pa.array([(i % 17) / 4 for i in range(n)], pa.float64()),
    })
    dim = pa.table({
        "dk": pa.array(range(20), pa.int64()),
        "region": pa.array([None if i == 3 else f"r{i % 3}" for i in range(20)]),
        "kind": pa.array([f"k{i % 4}" for i in range(20)]),
    })
    return write_halves(root, {"facts": facts, "dim": dim})


BY_DIM = ("select region, kind, sum(v) as s, count(v) as n, count(*) as c, avg(f) as a, min(p) as lo, max(p) as hi, sum(p) as sp"
          " from facts join dim on k = dk group by rollup(region, kind)")
BY_ID = "select id, kind, sum(v) as s, count(*) as c from facts join dim on k = dk group by rollup(id, kind)"
STATEMENTS = {
    "rollup by a dimension's columns": BY_DIM,
    "cube, a HAVING": "select region, kind, sum(p) as s from facts join dim on k = dk group by cube(region, kind) having count(*) > 10",
    "grouping sets, GROUPING()": (
        "select region, kind, grouping(region) as gr, avg(v) as a from facts join dim on k = dk"
        " group by grouping sets ((region, kind), (kind), ())"
    ),
    "no row passes the filter": (
        "select region, sum(v) as s, count(v) as n, avg(f) as a from facts join dim on k = dk where v < 0 group by rollup(region)"
    ),
    "rollup by a key of many values": BY_ID,
}


def aggregates(text: str, catalog: flight.Catalog) -> list[AggregateNode]:
    node = prune_columns(push_filters(flight.sql(text, catalog).node))
    return [n for n in node.walk() if isinstance(n, AggregateNode)]


def test_a_rollup_by_a_dimensions_columns_reads_the_facts_once(catalog: flight.Catalog) -> None:
    aggs = aggregates(BY_DIM, catalog)
    over_facts = [a for a in aggs if not isinstance(a.input, AggregateNode)]
    assert len(aggs) == 6 and len(over_facts) == 3, aggs  # each of the three sets over a copy of one pre-aggregate
    assert len({subtree_keys(a)[id(a)] for a in over_facts}) == 1  # the same pre-aggregate in every set
    assert all(a.keys == ["region", "kind"] for a in over_facts)


def test_a_rollup_by_a_key_of_many_values_aggregates_equal_copies(catalog: flight.Catalog) -> None:
    aggs = aggregates(BY_ID, catalog)
    assert len(aggs) == 3 and not any(isinstance(a.input, AggregateNode) for a in aggs), aggs
    inputs = {subtree_keys(a.input)[id(a.input)] for a in aggs}
    assert len(inputs) == 1, "each set's copy of the join was pruned to other columns"


@pytest.mark.parametrize("plans", ["default", "staged"])
@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_answers_on_workers_match_duckdb(
    name: str, plans: str, catalog: flight.Catalog, con: duckdb.DuckDBPyConnection, cluster: flight.LocalCluster
) -> None:
    """``staged``: every plan forced into stages (no one-task plan), its aggregates' rows shuffled."""
    text = STATEMENTS[name]
    options = {"small_query_bytes": 0, "one_host_query_bytes": 0, "broadcast_bytes": 0, "rows_per_task": 1} if plans == "staged" else {}
    got = flight.DistributedExec(flight.sql(text, catalog), cluster.urls, **options).to_table()
    why = difference(got, duckdb_table(con, text), ordered=False)
    assert why is None, f"{text}\n{why}"
