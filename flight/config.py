"""The one source of configuration defaults.

Every knob is an explicit argument somewhere; these dataclasses hold the
defaults in one place so the worker CLI, ``DistributedExec`` and the docs agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from flight.security import Security

__all__ = ["Compression", "ExecOptions", "WorkerOptions"]

Compression = Literal["none", "lz4", "zstd"]


@dataclass(frozen=True)
class WorkerOptions:
    """Defaults a worker applies when a task's header leaves a value at 0."""

    feed_window: int = 256
    """Units a task keeps asked-for per feed partition (its credit window)."""
    output_buffer_bytes: int = 32 << 20
    """A task's producer waits once this many bytes of output are unread."""
    batch_rows: int = 64 * 1024
    """Rows per batch the built-in readers aim for."""
    grace: float = 30.0
    """Seconds a draining worker lets running tasks finish before cancelling them."""
    get_wait: float = 10.0
    """Seconds a DoGet waits for the task it names to be registered."""
    unit_delay_ms: float = 0.0
    """Extra milliseconds per work unit: makes a worker artificially slow, for skew tests and benchmarks."""
    max_tasks: int = 64
    """Tasks running at once; one more is refused as busy (retryable). Every admitted task has
    threads of its own (exchange reader, runner, heartbeat): past a few dozen per core, Python's
    scheduling delays them all, heartbeats included, so the default stays modest."""
    source_threads: int = 64
    """Threads admitted tasks may hold while their sources wait (the I/O pool is sized to this plus a margin)."""
    memory_budget: int = 8 << 30
    """Bytes admitted tasks may reserve (output buffers and input queues); also the allocation above which
    a busy worker admits nothing new."""
    peer_timeout: float = 10.0
    """Seconds without any message from a task's coordinator (heartbeats included) before the task is freed."""
    queue_length: int = 256
    """Tasks that may wait for capacity at once; one more is refused as busy."""
    queue_wait: float = 60.0
    """Seconds a task may wait for capacity before it is refused as busy."""
    max_tasks_per_client: int | None = None
    """Slots one identity may hold (``--max-tasks-per-client``); None: 3/4 of ``max_tasks`` on a worker that
    tells callers apart (tokens, client certificates), else ``max_tasks`` (worker/admission.py, "Fair shares")."""
    max_queued_per_client: int | None = None
    """Tasks one identity may have waiting; None: 16 on a worker that tells callers apart, else ``queue_length``."""
    memory_budget_per_client: int | None = None
    """Bytes one identity's tasks may reserve; None: half of ``memory_budget`` on a worker that tells callers
    apart, else all of it."""
    spill_dir: str = ""
    """Where retained outputs past their bound are spilled (``--spill-dir``); empty: the system's temp directory."""
    memory_ceiling: int = 0
    """Resident bytes past which a busy worker gives its heaps' free memory back (its ``--memory-limit``;
    0: only when idle). ``flight/worker/memory.py``, ``trim_busy_memory``."""
    data_roots: tuple[str, ...] = ()
    """Directories (resolved real paths) under which the file readers may read (``--data-root``);
    none: every path a work unit names is refused (``flight.engine.confine``)."""


