"""``Fuzzer``: runs cases against one worker, classifies each, keeps failures, restarts an owned worker when it broke."""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import pyarrow as pa
import pyarrow.flight as fl
from google.protobuf.message import DecodeError

from benchmarks.fuzz.data import data_dir_in, write_data_files
from benchmarks.fuzz.exchange import Outcome
from benchmarks.fuzz.generator import seed_case
from benchmarks.fuzz.proto import P
from benchmarks.fuzz.runner import Runner
from benchmarks.fuzz.seeds import all_seed_kinds
from benchmarks.fuzz.settings import HEALTH_TIMEOUT, RECYCLE_THREADS, RSS_EVERY, RSS_WARMUP, START_TIMEOUT, UNCLEAR_KEPT, WATCHDOG_GRACE
from benchmarks.fuzz.tally import RssWatch, Tally, log, one_line
from benchmarks.fuzz.verdicts import Verdict, check_health, classify, clean_message
from benchmarks.fuzz.worker import WorkerPool, crash_site, worker_accepts

if TYPE_CHECKING:
    from benchmarks.fuzz.cases import Case
    from benchmarks.fuzz.worker import OwnedWorker

__all__ = ["Fuzzer"]


class Fuzzer:
    """Runs cases against one worker, classifies each, keeps failures, restarts an owned worker when it broke."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.timeout: float = args.timeout
        self.health_timeout: float = args.health_timeout
        self.corpus = Path(args.corpus)
        self.own_workdir = args.workdir is None
        self.workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="fuzz-worker-"))
        self.data_dir = data_dir_in(self.workdir)
        worker_args = list(args.worker_arg or ())
        if not args.url and worker_accepts("--data-root"):
            worker_args += ["--data-root", str(self.data_dir)]  # the file readers read only there
        self.pool = None if args.url else WorkerPool(self.workdir, worker_args)
        self.worker: OwnedWorker | None = None
        self.fixed_url: str | None = args.url
        self.url = ""
        self.client: fl.FlightClient | None = None
        self.tally = Tally()
        self.kept: Counter[tuple[str, str, str]] = Counter()
        self.stopped = False
        self.last_seconds = 0.0
        self.first_case: int | None = None  # the first case the current worker ran
        self.check_alone = not args.replay
        self.rss = RssWatch(getattr(args, "rss_every", RSS_EVERY))

    def __enter__(self) -> Self:
        write_data_files(self.data_dir)
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close_client()
        if self.worker is not None:
            self.worker.stop()
        if self.pool is not None:
            self.pool.close()
        if self.own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def connect(self) -> None:
        if self.pool is not None:
            self.worker = self.pool.next()
            self.url = self.worker.url
        else:
            self.url = str(self.fixed_url)
        self.client = fl.connect(self.url)

    def protocol_version(self) -> int:
        """The worker's protocol version (``info`` action), which the seeds must speak to be accepted."""
        assert self.client is not None
        (result,) = list(self.client.do_action(fl.Action("info", b""), options=fl.FlightCallOptions(timeout=START_TIMEOUT)))
        return int(P.WorkerInfo.FromString(result.body.to_pybytes()).protocol_version)

    def close_client(self) -> None:
        if self.client is not None:
            with contextlib.suppress(pa.ArrowException, OSError):
                self.client.close()
            self.client = None

    def restart(self) -> None:
        started = time.monotonic()
        self.close_client()
        if self.worker is not None:
            self.worker.kill()
        self.tally.restarts += 1
        self.first_case = None
        self.connect()
        self.tally.restart_seconds += time.monotonic() - started

    # -- one case

    def play(self, case: Case) -> Outcome:
        """Run the case on its own thread; a watchdog covers calls that ignore their deadline."""
        assert self.client is not None
        runner = Runner(self.client, self.url, self.timeout, self.data_dir)
        box: list[Outcome] = []

        def target() -> None:
            try:
                box.append(runner.run(case))
            except Exception:  # noqa: BLE001 - a bug of the fuzzer itself: report it, keep fuzzing
                box.append(Outcome(internal=traceback.format_exc()))

        thread = threading.Thread(target=target, name="fuzz-case", daemon=True)
        thread.start()
        thread.join(self.timeout + WATCHDOG_GRACE)
        return box[0] if box else Outcome(wedged=True)

    def judge(self, case: Case, timed: bool = True) -> tuple[Verdict, Outcome, str]:
        if self.first_case is None:
            self.first_case = case.index
        offset = self.worker.log_offset() if self.worker is not None else 0
        started = time.monotonic()
        out = self.play(case)
        died = self.worker.died() if self.worker is not None else None
        health = "not checked" if died else check_health(self.client, self.health_timeout) if self.client else "no client"
        if health not in ("ok", "timeout", "not checked") and self.worker is not None:
            died = self.worker.died(wait=1.0)  # unreachable: usually a process that is still being torn down
        verdict = classify(out, died, health)
        self.last_seconds = time.monotonic() - started
        if timed:
            self.tally.timed(self.last_seconds, case)
        worker_log = ""
        if verdict.kind in ("crash", "hang") and self.worker is not None:
            self.worker.dump_stacks()
            worker_log = self.worker.log_since(offset)
            if verdict.kind == "crash" and (site := crash_site(worker_log)):
                verdict = Verdict(verdict.kind, f"{verdict.detail}: {site}", verdict.reason)
        return verdict, out, worker_log

    def handle(self, case: Case, verdict: Verdict, out: Outcome, worker_log: str) -> Path | None:
        if out.internal:
            self.tally.internal += 1
            log(f"case {case.index}: fuzzer error (not counted as a worker failure):\n{out.internal}")
        self.tally.expected_waits += out.expected_waits
        seconds, extra = self.last_seconds, dict[str, Any]()
        if verdict.kind in ("crash", "hang"):
            since = self.first_case if self.first_case is not None else case.index
            self.recover(verdict)
            rerun = verdict.kind == "crash" or verdict.reason == "health-timeout"  # deadline hangs would cost another 10 s
            if rerun and self.worker is not None and self.check_alone and since < case.index:
                verdict, extra = self.rerun_alone(case, verdict, since)
        kept = self.keep(case, verdict, out, worker_log, extra)
        self.tally.add(case, verdict, kept, seconds)
        if verdict.kind != "ok":
            where = f" -> {kept}" if kept else ""
            log(f"case {case.index} [{case.family}] {verdict.kind} ({verdict.reason}): {one_line(verdict.detail, 300)}{where}")
        if verdict.kind not in ("crash", "hang") and self.worker is not None and (threads := self.worker.threads()) > RECYCLE_THREADS:
            self.tally.recycled.append(f"case {case.index} left {threads} threads: {case.note[:120]}")
            self.restart()
        return kept

    def rerun_alone(self, case: Case, verdict: Verdict, since: int) -> tuple[Verdict, dict[str, Any]]:
        """Run a failing case again on the fresh worker: a failure that needs earlier cases (memory one of them
        corrupted, work one of them left running) still counts, but its report must say which cases to replay together."""
        again, _, _ = self.judge(case, timed=False)
        if again.kind in ("crash", "hang"):
            self.restart()
        if again.kind == verdict.kind:
            return verdict, {"reproduces_alone": True}
        count = case.index - since + 1
        command = f"python -m benchmarks.fuzz_worker --seed {case.seed} --start {since} --cases {count}"
        detail = f"{verdict.detail} [alone it passes; cases {since}..{case.index} on one worker fail: {command}]"
        return Verdict(verdict.kind, detail, verdict.reason), {"reproduces_alone": False, "replay_together": command}

    def recover(self, verdict: Verdict) -> None:
        if self.worker is not None:
            self.restart()
            return
        if verdict.kind == "crash" and not self.wait_healthy(30.0):
            log(f"the worker at {self.url} is down and is not ours to restart; stopping")
            self.stopped = True

    def wait_healthy(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.close_client()
            self.client = fl.connect(self.url)
            if check_health(self.client, self.health_timeout) == "ok":
                return True
            threading.Event().wait(0.5)
        return False

    def keep(self, case: Case, verdict: Verdict, out: Outcome, worker_log: str, extra: dict[str, Any]) -> Path | None:
        """Every crash and hang, and the first few unclear cases of each kind, as a replayable JSON file."""
        mode = (verdict.kind, case.family, verdict.reason)
        if verdict.kind == "ok" or (verdict.kind == "unclear" and self.kept[mode] >= UNCLEAR_KEPT):
            return None
        self.kept[mode] += 1
        self.corpus.mkdir(parents=True, exist_ok=True)
        ignore = self.corpus / ".gitignore"
        if not ignore.exists():
            ignore.write_text("# fuzzer findings: never committed\n*\n")
        path = self.corpus / f"{verdict.kind}-{case.family}-s{case.seed}-c{case.index:05d}.json"
        record = {
            "format": "flight-exec-fuzz-case/1",
            "replay": f"python -m benchmarks.fuzz_worker --replay {path}",
            "verdict": {"kind": verdict.kind, "reason": verdict.reason, "detail": verdict.detail},
            "case": case.to_json(),
            "outcome": out.brief(),
            "worker_log": worker_log,
            **extra,
        }
        path.write_text(json.dumps(record, indent=1))
        return path

    # -- many cases

    def run(self, cases: Iterator[Case], total: int) -> Tally:
        started = last = time.monotonic()
        try:
            for n, case in enumerate(cases, 1):
                verdict, out, worker_log = self.judge(case)
                self.handle(case, verdict, out, worker_log)
                self.rss.after(self.worker, case, self.tally, self._idle, last=n == total)
                if self.stopped:
                    break
                if time.monotonic() - last >= 2.0:
                    last = time.monotonic()
                    self.progress(total, last - started)
        except KeyboardInterrupt:
            log("interrupted")
        self.progress(total, time.monotonic() - started)
        return self.tally

    def _idle(self) -> bool:
        """Whether the worker runs no task (its ``info``); False when it does not answer."""
        try:
            with fl.connect(self.url) as client:
                (result,) = list(client.do_action(fl.Action("info", b""), options=fl.FlightCallOptions(timeout=HEALTH_TIMEOUT)))
            return int(P.WorkerInfo.FromString(result.body.to_pybytes()).running_tasks) == 0
        except (pa.ArrowException, OSError, ValueError, DecodeError):
            return False

    def progress(self, total: int, elapsed: float) -> None:
        t = self.tally
        rate = t.cases / elapsed if elapsed > 0 else 0.0
        log(f"{t.cases}/{total} cases in {elapsed:.0f} s ({rate:.0f}/s): crashes {t.crashes}, hangs {t.hangs}, "
            f"unclear {t.unclear}, worker restarts {t.restarts}")

    def report(self) -> None:
        t = self.tally
        log(f"expected waits (DoGets that rightly waited): {t.expected_waits}; fuzzer errors: {t.internal}")
        log(f"seconds spent in crash and hang cases: {t.failure_seconds:.0f}; restarting the worker: {t.restart_seconds:.0f}")
        log("cases and seconds per family: " + ", ".join(
            f"{f} {t.family_cases[f]} in {t.family_seconds[f]:.1f} s" for f in sorted(t.family_cases)))
        log("slowest cases: " + "; ".join(f"case {i} {s:.1f} s {note}" for s, i, note in t.slowest[:5]))
        if t.recycled:
            log(f"worker swapped for a fresh one {len(t.recycled)} times, after: " + "; ".join(t.recycled[:5]))
        if t.rss_growth_mb is not None:
            base = f"{self.rss.base_kb / 1024:.0f} MiB" if self.rss.base_kb else f"none (fewer than {RSS_WARMUP} cases)"
            log(f"worker RSS: idle baseline {base}, largest idle growth {t.rss_growth_mb:.0f} MiB"
                + (f" ({t.rss_worst})" if t.rss_worst else ""))
            log(f"worker RSS peak while a case held memory: +{self.rss.peak_mb:.0f} MiB ({self.rss.peak_note})")
            if self.rss.samples:
                log(f"worker RSS when idle, every {self.rss.every} cases (case: MiB): "
                    + ", ".join(f"{i}: {kb / 1024:.0f}" for i, kb in self.rss.samples))
        for mode, count in sorted(t.modes.items(), key=lambda kv: (-kv[1], kv[0])):
            log(f"{count:5d} x {mode[0]} / {mode[1]} / {mode[2]}")
            for example in t.examples.get(mode, []):
                log(f"        {example}")

    def check_seeds(self) -> int:
        """Every unmutated seed must be accepted and finish without an error (else the fuzzer only tests rejections)."""
        failures = 0
        for index, (kind, template) in enumerate(all_seed_kinds()):
            case = seed_case(kind, template, index)
            verdict, out, _ = self.judge(case)
            finished = any(f.endswith(": finished") for f in out.frames)
            if verdict.kind != "ok" or out.statuses or out.error_infos or not finished:
                failures += 1
                log(f"seed {kind}/{template}: {verdict.kind} {verdict.detail} statuses={[(s.call, clean_message(s.message)) for s in out.statuses]} "
                    f"errors={out.error_infos} frames={out.frames}")
                if verdict.kind in ("crash", "hang"):
                    self.recover(verdict)
        log(f"{len(all_seed_kinds()) - failures}/{len(all_seed_kinds())} seeds ran cleanly")
        return 1 if failures else 0
