"""Concurrency soak: many mixed queries at once on one cluster, every result checked against DuckDB.

Why: one query at a time proves little about a worker that serves many: its
thread pools, output buffers, DoGet waits and credit loops must also hold up
when hundreds of tasks of different queries share it.

Setup: TPC-H Parquet at ``--sf`` (``benchmarks.tpch.ensure_tpch``), a
``LocalCluster`` of ``--workers`` workers, and a mix of distinct queries built
with the builder API (``CASES``): filtered scans (partitioned and shared-queue
feeds), limits with and without a sort (and an offset), grouped and global
aggregates, a distinct, a union, broadcast, shuffled, semi, anti and left
joins, and TPC-H Q1, Q3, Q4, Q6, Q12, Q13 and Q14 (``benchmarks.tpch_queries``).
DuckDB answers each distinct query once (its SQL over the same files). Then
``--queries`` queries (query i is case i mod the number of cases) start at the
same moment from ``--threads`` threads (default: one per query), each its own
``DistributedExec(...).to_table()``, and every result is compared with
DuckDB's (``tpch_queries.compare``: floats within a tolerance, order checked
only where the query sorts; a limit without a sort must return that many rows,
each one of DuckDB's).

A query counts as exact only when its result matches. One that raises counts
as its error (class and first line of the message); one without a result
``--query-deadline`` seconds after it started counts as a ``hang`` (its thread
is abandoned). After ``--deadline`` seconds in all, whatever has not finished
counts as a hang too, the results are printed and the exit code is 1, so the
benchmark never hangs itself. The workers' peak RSS is the sum of their
``VmHWM`` over the run (``benchmarks.memory``, reset at the start).

Progress goes to stderr; stdout gets a summary, the failure reasons by count,
and last ``concurrency_wall_s``, ``concurrency_exact: N/Q`` and
``worker_peak_rss_mb``. The exit code is 0 only when every query was exact.

    python benchmarks/micro/concurrency.py [--sf 0.1] [--queries 200] [--workers 2] [--deadline 600]
                                           [--threads N] [--query-deadline 300]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

if __name__ == "__main__" and not __package__:
    # Run as `python benchmarks/micro/concurrency.py`: the repo root holds the benchmarks package.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pyarrow as pa
import pyarrow.parquet as pq

import flight
from benchmarks.memory import PeakRSS
from benchmarks.tpch import ensure_tpch
from benchmarks.tpch_queries import (
    ORDERED,
    SQL,
    TABLES,
    Files,
    _date,
    _dec,
    _f,
    _scan,
    compare,
    decimals_as_numbers,
    duckdb_connection,
    query,
    tpch_files,
)
from flight import agg, col

__all__ = ["CASES", "Case", "Outcome", "Report", "check", "references", "run", "soak"]


def log(msg: str) -> None:
    print(f"[concurrency] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ the query mix


@dataclass(frozen=True)
class Case:
    """One distinct query: its builder, DuckDB's SQL for it, and how to check a result."""

    name: str
    build: Callable[[Files], flight.Query]
    sql: str
    ordered_by: tuple[str, ...] = ()
    """The sort key when the query sorts (row order is checked along it); empty: rows compared as a multiset."""
    any_rows: int | None = None
    """A limit without a sort: any ``any_rows`` rows of the SQL's answer (``sql`` has no LIMIT). Such a
    query's columns must be ints, strings or dates (rows are matched exactly)."""
    options: dict[str, object] = field(default_factory=dict)
    """``ExecOptions`` overrides for its ``DistributedExec`` (e.g. ``broadcast_bytes=0`` forces a shuffle join)."""


class SharedFiles(flight.WorkUnitFeedProvider):
    """A shared-queue feed: one unit per row group, each to whichever task has credit."""

    shared = True

    def __init__(self, paths: Sequence[Path]) -> None:
        self.paths = [str(p) for p in paths]

    def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[object]:
        for path in self.paths:
            for rg in range(pq.ParquetFile(path).num_row_groups):
                yield flight.file_unit(path, [rg])


