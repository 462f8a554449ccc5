"""Co-located joins (flight/planner/colocate.py): the decisions without sockets, then joins on real
workers compared with DuckDB, on files clustered by key whose ranges straddle each other."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import flight
from flight import agg, col
from flight.planner.colocate import range_files, rows_read, split_points, straddled
from flight.planner.cut import plan_query
from flight.planner.stages import PlannerOptions
from flight.sources.statistics import FileRange

# ------------------------------------------------------------------ decisions


def test_split_points_balance_rows_and_prefer_file_starts() -> None:
    files = [FileRange(f"f{i}", i * 100, i * 100 + 99, 100) for i in range(4)]
    assert split_points(files, 2) == [200]  # a file's first key: no file straddles
    assert split_points(files, 4) == [100, 200, 300]


def test_a_boundary_cuts_the_smaller_side_where_the_sides_disagree() -> None:
    # TPC-H's shape: lineitem (4x the rows) and orders, files starting a few keys apart.
    big = [FileRange(f"l{i}", i * 1000 - (i > 0) * 9, (i + 1) * 1000 - 10, 400) for i in range(4)]
    small = [FileRange(f"o{i}", i * 1000, (i + 1) * 1000 - 1, 100) for i in range(4)]
    (point,) = split_points(big + small, 2)
    assert point == 1991  # l2's start: no lineitem file straddles, one orders file does
    assert straddled(big, [point]) == [False, False] and straddled(small, [point]) == [True, True]


def test_straddled_says_which_ranges_need_a_filter() -> None:
    files = [FileRange("a", 0, 99, 10), FileRange("b", 100, 250, 10), FileRange("empty", 0, 0, 0)]
    assert straddled(files, [100, 200]) == [False, True, True]  # b spans ranges 1 and 2
    assert straddled(files, [100, 300]) == [False, False, False]


def test_split_points_refuse_too_few_keys() -> None:
    assert split_points([FileRange("f", 5, 5, 1000)], 2) is None
    assert split_points([], 2) is None
    assert split_points([FileRange("f", 0, 9, 10)], 1) is None


def test_every_file_goes_to_each_range_it_meets() -> None:
    files = [FileRange("a", 0, 150, 10), FileRange("b", 151, 300, 10), FileRange("empty", 0, 0, 0)]
    assert range_files(files, [100, 200]) == [["a", "empty"], ["a", "b"], ["b"]]


def test_rows_read_count_straddling_row_groups_twice() -> None:
    clustered = [FileRange("a", 0, 99, 100, groups=((0, 49, 50), (50, 99, 50))),
                 FileRange("b", 100, 199, 100, groups=((100, 149, 50), (150, 199, 50)))]
    assert rows_read(clustered, [100]) == 200
    assert rows_read(clustered, [120]) == 250  # b's first row group is read by both tasks
    spread = [FileRange("a", 0, 199, 100), FileRange("b", 0, 199, 100)]
    assert rows_read(spread, [100]) == 400  # keys not clustered: every task reads everything


# ------------------------------------------------------------------ on workers


def _write(root: Path, name: str, table: pa.Table, files: int, group_rows: int) -> list[Path]:
    """``table`` (sorted by its first column) cut into ``files`` files of row groups of ``group_rows``."""
    root.mkdir(parents=True, exist_ok=True)
    step = -(-table.num_rows // files)
    paths = []
    for i in range(files):
        path = root / f"{name}.{i}.parquet"
        pq.write_table(table.slice(i * step, step), path, row_group_size=group_rows)
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    """Orders-like ``o`` (keys 0, 4, 8, ...) and lines-like ``l`` (0–3 lines per order, keys not all
    in ``o``, a few null keys in ``n``), each cut at other keys than the other, so files straddle."""
    root = tmp_path_factory.mktemp("colocate")
    okeys = list(range(0, 40_000, 4))
    o = pa.table({"ok": pa.array(okeys, pa.int64()), "prio": pa.array([k % 5 for k in okeys], pa.int32())})
    lkeys = [k + (k % 3 == 0) for k in okeys for _ in range(k % 4)] + list(range(40_000, 40_400, 2))
    lkeys.sort()
    li = pa.table({"lk": pa.array(lkeys, pa.int64()), "qty": pa.array([i % 50 for i in range(len(lkeys))], pa.int64())})
    nulls = pa.table({"nk": pa.array([None if i % 97 == 0 else k for i, k in enumerate(okeys)], pa.int64()),
                      "v": pa.array(range(len(okeys)), pa.int64())})
    prios = pa.table({"p": pa.array(range(5), pa.int32()), "region": pa.array([p % 2 for p in range(5)], pa.int64())})
    regions = pa.table({"r": pa.array([0, 1], pa.int64()), "rname": ["even", "odd"]})
    return {
        "d": _write(root / "d", "d", prios, 2, 3),
        "r": _write(root / "r", "r", regions, 2, 1),
        "o": _write(root / "o", "o", o, 5, 1000),
        "l": _write(root / "l", "l", li, 7, 1500),
        "n": _write(root / "n", "n", nulls, 5, 1000),
    }


def _duck(tables: dict[str, list[Path]]) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    for name, paths in tables.items():
        listed = ", ".join(f"'{p}'" for p in paths)
        con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet([{listed}])")
    return con


def _rows(table: pa.Table | pa.RecordBatchReader) -> list[tuple]:
    if isinstance(table, pa.RecordBatchReader):
        table = table.read_all()
    return sorted((tuple(r.values()) for r in table.to_pylist()), key=lambda row: [(v is None, v or 0) for v in row])


_SQL = {"inner": "JOIN", "left": "LEFT JOIN", "right": "RIGHT JOIN", "full": "FULL JOIN"}


@pytest.mark.parametrize("how", ["inner", "left", "right", "full", "semi", "anti"])
def test_joins_of_clustered_files_run_in_place_and_match_duckdb(
    cluster: flight.LocalCluster, tables: dict[str, list[Path]], how: str
) -> None:
    o, li = flight.read_parquet(tables["o"]), flight.read_parquet(tables["l"])
    q = o.join(li, left_on="ok", right_on="lk", how=how)
    ex = flight.DistributedExec(q, cluster.urls, small_query_bytes=0)
    if how in ("semi", "anti"):
        sql = f"SELECT * FROM o WHERE {'NOT ' if how == 'anti' else ''}EXISTS (SELECT 1 FROM l WHERE lk = ok)"
    else:
        sql = f"SELECT o.*, l.* FROM o {_SQL[how]} l ON ok = lk"
    assert _rows(ex.to_table()) == _rows(_duck(tables).sql(sql).arrow())
    plan = ex.explain()
    assert "co-located" in plan, plan
    assert "Broadcast" not in plan and "HashRead" not in plan.split("co-located")[1].split("Stage")[0]


def test_an_aggregate_over_a_co_located_join_matches_duckdb(cluster: flight.LocalCluster, tables: dict[str, list[Path]]) -> None:
    q = (
        flight.read_parquet(tables["l"]).filter(col("qty") < 40)
        .join(flight.read_parquet(tables["o"]), left_on="lk", right_on="ok")
        .aggregate(["prio"], n=agg.count_all(), total=agg.sum("qty"))
    )
    ex = flight.DistributedExec(q, cluster.urls, small_query_bytes=0)
    got = ex.to_table()
    want = _duck(tables).sql("SELECT prio, count(*) AS n, sum(qty) AS total FROM l JOIN o ON lk = ok WHERE qty < 40 GROUP BY prio").arrow()
    assert _rows(got) == _rows(want)
    assert any("co-located" in r for r in ex.plan.rewrites)


def test_small_broadcasts_into_a_co_located_stage_are_read_by_each_task(
    cluster: flight.LocalCluster, tables: dict[str, list[Path]]
) -> None:
    """``d ⋈ r`` (two small file lists, a broadcast chain of two stages) joined to a co-located join
    is read whole by each of its tasks instead: no stage waits for another, and the rows are exact."""
    dims = flight.read_parquet(tables["d"]).join(flight.read_parquet(tables["r"]), left_on="region", right_on="r")
    q = (
        flight.read_parquet(tables["l"])
        .join(flight.read_parquet(tables["o"]), left_on="lk", right_on="ok")
        .join(dims, left_on="prio", right_on="p")
        .aggregate(["rname"], n=agg.count_all(), total=agg.sum("qty"))
    )
    ex = flight.DistributedExec(q, cluster.urls, small_query_bytes=0)
    want = _duck(tables).sql(
        "SELECT rname, count(*) AS n, sum(qty) AS total FROM l JOIN o ON lk = ok JOIN d ON prio = p JOIN r ON region = r GROUP BY rname"
    ).arrow()
    assert _rows(ex.to_table()) == _rows(want)
    assert sum("is read by every task of co-located stage" in r for r in ex.plan.rewrites) == 1
    leaf = ex.plan.stages[0]
    assert leaf.task_roots is not None and not leaf.reads  # dims inlined: it reads no other stage
    assert [s.stage_id for s in ex.plan.stages] == list(range(len(ex.plan.stages)))
    assert "replicated" in ex.explain() and "BroadcastRead" not in ex.explain()
    # Above the row limit they stay broadcasts (two stages of their own).
    kept = plan_query(q.node, 2, PlannerOptions(replicate_rows=0))
    assert len(kept.stages) == len(ex.plan.stages) + 2 and not any("is read by every task" in r for r in kept.rewrites)


def test_null_keys_on_a_kept_side_are_not_co_located(cluster: flight.LocalCluster, tables: dict[str, list[Path]]) -> None:
    """A left join keeps the left side's null-keyed rows, which no key range reads: it is shuffled
    or broadcast instead, and still exact."""
    q = flight.read_parquet(tables["n"]).join(flight.read_parquet(tables["l"]), left_on="nk", right_on="lk", how="left")
    ex = flight.DistributedExec(q, cluster.urls, small_query_bytes=0)
    want = _duck(tables).sql("SELECT n.*, l.* FROM n LEFT JOIN l ON nk = lk").arrow()
    assert _rows(ex.to_table()) == _rows(want)
    assert not any("co-located" in r for r in ex.plan.rewrites)
    inner = flight.read_parquet(tables["n"]).join(flight.read_parquet(tables["l"]), left_on="nk", right_on="lk")
    assert any("co-located" in r for r in plan_query(inner.node, 2).rewrites)  # an inner join drops them anyway


def test_unclustered_keys_are_not_co_located(tables: dict[str, list[Path]]) -> None:
    """Joined on a column spread over every file, each task would read everything."""
    other = flight.read_parquet(tables["l"]).select(q2="qty", k2="lk")
    q = flight.read_parquet(tables["l"]).join(other, left_on="qty", right_on="q2")
    assert not any("co-located" in r for r in plan_query(q.node, 2).rewrites)


def test_spark_plan_options_never_co_locate(tables: dict[str, list[Path]]) -> None:
    """A caller running one stage's plan as it is in every task asks for no key ranges."""
    q = flight.read_parquet(tables["o"]).join(flight.read_parquet(tables["l"]), left_on="ok", right_on="lk")
    assert len(plan_query(q.node, 2).stages) == 1
    assert len(plan_query(q.node, 2, colocate=False).stages) > 1


