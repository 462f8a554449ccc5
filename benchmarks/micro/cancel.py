"""How fast a Flight SQL client that leaves stops its query's work on the workers (issue 41).

A statement that would compute for minutes (lineitem joined with itself on ``l_linenumber``:
5·10^10 pairs at SF 0.1) runs through ``flight-coordinator`` with the real ADBC driver, with
direct endpoints and relayed ones. Once the workers run its tasks (and half a second more),
the client leaves one of three ways: ``adbc_cancel`` while it fetches, ``adbc_cancel`` then
closing its connection, or SIGKILL of the client's process. Timed: from that moment until
every worker's ``info`` counts no running task (polled every 20 ms).

The last lines: ``cancel_<way>_<endpoints>_s: median`` for each, and ``cancel_max_s: X``,
the worst single run (the goal: under 2 s).

    python -m benchmarks.micro.cancel [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pyarrow.flight as fl
from adbc_driver_flightsql import dbapi

import flight
from benchmarks.tpch import ensure_tpch
from benchmarks.tpch_queries import TABLES, tpch_files
from flight.wire._proto import protocol_pb2

SLOW = "select count(*) as n from lineitem a join lineitem b on a.l_linenumber = b.l_linenumber"
CLIENT = """
import sys
import adbc_driver_flightsql.dbapi as dbapi
with dbapi.connect(sys.argv[1], autocommit=True) as conn, conn.cursor() as cur:
    cur.execute(sys.argv[2])
    print("executing", flush=True)
    cur.fetch_arrow_table()
"""
PREFIX = "flight-coordinator listening on "


def running(urls: list[str]) -> int:
    total = 0
    for url in urls:
        with fl.connect(url) as c:
            body = next(iter(c.do_action(fl.Action("info", b"")))).body.to_pybytes()
        total += protocol_pb2.WorkerInfo.FromString(body).running_tasks
    return total


def wait(predicate: Callable[[], bool], timeout: float) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"not within {timeout} s")
        time.sleep(0.02)
    return time.monotonic() - start


def _swallow(fn: Callable[[], object]) -> None:
    try:
        fn()
    except Exception:  # noqa: BLE001 - the call is cancelled: its error is expected
        pass


def one(way: str, url: str, urls: list[str]) -> float:
    """Seconds from the client leaving (``way``) to no task on any worker."""
    if way == "kill":
        proc = subprocess.Popen([sys.executable, "-c", CLIENT, url, SLOW], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "executing"
        wait(lambda: running(urls) > 0, 60)
        time.sleep(0.5)
        left = time.monotonic()
        proc.kill()
        proc.wait(10)
        proc.stdout.close()
        wait(lambda: running(urls) == 0, 120)
        return time.monotonic() - left
    conn = dbapi.connect(url, autocommit=True)
    cur = conn.cursor()

    def fetch() -> None:
        cur.execute(SLOW)
        cur.fetch_arrow_table()

    reader = threading.Thread(target=lambda: _swallow(fetch), daemon=True)
    reader.start()
    wait(lambda: running(urls) > 0, 60)
    time.sleep(0.5)
    start = time.monotonic()
    cur.adbc_cancel()
    if way == "close":
        reader.join(30)
        cur.close()
        conn.close()
    wait(lambda: running(urls) == 0, 120)
    took = time.monotonic() - start
    if way != "close":
        reader.join(30)
        cur.close()
        conn.close()
    return took


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--sf", type=float, default=0.1)
    args = p.parse_args(argv)
    data_dir = ensure_tpch(args.sf, TABLES)
    files = tpch_files(data_dir, TABLES)
    tables = [a for t in TABLES for a in ("--table", f"{t}={files[t][0].parent}")]
    results: dict[str, list[float]] = {}
    with flight.LocalCluster(2, data_roots=[data_dir]) as cluster:
        procs = {}
        for kind in ("direct", "relay"):
            proc = subprocess.Popen([sys.executable, "-m", "flight.service", "--port", "0", "--workers", ",".join(cluster.urls),
                                     "--endpoints", kind, *tables], stdout=subprocess.PIPE, text=True)
            assert proc.stdout is not None
            procs[kind] = (proc, proc.stdout.readline()[len(PREFIX):].strip())
        try:
            for r in range(args.runs):
                for kind, (_, url) in procs.items():
                    for way in ("cancel", "close", "kill"):
                        took = one(way, url, cluster.urls)
                        results.setdefault(f"cancel_{way}_{kind}_s", []).append(took)
                        print(f"[cancel] run {r + 1}: {way:6} {kind:6} {took:.2f} s", file=sys.stderr, flush=True)
        finally:
            for proc, _ in procs.values():
                proc.terminate()
                proc.wait(30)
                if proc.stdout is not None:
                    proc.stdout.close()
    for name, values in results.items():
        print(f"{name}: {statistics.median(values):.2f}")
    print(f"cancel_max_s: {max(max(v) for v in results.values()):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
