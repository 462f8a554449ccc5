"""A cut file's runs made of the row groups its filter can keep (flight.planner.rowgroups), and the small filtered
sides run first for their keys' range (flight.planner.adaptive.prune_points).

A fact table written in date order and filtered to a few dates keeps a band of consecutive row groups: cut into
even runs, one task's run held the band and the others read nothing. Here the kept row groups are checked against
the files' own footers (pyarrow), the runs against each other, and answers on two real workers on their own
addresses against DuckDB.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support import file_catalog, file_views, sorted_table

import flight
from flight.plan.expr import Expr, col, lit
from flight.plan.nodes import FeedScanNode, FilterNode
from flight.planner import adaptive
from flight.planner.adaptive import prune_points
from flight.planner.cut import plan_query
from flight.planner.optimize import push_filters
from flight.planner.rowgroups import clustered, cut_feeds, kept_row_groups
from flight.planner.semijoin import push_semi_joins
from flight.planner.stages import PlannerOptions
from flight.sources.feed import FeedContext
from flight.sources.providers import FileListProvider, KeptRowGroups, runs

ROWS, GROUP = 40_000, 2_000  # 20 row groups of 2,000 rows; k is a day number: 100 rows a day, 400 days
CUT = {"cut_file_rows": 1, "small_query_bytes": 0, "one_host_query_bytes": 0}
JOIN = ("select d_month, count(*) as n, sum(v) as total from facts join days on k = d_sk "
        "where d_month = {month} group by d_month")


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("rowgroups")
    rng = random.Random(7)
    k = [i // 100 for i in range(ROWS)]
    v = [rng.randrange(1_000) for _ in range(ROWS)]
    shuffled = list(k)
    rng.shuffle(shuffled)
    out = {"facts": base / "facts.parquet", "mixed": base / "mixed.parquet", "days": base / "days.parquet", "long": base / "long.parquet"}
    day = pa.array([dt.date(2000, 1, 1) + dt.timedelta(days=d) for d in k], pa.date32())
    pq.write_table(pa.table({"k": pa.array(k, pa.int64()), "v": pa.array(v, pa.int64()), "day": day}), out["facts"], row_group_size=GROUP)
    pq.write_table(pa.table({"k": pa.array(shuffled, pa.int64()), "v": pa.array(v, pa.int64())}), out["mixed"], row_group_size=GROUP)
    pq.write_table(pa.table({"d_sk": pa.array(range(400), pa.int64()), "d_month": pa.array([d // 30 for d in range(400)], pa.int32())}),
                   out["days"])
    pq.write_table(pa.table({"k": pa.array(range(100_000), pa.int64())}), out["long"], row_group_size=100_000)  # two batches
    return out


@pytest.fixture(scope="module")
def catalog(paths: dict[str, Path]) -> flight.Catalog:
    return file_catalog(paths)


@pytest.fixture(scope="module")
def oracle(paths: dict[str, Path]) -> duckdb.DuckDBPyConnection:
    return file_views(paths)


@pytest.fixture(scope="module", params=["duckdb", "acero"])
def two_hosts(request: pytest.FixtureRequest, data_roots: list[Path]) -> Iterator[flight.LocalCluster]:
    """Two workers on their own loopback addresses (two hosts to the planner), on ``request.param``'s engine."""
    with flight.LocalCluster(2, hosts=["127.0.0.2", "127.0.0.3"], data_roots=data_roots, worker_args=["--engine", request.param]) as c:
        yield c


def footer_groups(path: Path, low: int, high: int) -> list[int]:
    """The row groups whose footer range of ``k`` meets ``[low, high]``: pyarrow's reading, not the planner's."""
    meta = pq.ParquetFile(path).metadata
    out = []
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(0).statistics
        if stats.max >= low and stats.min <= high:
            out.append(g)
    return out


def filtered_scan(catalog: flight.Catalog, text: str) -> tuple[FileListProvider, FeedScanNode, list[Expr]]:
    root = push_filters(flight.sql(text, catalog).node)
    top = next(n for n in root.walk() if isinstance(n, FilterNode))
    predicate, below = top.predicate, top.input
    while isinstance(below, FilterNode):  # conjuncts pushed as filters of their own
        predicate, below = predicate & below.predicate, below.input
    assert isinstance(below, FeedScanNode)
    provider = below.feed.inner()
    assert isinstance(provider, FileListProvider)
    return provider, below, [predicate]


def test_a_range_keeps_the_row_groups_its_footers_allow(catalog: flight.Catalog, paths: dict[str, Path]) -> None:
    provider, scan, filters = filtered_scan(catalog, "select v from facts where k between 95 and 130")
    assert kept_row_groups(provider, scan, filters) == [(str(paths["facts"]), footer_groups(paths["facts"], 95, 130))]
    provider, scan, filters = filtered_scan(catalog, "select v from facts where k > 350 and v < 10")
    assert kept_row_groups(provider, scan, filters) == [(str(paths["facts"]), footer_groups(paths["facts"], 351, 10**9))]


