"""``python -m benchmarks.chaos``: queries on a namespaced fleet while faults come at random, every answer checked.

    python -m benchmarks.chaos [--seconds 300] [--concurrency 4] [--workers 3] [--ways api,sql]
                               [--queries 'tpch:1,3,14;tpcds:3,7'] [--faults kill,stop,...] [--seed N]
                               [--tpch-sf 0.01] [--tpcds-sf 0.01] [--hang 120] [--out chaos-results]

For ``--seconds`` it keeps ``--concurrency`` queries running (``workload.Mix``: TPC-H and TPC-DS, through
``DistributedExec`` and through the Flight SQL service with ADBC) on a ``flight.dev.fleet.Fleet``, while
``faults.Faults`` breaks it. Each answer is compared with DuckDB's; each error is counted by kind and its
message judged (``tally``). Then the faults are undone, the queries in flight finish, the client and the
services stop, and every worker must report 0 running tasks within ``--settle`` seconds, with no process
left in the namespaces but the workers and their proxies (``rig``). The last line is the summary::

    chaos: answers A, wrong W, errors E (kind: n, ...), unclear U, hung H, faults F (kind: n, ...), leftover tasks L, stray processes P

Exit code 1 when W, U, H, L or P is not 0 (or the harness itself failed), else 0. Each wrong answer, unclear
error and hang is printed in full as it happens and written under ``--out`` (``chaos-<time>/``: the answer,
DuckDB's, the faults the query lived through, the workers' logs).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.chaos import rig
from benchmarks.chaos.faults import KINDS, Faults
from benchmarks.chaos.tally import Tally, error_kind
from benchmarks.chaos.workload import Mix, Pick, parse_queries
from benchmarks.progress import Progress
from flight.dev.fleet import Fleet

__all__ = ["main"]

REPORT_EVERY_S = 15.0
STACKS_AT = 0.8
"""The share of its deadline after which a request still in flight has every process's stacks dumped: a query that
takes that long is most likely stuck, and the dump must come before its deadline ends it."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=300.0, help="how long the load and the faults last (default: %(default)s)")
    p.add_argument("--concurrency", type=int, default=4, help="queries running at once (default: %(default)s)")
    p.add_argument("--workers", type=int, default=3, help="worker namespaces (default: %(default)s)")
    p.add_argument("--ways", default="api,sql", help="api (DistributedExec), sql (flight-coordinator via ADBC), or both")
    p.add_argument("--queries", default=None, help="'tpch:1,3,14;tpcds:3,7' ('all': a suite's every query); default: workload.DEFAULT_QUERIES")
    p.add_argument("--faults", default=",".join(KINDS), help="fault kinds to draw from (default: all: %(default)s)")
    p.add_argument("--seed", type=int, default=None, help="the random choices' seed (default: a random one, printed)")
    p.add_argument("--tpch-sf", type=float, default=0.01, help="TPC-H scale factor (default: %(default)s)")
    p.add_argument("--tpcds-sf", type=float, default=0.01, help="TPC-DS scale factor (default: %(default)s)")
    p.add_argument("--hang", type=float, default=120.0, help="seconds after which a query counts as hung (default: %(default)s)")
    p.add_argument("--settle", type=float, default=60.0, help="seconds the workers get to report 0 tasks after the load (default: %(default)s)")
    p.add_argument("--spill-mb", type=int, default=64, help="each worker's spill tmpfs, MiB (default: %(default)s)")
    p.add_argument("--worker-memory", default="256MB", help="each worker's --memory-limit (default: %(default)s)")
    p.add_argument("--out", type=Path, default=Path("chaos-results"), help="where problems are written (default: %(default)s)")
    p.add_argument("--live-tree", action="store_true",
                   help="run the working tree's code as it is at each process's start (default: a copy made at the start, for all)")
    return p


@dataclass
class Request:
    """A request in flight."""

    pick: Pick
    start: float
    out: Path
    dumped: bool = False  # the processes' stacks were dumped for it (once it outlived its deadline)


