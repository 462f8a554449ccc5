"""TPC-H (SQL) on three workers in network namespaces: clean links, slow links, a killed worker, a partition.

Issue 29's suite: Q3, Q5, Q9, Q18 and Q21 with every join shuffled between the workers, each
answer compared with DuckDB's, and every worker left with no task and no buffered byte. The
coordinator runs in its own namespace (``Fleet.query``); workers are lost by SIGKILL or by
dropping their packets (nftables in the switch), never by anything the coordinator is told.

Where a worker is hit: an ORDER BY query's rows reach the caller at its end (its head is one
task, whose rows are held until its output is whole: docs/architecture.md, "Losing a worker"),
so those are hit at a share of their undisturbed time; a query whose head has several tasks
(an aggregate without ORDER BY) is hit after a share of its rows reached the caller.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import tpch_test_files

from benchmarks.tpch_queries import TABLES, compare, duckdb_connection, duckdb_table
from benchmarks.tpch_sql import ORDERED, SQL
from flight.dev.fleet import COORDINATOR, Fleet
from flight.dev.fleet_driver import DriverResult, DriverRun
from flight.dev.netns import netns_unavailable

pytestmark = [pytest.mark.required, pytest.mark.slow, pytest.mark.skipif(netns_unavailable() is not None, reason=str(netns_unavailable()))]

SF = 0.05
QUERIES = (3, 5, 9, 18, 21)
SHUFFLED = {"broadcast_bytes": 0, "rows_per_task": 1, "small_query_bytes": 0}  # every join shuffled: the most traffic between workers
LOSS = {**SHUFFLED, "heartbeat": 0.5, "peer_timeout": 5.0}  # silence is a loss within seconds (not so soon that a busy worker looks silent)
UNORDERED = """
SELECT l_orderkey, sum(l_extendedprice * (1 - l_discount)) AS revenue, count(*) AS n
FROM customer, orders, lineitem
WHERE c_custkey = o_custkey AND l_orderkey = o_orderkey AND o_orderdate < DATE '1995-03-15'
GROUP BY l_orderkey
"""  # Q3 without its ORDER BY and LIMIT: a head of several tasks, whose rows arrive as each ends


@pytest.fixture(scope="module")
def tpch() -> tuple[dict[str, list[Path]], dict[int | str, Any]]:
    files = tpch_test_files(SF)
    con = duckdb_connection(files)
    try:
        expected: dict[int | str, Any] = {n: duckdb_table(con, SQL[n]) for n in QUERIES}
        expected["unordered"] = duckdb_table(con, UNORDERED)
        return files, expected
    finally:
        con.close()


@pytest.fixture(scope="module")
def fleet(data_roots: list[Path]) -> Iterator[Fleet]:
    # Worker 1 is slowed down per work unit, so that it is surely mid-query when it is hit.
    # A worker gives up on a silent peer after 5 s (--peer-timeout), as the coordinator does (LOSS).
    silent = ["--peer-timeout", "5"]
    with Fleet(3, data_roots=data_roots, per_worker_args=[silent, [*silent, "--unit-delay-ms", "40"], silent], seed=29) as f:
        yield f


def _tables(files: dict[str, list[Path]]) -> dict[str, list[Path]]:
    return {t: files[t] for t in TABLES}


def _check(result: DriverResult, expected: Any, ordered: Any, what: str) -> None:
    assert result.error is None and result.table is not None, f"{what}: {result.error}\n{result.stderr_tail}"
    difference = compare(result.table, expected, ordered)
    assert difference is None, f"{what} differs from DuckDB: {difference}"
    left = [(i.get("running_tasks"), i.get("buffered_bytes")) for i in result.infos if "error" not in i]
    assert left and all(x == (0, 0) for x in left), f"{what}: tasks or bytes left on the workers: {result.infos}"


def _done(run: DriverRun) -> dict[str, Any]:
    return next((e.data for e in run.seen if e.kind == "done"), {})


def _time(fleet: Fleet, sql: str, files: dict[str, list[Path]]) -> float:
    """The query's own time on the undisturbed fleet (the driver's start-up aside)."""
    run = fleet.query(sql, _tables(files), options=SHUFFLED, info=False)
    result = run.result()
    assert result.error is None, result.error
    return float(_done(run)["seconds"])


def test_five_queries_equal_duckdb_on_clean_links_and_through_slow_ones(fleet: Fleet, tpch: tuple[dict[str, list[Path]], dict[Any, Any]]) -> None:
    """(a) clean links; (b) 50 ms round trips with jitter, and every link stalling 2 s now and then."""
    files, expected = tpch
    for shaped in (False, True):
        if shaped:
            fleet.set_rtt(50, jitter_ms=10, stall_every_s=8, stall_s=2)
        try:
            for n in QUERIES:
                run = fleet.query(SQL[n], _tables(files), options=SHUFFLED)
                _check(run.result(), expected[n], ORDERED.get(n), f"Q{n} ({'50 ms RTT, stalls' if shaped else 'clean'})")
                assert _done(run)["attempts"] == [], f"Q{n}: a slow link was taken for a lost worker: {_done(run)}"
        finally:
            fleet.clear_shapes()


@pytest.mark.parametrize(("n", "share"), [(5, 0.25), (9, 0.5), (18, 0.9), (21, 0.5), (3, 0.25)])
def test_a_worker_killed_mid_query_is_recovered_from(fleet: Fleet, tpch: tuple[dict[str, list[Path]], dict[Any, Any]], n: int, share: float) -> None:
    """(c) SIGKILL at a share of the query's undisturbed time: the answer is DuckDB's all the same."""
    files, expected = tpch
    seconds = _time(fleet, SQL[n], files)
    run = fleet.query(SQL[n], _tables(files), options=LOSS)
    try:
        assert run.wait_for("started") is not None, run.result().stderr_tail
        threading.Event().wait(share * seconds)
        fleet.kill(1)
        result = run.result()
        _check(result, expected[n], ORDERED.get(n), f"Q{n} with worker 1 killed at {share:.0%} of {seconds:.2f}s")
        attempts = _done(run)["attempts"]
        assert not attempts or {tuple(a["lost"]) for a in attempts} == {(fleet.worker_urls[1],)}, attempts
    finally:
        fleet.restart(1)


@pytest.mark.parametrize("share", [0.25, 0.5, 0.9])
def test_a_worker_killed_after_rows_reached_the_caller_is_recovered_from(
    fleet: Fleet, tpch: tuple[dict[str, list[Path]], dict[Any, Any]], share: float
) -> None:
    """(c) SIGKILL once a share of the rows reached the caller: no row lost, none twice."""
    files, expected = tpch
    total = expected["unordered"].num_rows
    run = fleet.query(UNORDERED, _tables(files), options={**LOSS, "rows_per_task": 1})
    try:
        seen = run.wait_for("rows", rows=max(1, int(share * total)))
        if seen is not None and seen.rows < total:
            fleet.kill(1)
        result = run.result()
        _check(result, expected["unordered"], None, f"the unordered join with worker 1 killed after {seen.rows if seen else 0} rows")
    finally:
        fleet.restart(1)


@pytest.mark.parametrize(("n", "cut_from"), [(9, COORDINATOR), (9, 0)], ids=["from-coordinator", "from-one-peer"])
def test_a_worker_partitioned_mid_shuffle_is_a_loss_and_its_old_tasks_are_fenced_after_heal(
    fleet: Fleet, tpch: tuple[dict[str, list[Path]], dict[Any, Any]], n: int, cut_from: Any
) -> None:
    """(d) worker 1's packets dropped (from the coordinator only, or from worker 0 only) as the query
    starts, and healed 9 s later: the cut is a loss (which side of a cut between two workers is
    counted lost is whichever's reader gives up first), the answer is DuckDB's, nothing is counted
    twice, and the fenced old tasks leave nothing behind."""
    files, expected = tpch
    run = fleet.query(SQL[n], _tables(files), options=LOSS, settle_s=20.0)
    try:
        assert run.wait_for("started") is not None, run.result().stderr_tail
        fleet.partition(1, from_=cut_from)  # worker 1 is still being sent its units and read from
        threading.Event().wait(9.0)  # past the 5 s bounds: the loss is decided while the cut lasts
        fleet.heal()
        result = run.result()
        _check(result, expected[n], ORDERED.get(n), f"Q{n} with worker 1 cut off from {cut_from} mid-query")
        attempts = _done(run)["attempts"]
        assert attempts and all(a["within"] for a in attempts), f"the cut was not recovered from within the query: {attempts}"
        sides = {fleet.worker_urls[1]} | ({fleet.worker_urls[cut_from]} if cut_from != COORDINATOR else set())
        assert {u for a in attempts for u in a["lost"]} <= sides, attempts
    finally:
        fleet.heal()
