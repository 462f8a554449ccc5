"""A fleet behind real links: recovery, latency and a straggler, on three namespaced workers (issue 29).

Run as root: ``python -m benchmarks.micro.fleet --sf 1 --runs 3``. Every query runs in the
coordinator's own network namespace against three workers in theirs (``flight.dev.fleet``);
times are the driver's own (``DistributedExec`` from launch to the last row), medians of
``--runs``, measured side by side in one run, and every answer is compared with DuckDB's.

* **Recovery**: TPC-H Q3, Q5, Q9, Q18, Q21 (SQL) with worker 1 SIGKILLed at half the query's
  undisturbed time ÷ undisturbed (goal ≤ 1.6). The worker is restarted between runs.
* **Latency**: the 10 queries of the builder suite (their SQL) with every link at 5 ms round trip
  ÷ on clean links, clean and slow runs interleaved (goal ≤ 1.3).
* **Straggler**: a selective scan of lineitem read as a shared queue (a unit per row group) with
  worker 2's link limited to 10 Mbit/s ÷ clean (goal ≤ 1.5); the units each worker took say how
  far the queue routed around it.
"""

from __future__ import annotations

import argparse
import math
import statistics
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.tpch import ensure_tpch
from benchmarks.tpch_queries import TABLES, compare, duckdb_connection, duckdb_table, tpch_files
from benchmarks.tpch_sql import ORDERED, SQL
from flight.dev.fleet import Fleet
from flight.dev.fleet_driver import DriverRun
from flight.dev.netns import netns_unavailable

RECOVERY = (3, 5, 9, 18, 21)
LATENCY = (1, 3, 4, 5, 6, 10, 12, 13, 14, 19)
SCAN = "SELECT l_orderkey, l_partkey, l_extendedprice FROM lineitem WHERE l_quantity < 3 AND l_discount > 0.05"
LOSS: dict[str, Any] = {}  # the defaults: heartbeats every 2 s, a worker silent for 10 s is lost


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


class Bench:
    def __init__(self, fleet: Fleet, files: dict[str, list[Path]], runs: int) -> None:
        self.fleet, self.files, self.runs = fleet, files, runs
        self.tables = {t: files[t] for t in TABLES}
        con = duckdb_connection(files)
        try:
            self.expected = {n: duckdb_table(con, SQL[n]) for n in sorted(set(RECOVERY) | set(LATENCY))}
            self.expected_scan = duckdb_table(con, SCAN)
        finally:
            con.close()

    def timed(self, n: int | None, options: dict[str, Any] | None = None, act: Callable[[DriverRun, float], None] | None = None,
              guess: float = 0.0) -> tuple[float, dict[str, Any]]:
        """One run's own seconds and its ``done`` event; the answer checked against DuckDB's."""
        if n is None:
            run = self.fleet.query(SCAN, listed={"lineitem": Path(self.files["lineitem"][0]).parent}, options=options, info=False)
        else:
            run = self.fleet.query(SQL[n], self.tables, options=options, info=False)
        if act is not None:
            act(run, guess)
        result = run.result()
        what = f"Q{n}" if n is not None else "the scan"
        if result.error is not None or result.table is None:
            raise SystemExit(f"{what} failed: {result.error}\n{result.stderr_tail}")
        expected = self.expected[n] if n is not None else self.expected_scan
        difference = compare(result.table, expected, ORDERED.get(n) if n is not None else None)
        if difference is not None:
            raise SystemExit(f"{what} differs from DuckDB: {difference}")
        done = next(e.data for e in run.seen if e.kind == "done")
        return float(done["seconds"]), done

    def kill_at_half(self, run: DriverRun, clean: float) -> None:
        if run.wait_for("started") is None:
            return
        threading.Event().wait(clean / 2)
        self.fleet.kill(1)

    def recovery(self) -> list[float]:
        ratios = []
        for n in RECOVERY:
            clean, killed = [], []
            for _ in range(self.runs):
                clean.append(self.timed(n, LOSS)[0])
                seconds, done = self.timed(n, LOSS, self.kill_at_half, statistics.median(clean))
                killed.append(seconds)
                self.fleet.restart(1)
                if not done["attempts"]:
                    print(f"  (Q{n}: a run ended before the kill)")
            ratio = statistics.median(killed) / statistics.median(clean)
            ratios.append(ratio)
            print(f"fleet_recovery_q{n}: {ratio:.2f} ({statistics.median(clean):.2f}s clean, {statistics.median(killed):.2f}s killed at half)")
        return ratios

    def latency(self) -> float:
        clean: dict[int, list[float]] = {n: [] for n in LATENCY}
        slow: dict[int, list[float]] = {n: [] for n in LATENCY}
        for _ in range(self.runs):
            for n in LATENCY:
                clean[n].append(self.timed(n)[0])
                self.fleet.set_rtt(5)
                try:
                    slow[n].append(self.timed(n)[0])
                finally:
                    self.fleet.clear_shapes()
        ratios = [statistics.median(slow[n]) / statistics.median(clean[n]) for n in LATENCY]
        for n, r in zip(LATENCY, ratios, strict=True):
            print(f"  Q{n}: {statistics.median(clean[n]):.2f}s clean, x{r:.2f} at 5 ms RTT")
        return _geomean(ratios)

    def straggler(self) -> float:
        clean, limited = [], []
        shares: list[str] = []
        slow = self.fleet.worker_urls[2]
        for _ in range(self.runs):
            clean.append(self.timed(None)[0])
            self.fleet.rate_limit(2, 10)
            try:
                seconds, done = self.timed(None)
                limited.append(seconds)
            finally:
                self.fleet.rate_limit(2, None)
            units = done.get("units", {})
            shares.append(f"{units.get(slow, 0)}/{sum(units.values())}")
        print(f"  scan: {statistics.median(clean):.2f}s clean, {statistics.median(limited):.2f}s with worker 2 at 10 Mbit/s; "
              f"units worker 2 took per run: {', '.join(shares)} (a third would be 1/3)")
        return statistics.median(limited) / statistics.median(clean)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="benchmarks.micro.fleet", description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--sf", type=float, default=1.0)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--only", choices=["recovery", "latency", "straggler"], action="append")
    args = p.parse_args(argv)
    why = netns_unavailable()
    if why is not None:
        raise SystemExit(f"the fleet benchmark needs network namespaces: {why}")
    root = ensure_tpch(args.sf, TABLES)
    files = tpch_files(root, TABLES)
    only = set(args.only or ["recovery", "latency", "straggler"])
    with Fleet(3, data_roots=[Path(root).resolve().parent], per_worker_args=None, seed=29) as fleet:
        bench = Bench(fleet, files, args.runs)
        lines = []
        if "latency" in only:
            lines.append(f"fleet_latency_5ms_ratio: {bench.latency():.2f}")
            print(lines[-1])
        if "straggler" in only:
            lines.append(f"fleet_straggler_ratio: {bench.straggler():.2f}")
            print(lines[-1])
        if "recovery" in only:
            ratios = bench.recovery()
            lines.append(f"fleet_recovery_ratio: geomean {_geomean(ratios):.2f}, max {max(ratios):.2f}")
            print(lines[-1])
    print(" | ".join(lines))


if __name__ == "__main__":
    main()