@dataclass
class Run:
    """One chaos run's state: the fleet, the client, the faults, the counts."""

    args: argparse.Namespace
    mix: Mix
    fleet: Fleet
    client: rig.ClientProcess
    faults: Faults
    out: Path
    rng: random.Random
    t0: float = field(default_factory=time.monotonic)
    tally: Tally = field(default_factory=Tally)
    inflight: dict[int, Request] = field(default_factory=dict)
    next_id: int = 0
    problems: int = 0
    broken: str | None = None
    services: list[Any] = field(default_factory=list)
    interrupted: bool = False

    def interrupt(self, signum: int, _frame: object) -> None:
        """SIGINT or SIGTERM: the load ends now, the final checks and the summary still run; a second one stops at once."""
        if self.interrupted:
            raise KeyboardInterrupt
        self.interrupted = True
        self.say(f"{signal.Signals(signum).name}: ending the load early (again to stop at once)")

    def say(self, line: str) -> None:
        print(f"[chaos {time.monotonic() - self.t0:6.1f}s] {line}", flush=True)

    def submit(self) -> None:
        pick = self.mix.pick(self.rng)
        self.next_id += 1
        out = self.fleet.dir / f"answer-{self.next_id}.arrow"
        self.inflight[self.next_id] = Request(pick, time.monotonic(), out)
        self.client.send({"id": self.next_id, "via": pick.via, "suite": pick.suite, "n": pick.n, "options": pick.options, "out": str(out)})

    def handle(self, reply: dict[str, Any]) -> None:
        f = self.inflight.pop(int(reply["id"]), None)
        if f is None:
            return  # a hung request that ended after all: already counted
        end = time.monotonic()
        where = f"{f.pick.name} via {f.pick.via} ({f.pick.shape})"
        if reply["ok"]:
            got = pa.ipc.open_file(str(f.out)).read_all()
            why = self.mix.check(f.pick, got)
            if why is None:
                self.tally.answer(f.pick.name, f.pick.via)
            else:
                self.tally.wrong += 1
                self._problem("wrong", f, end, f"WRONG ANSWER {where}: {why}", got=got, diff=why, reply=reply)
            f.out.unlink(missing_ok=True)
            return
        kind, message = error_kind(reply), str(reply.get("message", ""))
        unclear = self.tally.error(kind, message)
        if float(reply.get("seconds", 0)) >= 0.95 * self.args.hang:
            self.tally.hung += 1
            self._problem("hung", f, end, f"HUNG {where}: {kind} after {reply['seconds']}s: {message[:500]}", reply=reply)
        elif unclear is not None:
            self._problem("unclear", f, end, f"UNCLEAR ERROR {where} ({unclear}): {kind}: {message}", reply=reply)

    def dump_overdue(self) -> None:
        """A request in flight for most of its deadline is most likely stuck: every process's thread stacks go to its
        log (``faulthandler`` on SIGUSR1: the client, the services, the workers), once per request, so that a hang
        leaves evidence of where it waits (the logs are saved with the problems)."""
        now = time.monotonic()
        late = [f for f in self.inflight.values() if not f.dumped and now - f.start > STACKS_AT * self.args.hang]
        if not late:
            return
        for f in late:
            f.dumped = True
        self.say(f"{len(late)} request(s) in flight for {STACKS_AT:.0%} of the deadline: dumping every process's stacks to its log")
        for proc in [self.client.proc, *self.services, *(w.proc for w in self.fleet.workers)]:
            if proc.poll() is None:
                proc.send_signal(signal.SIGUSR1)
        try:
            self.say(f"the workers now: {self.fleet.worker_info(timeout=30.0)}")
        except Exception as exc:  # noqa: BLE001 - evidence only: the run goes on without it
            self.say(f"the workers' info could not be had: {type(exc).__name__}: {exc}")

    def check_hung(self) -> None:
        """A request the client has not answered past the hang bound (and a margin) is hung: counted, and forgotten."""
        now = time.monotonic()
        for rid, f in list(self.inflight.items()):
            if now - f.start > self.args.hang + 60.0:
                del self.inflight[rid]
                self.tally.hung += 1
                self._problem("hung", f, now, f"HUNG {f.pick.name} via {f.pick.via} ({f.pick.shape}): no outcome after {now - f.start:.0f}s")

    def _problem(self, what: str, f: Request, end: float, line: str, *, got: pa.Table | None = None, diff: str | None = None,
                 reply: dict[str, Any] | None = None) -> None:
        self.problems += 1
        faults = [x.to_json(self.t0) for x in self.faults.during(f.start, end)]
        self.say(f"{line}\n    faults meanwhile: {faults}")
        d = self.out / f"{what}-{self.problems}"
        d.mkdir(parents=True, exist_ok=True)
        info = {"query": f.pick.name, "via": f.pick.via, "shape": f.pick.shape, "options": f.pick.options, "text": self.mix.text(f.pick),
                "started": round(f.start - self.t0, 2), "ended": round(end - self.t0, 2), "difference": diff, "reply": reply,
                "faults": faults, "workers": self.fleet.worker_urls}
        (d / "info.json").write_text(json.dumps(info, indent=1, default=str))
        if got is not None:
            pq.write_table(got, d / "got.parquet")
            pq.write_table(self.mix.expected[f.pick.suite, f.pick.n], d / "duckdb.parquet")

    def report(self) -> None:
        t = self.tally
        active = ", ".join(f"{x.kind} {x.target}" for x in self.faults.active()) or "none"
        self.say(f"answers {t.answers}, wrong {t.wrong}, errors {t.n_errors}, unclear {t.n_unclear}, hung {t.hung}, "
                 f"faults {sum(self.faults.counts.values())}, in flight {len(self.inflight)}; active fault: {active}")


