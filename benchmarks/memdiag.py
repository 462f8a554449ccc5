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
    for kind in os.environ.get("MEMDIAG_CHAINS", "").split(","):
        if kind and kinds.get(kind):
            lines.append(f"who holds a {kind}: " + _chain(kind))
    with open(OUT, "a") as out:
        out.write("\n".join(lines) + "\n")


def _chain(kind: str, depth: int = 10) -> str:
    """The referrers of one (the last made) object of type ``kind``, a step at a time, up to ``depth``."""
    import sys

    objects = [o for o in gc.get_objects() if type(o).__name__ == kind]
    here: object = objects[-1]
    del objects
    me = sys._getframe()
    steps = [kind]
    seen = {id(here), id(me), id(steps)}
    for _ in range(depth):
        holders = [r for r in gc.get_referrers(here) if id(r) not in seen and r is not me]
        seen.add(id(holders))
        if not holders:
            break
        here = holders[0]
        seen.add(id(here))
        name = type(here).__name__
        if name == "frame":
            code = here.f_code  # type: ignore[attr-defined]
            name = f"frame {code.co_name} ({os.path.basename(code.co_filename)}:{here.f_lineno})"  # type: ignore[attr-defined]
        elif name == "dict":
            name = f"dict({len(here)} keys: {', '.join(map(str, list(here)[:4]))})"  # type: ignore[arg-type]
        steps.append(f"{name} [+{len(holders) - 1}]")
    return " <- ".join(steps)


def _report(*_: object) -> None:
    threading.Thread(target=_write_report, name="memdiag", daemon=True).start()  # not inside the handler


def _every(seconds: float) -> None:
    while True:
        time.sleep(seconds)
        _write_report()


signal.signal(signal.SIGUSR2, _report)
if os.environ.get("MEMDIAG_EVERY"):
    threading.Thread(target=_every, args=(float(os.environ["MEMDIAG_EVERY"]),), name="memdiag-every", daemon=True).start()
