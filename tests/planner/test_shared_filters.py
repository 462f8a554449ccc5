"""Filters and a subplan its uses share (``flight.planner.optimize.push_filters``): what goes into it is what all
its uses ask, so its copies stay equal and are computed once; each use keeps the rest above it.

Shapes, on plans with a CTE planned once (``flight.sql.ctes``: one node object under each use): the conjuncts
every use asks go in; the OR of the rest goes in when every use asks some; nothing goes in when one use reads it
whole; a scan two uses share still gets each use's own filter; a shared subplan inside another is decided after
it. Results: each shape on two real workers, as one task and forced into stages, against DuckDB over the same
files."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support import table_rows, write_parts

import flight
from flight.plan.nodes import FeedScanNode, FilterNode, Node
from flight.plan.relnodes import AggregateNode
from flight.planner.optimize import conjuncts, disjuncts, push_filters
from flight.planner.reuse import subtree_keys

AGG = "WITH a AS (SELECT k, s, sum(v) AS t FROM facts GROUP BY k, s) "

TEXTS = {
    "or": AGG + "SELECT * FROM a WHERE s = 's1' AND k > 3 UNION ALL SELECT * FROM a WHERE s = 's2' AND k > 3",
    "whole": AGG + "SELECT x.k, x.s, x.t FROM a AS x WHERE x.s = 's1' AND x.t > (SELECT avg(t) FROM a)",
    "same": AGG + "SELECT x.k, x.t, y.t AS u FROM a AS x JOIN a AS y ON x.k = y.k + 1 WHERE x.s = 's3' AND y.s = 's3'",
    "scan": "SELECT x.k FROM facts AS x JOIN facts AS y ON x.k = y.v WHERE x.s = 's1' AND y.s = 's2'",
    "nested": AGG + ", b AS (SELECT a.k, a.t, d.name FROM a JOIN dims AS d ON a.k = d.k) "
    "SELECT * FROM b WHERE name = 'n1' UNION ALL SELECT * FROM b WHERE name = 'n2' UNION ALL SELECT k, t, s FROM a WHERE s = 's4'",
}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    root = tmp_path_factory.mktemp("shared")
    n = 2000
    facts = pa.table({
        "k": pa.array([None if i % 17 == 0 else i % 12 for i in range(n)], pa.int64()),
        "s": pa.array([None if i % 23 == 0 else f"s{i % 5}" for i in range(n)], pa.string()),
        "v": pa.array([(i * 7) % 13 for i in range(n)], pa.int64()),
    })
    dims = pa.table({"k": pa.array(range(12), pa.int64()), "name": [f"n{i % 3}" for i in range(12)]})
    return {"facts": write_parts(facts, root, "facts", 3), "dims": write_parts(dims, root, "dims", 1)}


@pytest.fixture(scope="module")
def catalog(files: dict[str, list[Path]]) -> flight.Catalog:
    return flight.Catalog({name: flight.read_parquet(paths) for name, paths in files.items()})


@pytest.fixture(scope="module")
def cluster(files: dict[str, list[Path]]) -> Iterator[flight.LocalCluster]:
    with flight.LocalCluster(2, data_roots=[files["facts"][0].parent]) as c:
        yield c


def aggregates(root: Node) -> list[AggregateNode]:
    """The grouped aggregates of ``root``: the CTE's, once per use."""
    return [n for n in root.walk() if isinstance(n, AggregateNode) and n.keys]


def scan_filters(root: Node) -> list[FilterNode]:
    return [n for n in root.walk() if isinstance(n, FilterNode) and isinstance(n.input, FeedScanNode)]


def above(root: Node, agg: AggregateNode) -> list[FilterNode]:
    """The filters above ``agg`` (on the path from the root down to it)."""
    path: list[Node] = []

    def find(node: Node) -> bool:
        path.append(node)
        if node is agg or any(find(c) for c in node.children()):
            return True
        path.pop()
        return False

    find(root)
    return [n for n in path if isinstance(n, FilterNode)]


def test_the_or_of_what_each_use_asks_goes_in_and_the_copies_stay_equal(catalog: flight.Catalog) -> None:
    root = push_filters(flight.sql(TEXTS["or"], catalog).node)
    first, second = aggregates(root)
    keys = subtree_keys(root)
    assert keys[id(first)] == keys[id(second)], "the two uses' copies differ: each would be computed"
    for agg in (first, second):
        (below,) = [f for f in scan_filters(agg) if "s" in f.predicate.referenced_fields()]
        terms = conjuncts(below.predicate)
        assert any(t.referenced_fields() == {"k"} for t in terms), below  # asked by both: in, as it is
        (either,) = [t for t in terms if len(disjuncts(t)) == 2]  # s = 's1' OR s = 's2'
        assert "the OR of its 2 uses' filters" in " ".join(below.origins)
        kept = [t for f in above(root, agg) for t in conjuncts(f.predicate)]
        assert [t.referenced_fields() for t in kept] == [{"s"}], kept  # each use's own colour, and not k > 3 again
    assert either is not None


def test_a_use_that_reads_it_whole_keeps_the_others_filters_above(catalog: flight.Catalog) -> None:
    root = push_filters(flight.sql(TEXTS["whole"], catalog).node)
    first, second = aggregates(root)
    assert subtree_keys(root)[id(first)] == subtree_keys(root)[id(second)]
    assert not [f for a in (first, second) for f in scan_filters(a)], "nothing goes in: one use reads every group"
    assert any("s" in f.predicate.referenced_fields() for a in (first, second) for f in above(root, a))


def test_what_every_use_asks_goes_in_whole(catalog: flight.Catalog) -> None:
    root = push_filters(flight.sql(TEXTS["same"], catalog).node)
    for agg in aggregates(root):
        assert [f.predicate.referenced_fields() for f in scan_filters(agg)] == [{"s"}]
        assert not [f for f in above(root, agg) if "s" in f.predicate.referenced_fields()], "pushed in: not asked again"


def test_a_scan_two_uses_share_gets_each_uses_own_filter(catalog: flight.Catalog) -> None:
    root = push_filters(flight.sql(TEXTS["scan"], catalog).node)
    asked = sorted(repr(f.predicate) for f in scan_filters(root) if "s" in f.predicate.referenced_fields())
    assert len(asked) == 2 and "s1" in asked[0] and "s2" in asked[1], asked


@pytest.mark.parametrize("staged", [False, True], ids=["default", "staged"])
@pytest.mark.parametrize("name", list(TEXTS))
def test_answers_match_duckdb(cluster: flight.LocalCluster, files: dict[str, list[Path]], catalog: flight.Catalog,
                              name: str, staged: bool) -> None:
    con = duckdb.connect()
    for table, paths in files.items():
        con.register(table, pa.concat_tables(pq.read_table(p) for p in paths))
    want = sorted(con.sql(TEXTS[name]).fetchall(), key=repr)
    options = {"one_host_query_bytes": 0, "small_query_bytes": 0} if staged else {}
    got = flight.DistributedExec(flight.sql(TEXTS[name], catalog), cluster.urls, **options).to_table()
    assert sorted(table_rows(got), key=repr) == want and want