def _load(run: Run) -> None:
    """Keep ``--concurrency`` requests in flight until ``--seconds`` passed; then undo the faults and let the last ones end."""
    end = run.t0 + run.args.seconds
    last_report = run.t0
    stopped = False
    while True:
        now = time.monotonic()
        if not stopped and (now >= end or run.interrupted or run.faults.failure is not None):
            run.say("load over: undoing the faults, waiting for the queries in flight")
            run.faults.stop()
            run.faults.undo_all()
            stopped = True
        if not stopped:
            while len(run.inflight) < run.args.concurrency:
                run.submit()
        elif not run.inflight:
            return
        try:
            reply = run.client.reply(0.5)
        except EOFError as exc:
            run.say(f"HARNESS FAILURE: {exc}; its log: {(run.fleet.dir / 'client.log').read_text(errors='replace')[-3000:]}")
            run.broken = str(exc)
            run.faults.stop()
            return
        if reply is not None:
            run.handle(reply)
        run.dump_overdue()
        run.check_hung()
        if now - last_report >= REPORT_EVERY_S:
            run.report()
            last_report = now


def _final_checks(run: Run, services: list[Any]) -> tuple[int, list[str]]:
    """Stop the client and the services; then the workers' tasks and the namespaces' processes. Returns (leftover, stray)."""
    stray: list[str] = []
    if not run.client.close(60.0):
        stray.append("the chaos client did not end within 60 s of its input's end (killed)")
    for proc in services:
        if not rig.stop(proc, signal.SIGTERM, 30.0):
            stray.append(f"flight-coordinator (pid {proc.pid}) did not end within 30 s of SIGTERM (killed)")
        elif proc.returncode != 0:
            stray.append(f"flight-coordinator (pid {proc.pid}) exited {proc.returncode} on SIGTERM")
    left, infos = rig.leftover_tasks(run.fleet, run.args.settle)
    run.say(f"the workers after {run.args.settle:g}s at most: {infos}")
    stray += rig.stray_processes(run.fleet)
    for s in stray:
        run.say(f"STRAY: {s}")
    return left, stray


