"""Every size a peer may choose, and the bound a receiver holds it to: one table.

A worker (or a coordinator reading a worker) never takes a peer's size as
given: a header asking for a million output partitions, a feed window of
2^32-1, a 10 KB zstd payload that inflates to 320 MB, an id of 16 KB echoed in
an error. Each such value is checked here against a named limit, and the check
either clamps (a preference, such as a window: the receiver uses its own bound)
or refuses with a ``ProtocolError`` naming the field (a requirement, such as a
partition count the plan depends on). docs/protocol.md, "Limits", lists them.
"""

from __future__ import annotations

import os

from flight.errors import ProtocolError

__all__ = [
    "DEFAULT_HEARTBEAT_MS",
    "DEFAULT_MEMORY_FRACTION",
    "INPUT_RESERVE_BYTES",
    "MAX_BATCH_BYTES",
    "MAX_ECHO_CHARS",
    "MAX_FEEDS",
    "MAX_FEED_PARTITIONS",
    "MAX_FEED_WINDOW",
    "MAX_FRAME_BYTES",
    "MAX_HEADER_BYTES",
    "MAX_HEARTBEAT_MS",
    "MAX_ID_CHARS",
    "MAX_IPC_BYTES",
    "MAX_MESSAGE_CHARS",
    "MAX_OUTPUT_BUFFER_BYTES",
    "MAX_OUTPUT_PARTITIONS",
    "MAX_OUTPUT_READERS",
    "MAX_PLAN_OPERATORS",
    "MAX_PRODUCERS",
    "MAX_RETAINED_BYTES",
    "MAX_SECRET_BYTES",
    "MAX_TASK_COUNT",
    "MAX_UNITS_PER_FRAME",
    "MAX_UNIT_BYTES",
    "MIN_HEARTBEAT_MS",
    "MIN_OUTPUT_BUFFER_BYTES",
    "MIN_SECRET_BYTES",
    "check_count",
    "clamp",
    "clip",
    "heartbeat_seconds",
    "parse_size",
    "physical_memory",
    "task_reserve",
]

MAX_HEADER_BYTES = 64 << 20
"""A TaskHeader, its plan included (a plan's Values and literals travel inside it)."""
MAX_FRAME_BYTES = 64 << 20
"""One CoordinatorFrame (a batch of work units)."""
MAX_UNITS_PER_FRAME = 65_536
"""Work units in one WorkUnitBatch (the coordinator sends at most 4,096 by default)."""
MAX_UNIT_BYTES = 16 << 20
"""One work unit's body: a unit names work (a file, a page token), it is not the data."""
MAX_TASK_COUNT = 65_536
"""Tasks in one stage (header.task_count)."""
MAX_FEEDS = 1_024
"""Feed assignments in one header."""
MAX_FEED_PARTITIONS = 65_536
"""Feed partitions assigned to one task, over all its feeds."""
MAX_FEED_WINDOW = 65_536
"""Credit window per feed partition; a larger one asked for is clamped to this."""
MAX_OUTPUT_PARTITIONS = 4_096
"""Output partitions of one task (plan.output.partitions): one per consumer task."""
MAX_OUTPUT_READERS = 4_096
"""Readers of each output partition (plan.output.readers): a broadcast's consumers."""
MAX_PRODUCERS = 4_096
"""Producer tasks one shuffle read names."""
MAX_PAD_WIDTH = 1 << 16
"""Widest a pad (lpad / rpad) may make a value, in characters: a peer's width times the rows is memory."""
MAX_TEMPORAL_MULTIPLE = 1 << 30
"""Most periods one date_trunc step may span (``RoundTemporalOptions.multiple``)."""
MAX_FIELD_DEPTH = 64
"""Indices in one struct field's path (``StructFieldOptions.indices``)."""
MAX_FIXED_SLICE = 1_024
"""Elements a list slice keeps per row: its fixed-size result allocates them all, for every row."""
MAX_SEPARATOR_CHARS = 1_024
"""Longest separator a string_agg may take: it is copied between every two values of a group."""
MAX_PLAN_OPERATORS = 10_000
"""Operators in one stage's plan (``StagePlan.operators``, a flat list: docs/protocol.md, section 5). The coordinator
refuses a larger plan (``PlanError``) before it sends it."""
MAX_PROJECTED = 8_192
"""Items in one of an operator's lists: the expressions a projection computes, a sort's or an aggregate's keys,
its aggregates, a join's keys, a window's keys and calls. 70,000 projected expressions took the worker over
10 s to compile; 70,000 sort keys 4 s, and left its heaps 78 MiB larger for good (seed 2's case 6674)."""
MIN_OUTPUT_BUFFER_BYTES = 1 << 20
MAX_OUTPUT_BUFFER_BYTES = 192 << 20
"""An unread output buffer is memory a client makes a worker hold: at most this much per task (it was 1 GiB:
one unread DoGet grew a worker by 595 MB; at 256 MiB, by 301 MB with what gRPC buffers beside it), and
admission counts it against the client's and the worker's budget. The default is 32 MiB."""
INPUT_RESERVE_BYTES = 8 << 20
"""Memory a worker reserves per blocking source of a task: what its queue of incoming batches may hold."""


