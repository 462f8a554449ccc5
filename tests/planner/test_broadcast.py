"""Broadcast or shuffle, by the bytes each moves at the fleet's size (flight/planner/cost.py), and how
many rows a co-located join may read twice (flight/planner/colocate.py): decisions without sockets.

A broadcast copies its side into each of the other side's tasks, so the bytes it moves grow with
the task count where a shuffle's do not: the same join is broadcast between two workers and
shuffled between four once the copies outweigh the other side."""

from __future__ import annotations

import random
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import flight
from flight.plan.relnodes import AggregateNode, JoinNode
from flight.planner.colocate import rereads_pay
from flight.planner.cost import BROADCAST_ALWAYS_BYTES, broadcast_pays
from flight.planner.cut import plan_query
from flight.planner.stages import PlannerOptions
from flight.sources.statistics import FileRange


def test_a_broadcast_pays_while_its_copies_move_no_more_than_the_other_side() -> None:
    mb = 1 << 20
    assert broadcast_pays(10 * mb, 2, 10 * mb)  # one copy against a shuffle of the same bytes
    assert not broadcast_pays(10 * mb, 4, 20 * mb)  # three copies, 30 MB, against 20
    assert broadcast_pays(10 * mb, 4, 30 * mb)
    assert broadcast_pays(1 * mb, 4, 0.5 * mb)  # 3 MB of copies in all: below BROADCAST_ALWAYS_BYTES
    assert not broadcast_pays(BROADCAST_ALWAYS_BYTES, 8, BROADCAST_ALWAYS_BYTES)


def _files(root: Path, name: str, rows: int, files: int) -> list[Path]:
    """``rows`` rows of two int64 columns, keys shuffled (no file bounds a key range: nothing co-locates)."""
    keys = list(range(rows))
    random.Random(rows).shuffle(keys)
    table = pa.table({f"{name}_key": pa.array(keys, pa.int64()), f"{name}_value": pa.array(range(rows), pa.int64())})
    root.mkdir(parents=True, exist_ok=True)
    step = rows // files
    paths = [root / f"{name}.{i}.parquet" for i in range(files)]
    for i, path in enumerate(paths):
        pq.write_table(table.slice(i * step, step), path)
    return paths


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], list[Path]]:
    root = tmp_path_factory.mktemp("broadcast")
    # ~6.4 MB estimated against ~3.2 MB: one copy of the small side is less, three are more.
    return _files(root, "big", 400_000, 8), _files(root, "small", 200_000, 8)


@pytest.fixture(scope="module")
def sides(files: tuple[list[Path], list[Path]]) -> tuple[flight.Query, flight.Query]:
    return flight.read_parquet(files[0]), flight.read_parquet(files[1])


def _strategies(q: flight.Query, workers: int) -> list[str]:
    """The joins' strategies, no broadcast read as files instead (``replicate_rows=0``: what crosses the network)."""
    plan = plan_query(q.node, workers, PlannerOptions(replicate_rows=0))
    return [n.strategy for s in plan.stages for n in s.root.walk() if isinstance(n, JoinNode)]


def test_a_join_is_broadcast_between_two_workers_and_shuffled_between_four(sides: tuple[flight.Query, flight.Query]) -> None:
    big, small = sides
    q = big.join(small, left_on="big_key", right_on="small_key")
    assert _strategies(q, 2) == ["broadcast"]
    assert _strategies(q, 4) == ["shuffle"]


def test_a_tiny_side_is_broadcast_whatever_the_task_count(sides: tuple[flight.Query, flight.Query]) -> None:
    big, small = sides
    q = big.join(small.filter(flight.col("small_value") < 1000), left_on="big_key", right_on="small_key")
    assert _strategies(q, 8) == ["broadcast"]


def test_a_side_each_task_reads_as_files_is_replicated_however_many_tasks(sides: tuple[flight.Query, flight.Query]) -> None:
    """200,000 rows of files (below ``replicate_rows``): every task reads them, so no copy crosses the network."""
    big, small = sides
    plan = plan_query(big.join(small, left_on="big_key", right_on="small_key").node, 4)
    assert [n.strategy for s in plan.stages for n in s.root.walk() if isinstance(n, JoinNode)] == ["replicated"]


def _orders_like(files: int, rows: int) -> list[FileRange]:
    """Clustered files of one row group each (TPC-H SF 1's orders)."""
    return [FileRange(f"o{i}", i * 1000, i * 1000 + 999, rows) for i in range(files)]


