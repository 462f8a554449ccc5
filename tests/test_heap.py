"""flight/heap.py: a coordinating process keeps freed receive buffers; a user's or a worker's settings are left alone.

Each case runs in a fresh interpreter: glibc's thresholds are the process's, and this one's must not change.
What is checked is glibc's behaviour, not our flag: a 16 MiB block freed stays resident (kept for the next
buffers) once the thresholds are set, and leaves the process at once under glibc's defaults (it is mapped
on its own and unmapped when freed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from flight.heap import glibc

pytestmark = pytest.mark.skipif(glibc() is None, reason="the thresholds are glibc's; this libc is not glibc")

PROBE = r"""
import ctypes, json, os, sys
import flight.heap as heap
if sys.argv[1] == "worker":
    from flight.worker.memory import limit_malloc_arenas
    limit_malloc_arenas()
elif sys.argv[1] == "query":
    import pyarrow as pa, flight
    with flight.LocalCluster(1) as cluster:
        assert flight.DistributedExec(flight.from_arrow(pa.table({"x": [1, 2, 3]})), cluster.urls).to_table().num_rows == 3
first = heap.keep_receive_buffers()
second = heap.keep_receive_buffers()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
size = 16 << 20
block = libc.malloc(size)
ctypes.memset(block, 1, size)
held = rss()
libc.free(block)
print(json.dumps({"first": first, "second": second, "kept": held - rss() < size // 2}))
"""


def _probe(role: str = "coordinator", **env: str) -> dict[str, bool]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES", "FLIGHT_EXEC_HEAP")}
    done = subprocess.run([sys.executable, "-c", PROBE, role], env={**clean, **env}, capture_output=True, text=True, timeout=60, check=True)
    return json.loads(done.stdout)


def test_a_coordinating_process_keeps_a_freed_block_for_the_next_buffers() -> None:
    assert _probe() == {"first": True, "second": False, "kept": True}


def test_the_first_query_a_process_runs_sets_them() -> None:
    """``Run`` calls ``keep_receive_buffers``: the probe's own call finds it done, and the block is kept."""
    assert _probe("query") == {"first": False, "second": False, "kept": True}


IDLE_PROBE = r"""
import ctypes, json, os, sys, time
import flight.heap as heap
heap.IDLE_TRIM_S = 0.2
assert heap.keep_receive_buffers()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
class Query: pass
running, other = Query(), Query()
heap.busy(running)
heap.busy(other)
size = 16 << 20
block = libc.malloc(size)
ctypes.memset(block, 1, size)
held = rss()
libc.free(block)
heap.idle(running)
time.sleep(1.0)
kept_while_one_runs = held - rss() < size // 2
heap.idle(other)
time.sleep(1.0)
print(json.dumps({"kept_while_one_runs": kept_while_one_runs, "kept_once_idle": held - rss() < size // 2}))
"""


def test_what_is_kept_is_handed_back_once_no_query_runs() -> None:
    """While one query still runs the freed block stays; once none has run for ``IDLE_TRIM_S`` it leaves."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES", "FLIGHT_EXEC_HEAP")}
    done = subprocess.run([sys.executable, "-c", IDLE_PROBE], env=clean, capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(done.stdout) == {"kept_while_one_runs": True, "kept_once_idle": False}


def test_without_the_thresholds_glibc_hands_the_block_back_at_once() -> None:
    """The baseline the first test differs from: the same probe, told to leave glibc's defaults."""
    assert _probe(FLIGHT_EXEC_HEAP="default") == {"first": False, "second": False, "kept": False}


@pytest.mark.parametrize("env", [{"MALLOC_ARENA_MAX": "4"}, {"MALLOC_TRIM_THRESHOLD_": "1000000"},
                                 {"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"}])
def test_a_users_own_glibc_settings_are_left_alone(env: dict[str, str]) -> None:
    assert _probe(**env)["first"] is False


def test_a_worker_sets_its_heap_itself_at_start() -> None:
    """``flight.worker.memory.limit_malloc_arenas`` (the worker's first step) sets the same thresholds, whatever the
    environment says, and a coordinator's call in the worker's process then changes nothing."""
    assert _probe("worker") == {"first": False, "second": False, "kept": True}
    assert _probe("worker", FLIGHT_EXEC_HEAP="default")["kept"] is True
