"""Service under load: 32 ADBC clients at once against ``flight-coordinator`` for 60 s, every result checked.

Each client is a thread with its own ADBC connection (as 32 applications would have), running the
TPC-H queries in a mix (client ``i`` starts at the ``i``-th query of the list and goes round), one
after another until the time is up. Every answer is compared with DuckDB's over the same files. The
service runs with its defaults (``--max-queries 16``, so half the clients wait for a slot at a
time: admission is part of what is measured) over a ``LocalCluster`` of two workers.

Before the run and after it (once the service lists no running query and the workers no task, and
their RSS stopped falling), the resident memory of the service and of each worker is read from
``/proc``. Nothing may be left behind: no query running on the service, no task on a worker.

Prints per query its count and median, then the figure lines; the last ones are
``service_load_qps``, ``service_load_p50_s``, ``service_load_p99_s``, the RSS of the service and
of the workers (summed) before -> after, what was left behind (``service_load_left_queries``,
``service_load_left_tasks``: both 0) and last ``service_load_exact`` (right/total). Exit 1 on a
wrong answer, a failed query or anything left behind.

    python -m benchmarks.micro.service_load [--clients 32] [--seconds 60] [--sf 0.1] [--queries 1,3,...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

if __name__ == "__main__" and not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pyarrow as pa
import pyarrow.flight as fl

import flight
from benchmarks.micro._service import coordinator
from benchmarks.tpch import ensure_tpch
from benchmarks.tpch_queries import ORDERED, TABLES, compare, decimals_as_numbers, duckdb_connection, duckdb_table, tpch_files
from benchmarks.tpch_sql import ALL_QUERIES, SQL
from flight.wire._proto import protocol_pb2

DEFAULT_QUERIES = ",".join(map(str, ALL_QUERIES))


def log(msg: str) -> None:
    print(f"[service_load] {msg}", file=sys.stderr, flush=True)


@dataclass
class Tally:
    """What the clients saw, under one lock."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    seconds: dict[int, list[float]] = field(default_factory=dict)
    wrong: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def add(self, n: int, elapsed: float, problem: str | None, error: str | None) -> None:
        with self.lock:
            if error is not None:
                self.failed.append(f"Q{n}: {error}")
            elif problem is not None:
                self.wrong.append(f"Q{n}: {problem}")
            else:
                self.seconds.setdefault(n, []).append(elapsed)

    @property
    def right(self) -> int:
        return sum(len(v) for v in self.seconds.values())


def client(url: str, order: list[int], answers: dict[int, pa.Table], deadline: float, tally: Tally) -> None:
    """One application: its own connection, queries one after another until ``deadline``."""
    from adbc_driver_flightsql import dbapi

    with dbapi.connect(url, autocommit=True) as conn, conn.cursor() as cursor:
        i = 0
        while time.monotonic() < deadline:
            n = order[i % len(order)]
            i += 1
            started = time.perf_counter()
            try:
                cursor.execute(SQL[n])
                got = cursor.fetch_arrow_table()
            except Exception as exc:  # noqa: BLE001 - a failed query is a figure, and the other clients go on
                tally.add(n, 0.0, None, " ".join(f"{type(exc).__name__}: {exc}".split())[:300])
                continue
            elapsed = time.perf_counter() - started
            tally.add(n, elapsed, compare(got, answers[n], ORDERED.get(n)), None)


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def settled_rss(pids: list[int], limit_s: float = 20.0) -> list[float]:
    """Each process's RSS once their sum has not fallen by 1 MiB for 2 s (idle processes give memory back)."""
    end = time.monotonic() + limit_s
    last, steady = [rss_mb(p) for p in pids], time.monotonic()
    while time.monotonic() < end and time.monotonic() - steady < 2.0:
        time.sleep(0.2)
        now = [rss_mb(p) for p in pids]
        if sum(now) < sum(last) - 1:
            last, steady = now, time.monotonic()
    return last