# ------------------------------------------ joins and aggregates joining a co-located stage (place.py)


def _catalog(tables: dict[str, list[Path]]) -> flight.Catalog:
    return flight.Catalog({name: flight.read_parquet(paths) for name, paths in tables.items()})


def _one_co_located_stage(ex: flight.DistributedExec) -> None:
    """Every scan in one co-located leaf stage, which reads no other stage."""
    leaves = [s for s in ex.plan.stages if s.feeds]
    assert len(leaves) == 1 and leaves[0].task_roots is not None and not leaves[0].reads, ex.explain()


def test_semi_and_anti_joins_on_the_key_join_the_co_located_stage(cluster: flight.LocalCluster, tables: dict[str, list[Path]]) -> None:
    """TPC-H Q21's shape: a co-located join, then EXISTS and NOT EXISTS on the same key with a
    condition beside it. Each subquery's scan joins the stage at its boundaries: one stage, exact."""
    sql = """
        SELECT prio, count(*) AS n FROM l l1 JOIN o ON l1.lk = o.ok
        WHERE EXISTS (SELECT 1 FROM l l2 WHERE l2.lk = l1.lk AND l2.qty <> l1.qty)
          AND NOT EXISTS (SELECT 1 FROM l l3 WHERE l3.lk = l1.lk AND l3.qty > l1.qty + 20)
        GROUP BY prio"""
    ex = flight.DistributedExec(flight.sql(sql, _catalog(tables)), cluster.urls, small_query_bytes=0)
    assert _rows(ex.to_table()) == _rows(_duck(tables).sql(sql).arrow())
    assert sum("joins the stage already split by" in r for r in ex.plan.rewrites) == 2, ex.plan.rewrites
    _one_co_located_stage(ex)