def _scan_lineitem(files: Files) -> flight.Query:
    return (_scan(files, "lineitem")
            .filter((col("l_shipdate") >= _date(1995, 6, 1)) & (col("l_shipdate") < _date(1995, 7, 1))
                    & (col("l_quantity") < _dec("5")))
            .select("l_orderkey", "l_linenumber", "l_quantity", "l_extendedprice", "l_shipmode"))


def _scan_orders_shared(files: Files) -> flight.Query:
    paths = list(files["orders"])
    orders = flight.read_parquet(SharedFiles(paths), schema=pq.read_schema(paths[0]))
    return (orders
            .filter((col("o_orderpriority") == "1-URGENT")
                    & (col("o_orderdate") >= _date(1996, 1, 1)) & (col("o_orderdate") < _date(1996, 2, 1)))
            .select("o_orderkey", "o_custkey", "o_orderstatus", "o_totalprice", "o_orderdate"))


def _scan_customer(files: Files) -> flight.Query:
    return (_scan(files, "customer")
            .filter((col("c_mktsegment") == "MACHINERY") & (col("c_acctbal") > _dec("9000")))
            .select("c_custkey", "c_name", "c_nationkey", balance=_f("c_acctbal") * 2.0))


def _limit_unsorted(files: Files) -> flight.Query:
    return (_scan(files, "lineitem")
            .filter((col("l_shipmode") == "AIR") & (col("l_returnflag") == "R") & (col("l_quantity") < _dec("4")))
            .select("l_orderkey", "l_linenumber", "l_shipdate", "l_shipmode")
            .limit(100))


def _limit_sorted(files: Files) -> flight.Query:
    return (_scan(files, "lineitem")
            .filter((col("l_shipdate") >= _date(1997, 1, 1)) & (col("l_shipdate") < _date(1998, 1, 1)))
            .select("l_orderkey", "l_linenumber", "l_extendedprice", "l_shipdate")
            .sort(["l_extendedprice", "l_orderkey", "l_linenumber"], descending=[True, False, False])
            .limit(25))


def _limit_offset(files: Files) -> flight.Query:
    return (_scan(files, "orders")
            .select("o_orderkey", "o_totalprice", "o_orderdate")
            .sort(["o_totalprice", "o_orderkey"], descending=[True, False])
            .limit(20, offset=10))


def _agg_shipmode(files: Files) -> flight.Query:
    return (_scan(files, "lineitem")
            .aggregate(["l_shipmode"], lines=agg.count_all(), qty=agg.sum(_f("l_quantity")),
                       first_ship=agg.min("l_shipdate"), last_ship=agg.max("l_shipdate"),
                       suppliers=agg.count_distinct("l_suppkey"), avg_disc=agg.mean(_f("l_discount"))))


def _agg_global(files: Files) -> flight.Query:
    return (_scan(files, "lineitem")
            .filter(col("l_returnflag") == "A")
            .aggregate(lines=agg.count_all(),
                       revenue=agg.sum(_f("l_extendedprice") * (1.0 - _f("l_discount"))),
                       top_price=agg.max(_f("l_extendedprice"))))


def _distinct(files: Files) -> flight.Query:
    return _scan(files, "orders").select("o_orderstatus", "o_orderpriority").distinct()


def _union(files: Files) -> flight.Query:
    lineitem = _scan(files, "lineitem")
    shipped = lineitem.filter(col("l_shipdate") == _date(1995, 3, 1)).select(key="l_orderkey", line="l_linenumber")
    received = lineitem.filter(col("l_receiptdate") == _date(1996, 2, 1)).select(key="l_orderkey", line="l_linenumber")
    return shipped.union(received)


def _join_broadcast(files: Files) -> flight.Query:
    customer = _scan(files, "customer").filter(col("c_mktsegment") == "AUTOMOBILE").select("c_custkey", "c_name")
    return (_scan(files, "orders")
            .filter((col("o_orderdate") >= _date(1995, 1, 1)) & (col("o_orderdate") < _date(1995, 1, 15)))
            .join(customer, left_on="o_custkey", right_on="c_custkey")
            .select("o_orderkey", "c_name", "o_totalprice"))