def _lineitem_like(files: int, rows: int, groups: int) -> list[FileRange]:
    """Clustered files, starting a few keys before the orders-like ones, of many row groups."""
    out = []
    for i in range(files):
        low, high = max(i * 1000 - 7, 0), i * 1000 + 992
        step = (high - low + 1) / groups
        parts = tuple((low + g * step, low + (g + 1) * step - 1, rows / groups) for g in range(groups))
        out.append(FileRange(f"l{i}", low, high, rows, groups=parts))
    return out


def test_a_join_may_read_a_few_straddled_files_twice_rather_than_move_a_side() -> None:
    orders, lineitem = _orders_like(4, 375), _lineitem_like(4, 1500, 12)
    points = [993, 1993, 2993]  # lineitem's file starts: three orders files straddle, each read twice
    assert not rereads_pay([orders], points)  # 1.75 times its rows: alone, not clustered enough
    assert rereads_pay([orders, lineitem], points)  # 1,125 rows again, where a broadcast of orders moves 4,500


def test_keys_spread_over_every_file_are_never_worth_reading_twice() -> None:
    spread = [FileRange(f"s{i}", 0, 3999, 1000) for i in range(4)]
    assert not rereads_pay([spread, _lineitem_like(4, 1500, 12)], [993, 1993, 2993])


def test_an_aggregate_by_the_shuffle_key_stays_in_place_after_a_broadcast_join(
    sides: tuple[flight.Query, flight.Query], files: tuple[list[Path], list[Path]], cluster: flight.LocalCluster
) -> None:
    """A broadcast join leaves its probe side's rows where they are, so they stay hash-partitioned on the keys
    of the shuffle before it: an aggregate by those keys needs no second shuffle (TPC-H Q10's customers, after
    nation is broadcast: 204 MB moved at SF 10 on two hosts, now 166)."""
    big, small = sides
    tiny = small.filter(flight.col("small_value") < 1000).select(tk="small_key", tv="small_value")
    q = (big.join(small, left_on="big_key", right_on="small_key")
         .join(tiny, left_on="small_value", right_on="tk")
         .aggregate(["big_key"], n=flight.agg.count_all(), s=flight.agg.sum("tv")))
    options = {"replicate_rows": 0, "broadcast_bytes": 1 << 20, "small_query_bytes": 0, "one_host_query_bytes": 0}
    ex = flight.DistributedExec(q, cluster.urls, **options)
    joins = [n.strategy for s in ex.plan.stages for n in s.root.walk() if isinstance(n, JoinNode)]
    assert sorted(joins) == ["broadcast", "shuffle"], ex.explain()
    aggregates = [n for s in ex.plan.stages for n in s.root.walk() if isinstance(n, AggregateNode)]
    assert len(aggregates) == 1 and not aggregates[0].partial, ex.explain()  # whole, where the rows are
    b, m = ([str(x) for x in f] for f in files)
    want = duckdb.sql(
        f"select big_key, count(*) as n, sum(t.small_value) as s from read_parquet({b}) b "
        f"join read_parquet({m}) m on b.big_key = m.small_key "
        f"join (select small_key, small_value from read_parquet({m}) where small_value < 1000) t on m.small_value = t.small_key "
        "group by big_key order by big_key"
    ).to_arrow_table()
    assert ex.to_table().sort_by("big_key").to_pylist() == want.to_pylist()


def test_a_side_over_broadcast_bytes_is_still_broadcast_when_its_copies_are_a_tenth_of_the_other(
    sides: tuple[flight.Query, flight.Query],
) -> None:
    """~6.4 MB of ``big`` against ``small`` filtered to a tenth (~0.3 MB), with broadcast_bytes of 0.1 MB: the
    filtered side is over the limit, but one copy is a twentieth of shuffling ``big`` (``cost.LARGE_BROADCAST``);
    whole (~3.2 MB, past four times the limit) it is shuffled."""
    big, small = sides
    limit = 100 << 10
    for kept, want in ((20_000, "broadcast"), (200_000, "shuffle")):
        q = big.join(small.filter(flight.col("small_value") < kept), left_on="big_key", right_on="small_key")
        plan = plan_query(q.node, 2, PlannerOptions(replicate_rows=0, broadcast_bytes=limit))
        assert [n.strategy for s in plan.stages for n in s.root.walk() if isinstance(n, JoinNode)] == [want], plan.rewrites
