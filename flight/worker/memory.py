"""Giving memory back: what a worker frees must leave the process, not stay in its heaps.

Why: after 2,000 hostile fuzz cases an idle worker was 300-550 MiB above where it started,
with no task left. Three holders keep freed memory from the system:

* Python's cyclic garbage: a stopped task's frames, errors and readers wait for the
  collector, and an idle worker allocates too little to trigger it;
* Arrow's allocator, mimalloc 3, which keeps a thread's freed pages in that thread's heap: a
  page freed from another thread only becomes free when its owner allocates again, and an
  idle thread never does. A heap goes back to the shared arenas, where a collection can free
  it, only when its thread ends. After 1,880 fuzz cases an idle worker still had 160 threads
  (64 in Arrow's I/O pool, the rest ``flight.threads``' idle ones, which wait 30 s) and was
  +200 MiB over its start, with 0 bytes allocated in Arrow's pool;
* glibc's heap, where each thread that allocates gets an arena of its own (up to eight per
  core) and a freed block only leaves once its arena's top is free: fuzzing left 469 MB of
  heap with 155 MB in use.

So the worker takes Arrow's **jemalloc** pool instead of mimalloc (``use_jemalloc``, at start,
before anything is allocated): jemalloc's arenas are shared by threads, a block freed from any
thread goes back to its arena at once (only small blocks wait in a per-thread cache), and
``release_unused`` purges every arena's free pages. Measured on the 2,000-case fuzz run with
``--seed 20261122``: the worst idle sample +295 MiB over the baseline with mimalloc, +143 (and
+178 with pages purged at once, ``jemalloc_set_decay_ms(0)``: not taken, it costs page faults
while busy) with jemalloc. It also caps glibc at ``MALLOC_ARENAS`` arenas and fixes its mmap
and trim thresholds (``limit_malloc_arenas``) before its threads start (a worker's allocations are few and
large: Arrow and DuckDB have allocators of their own), and, once it becomes idle
(``release_idle_memory``, run by the watchdog within a second): ends the idle threads of
``flight.threads`` and of Arrow's I/O pool (shrunk to one thread until they are gone, then given
its size back: Arrow starts threads again as work comes; a task that arrives meanwhile has it back
within 10 ms), collects garbage,
and purges and trims both heaps. Arrow's compute pool is never resized: it was, until an Acero
plan started during the resize was found losing rows (the CPU pool's size is what Acero sizes its
per-thread state by; ``tests/worker/test_memory_bounds.py`` has the case). DuckDB's allocator (jemalloc of its own) flushes itself
(docs/engine.md). Trimming applies on glibc only.

``pa.set_memory_pool`` only changes the pool pyarrow's own Python calls use. Arrow's C++ code (the
Flight server reading a call's batches, Acero, the IPC reader) allocates from the C++ default pool,
which Arrow chooses once, at import, from ``ARROW_DEFAULT_MEMORY_POOL``: set after the import it
changes nothing, and the worker's batches went on living in mimalloc's heaps (memdiag showed
330 MiB resident in mimalloc's arena, with the jemalloc pool at 0 bytes). So the worker's launchers
set it (``WORKER_ENV``), and ``flight-worker`` started without it runs itself again with it
(``reexec_with_arrow_pool``, before anything else: the same process id, the same arguments).

The system allocator for Arrow was tried too: it gives memory back whichever thread frees
it, but a worker started so wedged in 16 of its first 150 fuzz cases (threads waiting for the GIL
behind Acero's and DuckDB's locks): not taken. A pyarrow built without jemalloc keeps its default
pool (mimalloc), and the idle release above is what bounds it.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence

import pyarrow as pa

from flight.heap import glibc, leave_alone, release, set_thresholds
from flight.threads import retire_idle

__all__ = [
    "MALLOC_ARENAS", "WORKER_ENV", "limit_malloc_arenas", "reexec_with_arrow_pool", "release_idle_memory", "resident_bytes",
    "trim_busy_memory", "use_jemalloc",
]

log = logging.getLogger(__name__)

MALLOC_ARENAS = 2
"""glibc heap arenas a worker may have (``M_ARENA_MAX``); glibc's default is 8 per core."""
_M_ARENA_MAX = -8  # glibc's mallopt parameter number
SETTLE_S = 1.0
"""How long an idle worker waits for its idle threads to end before it collects their memory."""


def _threads_settle(busy: Callable[[], bool], limit_s: float = SETTLE_S) -> None:
    """Wait until the process's thread count stops falling (threads end asynchronously), at most
    ``limit_s``, and not once ``busy()``."""
    deadline = time.monotonic() + limit_s
    count = _thread_count()
    while time.monotonic() < deadline and not busy():
        time.sleep(0.01)  # a task that arrives waits at most this long for the I/O pool's size
        now = _thread_count()
        if now >= count:
            return
        count = now


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:  # not Linux: nothing to wait for
        return 0