def _join_nation(files: Files) -> flight.Query:
    nation = _scan(files, "nation").select("n_nationkey", "n_name")
    return (_scan(files, "customer")
            .join(nation, left_on="c_nationkey", right_on="n_nationkey")
            .aggregate(["n_name"], customers=agg.count_all(), balance=agg.sum(_f("c_acctbal")))
            .sort("n_name"))


def _join_shuffle(files: Files) -> flight.Query:
    lineitem = (_scan(files, "lineitem")
                .filter((col("l_shipdate") >= _date(1996, 3, 1)) & (col("l_shipdate") < _date(1996, 4, 1)))
                .select("l_orderkey", "l_quantity"))
    orders = _scan(files, "orders").select("o_orderkey", "o_orderpriority")
    return (lineitem
            .join(orders, left_on="l_orderkey", right_on="o_orderkey")
            .aggregate(["o_orderpriority"], lines=agg.count_all(), qty=agg.sum(_f("l_quantity")))
            .sort("o_orderpriority"))


def _join_anti(files: Files) -> flight.Query:
    orders = _scan(files, "orders").select("o_custkey")
    return (_scan(files, "customer")
            .join(orders, left_on="c_custkey", right_on="o_custkey", how="anti")
            .aggregate(customers=agg.count_all(), balance=agg.sum(_f("c_acctbal"))))


def _tpch(n: int) -> Case:
    return Case(f"tpch_q{n}", lambda files: query(n, files), SQL[n], tuple(ORDERED.get(n, ())))


CASES: list[Case] = [
    Case("scan_lineitem", _scan_lineitem, """
select l_orderkey, l_linenumber, l_quantity, l_extendedprice, l_shipmode from lineitem
where l_shipdate >= date '1995-06-01' and l_shipdate < date '1995-07-01' and l_quantity < 5"""),
    _tpch(1),
    Case("join_broadcast", _join_broadcast, """
select o_orderkey, c_name, o_totalprice from orders, customer
where o_custkey = c_custkey and c_mktsegment = 'AUTOMOBILE'
  and o_orderdate >= date '1995-01-01' and o_orderdate < date '1995-01-15'"""),
    Case("limit_unsorted", _limit_unsorted, """
select l_orderkey, l_linenumber, l_shipdate, l_shipmode from lineitem
where l_shipmode = 'AIR' and l_returnflag = 'R' and l_quantity < 4""", any_rows=100),
    Case("agg_shipmode", _agg_shipmode, """
select l_shipmode, count(*) as lines, sum(l_quantity::double) as qty, min(l_shipdate) as first_ship,
       max(l_shipdate) as last_ship, count(distinct l_suppkey) as suppliers, avg(l_discount::double) as avg_disc
from lineitem group by l_shipmode"""),
    _tpch(3),
    Case("scan_orders_shared", _scan_orders_shared, """
select o_orderkey, o_custkey, o_orderstatus, o_totalprice, o_orderdate from orders
where o_orderpriority = '1-URGENT' and o_orderdate >= date '1996-01-01' and o_orderdate < date '1996-02-01'"""),
    Case("limit_sorted", _limit_sorted, """
select l_orderkey, l_linenumber, l_extendedprice, l_shipdate from lineitem
where l_shipdate >= date '1997-01-01' and l_shipdate < date '1998-01-01'
order by l_extendedprice desc, l_orderkey, l_linenumber limit 25""",
         ordered_by=("l_extendedprice", "l_orderkey", "l_linenumber")),
    _tpch(6),
    Case("join_shuffle", _join_shuffle, """
select o_orderpriority, count(*) as lines, sum(l_quantity::double) as qty from lineitem, orders
where l_orderkey = o_orderkey and l_shipdate >= date '1996-03-01' and l_shipdate < date '1996-04-01'
group by o_orderpriority order by o_orderpriority""", ordered_by=("o_orderpriority",), options={"broadcast_bytes": 0}),
    Case("agg_global", _agg_global, """
select count(*) as lines, sum(l_extendedprice::double * (1 - l_discount::double)) as revenue,
       max(l_extendedprice::double) as top_price
from lineitem where l_returnflag = 'A'"""),
    _tpch(12),
    Case("scan_customer", _scan_customer, """
select c_custkey, c_name, c_nationkey, c_acctbal::double * 2.0 as balance from customer
where c_mktsegment = 'MACHINERY' and c_acctbal > 9000"""),
    Case("distinct", _distinct, "select distinct o_orderstatus, o_orderpriority from orders"),
    _tpch(14),
    Case("limit_offset", _limit_offset, """
select o_orderkey, o_totalprice, o_orderdate from orders order by o_totalprice desc, o_orderkey limit 20 offset 10""",
         ordered_by=("o_totalprice", "o_orderkey")),
    Case("join_nation", _join_nation, """
select n_name, count(*) as customers, sum(c_acctbal::double) as balance from customer, nation
where c_nationkey = n_nationkey group by n_name order by n_name""", ordered_by=("n_name",)),
    _tpch(4),
    Case("union", _union, """
select l_orderkey as key, l_linenumber as line from lineitem where l_shipdate = date '1995-03-01'
union all
select l_orderkey, l_linenumber from lineitem where l_receiptdate = date '1996-02-01'"""),
    Case("join_anti", _join_anti, """
select count(*) as customers, sum(c_acctbal::double) as balance from customer
where not exists (select 1 from orders where o_custkey = c_custkey)"""),
    _tpch(13),
]
"""The distinct queries; query i of a run is ``CASES[i % len(CASES)]``."""


