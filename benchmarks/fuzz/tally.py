"""What a run counted: verdicts per family and reason, time per family, and the worker's idle RSS (``RssWatch``)."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from benchmarks.fuzz.settings import RSS_EVERY, RSS_NOTE_MB, RSS_WARMUP, SETTLE_MAX_S, SETTLE_S, SUMMARY

if TYPE_CHECKING:
    from benchmarks.fuzz.cases import Case
    from benchmarks.fuzz.verdicts import Verdict
    from benchmarks.fuzz.worker import OwnedWorker

__all__ = ["RssWatch", "Tally", "log", "one_line"]


# -------------------------------------------------------------------- the loop


@dataclass
class Tally:
    cases: int = 0
    crashes: int = 0
    hangs: int = 0
    unclear: int = 0
    restarts: int = 0
    restart_seconds: float = 0.0
    failure_seconds: float = 0.0
    expected_waits: int = 0
    internal: int = 0
    modes: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    examples: dict[tuple[str, str, str], list[str]] = field(default_factory=dict)
    slowest: list[tuple[float, int, str]] = field(default_factory=list)
    recycled: list[str] = field(default_factory=list)
    family_seconds: dict[str, float] = field(default_factory=dict)
    family_cases: Counter[str] = field(default_factory=Counter)
    rss_growth_mb: float | None = None
    """The largest RSS of a worker after a case minus its baseline (``RssWatch``); None: not measured."""
    rss_worst: str = ""

    def timed(self, seconds: float, case: Case) -> None:
        """Time per family, and the ten slowest cases: slow is not a failure, but worth a look."""
        self.family_seconds[case.family] = self.family_seconds.get(case.family, 0.0) + seconds
        self.family_cases[case.family] += 1
        self.slowest.append((seconds, case.index, f"[{case.family}] {case.note[:150]}"))
        self.slowest.sort(reverse=True)
        del self.slowest[10:]

    def line(self) -> str:
        growth = "n/a" if self.rss_growth_mb is None else f"{self.rss_growth_mb:.0f}"
        return SUMMARY.format(n=self.cases, c=self.crashes, h=self.hangs, u=self.unclear, g=growth)

    def add(self, case: Case, verdict: Verdict, kept: Path | None, seconds: float) -> None:
        self.cases += 1
        if verdict.kind == "ok":
            return
        if verdict.kind in ("crash", "hang"):
            self.failure_seconds += seconds
        setattr(self, {"crash": "crashes", "hang": "hangs", "unclear": "unclear"}[verdict.kind],
                getattr(self, {"crash": "crashes", "hang": "hangs", "unclear": "unclear"}[verdict.kind]) + 1)
        mode = (verdict.kind, case.family, verdict.reason)
        self.modes[mode] += 1
        examples = self.examples.setdefault(mode, [])
        if len(examples) < 3:
            examples.append(f"case {case.index}: {one_line(case.note, 160)} | {one_line(verdict.detail, 160)}" + (f" -> {kept}" if kept else ""))


def log(message: str) -> None:
    print(f"[fuzz] {message}", file=sys.stderr, flush=True)


def one_line(text: str, most: int) -> str:
    """``text`` cut to ``most`` characters, newlines shown as \\n (error texts may hold whole schemas)."""
    return text[:most].replace("\n", "\\n")


class RssWatch:
    """The owned worker's RSS once it is idle again, against its baseline (the same after its first RSS_WARMUP cases).

    A flood case makes a worker *hold* memory while it runs (an unread output buffer up to
    its 192 MiB bound: tests/worker/test_memory_bounds.py checks those bounds); what must not
    happen is that the worker *keeps* it. So every RSS_EVERY cases, and at the baseline and the
    end, the fuzzer waits until the worker runs no task and its RSS stops falling (an idle
    worker collects garbage and trims its heaps within two seconds: ``release_idle_memory``),
    and takes that as a settled sample. ``max_rss_growth_mb`` is the largest settled sample
    minus the baseline; the largest RSS right after any case is reported beside it as the peak.
    A worker swapped for a fresh one (a crash, a hang, too many threads) gets a baseline of its own.
    """

    def __init__(self, every: int = RSS_EVERY) -> None:
        self.every = max(1, every)
        self.pid = 0
        self.cases = 0
        self.base_kb = 0
        self.peak_mb = 0.0
        self.peak_note = ""
        self.samples: list[tuple[int, int]] = []  # (case index, settled RSS KiB) of the current worker

    def settled_kb(self, worker: OwnedWorker, idle: Callable[[], bool]) -> int:
        """The worker's RSS once it runs no task and has not shrunk for SETTLE_S (at most SETTLE_MAX_S)."""
        end = time.monotonic() + SETTLE_MAX_S
        while not idle() and time.monotonic() < end:
            time.sleep(0.1)
        last, steady_since = worker.rss_kb(), time.monotonic()
        while time.monotonic() < end and time.monotonic() - steady_since < SETTLE_S:
            time.sleep(0.1)
            now = worker.rss_kb()
            if now < last - 1024:
                last, steady_since = now, time.monotonic()
        return last

    def after(self, worker: OwnedWorker | None, case: Case, tally: Tally, idle: Callable[[], bool], last: bool = False) -> None:
        if worker is None or worker.proc is None:
            return
        if worker.proc.pid != self.pid:
            self.pid, self.cases, self.base_kb, self.samples = worker.proc.pid, 0, 0, []
        self.cases += 1
        rss = worker.rss_kb()
        if not rss:
            return
        if self.base_kb and (rss - self.base_kb) / 1024 > self.peak_mb:
            self.peak_mb = (rss - self.base_kb) / 1024
            self.peak_note = f"{rss / 1024:.0f} MiB after case {case.index} [{case.family}] {case.note[:120]}"
        if self.cases == RSS_WARMUP:
            self.base_kb = self.settled_kb(worker, idle)
            log(f"worker RSS baseline (idle, after its first {RSS_WARMUP} cases): {self.base_kb / 1024:.0f} MiB")
            if os.environ.get("FUZZ_MEMDIAG"):
                os.kill(worker.proc.pid, signal.SIGUSR2)
            tally.rss_growth_mb = tally.rss_growth_mb or 0.0
            return
        if not self.base_kb:
            tally.rss_growth_mb = tally.rss_growth_mb or 0.0
            return
        if self.cases % self.every and not last:
            return
        settled = self.settled_kb(worker, idle)
        self.samples.append((case.index, settled))
        growth = (settled - self.base_kb) / 1024
        if growth > RSS_NOTE_MB:  # what a large sample looked like: the worker still busy, or its threads
            log(f"idle RSS after case {case.index}: {settled / 1024:.0f} MiB (+{growth:.0f}), "
                f"{worker.threads()} threads, {'idle' if idle() else 'still running a task'}")
            if os.environ.get("FUZZ_MEMDIAG"):  # the worker runs benchmarks.memdiag: it reports where the memory is
                os.kill(worker.proc.pid, signal.SIGUSR2)
        if tally.rss_growth_mb is None or growth > tally.rss_growth_mb:
            tally.rss_growth_mb = growth
            tally.rss_worst = f"{settled / 1024:.0f} MiB idle after case {case.index} [{case.family}] {case.note[:120]}"