def test_an_aggregate_by_the_range_key_runs_in_place(cluster: flight.LocalCluster, tables: dict[str, list[Path]]) -> None:
    """Grouped by the key the tasks split: every group is whole in one task, so no shuffle and no
    final merge; and a second co-located subquery at the same boundaries joins it in the stage."""
    sql = """
        SELECT x.ok, x.lines, y.total FROM
          (SELECT ok, count(*) AS lines FROM o JOIN l ON ok = lk GROUP BY ok) x
          JOIN (SELECT lk, sum(qty) AS total FROM l JOIN o ON lk = ok WHERE qty > 10 GROUP BY lk) y ON x.ok = y.lk"""
    ex = flight.DistributedExec(flight.sql(sql, _catalog(tables)), cluster.urls, small_query_bytes=0)
    assert _rows(ex.to_table()) == _rows(_duck(tables).sql(sql).arrow())
    # The subquery's aggregate runs in place for each side its semi join lands on (planner/semijoin.py), the join too.
    assert sum(": in place, nothing shuffled" in r for r in ex.plan.rewrites) >= 2, ex.plan.rewrites
    assert any("at the same boundaries" in r for r in ex.plan.rewrites), ex.plan.rewrites
    _one_co_located_stage(ex)
    assert "FinalAggregate" not in ex.explain()