def _print_end(run: Run, left: int, stray: list[str]) -> None:
    t = run.tally
    by_way = ", ".join(f"{k}: {n}" for k, n in sorted(t.per_way.items()))
    run.say(f"answers by way: {by_way}; by query: {dict(sorted(t.per_query.items()))}")
    for kind, n in t.errors.most_common():
        tag = f", {t.unclear[kind]} unclear" if t.unclear[kind] else ""
        print(f"  error {kind}: {n}{tag}; e.g. " + " | ".join(" ".join(m.split())[:300] for m in t.examples.get(kind, [])))
    for name, n in run.faults.counts.most_common():
        print(f"  fault {name}: {n}")
    if run.faults.failure is not None:
        print(f"  the fault thread failed: {type(run.faults.failure).__name__}: {run.faults.failure}")
    print(t.summary(run.faults.counts, left, len(stray)), flush=True)


def _save_logs(run: Run) -> None:
    for i in range(run.fleet.n_workers):
        (run.out / f"w{i}.log").write_text(run.fleet.log(i))
    for name in ("client.log", "service-tpch.log", "service-tpcds.log"):
        if (run.fleet.dir / name).exists():
            shutil.copy(run.fleet.dir / name, run.out / name)


def run_chaos(args: argparse.Namespace) -> int:
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    ways = [w.strip() for w in args.ways.split(",") if w.strip()]
    progress = Progress(live=False)
    mix = Mix(parse_queries(args.queries), tpch_sf=args.tpch_sf, tpcds_sf=args.tpcds_sf, ways=ways, progress=progress)
    out = args.out / time.strftime("chaos-%Y%m%d-%H%M%S")
    print(f"[chaos] seed {seed}; {len(mix.expected)} queries x {ways}; {args.workers} workers; problems go to {out}", flush=True)
    with ExitStack() as stack:
        spill = stack.enter_context(rig.SpillDirs(args.workers, args.spill_mb))
        if spill.why_not:
            print(f"[chaos] no spill-full faults: {spill.why_not}", flush=True)
        per_worker = [["--peer-timeout", "5", "--spill-dir", str(d)] for d in spill.dirs]
        fleet = stack.enter_context(Fleet(args.workers, data_roots=mix.data_dirs, per_worker_args=per_worker, seed=seed,
                                          worker_args=["--memory-limit", args.worker_memory]))
        services, urls = [], {}
        if "sql" in ways:
            for suite, w in mix.workloads.items():
                proc, urls[suite] = rig.start_service(fleet, w.files, stack.enter_context(open(fleet.dir / f"service-{suite}.log", "w")),
                                                      query_timeout=args.hang)
                services.append(proc)
        spec = {"workers": fleet.worker_urls, "suites": mix.client_suites(), "services": urls, "threads": args.concurrency,
                "deadline": args.hang}
        client = rig.start_client(fleet, spec, stack.enter_context(open(fleet.dir / "client.log", "w")))
        kinds = tuple(k.strip() for k in args.faults.split(",") if k.strip())
        faults = Faults(fleet, kinds, seed=seed, spill_dirs=spill.dirs if spill.mounted else None)
        run = Run(args, mix, fleet, client, faults, out, random.Random(seed), services=services)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, run.interrupt)  # also where a background job was started with SIGINT ignored
        faults.start()
        try:
            _load(run)
        finally:
            faults.stop()
            faults.undo_all()
        left, stray = _final_checks(run, services)
        failed = run.tally.failed(left, len(stray)) or run.faults.failure is not None or run.broken is not None
        if failed:
            out.mkdir(parents=True, exist_ok=True)
            _save_logs(run)
        _print_end(run, left, stray)
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if args.live_tree or os.environ.get(rig.CODE_ENV):
        try:
            return run_chaos(args)
        finally:
            if os.environ.get(rig.CODE_ENV):
                shutil.rmtree(os.environ[rig.CODE_ENV], ignore_errors=True)
    out = str(args.out.resolve())
    code = rig.snapshot_code()
    print(f"[chaos] running a copy of the code, made now: {code}", flush=True)
    os.chdir(code)
    os.execve(sys.executable, [sys.executable, "-m", "benchmarks.chaos", *argv, "--out", out], {**os.environ, rig.CODE_ENV: str(code)})


if __name__ == "__main__":
    sys.exit(main())