_LIBC = glibc()


def limit_malloc_arenas() -> None:
    """Cap glibc's heap arenas (before the process starts its threads: arenas are made per thread),
    and fix its mmap and trim thresholds (``flight.heap.MMAP_THRESHOLD``, ``TRIM_THRESHOLD``).

    The thresholds are fixed at start whatever the environment says (``flight.heap.set_thresholds``;
    ``FLIGHT_EXEC_HEAP`` is for coordinating processes: a worker's memory is flight-exec's to bound): a worker's shuffle reads
    are gRPC receive buffers of a few MB, which then come from the heap and are reused, where with an mmap
    threshold of 1 MiB each was mapped, faulted in and unmapped. A/B on TPC-H SF 10 across two one-core hosts
    (Q9, Q10, Q13, Q18, Q21, two rounds of two runs each, 2026-12-05): 1.1-3.9 % faster each, every query in
    both rounds. The 1 MiB threshold came from the fuzz run (a flood's 1 MiB work units came from the heap and
    stayed: +300 MiB at one idle sample; the idle release trims the heaps since, ``release_idle_memory``):
    the 2,000-case run with seed 20261122 kept +144 MiB at its worst idle sample with these thresholds, +147
    with 1 MiB, the same day. At 256 KiB a deep expression's many mid-sized blocks were mapped one by one, and
    a worker missed its 5 s health check."""
    leave_alone()  # a worker's heap is set here, not by flight.heap's settings for a coordinator
    if _LIBC is not None and not _LIBC.mallopt(_M_ARENA_MAX, MALLOC_ARENAS):
        log.debug("mallopt(M_ARENA_MAX) was refused")
    set_thresholds()


ARROW_POOL_VARIABLE = "ARROW_DEFAULT_MEMORY_POOL"
WORKER_ENV = {ARROW_POOL_VARIABLE: "jemalloc"}
"""What a process starting a worker puts in its environment: Arrow's C++ code allocates from jemalloc too."""


def reexec_with_arrow_pool(argv: Sequence[str]) -> None:
    """Run this worker again (``os.execve``: the same pid, open descriptors and ``argv``) with ``WORKER_ENV``,
    unless the variable is set already (by a launcher, or by the user choosing another pool) or this pyarrow
    has no jemalloc. Returns only when nothing needed doing."""
    if os.environ.get(ARROW_POOL_VARIABLE) or not _has_jemalloc():
        return
    env = {**os.environ, **WORKER_ENV}
    os.execve(sys.executable, [sys.executable, "-m", "flight.worker", *argv], env)


def _has_jemalloc() -> bool:
    try:
        pa.jemalloc_memory_pool()
        return True
    except (NotImplementedError, pa.ArrowException):
        return False


def use_jemalloc() -> str:
    """Make Arrow's jemalloc pool the default (where this pyarrow has it); the pool's name."""
    try:
        pa.set_memory_pool(pa.jemalloc_memory_pool())
    except (NotImplementedError, pa.ArrowException) as exc:
        log.debug("Arrow's jemalloc pool is not available (%s); keeping %s", exc, pa.default_memory_pool().backend_name)
    return pa.default_memory_pool().backend_name


def release_idle_memory(busy: Callable[[], bool] = lambda: False) -> None:
    """End idle threads, collect garbage, then hand Arrow's and glibc's free memory back to the system.

    ``busy()`` true (a task arrived) gives the I/O pool its size back at once: its sources need it.
    """
    retire_idle()
    io_threads = pa.io_thread_count()
    pa.set_io_thread_count(1)  # idle pool threads end (a pool thread that works ends after its task)
    # Never Arrow's compute pool: an Acero plan that starts while its size changes sizes its
    # per-thread state by the size it saw, and a thread beyond it shares another's state (a hash
    # join lost rows: 5 of 300 runs with the size toggled beside them, none without).
    try:
        _threads_settle(busy)
    finally:
        pa.set_io_thread_count(io_threads)
    gc.collect()
    pa.default_memory_pool().release_unused()
    release()


def resident_bytes() -> int:
    """This process's resident memory (``VmRSS``), or 0 where ``/proc`` has none."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def trim_busy_memory() -> None:
    """Hand back the free memory of Arrow's pool and glibc's heaps while tasks run.

    Why: under a flood of map-stage input (8 stages, 400 MB each, output unread) a worker with
    ``--memory-limit 1GB`` reached 2.5-4.6 GB resident with 93 MiB in Arrow's pool and 842 MiB in
    glibc's heap, most of it free: gRPC's receive buffers, freed in an order that leaves the heap's
    top in use. ``malloc_trim(0)`` gives back every free page of every arena, not only the top. The
    watchdog calls it when the worker is past its limit (``--memory-limit``), at most every few
    seconds: it walks the heap, which costs milliseconds (ctypes lets the interpreter run meanwhile)."""
    pa.default_memory_pool().release_unused()
    release()
