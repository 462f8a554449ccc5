"""The chaos run's faults: one at a time, at random, each undone after a while, every one on record.

``Faults.run`` (a thread) draws a kind and a target, does it, waits a random hold, undoes it, then
waits a random gap. The kinds (``KINDS``):

* ``kill``: SIGKILL of a worker, restarted at the same URL after the hold;
* ``stop``: SIGSTOP of a worker (a frozen process: its sockets stay open, nothing answers), SIGCONT after;
* ``partition-peers``: a worker cut off from one other worker; ``partition-coordinator``: from the coordinator;
* ``delay``: a node's link slowed (tens of ms each way, jittered); ``stall``: nothing crosses a node's link;
* ``rate-limit``: a node's link at a few Mbit/s;
* ``busy-cores``: a CPU burner (a process per core) in a worker's namespace;
* ``spill-full``: a worker's spill directory (a small tmpfs of its own) filled to the last byte by a file.

A node is a worker or the coordinator (whose link carries the API client's and the services' traffic).
``Fault`` records keep what was done and when, so a wrong answer names the faults its query lived through.
``undo_all`` puts everything back, whatever was active, for the end of the run.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flight.dev.fleet import COORDINATOR, Fleet, Node

__all__ = ["KINDS", "Fault", "Faults"]

KINDS = ("kill", "stop", "partition-peers", "partition-coordinator", "delay", "stall", "rate-limit", "busy-cores", "spill-full")
BURN = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end:\n    pass\n"
"""A burner: one busy core until its time is up (it is also killed when the fault ends)."""


@dataclass
class Fault:
    """One fault: its kind, what it hit (``w1``, ``c``, ``w0-w2``), its settings, when it began and ended (monotonic)."""

    kind: str
    target: str
    detail: str
    start: float
    end: float | None = None

    def overlaps(self, start: float, end: float) -> bool:
        return self.start <= end and (self.end is None or self.end >= start)

    def to_json(self, t0: float) -> dict[str, Any]:
        return {"kind": self.kind, "target": self.target, "detail": self.detail, "at": round(self.start - t0, 2),
                "until": None if self.end is None else round(self.end - t0, 2)}


class Faults:
    """Draws and applies faults on ``fleet`` until ``stop()``; ``spill_dirs[i]`` is worker i's spill directory."""

    def __init__(self, fleet: Fleet, kinds: tuple[str, ...], *, seed: int, spill_dirs: list[Path] | None,
                 hold: tuple[float, float] = (2.0, 10.0), gap: tuple[float, float] = (0.5, 3.0)) -> None:
        unknown = set(kinds) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}: the kinds are {', '.join(KINDS)}")
        self.fleet = fleet
        self.kinds = tuple(k for k in kinds if k != "spill-full" or spill_dirs)
        self.rng = random.Random(seed)
        self.spill_dirs = spill_dirs or []
        self.hold, self.gap = hold, gap
        self.done: list[Fault] = []
        self.counts: Counter[str] = Counter()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._burners: list[subprocess.Popen[Any]] = []
        self._thread = threading.Thread(target=self._run, name="chaos-faults", daemon=True)
        self.failure: BaseException | None = None
        self._kinds = {"kill": self._kill, "stop": self._sigstop, "partition-peers": self._partition_peers,
                       "partition-coordinator": self._partition_coordinator, "delay": self._delay, "stall": self._stall,
                       "rate-limit": self._rate_limit, "busy-cores": self._busy_cores, "spill-full": self._spill_full}

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 120.0) -> None:
        """No new fault; the one active is undone (its hold cut short); returns when the thread ended."""
        self._stop.set()
        self._thread.join(timeout)

    def active(self) -> list[Fault]:
        with self._lock:
            return [f for f in self.done if f.end is None]

    def during(self, start: float, end: float) -> list[Fault]:
        with self._lock:
            return [f for f in self.done if f.overlaps(start, end)]

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.rng.uniform(*self.gap)):
                self._one(self.rng.choice(self.kinds))
        except BaseException as exc:  # noqa: BLE001 - a harness failure ends the faults; the run reports it
            self.failure = exc

    def _one(self, kind: str) -> None:
        hold = self.rng.uniform(*self.hold)
        undo, target, detail = self._kinds[kind](hold)
        fault = Fault(kind, target, detail, time.monotonic())
        with self._lock:
            self.done.append(fault)
            self.counts[kind] += 1
        try:
            self._stop.wait(hold)
        finally:
            undo()
            fault.end = time.monotonic()

    # -- the kinds: each does its fault and returns (undo, target, detail)

    def _worker(self) -> int:
        return self.rng.randrange(self.fleet.n_workers)

    def _node(self) -> Node:
        return self.rng.choice([COORDINATOR, *range(self.fleet.n_workers)])

    def _kill(self, hold: float) -> tuple[Any, str, str]:
        i = self._worker()
        self.fleet.kill(i)
        return (lambda: self.fleet.restart(i)), f"w{i}", f"SIGKILL, restarted after {hold:.1f}s"

    def _sigstop(self, hold: float) -> tuple[Any, str, str]:
        i = self._worker()
        pid = self.fleet.workers[i].proc.pid
        os.kill(pid, signal.SIGSTOP)
        return (lambda: os.kill(pid, signal.SIGCONT)), f"w{i}", f"SIGSTOP for {hold:.1f}s"

    def _partition_peers(self, hold: float) -> tuple[Any, str, str]:
        i, j = self.rng.sample(range(self.fleet.n_workers), 2)
        self.fleet.partition(i, from_=j)
        return self.fleet.heal, f"w{i}-w{j}", f"cut for {hold:.1f}s"

    def _partition_coordinator(self, hold: float) -> tuple[Any, str, str]:
        i = self._worker()
        self.fleet.partition(i, from_=COORDINATOR)
        return self.fleet.heal, f"c-w{i}", f"cut for {hold:.1f}s"

    def _delay(self, hold: float) -> tuple[Any, str, str]:
        node = self._node()
        ms, jitter = self.rng.uniform(5, 40), self.rng.uniform(0, 10)
        self.fleet.set_delay(node, ms, jitter_ms=jitter)
        return self.fleet.clear_shapes, self.fleet.node(node), f"{ms:.0f} ms each way ± {jitter:.0f} for {hold:.1f}s"

    def _stall(self, hold: float) -> tuple[Any, str, str]:
        node = self._node()
        self.fleet.stall(node, hold)
        return self.fleet.clear_shapes, self.fleet.node(node), f"stalled {hold:.1f}s"

    def _rate_limit(self, hold: float) -> tuple[Any, str, str]:
        node = self._node()
        mbit = self.rng.choice((2, 5, 10, 25))
        self.fleet.rate_limit(node, mbit)
        return (lambda: self.fleet.rate_limit(node, None)), self.fleet.node(node), f"{mbit} Mbit/s for {hold:.1f}s"

    def _busy_cores(self, hold: float) -> tuple[Any, str, str]:
        i = self._worker()
        cores = os.cpu_count() or 1
        procs = [self.fleet.popen(i, [sys.executable, "-c", BURN, str(hold + 5.0)]) for _ in range(cores)]
        with self._lock:
            self._burners.extend(procs)

        def undo() -> None:
            for p in procs:
                p.kill()
                p.wait()
            with self._lock:
                self._burners = [b for b in self._burners if b not in procs]
        return undo, f"w{i}", f"{cores} burners for {hold:.1f}s"

    def _spill_full(self, hold: float) -> tuple[Any, str, str]:
        i = self._worker()
        ballast = self.spill_dirs[i] / "chaos-ballast"
        st = os.statvfs(self.spill_dirs[i])
        free = st.f_bavail * st.f_frsize
        with open(ballast, "wb") as f:
            try:
                os.posix_fallocate(f.fileno(), 0, free)
            except OSError:  # tmpfs may refuse the last pages: then as much as it takes
                f.write(b"\0" * max(0, free - (1 << 20)))
        return (lambda: ballast.unlink(missing_ok=True)), f"w{i}", f"{free >> 20} MiB ballast for {hold:.1f}s"

    def undo_all(self) -> None:
        """Everything back to normal, whatever is active: heal, clear, lift, continue, restart, kill burners, drop ballast."""
        self.fleet.heal()
        self.fleet.clear_shapes()
        for node in [COORDINATOR, *range(self.fleet.n_workers)]:
            self.fleet.rate_limit(node, None)
        for i, w in enumerate(self.fleet.workers):
            if w.proc.poll() is None:
                os.kill(w.proc.pid, signal.SIGCONT)
            else:
                self.fleet.restart(i)
        with self._lock:
            burners, self._burners = self._burners, []
        for p in burners:
            p.kill()
            p.wait()
        for d in self.spill_dirs:
            (d / "chaos-ballast").unlink(missing_ok=True)