def references(cases: Sequence[Case], files: Files) -> dict[str, pa.Table]:
    """DuckDB's answer to each case (decimals made numbers, as ``tpch_queries.duckdb_answer`` does)."""
    con = duckdb_connection(files)
    try:
        answers = {}
        for case in cases:
            rel = con.sql(case.sql)
            fetch = getattr(rel, "to_arrow_table", None) or rel.fetch_arrow_table  # to_arrow_table: duckdb >= 1.4
            answers[case.name] = decimals_as_numbers(fetch())
        return answers
    finally:
        con.close()


def check(case: Case, got: pa.Table, want: pa.Table) -> str | None:
    """None when ``got`` is a right answer to ``case`` given DuckDB's ``want``, else how it differs."""
    if case.any_rows is None:
        return compare(got, want, case.ordered_by or None)
    n = min(case.any_rows, want.num_rows)
    if got.num_rows != n:
        return f"{got.num_rows} rows, expected {n} (a limit without a sort: any {n} of DuckDB's {want.num_rows} rows)"
    if got.column_names != want.column_names:
        return f"columns {got.column_names}, expected {want.column_names}"
    free: dict[tuple[object, ...], list[int]] = {}
    for i, row in enumerate(zip(*(c.to_pylist() for c in want.columns), strict=True)):
        free.setdefault(row, []).append(i)
    take = []
    for row in zip(*(c.to_pylist() for c in got.columns), strict=True):
        left = free.get(row)
        if not left:
            return f"row {dict(zip(got.column_names, row, strict=True))} is not in DuckDB's answer (or appears too often)"
        take.append(left.pop())
    return compare(got, want.take(take))  # the same rows: now names and types


# ------------------------------------------------------------------ the soak


@dataclass
class Outcome:
    """What became of one query."""

    index: int
    case: str
    status: str = "pending"
    """``exact``, ``mismatch``, ``error``, ``hang`` (no result within its deadline) or ``pending``."""
    reason: str = ""
    """Why it is not exact: ``mismatch: ...``, ``ErrorClass: first line``, ``hang ...``."""
    detail: str = ""
    started: float | None = None
    seconds: float | None = None
    late: str | None = None
    """A hang whose thread did return later: what it returned (``exact`` or a reason; not counted)."""
    late_at: float | None = None
    """When (``time.monotonic()``) that late return came."""


