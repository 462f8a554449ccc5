"""flight/heap.py: a process keeps freed receive buffers while it reads a query's results, and hands them back when idle.

Each case runs in a fresh interpreter: glibc's thresholds are the process's, and this one's must not change.
What is checked is glibc's behaviour, not our flags: a 16 MiB block freed stays resident (kept for the next
buffers) while the thresholds are raised, and leaves the process at once under glibc's initial settings (it
is mapped on its own and unmapped when freed). The resident size is read from a descriptor opened first, so
that reading it allocates nothing above the block.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from flight.heap import glibc

pytestmark = pytest.mark.skipif(glibc() is None, reason="the thresholds are glibc's; this libc is not glibc")

COMMON = r"""
import ctypes, json, os, sys, time
import flight.heap as heap
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
STATM = os.open("/proc/self/statm", os.O_RDONLY)
PAGE = os.sysconf("SC_PAGE_SIZE")
SIZE = 16 << 20
def rss():
    return int(os.pread(STATM, 100, 0).split()[1]) * PAGE
def kept(size=SIZE):
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    held = rss()
    libc.free(block)
    return held - rss() < size // 2
def given_back(within=10.0):
    # a block freed while the thresholds keep it: whether it leaves within `within` seconds
    deadline = time.monotonic() + within
    block = libc.malloc(SIZE)
    ctypes.memset(block, 1, SIZE)
    libc.free(block)
    held = rss()
    while time.monotonic() < deadline:
        if rss() < held - SIZE // 2:
            return True
        time.sleep(0.05)
    return False
class Query: pass
"""

PROBES = {
    "query": """
import pyarrow as pa, flight
with flight.LocalCluster(1) as cluster:
    table = flight.DistributedExec(flight.from_arrow(pa.table({"x": [1, 2, 3]})), cluster.urls).to_table()
    print(json.dumps({"rows": table.num_rows, "busy_after": heap.busy_queries(), "kept": kept()}))
""",
    "busy": """
heap.busy(q := Query())
print(json.dumps({"kept": kept()}))
""",
    "worker": """
from flight.worker.memory import limit_malloc_arenas
limit_malloc_arenas()
heap.busy(q := Query())
print(json.dumps({"kept": kept(), "busy": heap.busy_queries()}))
""",
    "idle": """
heap.IDLE_TRIM_S = 0.2
running, other = Query(), Query()
heap.busy(running)
heap.busy(other)
heap.idle(running)
time.sleep(1.0)
while_one_runs = kept()
heap.idle(other)
back = given_back()
# 24 MiB: larger than any free block the 16 MiB ones left in the heap, so it is mapped (not kept) only if the mmap
# threshold is glibc's initial one again, whatever the heap's layout.
print(json.dumps({"kept_while_one_runs": while_one_runs, "given_back_once_idle": back, "kept_after": kept(24 << 20)}))
""",
    "fork": """
heap.busy(q := Query())
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    STATM = os.open("/proc/self/statm", os.O_RDONLY)  # the parent's descriptor reads the parent's
    os.write(w, json.dumps({"child_kept": kept(24 << 20)}).encode())
    os._exit(0)
os.waitpid(pid, 0)
child = json.loads(os.read(r, 1000))
print(json.dumps({**child, "parent_kept": kept()}))
""",
}


def _probe(role: str, **env: str) -> dict[str, object]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES", "FLIGHT_EXEC_HEAP")}
    done = subprocess.run([sys.executable, "-c", COMMON + PROBES[role]], env={**clean, **env}, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_query_read_here_keeps_freed_buffers_and_leaves_the_count_when_it_ends() -> None:
    assert _probe("query") == {"rows": 3, "busy_after": 0, "kept": True}


def test_without_the_thresholds_glibc_hands_the_block_back_at_once() -> None:
    """The baseline the other cases differ from: the same probe, told to leave glibc's settings."""
    assert _probe("busy", FLIGHT_EXEC_HEAP="default") == {"kept": False}
    assert _probe("busy") == {"kept": True}


@pytest.mark.parametrize("env", [{"MALLOC_ARENA_MAX": "4"}, {"MALLOC_MMAP_MAX_": "65536"},
                                 {"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"}])
def test_a_users_own_glibc_settings_are_left_alone(env: dict[str, str]) -> None:
    assert _probe("busy", **env) == {"kept": False}


def test_what_is_kept_is_handed_back_once_no_query_runs() -> None:
    """While one query still runs a freed block stays; once none has run for ``IDLE_TRIM_S`` what is free leaves,
    and the thresholds are glibc's initial ones again."""
    assert _probe("idle") == {"kept_while_one_runs": True, "given_back_once_idle": True, "kept_after": False}


def test_a_forked_child_starts_with_glibcs_initial_thresholds() -> None:
    """A child forked mid-query (multiprocessing) has no trim thread of its own: it does not keep what it frees."""
    assert _probe("fork") == {"child_kept": False, "parent_kept": True}


def test_a_worker_sets_its_heap_itself_at_start() -> None:
    """``flight.worker.memory.limit_malloc_arenas`` (the worker's first step) raises the thresholds whatever its
    environment says, and ``busy`` in the worker's process counts nothing (it never idles them back)."""
    assert _probe("worker") == {"kept": True, "busy": 0}
    assert _probe("worker", FLIGHT_EXEC_HEAP="default") == {"kept": True, "busy": 0}