def running_queries(page: str) -> int:
    with urllib.request.urlopen(page + "api/queries", timeout=10) as response:
        data = json.loads(response.read())
    return len(data["running"]) + sum(data["queued"].values())


def worker_tasks(url: str) -> int:
    with fl.connect(url) as c:
        (result,) = list(c.do_action(fl.Action("info", b"")))
    return int(protocol_pb2.WorkerInfo.FromString(result.body.to_pybytes()).running_tasks)


def left_behind(page: str, cluster: flight.LocalCluster, wait_s: float = 30.0) -> tuple[int, int]:
    """(queries the service still runs or queues, tasks the workers still hold), once both are 0 or after ``wait_s``."""
    end = time.monotonic() + wait_s
    while True:
        queries, tasks = running_queries(page), sum(worker_tasks(url) for url in cluster.urls)
        if (not queries and not tasks) or time.monotonic() > end:
            return queries, tasks
        time.sleep(0.2)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--sf", type=float, default=0.1)
    p.add_argument("--queries", default=DEFAULT_QUERIES, help="the mix (default: all 22)")
    args = p.parse_args(argv)
    numbers = [int(q) for q in args.queries.split(",")]
    data_dir = ensure_tpch(args.sf, TABLES)
    files = tpch_files(data_dir, TABLES)
    con = duckdb_connection(files)
    answers = {n: decimals_as_numbers(duckdb_table(con, SQL[n])) for n in numbers}
    tally = Tally()
    with flight.LocalCluster(2, data_roots=[data_dir]) as cluster:
        with coordinator(cluster.urls, files) as (url, page, service_pid):
            pids = [service_pid, *(w.pid for w in cluster.processes)]
            # Warm: every query once through the service (imports, caches, the workers' thread pools).
            from adbc_driver_flightsql import dbapi

            with dbapi.connect(url, autocommit=True) as conn, conn.cursor() as cursor:
                for n in numbers:
                    cursor.execute(SQL[n])
                    cursor.fetch_arrow_table()
            before = settled_rss(pids)
            log(f"{args.clients} clients for {args.seconds:.0f} s on {url}, TPC-H SF {args.sf:g}, queries {args.queries}")
            started = time.monotonic()
            deadline = started + args.seconds
            threads = [threading.Thread(target=client, args=(url, numbers[i % len(numbers):] + numbers[:i % len(numbers)], answers,
                                                            deadline, tally), name=f"client-{i}") for i in range(args.clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.monotonic() - started
            leaked_queries, leaked_tasks = left_behind(page, cluster)
            after = settled_rss(pids)
    every = [s for v in tally.seconds.values() for s in v]
    total = tally.right + len(tally.wrong) + len(tally.failed)
    print(f"{args.clients} ADBC clients, {wall:.0f} s, TPC-H SF {args.sf:g} on 2 workers; per query: count, median s")
    for n in numbers:
        got = tally.seconds.get(n, [])
        print(f"  Q{n}: {len(got)}, {statistics.median(got):.3f}" if got else f"  Q{n}: 0")
    for problem in [*tally.wrong, *tally.failed][:10]:
        log(problem)
    workers_before, workers_after = sum(before[1:]), sum(after[1:])
    print(f"service_load_queries: {total}")
    print(f"service_load_qps: {tally.right / wall:.2f}")
    print(f"service_load_p50_s: {percentile(every, 0.5):.3f}" if every else "service_load_p50_s: n/a")
    print(f"service_load_p99_s: {percentile(every, 0.99):.3f}" if every else "service_load_p99_s: n/a")
    print(f"service_load_service_rss_mb: {before[0]:.0f}->{after[0]:.0f}")
    print(f"service_load_workers_rss_mb: {workers_before:.0f}->{workers_after:.0f}")
    print(f"service_load_left_queries: {leaked_queries}")
    print(f"service_load_left_tasks: {leaked_tasks}")
    print(f"service_load_exact: {tally.right}/{total}")
    return 0 if tally.right == total and total and not leaked_queries and not leaked_tasks else 1


if __name__ == "__main__":
    sys.exit(main())