@pytest.mark.parametrize("text", [
    "select v from mixed where k between 95 and 130",  # every row group spans every day
    "select v from facts where v < 10",  # v bounds no row group
    "select v from facts where k between 0 and 10000",  # every row group kept
    "select v from facts where k = 5 or k = 300",  # no conjunct bounds k
])
def test_a_filter_that_drops_no_row_group_keeps_the_plain_runs(catalog: flight.Catalog, text: str) -> None:
    provider, scan, filters = filtered_scan(catalog, text)
    assert kept_row_groups(provider, scan, filters) is None


def test_a_date_is_compared_with_dates_only(catalog: flight.Catalog, paths: dict[str, Path]) -> None:
    """Dates and timestamps are different number lines to the footers' reading (days, seconds): a date column
    bounded by a timestamp literal bounds nothing, where it kept no row group (and the query no row)."""
    query = flight.read_parquet([str(paths["facts"])])
    for literal, kept in ((lit(dt.datetime(2000, 6, 1)), None), (lit(dt.date(2000, 6, 1)), footer_groups(paths["facts"], 152, 10**9))):
        root = push_filters(query.filter(col("day") >= literal).node)
        node = next(n for n in root.walk() if isinstance(n, FilterNode))
        assert isinstance(node.input, FeedScanNode)
        got = kept_row_groups(node.input.feed.inner(), node.input, [node.predicate])
        assert got == (None if kept is None else [(str(paths["facts"]), kept)])


def test_a_filter_that_keeps_no_row_group_keeps_the_plain_runs(catalog: flight.Catalog) -> None:
    """Every task then still reads a run (and skips it): a task with no unit gave a global aggregate no partial row."""
    provider, scan, predicates = filtered_scan(catalog, "select v from facts where k < -5")
    assert kept_row_groups(provider, scan, predicates) is None


def test_a_band_of_kept_row_groups_is_shared_evenly_by_the_partitions(paths: dict[str, Path]) -> None:
    path = str(paths["facts"])
    kept = KeptRowGroups(FileListProvider([path]), [(path, [3, 4, 5, 6, 9, 10])])
    parts = [list(kept.feed(p, FeedContext("q", "f", p, 3))) for p in range(3)]
    groups = [[g for unit in part for g in unit.row_groups] for part in parts]
    assert sorted(g for part in groups for g in part) == [3, 4, 5, 6, 9, 10]  # each kept group once
    assert [len(g) for g in groups] == [2, 2, 2]  # even: every group holds 2,000 rows
    for part in parts:  # a unit is a run of consecutive row groups of one file
        for unit in part:
            assert unit.path == path and list(unit.row_groups) == list(range(unit.row_groups[0], unit.row_groups[-1] + 1))
    assert [list(u.row_groups) for u in parts[2]] == [[9, 10]]
    assert [list(kept.feed(p, FeedContext("q", "f", p, 8))) != [] for p in range(8)].count(True) == 6  # more parts than groups


def test_the_plain_cut_is_unchanged(paths: dict[str, Path]) -> None:
    """``runs`` shares its balancing with the kept groups' cut: 20 groups in 3 runs of 7, 7 and 6 (and whole)."""
    assert [list(u.row_groups) for u in runs(str(paths["facts"]), 3)] == [list(range(7)), list(range(7, 14)), list(range(14, 20))]
    assert [list(u.row_groups) for u in runs(str(paths["facts"]), 1)] == [[]]


def test_a_filtered_cut_scan_reads_only_its_kept_row_groups(catalog: flight.Catalog, paths: dict[str, Path]) -> None:
    query = flight.sql("select v from facts where k between 95 and 130", catalog).node
    plan = plan_query(query, 2, PlannerOptions(cut_file_rows=1, small_query_bytes=0))
    leaf = next(s for s in plan.stages if s.feeds)
    assert isinstance(leaf.feeds[0].feed.inner(), KeptRowGroups)
    assert any("keeps at most 3 of its 20 row groups" in r for r in plan.rewrites), plan.rewrites
    plain = plan_query(query, 2, PlannerOptions(cut_file_rows=0, small_query_bytes=0))  # not cut: nothing to share
    assert all(not isinstance(f.feed.inner(), KeptRowGroups) for s in plain.stages for f in s.feeds)
    unfiltered = plan_query(flight.sql("select v from facts", catalog).node, 2, PlannerOptions(cut_file_rows=1, small_query_bytes=0))
    assert cut_feeds(unfiltered.stages) == {leaf.feeds[0].feed.feed_id} and cut_feeds(plain.stages) == set()


def test_a_file_in_the_keys_order_is_clustered(catalog: flight.Catalog) -> None:
    provider, _, _ = filtered_scan(catalog, "select v from facts where k > 3")
    mixed, _, _ = filtered_scan(catalog, "select v from mixed where k > 3")
    assert clustered(provider, "k") and not clustered(mixed, "k") and not clustered(provider, "v")


