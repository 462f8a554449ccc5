"""glibc's heap in a process that reads query results: freed receive buffers kept for the next ones.

Why: gRPC receives each Flight message into buffers of glibc's ``malloc`` (pyarrow copies a
message that arrived in pieces into one block of its size: a few MB for a 64K-row batch), and
a coordinator frees them in bursts: a head stream's rows are held until their work unit is
complete (docs/architecture.md, "Losing a worker"), then handed over and dropped together. With
glibc's defaults each burst leaves a free top of heap past its trim threshold (twice the
largest mapped block freed so far, ~10 MB here), which glibc hands back to the system at once
(``madvise``), and the next unit's buffers fault the same pages in again; blocks past the mmap
threshold are mapped and unmapped one by one. On ``benchmarks/micro/transport.py`` (310 MB of
lineitem from two workers) the coordinator spent 195 ms of CPU a run against the plain pyarrow
reader's 133, most of the difference in page faults under the copy and in ``madvise``; the
same bursts made dropping a task's protobuf header trim the heap too.

So while a process reads the results of a query it coordinates (``busy``, from ``Run``; a
detached query, whose results others read, does not count), glibc's trim threshold is
``TRIM_THRESHOLD`` and its mmap threshold ``MMAP_THRESHOLD``: a free top of heap up to that size
stays for the next buffers, up to ``TRIM_THRESHOLD`` per glibc arena (the coordinator reads on a
few pool threads, each with an arena). Once no such query has run for ``IDLE_TRIM_S`` (a daemon
thread looks every ``IDLE_TRIM_S``: 2-4 s after the last one ended), what is kept is handed back
(``malloc_trim(0)``) and both thresholds go back to glibc's initial 128 KiB (fixed: glibc's
adjustment of them as blocks are freed stays off once set). So a process between two queries of a
busy client keeps its buffers, and an idle one (a notebook) has glibc's initial settings.

Left alone: a process whose user chose glibc's settings (any ``MALLOC_*`` variable, a
``glibc.malloc`` tunable), one started with ``FLIGHT_EXEC_HEAP=default``, another libc. A worker
(flight-exec's own daemon) sets the same thresholds itself at start, whatever its environment
says (``flight.worker.memory``): its shuffle reads are the same receive buffers, and it hands
memory back whenever it goes idle.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import threading
import time
import weakref

__all__ = [
    "DEFAULT_THRESHOLD", "IDLE_TRIM_S", "MMAP_THRESHOLD", "OPT_OUT", "TRIM_THRESHOLD", "busy", "busy_queries", "glibc", "idle",
    "leave_alone", "release", "set_thresholds",
]

log = logging.getLogger(__name__)

TRIM_THRESHOLD = 128 << 20
"""Free bytes at a heap's top that glibc keeps rather than hands back while queries run. Measured on the transport
benchmark, 64 MiB and 512 MiB gave the same; 128 MiB leaves room for two streams' held units of a few files each."""
MMAP_THRESHOLD = 32 << 20
"""Blocks from this size up are mapped on their own (glibc's largest dynamic threshold): a batch's receive buffer,
a few MB, comes from the heap and is reused."""
DEFAULT_THRESHOLD = 128 << 10
"""glibc's initial trim and mmap thresholds: what an idle process goes back to."""
IDLE_TRIM_S = 2.0
"""How long a process must read no query's results before what it keeps is handed back (and how often it looks):
longer than the gap between a busy client's queries."""
OPT_OUT = "FLIGHT_EXEC_HEAP"
"""``FLIGHT_EXEC_HEAP=default`` leaves glibc's heap as it is."""

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers
_M_MMAP_THRESHOLD = -3


def glibc() -> ctypes.CDLL | None:
    """The C library, if it is glibc (it has ``malloc_trim`` and ``mallopt``); None on another libc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim, libc.mallopt  # noqa: B018 - glibc has both; another libc may not
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = glibc()


def _user_chose() -> bool:
    return (os.environ.get(OPT_OUT, "").lower() == "default" or any(k.startswith("MALLOC_") for k in os.environ)
            or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""))


def set_thresholds(mmap: int = MMAP_THRESHOLD, trim: int = TRIM_THRESHOLD) -> bool:
    """Fix glibc's mmap and trim thresholds now; whether glibc took both."""
    if _LIBC is None:
        return False
    ok = bool(_LIBC.mallopt(_M_MMAP_THRESHOLD, mmap)) and bool(_LIBC.mallopt(_M_TRIM_THRESHOLD, trim))
    if not ok:
        log.debug("glibc refused the heap thresholds %d and %d", mmap, trim)
    return ok


def release() -> None:
    """Hand every free page of glibc's heaps back to the system now (``malloc_trim(0)``); nothing on another libc."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


class _Heap:
    """The process's queries that read results, and whether the thresholds are raised for them.

    An ``RLock``: a garbage collection that runs while it is held (any allocation may start one) can finalize
    an abandoned result reader, whose ``Run`` then calls ``idle`` on the same thread."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.allowed: bool | None = None  # None: not decided yet (at the first busy)
        self.raised = False  # the thresholds are ours now
        self.active: weakref.WeakSet[object] = weakref.WeakSet()  # a query dropped unfinished leaves with its object
        self.changed = 0.0  # when a query last started or ended
        self.trimmer: threading.Thread | None = None

    def busy(self, query: object) -> None:
        with self.lock:
            if self.allowed is None:
                self.allowed = _LIBC is not None and not _user_chose()
            if not self.allowed:
                return
            self.active.add(query)
            self.changed = time.monotonic()
            if not self.raised:
                self.raised = set_thresholds()
            if self.trimmer is None:
                self.trimmer = threading.Thread(target=self.trim_when_idle, name="flight-heap-trim", daemon=True)
                self.trimmer.start()

    def idle(self, query: object) -> None:
        with self.lock:
            if query in self.active:
                self.active.discard(query)
                self.changed = time.monotonic()

    def trim_when_idle(self) -> None:
        while True:
            time.sleep(IDLE_TRIM_S)
            with self.lock:
                due = self.raised and not self.active and time.monotonic() - self.changed >= IDLE_TRIM_S
                if due:
                    set_thresholds(DEFAULT_THRESHOLD, DEFAULT_THRESHOLD)
                    self.raised = False
            if due:
                release()


def _forked() -> None:
    """A forked child (multiprocessing, a Spark Python worker) has none of the parent's threads, and may have forked
    while one held the lock: it starts afresh, with glibc's initial thresholds, and keeps the parent's decision."""
    allowed, raised = _HEAP.allowed, _HEAP.raised
    _Heap.__init__(_HEAP)
    _HEAP.allowed = allowed
    if raised:
        set_thresholds(DEFAULT_THRESHOLD, DEFAULT_THRESHOLD)


_HEAP = _Heap()
os.register_at_fork(after_in_child=_forked)


def busy(query: object) -> None:
    """``query`` (an object that lives as long as it runs) reads results in this process: raise the thresholds (the
    first time: unless the user chose glibc's settings, or ``leave_alone``) and keep them until no query runs."""
    _HEAP.busy(query)


def idle(query: object) -> None:
    """``query`` ended (again, or for a query never counted: nothing)."""
    _HEAP.idle(query)


def busy_queries() -> int:
    """How many queries this process counts as reading results now."""
    with _HEAP.lock:
        return len(_HEAP.active)


def leave_alone() -> None:
    """This process sets glibc's heap itself (a worker does, at start): ``busy`` changes nothing here."""
    with _HEAP.lock:
        _HEAP.allowed = False
