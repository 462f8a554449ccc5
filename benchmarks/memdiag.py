"""A worker extension that reports where an idle worker's memory is, for chasing what it keeps.

Load it on a worker (``flight-worker --extension benchmarks.memdiag``, or the fuzzer's
``--worker-arg=--extension=benchmarks.memdiag``); ``kill -USR2 <pid>`` then appends a report to
``$MEMDIAG_OUT`` (default ``memdiag.txt`` in the worker's directory), and ``MEMDIAG_EVERY=<s>``
adds one every so many seconds. A report: thread counts (Python and native), Arrow's pool, the
garbage collector's objects by type, and the resident memory by mapping (``/proc/self/smaps``:
mimalloc's arenas show as 1 GiB anonymous mappings, glibc's heap as ``[heap]`` and 64 MiB
arenas). Why a tool: the fuzz runs' idle growth (issue 24) is found by which of these grows.
Linux only; a diagnostic, never loaded by default.
"""

from __future__ import annotations

import collections
import gc
import os
import signal
import threading
import time

import pyarrow as pa

OUT = os.environ.get("MEMDIAG_OUT", "memdiag.txt")


def _rss_by_mapping() -> collections.Counter[str]:
    kib: collections.Counter[str] = collections.Counter()
    current = "?"
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            parts = line.split()
            if len(parts) >= 5 and "-" in parts[0] and not parts[0].endswith(":"):
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                size = hi - lo
                current = parts[5] if len(parts) > 5 else (f"[anon {size >> 20} MiB]" if size >= 1 << 20 else "[anon small]")
            elif parts and parts[0] == "Rss:":
                kib[current] += int(parts[1])
    return kib


def _write_report() -> None:
    gc.collect()
    kinds = collections.Counter(type(o).__name__ for o in gc.get_objects())
    status = open("/proc/self/status").read()
    rss = status.split("VmRSS:")[1].split()[0]
    lines = [
        f"==== {time.ctime()} rss={int(rss) >> 10} MiB threads={threading.active_count()} native={len(os.listdir('/proc/self/task'))}",
        f"arrow pool: {pa.total_allocated_bytes() >> 20} MiB allocated, {pa.default_memory_pool().backend_name}",
        f"gc objects: {sum(kinds.values())}; " + ", ".join(f"{k}={v}" for k, v in kinds.most_common(20)),
        *(f"  rss {v >> 10:6d} MiB  {k}" for k, v in _rss_by_mapping().most_common(20)),
        "threads: " + str(collections.Counter(t.name.rstrip("0123456789-_ ") for t in threading.enumerate()).most_common(10)),
    ]
    with open(OUT, "a") as out:
        out.write("\n".join(lines) + "\n")


def _report(*_: object) -> None:
    threading.Thread(target=_write_report, name="memdiag", daemon=True).start()  # not inside the handler


def _every(seconds: float) -> None:
    while True:
        time.sleep(seconds)
        _write_report()


signal.signal(signal.SIGUSR2, _report)
if os.environ.get("MEMDIAG_EVERY"):
    threading.Thread(target=_every, args=(float(os.environ["MEMDIAG_EVERY"]),), name="memdiag-every", daemon=True).start()