@pytest.fixture
def narrow_bands(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tables are small: a band of any rows is worth sharing (by default 2 million)."""
    monkeypatch.setattr(adaptive, "PRUNE_BAND_ROWS", 1)


def test_a_narrow_band_is_left_to_the_plain_runs(catalog: flight.Catalog) -> None:
    """A side whose keys hold ~3,000 of the file's rows: one task reads them faster than a side run first costs."""
    root, _ = push_semi_joins(push_filters(flight.sql(JOIN.format(month=3), catalog).node))
    assert prune_points(root, 1, 2) == []


def test_an_equality_on_a_dimensions_integer_column_keeps_one_value_of_its_range(catalog: flight.Catalog) -> None:
    """The band a side's keys hold is sized from the side's rows: ``d_month = 3`` keeps one of the 14 months of
    400 days (~29), where the textbook tenth of an equality says ~40 (TPC-DS's month of 2001: 730, not 28)."""
    root, _ = push_semi_joins(push_filters(flight.sql("select d_sk from days where d_month = 3", catalog).node))
    assert adaptive._side_rows(root, 1e9) == pytest.approx(400 / 14)
    assert adaptive._side_rows(root, 10.0) == 10.0  # never more than the planner's own estimate


@pytest.mark.usefixtures("narrow_bands")
def test_a_small_filtered_side_joined_to_a_clustered_cut_file_is_run_first(catalog: flight.Catalog) -> None:
    root, _ = push_semi_joins(push_filters(flight.sql(JOIN.format(month=3), catalog).node))
    points = prune_points(root, 1, 2)
    assert len(points) == 1 and points[0].pruned is not None and points[0].pruned[1] == "k"
    assert "range of its keys filters" in points[0].text()
    assert prune_points(root, 0, 2) == []  # files not cut: the tasks' runs do not depend on it
    assert prune_points(root, 1, 1) == []  # one task reads the whole file anyway
    mixed, _ = push_semi_joins(push_filters(flight.sql(JOIN.format(month=3).replace("facts", "mixed"), catalog).node))
    assert prune_points(mixed, 1, 2) == []  # every row group holds every day: a range keeps them all


@pytest.mark.usefixtures("narrow_bands")
@pytest.mark.parametrize("month", [0, 6, 12])
def test_the_join_answers_as_duckdb_and_every_task_reads_part_of_the_band(
    two_hosts: flight.LocalCluster, catalog: flight.Catalog, oracle: duckdb.DuckDBPyConnection, month: int
) -> None:
    text = JOIN.format(month=month)
    ex = flight.DistributedExec(flight.sql(text, catalog), two_hosts.urls, **CUT)
    assert len(ex.prunes) == 1
    got = ex.to_table()
    want = oracle.sql(text).to_arrow_table()
    assert sorted_table(got).equals(sorted_table(want.cast(got.schema)))
    notes = "\n".join(ex.plan.rewrites)
    assert "ran first" in notes and "dynamic filter" in notes and "row groups (footers)" in notes, notes
    leaf = next(s.stage_id for s in ex.stages if any(isinstance(f.feed.inner(), KeptRowGroups) for f in s.feeds))
    assert ex.metrics is not None
    outs = [t.rows_out for t in ex.metrics.tasks if int(t.stage_key.split("/")[1]) == leaf]
    assert len(outs) == 2 and all(outs), outs  # the band is shared: before, one task's run held all of it


@pytest.mark.parametrize("where", ["k < -5", "k between 95 and 130", "k > 398"])
def test_global_aggregates_over_a_cut_filtered_file_answer_as_duckdb(
    two_hosts: flight.LocalCluster, catalog: flight.Catalog, oracle: duckdb.DuckDBPyConnection, where: str
) -> None:
    text = f"select count(*) as n, count(v) as c, sum(v) as s from facts where {where}"
    got = flight.DistributedExec(flight.sql(text, catalog), two_hosts.urls, **CUT).to_table()
    assert got.to_pylist() == oracle.sql(text).to_arrow_table().cast(got.schema).to_pylist()


def test_a_single_stage_filter_whose_batches_keep_no_rows_answers(two_hosts: flight.LocalCluster, catalog: flight.Catalog,
                                                                  oracle: duckdb.DuckDBPyConnection) -> None:
    """A one-stage query tags its rows with their work unit (to replay a lost worker's units); a batch its filter
    empties (here its first 32,768 rows: Acero filters a 65,536-row batch in two) was tagged as a run ending at 0,
    which Arrow refuses (TPC-DS's date_dim filtered to a month of 2001 failed so)."""
    text = "select k from long where k between 40000 and 40010"
    got = flight.DistributedExec(flight.sql(text, catalog), two_hosts.urls).to_table()
    want = oracle.sql(text).to_arrow_table()
    assert got.num_rows == want.num_rows > 0
    assert sorted_table(got).equals(sorted_table(want.cast(got.schema)))