def test_an_aggregate_by_a_range_key_with_null_keys_is_merged_across_tasks(
    cluster: flight.LocalCluster, tables: dict[str, list[Path]]
) -> None:
    """``n``'s footers count null keys, which every task whose files hold some would group apart:
    grouped by ``nk`` the aggregate is partial and merged (one null group), and exact."""
    sql = "SELECT nk, count(*) AS c, sum(v) AS s FROM n LEFT JOIN o ON nk = ok GROUP BY nk"
    ex = flight.DistributedExec(flight.sql(sql, _catalog(tables)), cluster.urls, small_query_bytes=0)
    assert _rows(ex.to_table()) == _rows(_duck(tables).sql(sql).arrow())
    assert not any("in place" in r for r in ex.plan.rewrites)
    inner = flight.sql("SELECT nk, count(*) AS c FROM n JOIN o ON nk = ok GROUP BY nk", _catalog(tables))
    assert not any("in place" in r for r in plan_query(inner.node, 2).rewrites)  # footers count nulls: never assumed away


def test_an_aggregate_over_a_lone_scan_by_its_clustered_key_splits_the_scan(
    cluster: flight.LocalCluster, tables: dict[str, list[Path]]
) -> None:
    """TPC-H Q18's shape: lines grouped by order key, kept ``IN`` a join of orders and lines. The
    lines' scan splits into key ranges for the aggregate (here at other boundaries than the join's,
    so the join reads it as a broadcast of its keys; TPC-H's agree, and Q18 is one stage), exact."""
    sql = """
        SELECT ok, prio, sum(qty) AS q FROM o JOIN l ON ok = lk
        WHERE ok IN (SELECT lk FROM l GROUP BY lk HAVING sum(qty) > 60)
        GROUP BY ok, prio ORDER BY q DESC, ok LIMIT 50"""
    ex = flight.DistributedExec(flight.sql(sql, _catalog(tables)), cluster.urls, small_query_bytes=0)
    assert ex.to_table().to_pylist() == _duck(tables).sql(sql).arrow().read_all().to_pylist()
    assert any("is split into key ranges" in r for r in ex.plan.rewrites), ex.plan.rewrites
    # The subquery's aggregate runs in place for each side its semi join lands on (planner/semijoin.py), the join too.
    assert sum(": in place, nothing shuffled" in r for r in ex.plan.rewrites) >= 2, ex.plan.rewrites


