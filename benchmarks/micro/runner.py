"""``flight-bench micro [NAME ...] [-- ARGS]``: the micro benchmarks, each in its own process.

Each benchmark starts its own cluster, so each runs as ``python -m
benchmarks.micro.NAME`` in a subprocess; its figure lines (the trailing
``name: value`` lines it prints last) are shown, its whole output is saved to
``OUT/micro/NAME.txt`` and the figures to ``OUT/micro.json`` (merged with the figures already there). Arguments after
``--`` go to every benchmark named.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from importlib.util import find_spec
from pathlib import Path

from benchmarks.progress import Progress
from benchmarks.tpch import REPO_ROOT

__all__ = ["DEFAULT", "MICRO", "available", "main", "run"]

MICRO = {
    "transport": "flight-exec's DoGet streams vs a plain pyarrow Flight server: transport_ratio (throughput, 1 = as fast)",
    "feed": "work units dispatched per second from one provider: feed_units_per_s",
    "skew": "shared-queue feed vs static partitions, uneven units and a slow worker: skew_speedup",
    "slow_discovery": "execution overlapping a slow discovery: first_batch_ms, slow_discovery_ratio (1 = ideal)",
    "overhead": "TPC-H SF1 on 2 workers vs the same plan in one process: overhead_geomean",
    "spark_map": "PySpark mapInArrow through flight-exec workers",
    "liveness": "frozen coordinator, silent worker, SIGTERM with a silent client: seconds each, with default settings",
    "scale": "TPC-H SF 10 on 2 workers with --memory-limit 4GB, checked against DuckDB: scale_sf10 (matches, worker peak RSS)",
    "engine_probe": "the per-task engine candidates on the same probes (docs/engine.md): python_hop_cost_s, q1_duckdb_vs_acero",
    "recovery": "TPC-H SF1 on 3 workers, one killed at the query's midpoint, checked against DuckDB: recovered, recovery_overhead",
    "service": "TPC-H SF1 through ADBC and flight-coordinator vs DistributedExec in-process: service_overhead_geomean",
    "service_load": "32 ADBC clients for 60 s against flight-coordinator, TPC-H SF 0.1, every answer checked: service_load_qps, p50, p99, RSS before/after, service_load_exact",
    "spark_offload": "TPC-H Q1,3,9,18,21 SF 1 in Spark SQL vs flight-exec read by Spark through flight-coordinator; pushdown bytes: spark_offload_geomean, spark_pushdown_bytes_ratio",
    "cancel": "an ADBC client that cancels, closes or is killed mid-statement: seconds until no worker runs a task, cancel_max_s",
    "memory_bound": "a worker with --memory-limit 1GB under hostile clients: peak RSS beside its own accounting, memory_over_limit_mb",
    "concurrency": "soak: 200 mixed TPC-H SF 0.1 queries at once on 2 workers, each checked against DuckDB: concurrency_exact, worker_peak_rss_mb",
    "scaleout": "TPC-H (or --suite tpcds) SF 10 on N workers as N hosts (own address, own cores) vs DuckDB on one host's cores and on all: scaleout_speedup_geomean",
}
DEFAULT = ("transport", "feed", "skew", "slow_discovery")
"""What ``flight-bench micro`` runs without names (``overhead`` takes minutes at SF1; name it)."""

_FIGURE = re.compile(r"^[A-Za-z_][\w.]*: [-+]?[0-9][0-9.,eE+-]*\S*$")


def available() -> list[str]:
    """The micro benchmarks present in this checkout (``spark_map`` may not be)."""
    return [name for name in MICRO if find_spec(f"benchmarks.micro.{name}") is not None]


def figures(stdout: str) -> list[str]:
    """The trailing ``name: value`` lines of a benchmark's output."""
    lines = stdout.strip().splitlines()
    found: list[str] = []
    for line in reversed(lines):
        if not _FIGURE.match(line.strip()):
            break
        found.insert(0, line.strip())
    return found or lines[-1:]


def run(names: list[str], extra: list[str], out: Path, progress: Progress) -> bool:
    """Run ``names`` one after the other; print their figure lines; False when one failed."""
    (out / "micro").mkdir(parents=True, exist_ok=True)
    summary: dict[str, object] = {}
    ok = True
    for name in names:
        bar = progress.add(f"micro: {name} ({MICRO[name]})", total=1)
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", f"benchmarks.micro.{name}", *extra], cwd=REPO_ROOT,
                              capture_output=True, text=True)
        seconds = time.perf_counter() - started
        (out / "micro" / f"{name}.txt").write_text(proc.stdout + ("\n--- stderr ---\n" + proc.stderr if proc.stderr else ""))
        progress.finish(bar)
        if proc.returncode != 0:
            ok = False
            tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
            progress.error(f"micro benchmark {name} failed (exit code {proc.returncode}) after {seconds:.0f}s:\n{tail}")
            print(f"{name}: FAILED (exit code {proc.returncode})", flush=True)
            summary[name] = {"exit_code": proc.returncode, "seconds": seconds}
            continue
        shown = figures(proc.stdout)
        print("\n".join(shown), flush=True)
        summary[name] = {"exit_code": 0, "seconds": seconds, "figures": shown, "args": extra}
    path = out / "micro.json"
    try:
        earlier = json.loads(path.read_text())  # keep the figures of benchmarks not run this time
    except (OSError, ValueError):
        earlier = {}
    path.write_text(json.dumps({**earlier, **summary}, indent=2) + "\n")
    return ok


def main(argv: list[str], out_default: str) -> int:
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    names_known = available()
    p = argparse.ArgumentParser(
        prog="flight-bench micro", description="Run the micro benchmarks, each in its own process.",
        epilog="benchmarks: " + "; ".join(f"{n}: {MICRO[n]}" for n in names_known)
        + ". Arguments after -- go to each benchmark, e.g. flight-bench micro transport -- --sf 0.1 --runs 3",
    )
    p.add_argument("names", nargs="*", metavar="NAME", help=f"default: {' '.join(DEFAULT)}")
    p.add_argument("--out", default=out_default, help="where micro/NAME.txt and micro.json go (default: %(default)s)")
    args = p.parse_args(argv)
    names = args.names or [n for n in DEFAULT if n in names_known]
    unknown = [n for n in names if n not in names_known]
    if unknown:
        p.error(f"unknown micro benchmark(s) {', '.join(unknown)}; choose from {', '.join(names_known)}")
    with Progress() as progress:
        ok = run(names, extra, Path(args.out), progress)
    return 0 if ok else 1
