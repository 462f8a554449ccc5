"""``Target`` (a service or a registry, owned or not) and ``run_cases``: each case played, judged, kept, counted.

The verdicts are the worker fuzzer's (``benchmarks.fuzz.verdicts``): **crash** (the process died, or
the check after the case failed), **hang** (a call past its deadline, or the check not answered in
time), **unclear** (a traceback, a path of the code, a message over 2,000 characters, a generic
internal error). The check after each case: the service must still answer ``SELECT 1`` (planned,
run on a worker, read) within ``--health-timeout``; the registry must take a valid registration.
"""

from __future__ import annotations

import json
import re
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Self

import pyarrow as pa

from benchmarks.fuzz.cases import Case
from benchmarks.fuzz.exchange import Outcome
from benchmarks.fuzz.scripts import op
from benchmarks.fuzz.service.registry import HEALTH_INDEX, valid_body
from benchmarks.fuzz.service.runner import ServiceRunner
from benchmarks.fuzz.service.sqlproto import S, pack
from benchmarks.fuzz.settings import UNCLEAR_KEPT, WATCHDOG_GRACE
from benchmarks.fuzz.tally import Tally, log, one_line
from benchmarks.fuzz.verdicts import Verdict, classify
from benchmarks.fuzz.worker import OwnedWorker

__all__ = ["REGISTRY_LISTENING", "SERVICE_LISTENING", "Target", "run_cases"]

SERVICE_LISTENING = re.compile(r"^flight-coordinator listening on (grpc://\S+)$")
REGISTRY_LISTENING = re.compile(r"^fleet registry listening on (grpc://\S+)$")