def test_a_join_order_that_hides_a_co_located_pair_is_rotated(cluster: flight.LocalCluster, tables: dict[str, list[Path]]) -> None:
    """``(d ⋈ o) ⋈ l`` joined on ``o``'s key last (as SQL front ends order TPC-H Q10's customer,
    orders and lineitem): the planner joins ``o ⋈ l`` first, in place, and ``d`` beside it; the
    columns keep the query's order and the rows match DuckDB's."""
    q = (
        flight.read_parquet(tables["d"])
        .join(flight.read_parquet(tables["o"]), left_on="p", right_on="prio")
        .join(flight.read_parquet(tables["l"]).filter(col("qty") > 5), left_on="ok", right_on="lk")
    )
    ex = flight.DistributedExec(q, cluster.urls, small_query_bytes=0)
    got = ex.to_table()
    assert got.column_names == q.schema.names
    want = _duck(tables).sql("SELECT d.*, o.*, l.* FROM d JOIN o ON p = prio JOIN l ON ok = lk WHERE qty > 5").arrow()
    assert _rows(got) == _rows(want)
    assert any("joins reordered" in r for r in ex.plan.rewrites), ex.plan.rewrites
    assert any("co-located" in r for r in ex.plan.rewrites)
    flat = flight.read_parquet(tables["o"]).join(flight.read_parquet(tables["l"]), left_on="ok", right_on="lk")
    assert not any("joins reordered" in r for r in plan_query(flat.node, 2).rewrites)  # nothing to rotate


def test_a_repeated_subquery_grouped_in_place_is_computed_once_and_broadcast_to_each_use(
    cluster: flight.LocalCluster, tables: dict[str, list[Path]]
) -> None:
    """TPC-H Q18's shape: the IN subquery groups the lines by key, and the semi join lands on both sides of
    the co-located join (flight/planner/semijoin.py). Grouped in each use's tasks, the lines were grouped twice;
    made once, its keys are broadcast to both scans, which are still joined in place."""
    text = ("SELECT ok, prio, sum(qty) AS q FROM o JOIN l ON ok = lk "
            "WHERE ok IN (SELECT lk FROM l GROUP BY lk HAVING sum(qty) > 60) GROUP BY ok, prio")
    ex = flight.DistributedExec(flight.sql(text, _catalog(tables)), cluster.urls, small_query_bytes=0, one_host_query_bytes=0)
    grouped = [n for s in ex.plan.stages for n in s.root.walk() if isinstance(n, flight.plan.relnodes.AggregateNode) and n.keys == ["lk"]]
    assert len(grouped) == 1, ex.explain()
    assert any("computed once and broadcast to each use" in r for r in ex.plan.rewrites), ex.plan.rewrites
    assert any("co-located" in r and "ok" in r and "lk" in r for r in ex.plan.rewrites), ex.plan.rewrites  # the join, in place
    assert _rows(ex.to_table()) == _rows(_duck(tables).sql(text).to_arrow_table())


def test_an_aggregate_over_a_rotated_join_is_pre_aggregated_in_the_co_located_stage(
    cluster: flight.LocalCluster, tables: dict[str, list[Path]]
) -> None:
    """TPC-H Q10's shape in SQL: a lookup ``d`` joined to ``o``, then ``l`` on ``o``'s key, summed by ``d``'s
    columns. The rotation comes before eager aggregation (``place.rotate_joins``), so the sum sinks, through the
    projections the SQL front end puts between joins, onto the co-located ``o ⋈ l``; the rows match DuckDB's."""
    sql = ("SELECT p, region, sum(qty) AS q, count(qty) AS c FROM d JOIN o ON p = prio JOIN l ON ok = lk "
           "WHERE qty > 5 GROUP BY p, region ORDER BY p")
    ex = flight.DistributedExec(flight.sql(sql, _catalog(tables)), cluster.urls, small_query_bytes=0)
    assert ex.to_table().to_pylist() == _duck(tables).sql(sql).arrow().read_all().to_pylist()
    assert any("joins reordered" in r for r in ex.plan.rewrites), ex.plan.rewrites
    assert any("pre-aggregated by ['prio']" in r for r in ex.plan.rewrites), ex.plan.rewrites
