"""An aggregate joined on its group keys reads only the keys the join can match (``flight.planner.keysets``).

Shapes (planned without workers): the aggregate's input becomes a semi join with the small
subplan's key column where the join drops unmatched aggregate rows (inner, left outer, semi, anti
joins with the aggregate on the right, beneath projects and a HAVING filter); never where the aggregate's rows are kept unmatched (a right
or full outer join), where the key subplan is not much smaller, unfiltered, or reads as many rows as
the aggregate (another aggregate over the same table: TPC-DS q04's chain), or where the join key is not a
group key. Results: each query on two real workers, every join shuffled or broadcast, against
DuckDB over the same files.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from support import write_halves

import flight
from benchmarks.tpch_queries import duckdb_table
from flight.plan.relnodes import AggregateNode, JoinNode
from flight.planner.cut import plan_query
from flight.planner.keysets import reduce_aggregate_inputs
from flight.planner.optimize import push_filters
from flight.planner.stages import PlannerOptions


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``facts``: 20,000 rows over 2,000 keys (some null); ``dim``: 2,000 keys, 20 tagged 'x'."""
    root = tmp_path_factory.mktemp("keysets")
    n = 20_000
    facts = pa.table({
        "k": pa.array([None if i % 97 == 0 else i % 2000 for i in range(n)], pa.int64()),
        "v": pa.array([(i * 37) % 101 for i in range(n)], pa.int64()),
    })
    dim = pa.table({
        "dk": pa.array(range(2000), pa.int64()),
        "tag": pa.array(["x" if i % 100 == 7 else "y" for i in range(2000)]),
    })
    return write_halves(root, {"facts": facts, "dim": dim})


def reduced(text: str, catalog: flight.Catalog) -> list[str]:
    """The rewrite's notes for ``text``."""
    return reduce_aggregate_inputs(push_filters(flight.sql(text, catalog).node), 32 << 20)[1]


CORRELATED = "select dk, (select avg(v) from facts where k = dk) as a from dim where tag = 'x'"
REDUCED = {
    "scalar subquery": CORRELATED,
    "inner join": "select dk, s from dim join (select k, sum(v) as s from facts group by k) f on f.k = dim.dk where tag = 'x'",
    "aggregate on the left": "select dk, s from (select k, sum(v) as s from facts group by k) f join dim on f.k = dim.dk where tag = 'x'",
    "left outer": "select dk, s from dim left join (select k, sum(v) as s from facts group by k) f on f.k = dim.dk where tag = 'x'",
    "in": "select dk from dim where tag = 'x' and dk in (select k from facts group by k having sum(v) > 400)",
    "not exists": "select dk from dim d where tag = 'x' and not exists (select 1 from facts f where f.k = d.dk group by k having count(*) > 9)",
}
KEPT = {
    "right outer keeps every group": "select dk, s from dim right join (select k, sum(v) as s from facts group by k) f on f.k = dim.dk and tag = 'x'",
    "full outer keeps every group": (
        "select dk, s from (select * from dim where tag = 'x') d full join (select k, sum(v) as s from facts group by k) f on f.k = d.dk"
    ),
    "the other side is as large": "select g.k, s from facts g join (select k, sum(v) as s from facts group by k) f on f.k = g.k where g.v > 3",
    "no aggregate (the cutter reduces a semi join)": "select dk from dim where tag = 'x' and exists (select 1 from facts where k = dk and v > 99)",
    "the join key is not a group key": "select dk, s from dim join (select max(k) as m, sum(v) as s from facts) f on f.m = dim.dk where tag = 'x'",
    "an unfiltered table holds every key": (
        "select dk, s from dim join (select k, sum(v) as s from facts group by k) f on f.k = dim.dk"
    ),
    "the keys cost as much as they save": (
        "select a.k, c from (select k from facts group by k having sum(v) > 700) a"
        " join (select k, count(*) as c from facts group by k) b on a.k = b.k"
    ),
}


@pytest.mark.parametrize("name", sorted(REDUCED))
def test_the_aggregate_reads_only_the_keys_the_join_can_match(name: str, catalog: flight.Catalog) -> None:
    notes = reduced(REDUCED[name], catalog)
    assert len(notes) == 1 and "reads only the 'dk' values" in notes[0], notes


@pytest.mark.parametrize("name", sorted(KEPT))
def test_the_aggregate_is_left_whole(name: str, catalog: flight.Catalog) -> None:
    assert reduced(KEPT[name], catalog) == []


def test_the_plan_semi_joins_the_aggregates_input_and_explain_says_so(catalog: flight.Catalog) -> None:
    node = flight.sql(CORRELATED, catalog).node
    plan = plan_query(node, 2)
    aggs = [n for s in plan.stages for n in s.root.walk() if isinstance(n, AggregateNode) and "k" in n.keys]
    assert any(isinstance(a.input, JoinNode) and a.input.join_type == "left semi" for a in aggs), aggs
    assert any("the keys the join can match" in r for r in plan.rewrites), plan.rewrites


@pytest.mark.parametrize("name", sorted(REDUCED) + sorted(KEPT))
@pytest.mark.parametrize("spread", ["shuffled", "broadcast"])
def test_answers_on_workers_match_duckdb(
    name: str, spread: str, catalog: flight.Catalog, con: duckdb.DuckDBPyConnection, cluster: flight.LocalCluster
) -> None:
    text = {**REDUCED, **KEPT}[name]
    options = {"broadcast_bytes": 0, "rows_per_task": 1} if spread == "shuffled" else {}
    got = flight.DistributedExec(flight.sql(text, catalog), cluster.urls, **options).to_table()
    want = duckdb_table(con, text)
    key = [(c, "ascending") for c in want.schema.names]
    assert got.cast(want.schema).sort_by(key).equals(want.sort_by(key)), f"{text}\n{got}\n{want}"


def test_a_source_that_is_not_repeatable_is_not_read_twice(catalog: flight.Catalog, paths: dict[str, Path]) -> None:
    """The key subplan is read a second time for the rewrite: a feed that may answer differently is left alone."""

    class Once(flight.ListingProvider):
        repeatable = False

    dim = flight.read_parquet(Once(str(paths["dim"]), "*.parquet"), schema=pa.schema([("dk", pa.int64()), ("tag", pa.string())]))
    mixed = flight.Catalog({"facts": catalog["facts"], "dim": dim})
    assert reduced(CORRELATED, mixed) == []
    assert PlannerOptions().broadcast_bytes > 0  # the default lets the small side through