def task_reserve(output_buffer_bytes: int, threads: int) -> int:
    """The memory a worker reserves for a task (docs/protocol.md, section 15): its output buffer, clamped as the
    worker clamps it, and ``INPUT_RESERVE_BYTES`` per source thread. The coordinator computes the same sum to
    know whether a query's tasks fit a worker's memory budget together (``coordinator/opening.py``)."""
    return clamp(output_buffer_bytes, MIN_OUTPUT_BUFFER_BYTES, MAX_OUTPUT_BUFFER_BYTES) + threads * INPUT_RESERVE_BYTES

MAX_RETAINED_BYTES = 64 << 30
"""Most bytes a worker keeps on disk for one task's retained output (``TaskOptions.retain_output``):
past it the task fails, naming the option, rather than filling the spill directory."""
"""A task's output buffer bound is clamped into [MIN, MAX]."""
MAX_BATCH_BYTES = 512 << 20
"""One record batch from a peer (map input, shuffle read), in Arrow memory."""
MAX_IPC_BYTES = 256 << 20
"""An Arrow IPC payload inside a plan (Values, literals, value sets) once decompressed."""
MIN_SECRET_BYTES = 16
MAX_SECRET_BYTES = 64
"""A query secret (TaskHeader.query_secret): at least 128 random bits."""
MAX_ID_CHARS = 128
"""A query id (the stage key's), and a feed id."""
MAX_ECHO_CHARS = 200
"""Most characters of peer-chosen text (ids, reasons, names) repeated in a message."""
MAX_MESSAGE_CHARS = 2_000
"""Most characters of any error message a client is sent."""
DEFAULT_HEARTBEAT_MS = 2_000
MIN_HEARTBEAT_MS = 200
MAX_HEARTBEAT_MS = 10_000
"""A task's heartbeat interval (TaskOptions.heartbeat_ms) is clamped into [MIN, MAX]; 0 is the default."""


def clip(text: object, most: int = MAX_ECHO_CHARS) -> str:
    """``text`` cut to ``most`` characters, saying how much was left out."""
    s = str(text)
    if len(s) <= most:
        return s
    return f"{s[:most]}… ({len(s) - most} more characters)"


def clamp(value: int, low: int, high: int) -> int:
    """A preference a peer expressed, held into [low, high]."""
    return max(low, min(value, high))


def heartbeat_seconds(ms: int) -> float:
    """A task's heartbeat interval in seconds from its ``TaskOptions.heartbeat_ms``: 0 is the default, the rest clamped.

    One function because three things beat at it (the exchange both ways, the task's DoGet streams)."""
    return clamp(ms or DEFAULT_HEARTBEAT_MS, MIN_HEARTBEAT_MS, MAX_HEARTBEAT_MS) / 1000


def check_count(value: int, most: int, field: str, what: str) -> None:
    """Refuse a requirement above ``most`` (``field`` names where it was)."""
    if value > most:
        raise ProtocolError(f"{field} asks for {value} {what}; this worker allows at most {most}", field=field)


DEFAULT_MEMORY_FRACTION = 0.5
"""A worker's engine may use this share of the machine's memory unless ``--memory-limit`` says otherwise."""

_UNITS = {
    "": 1 << 20, "B": 1, "KB": 1 << 10, "KIB": 1 << 10, "MB": 1 << 20, "MIB": 1 << 20,
    "GB": 1 << 30, "GIB": 1 << 30, "TB": 1 << 40, "TIB": 1 << 40,
}


def parse_size(text: str) -> int:
    """Bytes from ``4GB``, ``512MB``, ``1.5GiB`` or a plain number of MiB; ``ValueError`` otherwise.

    Units are binary (GB = GiB), as DuckDB and most tools read a memory setting.
    """
    cleaned = text.strip().upper().replace(" ", "")
    number = cleaned.rstrip("KMGTIB")
    unit = cleaned[len(number):]
    if unit not in _UNITS:
        raise ValueError(f"{text!r} is not a size such as 4GB or 512MB")
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"{text!r} is not a size such as 4GB or 512MB") from None
    size = int(value * _UNITS[unit])
    if size < 16 << 20:
        raise ValueError(f"{text!r} is less than 16MB, too little to run a query")
    return size


def physical_memory() -> int:
    """This machine's memory in bytes (8 GiB when the system does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 8 << 30