@dataclass
class Report:
    outcomes: list[Outcome]
    wall_s: float
    peak_rss_bytes: int | None = None
    peak_rss_method: str = "none"
    timed_out: bool = False
    """The overall deadline ended the run before every query had an outcome."""
    abandoned_threads: int = 0
    """Query threads still stuck when the run ended (hung queries the cluster's stop did not release)."""
    stopped_at: float | None = None
    """When (``time.monotonic()``) the workers were told to stop."""
    workers_at_end: list[str] = field(default_factory=list)
    """Each worker's ``info`` when the run ended with queries unfinished (diagnostics)."""

    @property
    def exact(self) -> int:
        return sum(o.status == "exact" for o in self.outcomes)

    def reasons(self) -> Counter[str]:
        return Counter(o.reason for o in self.outcomes if o.status != "exact")

    def failed_cases(self, reason: str) -> Counter[str]:
        return Counter(o.case for o in self.outcomes if o.status != "exact" and o.reason == reason)

    def summary(self) -> str:
        """The failure reasons, most frequent first, each with the cases it hit."""
        lines = []
        for reason, count in self.reasons().most_common():
            cases = ", ".join(f"{c} x{k}" for c, k in sorted(self.failed_cases(reason).items()))
            lines.append(f"  {count:4d}  {reason}  [{cases}]")
        return "\n".join(lines)


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0][:200]


_NOISE = [  # what differs between two occurrences of the same failure
    (re.compile(r"\b[0-9a-f]{16}(/\d+)*"), "<task>"),
    (re.compile(r"grpc(\+tcp)?://[\w.-]+:\d+"), "<worker>"),
    (re.compile(r"\b\d+(\.\d+)?\s*(s|ms|seconds)\b"), "<time>"),
]


def _reason(exc: BaseException) -> str:
    """An error as a failure reason: its class and the first line of its message, ids and URLs elided."""
    text = _first_line(str(exc))
    for pattern, repl in _NOISE:
        text = pattern.sub(repl, text)
    return f"{type(exc).__name__}: {text}"


def soak(
    cases: Sequence[Case],
    expected: dict[str, pa.Table],
    files: Files,
    urls: Sequence[str],
    *,
    queries: int,
    threads: int | None = None,
    query_deadline: float = 300.0,
    deadline: float = 600.0,
    progress_every: float = 5.0,
) -> tuple[list[Outcome], list[threading.Thread]]:
    """Run ``queries`` queries (query i is ``cases[i % len(cases)]``) from ``threads`` threads, all released at once.

    Returns each query's outcome once every query has one, or at ``deadline``
    seconds (then the unfinished ones are hangs), and the client threads: those
    of hung queries are daemons left running; stopping the workers frees them.
    """
    threads = min(threads or queries, queries)
    outcomes = [Outcome(i, cases[i % len(cases)].name) for i in range(queries)]
    lock = threading.Condition()
    todo = iter(range(queries))
    go = threading.Event()
    final = {"exact", "mismatch", "error", "hang"}

    def settle(o: Outcome, status: str, reason: str = "", detail: str = "") -> None:
        with lock:
            if o.status == "hang":  # its deadline passed first: the late result does not count
                o.late, o.late_at = reason or status, time.monotonic()
            else:
                o.seconds = time.monotonic() - (o.started or 0.0)
                o.status, o.reason, o.detail = status, reason, detail
            lock.notify_all()
        if status != "exact" and o.late is None:
            log(f"query {o.index} ({o.case}) {status}: {reason}")

    def worker() -> None:
        go.wait()
        while True:
            with lock:
                i = next(todo, None)
                if i is None:
                    return
                o = outcomes[i]
                o.started = time.monotonic()
            case = cases[i % len(cases)]
            try:
                got = flight.DistributedExec(case.build(files), list(urls), **case.options).to_table()  # type: ignore[arg-type]
            except Exception as exc:  # noqa: BLE001 - every failure is an outcome
                settle(o, "error", _reason(exc), f"{type(exc).__name__}: {exc}")
                continue
            try:
                problem = check(case, got, expected[case.name])
            except Exception as exc:  # noqa: BLE001
                problem = f"the check raised {type(exc).__name__}: {exc}"
            if problem is None:
                settle(o, "exact")
            else:
                settle(o, "mismatch", f"mismatch: {_first_line(problem)}", problem)

    pool = [threading.Thread(target=worker, name=f"soak-{t}", daemon=True) for t in range(threads)]
    for t in pool:
        t.start()
    started = time.monotonic()
    end = started + deadline
    go.set()
    last_report, last_done, last_change = started, 0, started
    with lock:
        while True:
            now = time.monotonic()
            for o in outcomes:
                if o.status == "pending" and o.started is not None and now - o.started > query_deadline:
                    o.status, o.reason = "hang", f"hang (no result within the {query_deadline:g}s query deadline)"
                    o.seconds = now - o.started
            done = sum(o.status in final for o in outcomes)
            if done != last_done:
                last_done, last_change = done, now
            if done == queries or now >= end:
                break
            if now - last_report >= progress_every:
                last_report = now
                exact = sum(o.status == "exact" for o in outcomes)
                running = sum(o.status == "pending" and o.started is not None for o in outcomes)
                log(f"{now - started:6.1f}s: {done}/{queries} done ({exact} exact, {done - exact} failed), "
                    f"{running} running, {queries - done - running} waiting; last finish {now - last_change:.1f}s ago")
            next_hang = min((o.started + query_deadline for o in outcomes if o.status == "pending" and o.started is not None),
                            default=end)
            lock.wait(max(0.01, min(end, next_hang, last_report + progress_every) - now))
        for _ in todo:  # the run is over: a thread a hung query releases later starts nothing new
            pass
        for o in outcomes:
            if o.status == "pending":
                if o.started is None:
                    o.status, o.reason = "hang", f"never started (the overall deadline, {deadline:.0f}s after the launch, passed first)"
                else:
                    o.status, o.reason = "hang", f"hang (no result when the overall deadline passed, {deadline:.0f}s after the launch)"
                    o.seconds = time.monotonic() - o.started
    exact = sum(o.status == "exact" for o in outcomes)
    log(f"{time.monotonic() - started:6.1f}s: {exact}/{queries} exact, {queries - exact} not")
    return outcomes, pool


