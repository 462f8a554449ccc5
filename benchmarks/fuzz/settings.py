"""The worker fuzzer's numbers in one place: deadlines, sizes of hostile inputs, memory sampling."""

from __future__ import annotations

import re

__all__ = [
    "BLOWUP_BYTES", "BOMB_ROWS", "CASE_TIMEOUT", "DEAD_URL", "DEFAULT_CASES", "FLOOD_BATCH_ROWS", "FLOOD_FRAME_BYTES", "FLOOD_UNIT_SIZES",
    "FLOOD_WAIT", "FORBIDDEN_DIRS", "GET_WAIT_S", "HEALTH_TIMEOUT", "HOARD_BEAT", "HOARD_TASKS", "LISTENING", "LOOPBACK_URL", "MAX_ENDS",
    "MAX_MESSAGE", "PROTOCOL", "RECYCLE_THREADS", "RSS_EVERY", "RSS_NOTE_MB", "RSS_WARMUP", "SELF_URL", "SETTLE", "SETTLE_MAX_S", "SETTLE_S",
    "SHORT_WAIT", "START_TIMEOUT", "SUMMARY", "T0", "UNCLEAR_KEPT", "WATCHDOG_GRACE",
]


PROTOCOL = {"version": 1}
"""The protocol version seeds speak: the worker's own, asked with the ``info`` action before any case is made."""
SUMMARY = "fuzz_cases: {n}, crashes: {c}, hangs: {h}, unclear: {u}, max_rss_growth_mb: {g}"
LISTENING = re.compile(r"^flight-worker listening on (grpc://\S+)$")
SELF_URL = "grpc://127.0.0.1:00000"
"""Stands for the worker's own URL in shuffle reads; replaced at run time (same length, so protobuf stays valid)."""
DEAD_URL = "grpc://127.0.0.1:1"
GET_WAIT_S = 10.0
"""How long a worker waits for a task named by a DoGet or a shuffle read to appear (``--get-wait``): a case whose
plan reads absent producers on its own worker rightly takes that long, so its deadline is extended by it."""
LOOPBACK_URL = re.compile(r"grpc(\+tcp)?://127\.0\.0\.1:\d{1,5}")
FORBIDDEN_DIRS = ("/dev", "/proc", "/sys", "/run")

DEFAULT_CASES = 10_000
CASE_TIMEOUT = 10.0
HEALTH_TIMEOUT = 2.0
SETTLE = 0.15
"""Seconds a case reads a task's output before it half-closes anyway (a mutated plan may rightly wait for ever)."""
SHORT_WAIT = 0.05
"""Deadline of a DoGet whose ticket names a task that never ran: the worker waits 10 s for it, by design."""
WATCHDOG_GRACE = 5.0
RECYCLE_THREADS = 400
"""An owned worker left with more threads than this by a case (say, a shuffle read of 1,000 absent
producers, each waiting 10 s on a thread of its own) is swapped for the spare: not a failure, but
it would slow every later case down. Each recycle is reported with the case that caused it."""
START_TIMEOUT = 60.0
MAX_MESSAGE = 2_000
MAX_ENDS = 64
"""Most feed partitions a case feeds and ends (a mutated header may assign thousands)."""
BLOWUP_BYTES = 4 << 20
BOMB_ROWS = 12_000_000
"""Rows of the all-zero batches that zstd squeezes into a few KB: 288 MB once inflated."""
UNCLEAR_KEPT = 3
"""Unclear cases kept in the corpus per family and reason (crashes and hangs: all)."""
T0 = 1_700_000_000_000_000_000
"""Work-unit timestamps: fixed, so that cases are deterministic."""
HOARD_TASKS = (20, 70)
"""Exchanges a hoarder opens: more than one client may run at once (64), few enough to open within a case's deadline."""
HOARD_BEAT = 0.2
"""Seconds between a hoarder's rounds of Heartbeat frames."""
FLOOD_WAIT = 1.5
"""Deadline of a flood's calls: a worker holding the flood back (gRPC flow control) stalls them, and that is the pass."""
FLOOD_FRAME_BYTES = 8 << 20
"""Unit bytes per WorkUnitBatch of a flood (a frame may carry up to 64 MiB)."""
FLOOD_UNIT_SIZES = (1 << 20, 256 << 10, 16 << 10)
FLOOD_BATCH_ROWS = 1 << 19
"""Rows of a map flood's batches: 12 MiB of zeros each."""
RSS_WARMUP = 20
"""Cases a fresh worker runs before its RSS becomes the baseline of ``max_rss_growth_mb``: the first ones
import the engines, open the DuckDB database and start the thread pools, which every later case reuses."""
RSS_EVERY = 100
"""Cases between two settled RSS samples (``RssWatch``)."""
SETTLE_S = 2.5
"""An idle worker's RSS counts as settled once it has not fallen for this long (it trims within two
seconds: after a whole round of its watchdog, a second long, in which no call ended)."""
SETTLE_MAX_S = 15.0
"""The longest wait for a settled sample: past the worker's 10 s peer timeout, which frees a task a
hoarder abandoned without a word."""
RSS_NOTE_MB = 150.0
"""An idle sample this far above the baseline is logged with the worker's thread count and whether it was idle."""
