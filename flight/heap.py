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

So the first query a process coordinates sets a fixed trim threshold (``TRIM_THRESHOLD``) and
mmap threshold (``MMAP_THRESHOLD``): a free top of heap up to that size stays for the next
buffers. What is kept so is handed back once the process coordinates nothing for ``IDLE_TRIM_S``
(``busy``/``idle`` around each query, a daemon thread that calls ``malloc_trim(0)``): a process
between two queries of a busy client keeps its buffers, an idle one (a notebook, a
``flight-coordinator`` between its clients' queries) holds no more than glibc's defaults would. Nothing changes where the user chose glibc's
settings already (``MALLOC_*_`` variables, ``glibc.malloc`` tunables), where
``FLIGHT_EXEC_HEAP=default`` says to leave them, or on another libc. A worker sets the same
thresholds itself at start (``flight.worker.memory``): its shuffle reads are the same receive
buffers.
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
    "IDLE_TRIM_S", "MMAP_THRESHOLD", "TRIM_THRESHOLD", "busy", "glibc", "idle", "keep_receive_buffers", "leave_alone", "release",
    "set_thresholds",
]

log = logging.getLogger(__name__)

TRIM_THRESHOLD = 128 << 20
"""Free bytes at a heap's top that glibc keeps rather than hands back (its default: 128 KiB, rising with freed mapped
blocks). Measured on the transport benchmark, 64 MiB and 512 MiB gave the same; 128 MiB leaves room for two streams'
held units of a few files each."""
MMAP_THRESHOLD = 32 << 20
"""Blocks from this size up are mapped on their own (glibc's largest dynamic threshold): a batch's receive buffer,
a few MB, comes from the heap and is reused."""
IDLE_TRIM_S = 2.0
"""How long a process that keeps freed buffers must coordinate nothing before they are handed back (and how often it
looks): longer than the gap between a busy client's queries."""
OPT_OUT = "FLIGHT_EXEC_HEAP"
"""``FLIGHT_EXEC_HEAP=default`` leaves glibc's heap as it is."""

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers
_M_MMAP_THRESHOLD = -3
_USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_ARENA_MAX")


def glibc() -> ctypes.CDLL | None:
    """The C library, if it is glibc (it has ``malloc_trim`` and ``mallopt``); None on another libc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim, libc.mallopt  # noqa: B018 - glibc has both; another libc may not
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = glibc()
_lock = threading.Lock()
_decided = False
_kept = False  # the thresholds are ours: what they keep is handed back when idle
_active: weakref.WeakSet[object] = weakref.WeakSet()  # queries running (a query dropped unfinished leaves with its object)
_changed = 0.0  # when a query last started or ended
_used = False  # a query ran since the heaps were last trimmed


def _user_chose() -> bool:
    return (os.environ.get(OPT_OUT, "").lower() == "default" or any(v in os.environ for v in _USER_SETTINGS)
            or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""))


def keep_receive_buffers() -> bool:
    """Set the thresholds above, once per process (later calls do nothing); whether they were set."""
    global _decided
    with _lock:
        if _decided:
            return False
        _decided = True
        global _kept
        _kept = not _user_chose() and set_thresholds()
        if _kept:
            threading.Thread(target=_trim_when_idle, name="flight-heap-trim", daemon=True).start()
        return _kept


def busy(query: object) -> None:
    """``query`` (any object that lives as long as it runs) started: the heaps are in use."""
    global _changed, _used
    with _lock:
        _active.add(query)
        _changed, _used = time.monotonic(), True


def idle(query: object) -> None:
    """``query`` ended (calling it again, or for a query never started, does nothing)."""
    global _changed
    with _lock:
        if query in _active:
            _active.discard(query)
            _changed = time.monotonic()


def _trim_when_idle() -> None:
    global _used
    while True:
        time.sleep(IDLE_TRIM_S)
        with _lock:
            due = _used and not _active and time.monotonic() - _changed >= IDLE_TRIM_S
            if due:
                _used = False
        if due:
            release()


def set_thresholds() -> bool:
    """Fix glibc's mmap and trim thresholds at ``MMAP_THRESHOLD`` and ``TRIM_THRESHOLD`` now; whether glibc took both."""
    if _LIBC is None:
        return False
    ok = bool(_LIBC.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(_LIBC.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    if not ok:
        log.debug("glibc refused the heap thresholds: keeping its defaults")
    return ok


def leave_alone() -> None:
    """This process sets glibc's heap itself (a worker does, at start): ``keep_receive_buffers`` does nothing here."""
    global _decided
    with _lock:
        _decided = True


def release() -> None:
    """Hand every free page of glibc's heaps back to the system now (``malloc_trim(0)``); nothing on another libc."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