def run(
    files: Files,
    *,
    queries: int,
    workers: int = 2,
    threads: int | None = None,
    query_deadline: float = 300.0,
    deadline: float = 600.0,
    cases: Sequence[Case] = CASES,
) -> Report:
    """DuckDB's answers, a ``LocalCluster(workers)``, then ``soak`` under ``PeakRSS`` of the workers.

    ``deadline`` covers all of it (the answers and the cluster's start come out of the soak's share).
    """
    begun = time.monotonic()
    cases = list(cases)[:queries] if queries < len(cases) else list(cases)
    log(f"{len(cases)} distinct queries: computing DuckDB's answers")
    expected = references(cases, files)
    log(f"starting {workers} workers")
    roots = sorted({str(Path(p).parent) for paths in files.values() for p in paths})  # the workers read only there
    with flight.LocalCluster(workers, data_roots=roots) as cluster:
        pids = [p.pid for p in cluster.processes]
        log(f"workers {', '.join(cluster.urls)}; launching {queries} queries at once")
        remaining = max(1.0, deadline - (time.monotonic() - begun))
        with PeakRSS(pids) as peak:
            started = time.perf_counter()
            outcomes, pool = soak(cases, expected, files, cluster.urls, queries=queries, threads=threads,
                            query_deadline=query_deadline, deadline=remaining)
            wall = time.perf_counter() - started
        report = Report(outcomes, wall, peak.bytes, peak.method,
                        timed_out=any(o.status == "hang" and "overall deadline" in o.reason for o in outcomes))
        if any(o.status == "hang" for o in outcomes):
            report.workers_at_end = worker_info(cluster.urls)
            stuck = sum(o.status == "hang" and o.late is None and o.started is not None for o in outcomes)
            log(f"{stuck} hung queries still running; stopping the workers to free them")
        report.stopped_at = time.monotonic()
    # The cluster is stopped (killed after its grace): stuck DoGets should now fail. Give them a moment.
    until = time.monotonic() + 5.0
    for t in pool:
        t.join(max(0.0, until - time.monotonic()))
    report.abandoned_threads = sum(t.is_alive() for t in pool)
    return report


