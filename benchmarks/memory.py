"""Peak resident memory of the processes an engine runs in, per timed run (Linux ``/proc``).

Method: before a run, each process's RSS high-water mark (``VmHWM`` in
``/proc/PID/status``) is reset by writing ``5`` to ``/proc/PID/clear_refs``
(Linux >= 4.0; allowed for our own processes and their children); after the
run, the engine's peak is the **sum of the processes' VmHWM**. Each process's
figure is exact; their peaks need not coincide, so the sum is an upper bound
of the set's simultaneous peak. The high-water mark starts from the RSS at the
reset, so a process's resident baseline (interpreter, libraries, a JVM's heap
in use, caches) is part of the figure.

Where the reset is not allowed, a background thread samples the sum of
``VmRSS`` every 20 ms instead (``method`` says which was used). Without
``/proc`` (not Linux) the peak is ``None``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType

__all__ = ["PeakRSS", "children_of", "rss_bytes"]

log = logging.getLogger(__name__)

_PROC = Path("/proc")
_SAMPLE_SECONDS = 0.02


def _status_kib(pid: int, field: str) -> int | None:
    try:
        text = (_PROC / str(pid) / "status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return None


def rss_bytes(pid: int) -> int | None:
    """The current resident set size of ``pid``, or None when it cannot be read."""
    kib = _status_kib(pid, "VmRSS")
    return None if kib is None else kib * 1024


def children_of(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children, their children, ...; no zombies), from ``/proc/*/stat``."""
    parents: dict[int, int] = {}
    for entry in _PROC.glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'.
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] in ("Z", "X"):  # a zombie holds no memory, and its entry is about to go
            continue
        parents[int(entry.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        kids = [p for p, pp in parents.items() if pp == parent]
        found.extend(kids)
        frontier.extend(kids)
    return found


def _reset_hwm(pid: int) -> bool:
    try:
        with open(_PROC / str(pid) / "clear_refs", "w") as f:
            f.write("5")
    except OSError as exc:
        log.debug("cannot reset the RSS high-water mark of pid %d: %s", pid, exc)
        return False
    return True


class PeakRSS:
    """``with PeakRSS(pids) as peak: ...`` then ``peak.bytes`` (None when unknown), ``peak.parts`` and ``peak.method``."""

    def __init__(self, pids: Iterable[int]) -> None:
        self.pids: Sequence[int] = list(pids)
        self.bytes: int | None = None
        self.parts: list[int | None] = []
        """Each process's own peak (or None), in the order of ``pids``; empty when sampled."""
        self.method = "none"
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None
        self._sampled = 0

    def __enter__(self) -> PeakRSS:
        if not self.pids or not _PROC.is_dir():
            return self
        if all(_reset_hwm(pid) for pid in self.pids):
            self.method = "VmHWM"
        else:
            self.method = "sampled VmRSS"
            self._sampler = threading.Thread(target=self._sample, name="peak-rss", daemon=True)
            self._sampler.start()
        return self

    def _sample(self) -> None:
        while True:
            total = sum(rss_bytes(pid) or 0 for pid in self.pids)
            self._sampled = max(self._sampled, total)
            if self._stop.wait(_SAMPLE_SECONDS):
                return

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.method == "VmHWM":
            peaks = [_status_kib(pid, "VmHWM") for pid in self.pids]
            self.parts = [None if p is None else p * 1024 for p in peaks]
            self.bytes = sum(p for p in self.parts if p is not None)
        elif self._sampler is not None:
            self._stop.set()
            self._sampler.join()
            self.bytes = self._sampled
