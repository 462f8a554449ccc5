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
buffers. The price: a process that read results keeps up to ``TRIM_THRESHOLD`` of free heap per
glibc arena it read them on (the coordinator reads on a few pool threads) until it allocates
again or calls ``malloc_trim(0)`` (``release()``). Nothing changes where the user chose glibc's
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

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "glibc", "keep_receive_buffers", "leave_alone", "release", "set_thresholds"]

log = logging.getLogger(__name__)

TRIM_THRESHOLD = 128 << 20
"""Free bytes at a heap's top that glibc keeps rather than hands back (its default: 128 KiB, rising with freed mapped
blocks). Measured on the transport benchmark, 64 MiB and 512 MiB gave the same; 128 MiB leaves room for two streams'
held units of a few files each."""
MMAP_THRESHOLD = 32 << 20
"""Blocks from this size up are mapped on their own (glibc's largest dynamic threshold): a batch's receive buffer,
a few MB, comes from the heap and is reused."""
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
        return not _user_chose() and set_thresholds()


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