def worker_info(urls: Sequence[str], timeout: float = 3.0) -> list[str]:
    """Each worker's answer to the ``info`` action (running tasks, buffered bytes, load), one line each."""
    import pyarrow.flight as fl
    from google.protobuf import text_format

    from flight.wire._proto import protocol_pb2

    lines = []
    for url in urls:
        try:
            with fl.connect(url) as client:
                results = list(client.do_action(fl.Action("info", b""), fl.FlightCallOptions(timeout=timeout)))
            info = protocol_pb2.WorkerInfo()
            info.ParseFromString(results[0].body.to_pybytes())
            lines.append(f"{url}: {text_format.MessageToString(info, as_one_line=True)}")
        except Exception as exc:  # noqa: BLE001 - a diagnostic: a worker that does not answer is news too
            lines.append(f"{url}: no answer to info within {timeout:g}s ({type(exc).__name__}: {_first_line(str(exc))})")
    return lines


def print_report(report: Report) -> None:
    outcomes = report.outcomes
    n = len(outcomes)
    by_status = Counter(o.status for o in outcomes)
    seconds = sorted(o.seconds for o in outcomes if o.status == "exact" and o.seconds is not None)
    print(f"{n} concurrent queries over {len({o.case for o in outcomes})} distinct ones: "
          + ", ".join(f"{by_status[s]} {s}" for s in ("exact", "mismatch", "error", "hang") if by_status[s]))
    if seconds:
        print(f"latency of exact queries: median {statistics.median(seconds):.2f}s, max {seconds[-1]:.2f}s")
    print(f"wall time {report.wall_s:.1f}s; workers' peak RSS by {report.peak_rss_method}")
    if report.reasons():
        print("not exact, by reason (count, reason, [case x count]):")
        print(report.summary())
    if report.workers_at_end:
        print("workers when the run ended with queries unfinished:")
        print("\n".join(f"  {line}" for line in report.workers_at_end))
    late = [o for o in outcomes if o.late is not None]
    if late:
        stop = report.stopped_at if report.stopped_at is not None else float("inf")
        before = Counter(o.late for o in late if o.late_at is not None and o.late_at < stop)
        after = Counter(o.late for o in late if o.late_at is not None and o.late_at >= stop)
        print(f"{len(late)} hung queries returned after their deadline (not counted):")
        for label, found in (("before the workers were stopped", before), ("once the workers were stopped", after)):
            for reason, count in found.most_common():
                print(f"  {count:4d}  {label}: {reason}")
    if report.timed_out:
        print("the overall deadline ended the run")
    if report.abandoned_threads:
        print(f"{report.abandoned_threads} query thread(s) were still stuck after the workers stopped")
    rss = "n/a" if report.peak_rss_bytes is None else f"{report.peak_rss_bytes / 2**20:.0f}"
    print(f"concurrency_wall_s: {report.wall_s:.1f}")
    print(f"concurrency_exact: {report.exact}/{n}")
    print(f"worker_peak_rss_mb: {rss}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sf", type=float, default=0.1, help="TPC-H scale factor (default: %(default)s)")
    p.add_argument("--queries", type=int, default=200, help="queries in flight at once (default: %(default)s)")
    p.add_argument("--workers", type=int, default=2, help="LocalCluster workers (default: %(default)s)")
    p.add_argument("--deadline", type=float, default=600.0,
                   help="seconds for the whole run once the data is ready; then report and exit 1 (default: %(default)s)")
    p.add_argument("--query-deadline", type=float, default=300.0,
                   help="a query without a result this many seconds after it started is a hang (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None,
                   help="client threads (default: one per query, all released at once)")
    args = p.parse_args(argv)
    if args.queries < 1 or args.workers < 1 or (args.threads is not None and args.threads < 1):
        p.error("--queries, --workers and --threads must be at least 1")
    log(f"TPC-H SF {args.sf:g}: generating or reusing data")
    files = tpch_files(ensure_tpch(args.sf, TABLES), TABLES)
    # A last resort should stopping the cluster itself hang: the figures are printed before that.
    guard = threading.Timer(args.deadline + 120.0, lambda: (log("still not done 120s after the deadline: exiting"),
                                                            os._exit(3)))
    guard.daemon = True
    guard.start()
    report = run(files, queries=args.queries, workers=args.workers, threads=args.threads,
                 query_deadline=args.query_deadline, deadline=args.deadline)
    print_report(report)
    code = 0 if report.exact == len(report.outcomes) else 1
    if report.abandoned_threads:
        # Stuck threads may hold non-daemon resources (gRPC): do not wait for them at exit.
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