@dataclass(frozen=True)
class ExecOptions:
    """How ``DistributedExec`` runs a query."""

    compression: Compression = "none"
    """Arrow IPC compression of result streams on the wire."""
    connect_timeout: float = 10.0
    """Seconds to wait for a worker to accept a task before naming it unavailable."""
    feed_window: int = 0
    """Credit window per partitioned-feed partition; 0 lets each worker use its default."""
    shared_window: int = 2
    """Credit window of each task on a shared-queue feed: small, so slow tasks get fewer units."""
    affinity_wait: float = 0.05
    """Seconds a unit with a preferred worker waits for that worker's task to have credit."""
    output_buffer_bytes: int = 0
    """Per-task output buffer bound; 0 lets each worker use its default."""
    discovery_buffer: int = 4096
    """Units the coordinator may discover ahead of the tasks' credit, per feed partition."""
    max_units_per_frame: int = 4096
    """Most units one WorkUnitBatch frame carries, and one FeedFrames over all its partitions (protocol 13)."""
    result_queue_batches: int = 16
    """Batches the coordinator buffers between the DoGet streams and the caller."""
    broadcast_bytes: int = 32 << 20
    """A join's right side estimated below this many bytes is broadcast to the other side's tasks."""
    rows_per_task: int = 250_000
    """Upper stages get one task per this many estimated input rows (never more than the workers)."""
    replicate_rows: int = 500_000
    """A broadcast of Parquet files holding at most this many rows is read whole by each task of the
    leaf stage that reads it instead of being a stage of its own (0: always a stage; docs/queries.md)."""
    small_query_bytes: int = 64 << 20
    """A query whose scans are estimated to read at most this many bytes (the columns it reads, from the
    Parquet footers) runs as one task on one worker: a second worker saves less than its stages cost
    (0: never; docs/queries.md, "Small queries")."""
    one_host_query_bytes: int = 1 << 30
    """When every worker is on one host (their URLs name the same one: they share its cores), a query reading
    at most this many bytes also runs as one task, on all of the host's cores, unless it computes a CTE twice
    or its split only gathers co-located work over many groups (``DistributedExec._plan``; docs/queries.md,
    "Small queries"; 0: never, and never when ``small_query_bytes`` is 0)."""
    cut_file_rows: int = 0
    """A scan of Parquet files fewer than its tasks, holding at least this many rows (one of them of several row
    groups: a table written as one file), gets a task per worker, each reading a run of the files' row groups
    (``FileListProvider.may_cut``; docs/feeds.md). 0: never (the default, until TPC-DS's plans across hosts gain
    from it: docs/queries.md, "Tables in one file"); ``1_000_000`` is a good value for scans.
    Without it such a scan is one task, whatever the workers."""
    adaptive_bytes: int = 8 << 20
    """A join side whose size only a guess gives (a filter on an aggregate's output), where the guess would
    shuffle the other side, runs first; so do small filtered sides whose keys' range picks the row groups of a file
    cut into runs in that key's order (``cut_file_rows``: a fact table written by date), and two large tables a join
    on a composite key pairs (``flight.planner.composite``: TPC-DS q25's returns and catalog sales). If its rows come to at most
    this many bytes, the query is planned again with them as literal input (``flight.planner.adaptive``;
    docs/queries.md, "Adaptive planning"). Only across hosts (workers on one host move rows by a local copy). 0: never."""
    security: Security | None = None
    """Token and TLS material for talking to the workers (``LocalCluster.security``, ``Security.from_files``)."""
    deadline: float | None = None
    """Seconds the whole query may take; past it every task is cancelled and ``QueryTimeoutError`` raised."""
    heartbeat: float = 2.0
    """Seconds between heartbeats on each task's exchange (both ways)."""
    peer_timeout: float = 10.0
    """Seconds without any message from a task's worker before the query fails naming that worker."""
    admission_wait: float = 300.0
    """Seconds to keep retrying while busy workers refuse the query's tasks (within ``deadline``)."""
    retries: int = 2
    """Times a query runs again when a worker is lost (dead, or silent past ``peer_timeout``) before
    the caller received any row: on the workers that remain, discovery included. 0: never.
    Also how many workers a streaming scan may lose after its first rows (``unit_recovery``)."""
    progress: bool = False
    """Progress bars while the query runs, one per stage (``rich``: the ``progress`` extra)."""
    unit_recovery: bool = True
    """A query that streams a scan to the caller (filters and projections over one feed: one
    stage) survives losing a worker even after rows reached the caller: each task's rows say
    their work unit, a unit's rows are handed over once the unit is complete, and a lost
    task's incomplete units are replayed on another worker (docs/architecture.md). The cost:
    such a task runs on Acero one unit at a time, and a unit's first row waits for its last."""
    stage_recovery: bool = True
    """A query of several stages survives losing a worker even after rows reached the caller:
    every stage below the head keeps its outputs until the query ends (memory, then the workers'
    spill files), a head task's rows reach the caller once its whole output was read, and the
    tasks a lost worker took (and those that were reading them) run again on the survivors
    (``coordinator/rerun.py``, docs/architecture.md). The cost: the kept outputs, and the rows of
    a query whose head is one task (an ORDER BY, a final aggregate) arrive at its end."""
    held_output_bytes: int = 64 << 20
    """With ``stage_recovery``: the bytes of one head task's rows held in memory until its output
    is whole; past it they wait in a temporary file."""
    stream_checksums: bool = True
    """Every partition of a stream that carries rows ends with a trailer of its rows and batches,
    which its reader checks; with this, a checksum of what was sent too (docs/protocol.md,
    section 17). Off for a fleet whose links are trusted and where its cost shows: the counts
    are still checked."""