class Target:
    """The server under test: started (and restarted after a crash or a hang) by ``start``, or fixed at ``url``."""

    def __init__(self, kind: str, start: Callable[[int], OwnedWorker] | None, url: str = "", health_timeout: float = 10.0) -> None:
        self.kind = kind
        self._start = start
        self.url = url
        self.health_timeout = health_timeout
        self.process: OwnedWorker | None = None
        self.started = 0
        self.restarts = 0

    def __enter__(self) -> Self:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.stop()

    def connect(self) -> None:
        if self._start is not None:
            self.started += 1
            self.process = self._start(self.started)
            self.url = self.process.wait_listening()

    def restart(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.restarts += 1
            self.connect()

    def health(self) -> str:
        """``ok``, ``timeout``, or why the check failed."""
        steps = ([op("register", type="register", body=json.dumps(valid_body(HEALTH_INDEX, 0)).encode())] if self.kind == "registry" else
                 [op("info", cmd=pack(S.CommandStatementQuery(query="SELECT 1 AS one")), read=True)])
        runner = ServiceRunner(self.url, self.health_timeout)
        try:
            out = runner.run(Case("health", 0, 0, "", steps))
        except (pa.ArrowException, OSError) as exc:
            return f"{type(exc).__name__}: {exc}"[:300]
        finally:
            runner.close()
        if out.timeouts:
            return "timeout"
        return "ok" if not out.statuses else f"{out.statuses[0].kind}: {out.statuses[0].message[:300]}"


def play(target: Target, case: Case, timeout: float) -> Outcome:
    """The case on a thread of its own; a watchdog covers calls that ignore their deadline."""
    box: list[Outcome] = []

    def run() -> None:
        runner = ServiceRunner(target.url, timeout)
        try:
            box.append(runner.run(case))
        except Exception:  # noqa: BLE001 - a bug of the fuzzer itself: reported, fuzzing goes on
            box.append(Outcome(internal=traceback.format_exc()))
        finally:
            runner.close()

    thread = threading.Thread(target=run, name="fuzz-service-case", daemon=True)
    thread.start()
    thread.join(timeout + WATCHDOG_GRACE)
    return box[0] if box else Outcome(wedged=True)


def judge(target: Target, case: Case, timeout: float) -> tuple[Verdict, Outcome, str]:
    offset = target.process.log_offset() if target.process is not None else 0
    out = play(target, case, timeout)
    died = target.process.died() if target.process is not None else None
    health = "not checked" if died else target.health()
    if health not in ("ok", "timeout", "not checked") and target.process is not None:
        died = target.process.died(wait=1.0)
    verdict = classify(out, died, health)
    log_text = ""
    if verdict.kind in ("crash", "hang") and target.process is not None:
        target.process.dump_stacks()
        log_text = target.process.log_since(offset)
    return verdict, out, log_text


def keep(corpus: Path, kept: Counter[tuple[str, str, str]], case: Case, verdict: Verdict, out: Outcome, log_text: str,
         most_unclear: int = UNCLEAR_KEPT) -> Path | None:
    """Every crash and hang, and the first ``most_unclear`` unclear cases of each kind, as a replayable JSON file."""
    mode = (verdict.kind, case.family, verdict.reason)
    if verdict.kind == "ok" or (verdict.kind == "unclear" and kept[mode] >= most_unclear):
        return None
    kept[mode] += 1
    corpus.mkdir(parents=True, exist_ok=True)
    if not (corpus / ".gitignore").exists():
        (corpus / ".gitignore").write_text("# fuzzer findings: never committed\n*\n")
    path = corpus / f"{verdict.kind}-{case.family}-s{case.seed}-c{case.index:05d}.json"
    record = {"format": "flight-exec-fuzz-case/1", "replay": f"python -m benchmarks.fuzz_service --replay {path}",
              "verdict": {"kind": verdict.kind, "reason": verdict.reason, "detail": verdict.detail}, "case": case.to_json(),
              "outcome": out.brief(), "log": log_text}
    path.write_text(json.dumps(record, indent=1))
    return path


def run_cases(target: Target, cases: Iterator[Case], total: int, timeout: float, corpus: Path, most_unclear: int = UNCLEAR_KEPT) -> Tally:
    tally, kept = Tally(), Counter[tuple[str, str, str]]()
    try:
        _loop(target, cases, total, timeout, (corpus, most_unclear), tally, kept)
    except KeyboardInterrupt:
        log(f"interrupted:\n{traceback.format_exc()[-1500:]}")
    tally.restarts = target.restarts
    return tally


def _loop(target: Target, cases: Iterator[Case], total: int, timeout: float, corpus: tuple[Path, int], tally: Tally,
          kept: Counter[tuple[str, str, str]]) -> None:
    started = last = time.monotonic()
    for case in cases:
        began = time.monotonic()
        verdict, out, log_text = judge(target, case, timeout)
        if out.internal:
            tally.internal += 1
            log(f"case {case.index}: fuzzer error (not counted against the {target.kind}):\n{out.internal}")
        if verdict.kind in ("crash", "hang"):
            target.restart()
        path = keep(corpus[0], kept, case, verdict, out, log_text, corpus[1])
        tally.timed(time.monotonic() - began, case)
        tally.add(case, verdict, path, time.monotonic() - began)
        if verdict.kind != "ok":
            log(f"{target.kind} case {case.index} [{case.family}] {verdict.kind} ({verdict.reason}): {one_line(verdict.detail, 300)}"
                + (f" -> {path}" if path else ""))
        if time.monotonic() - last >= 5.0:
            last = time.monotonic()
            log(f"{target.kind}: {tally.cases}/{total} cases in {last - started:.0f} s: crashes {tally.crashes}, hangs {tally.hangs}, "
                f"unclear {tally.unclear}")


def report(kind: str, tally: Tally) -> None:
    log(f"{kind}: cases and seconds per family: " + ", ".join(
        f"{f} {tally.family_cases[f]} in {tally.family_seconds[f]:.1f} s" for f in sorted(tally.family_cases)))
    log(f"{kind}: slowest cases: " + "; ".join(f"case {i} {s:.1f} s {note}" for s, i, note in tally.slowest[:5]))
    for mode, count in sorted(tally.modes.items(), key=lambda kv: (-kv[1], kv[0])):
        log(f"{count:5d} x {mode[0]} / {mode[1]} / {mode[2]}")
        for example in tally.examples.get(mode, []):
            log(f"        {example}")


def summary(kind: str, tally: Tally) -> str:
    families = ", ".join(f"{f} {tally.family_cases[f]}" for f in sorted(tally.family_cases))
    return f"{kind}_fuzz_cases: {tally.cases}, crashes: {tally.crashes}, hangs: {tally.hangs}, unclear: {tally.unclear} ({families})"


