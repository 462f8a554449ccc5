"""``flight-worker``: the worker daemon's command line.

The first line on stdout is exactly ``flight-worker listening on grpc://HOST:PORT``
(tools and ``LocalCluster`` wait for it); everything else is logging on stderr.
SIGTERM (and Ctrl-C) drain: no new tasks, running ones get ``--grace`` seconds.
So does the end of ``--parent-fd``'s pipe: a worker started by a program that holds the pipe's
write end (``LocalCluster``, ``flight-coordinator --local-workers``) goes when that program goes,
even when it was killed with SIGKILL and ran no code of its own.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import pyarrow as pa

from flight._version import __version__
from flight.config import WorkerOptions
from flight.daemon import catch_stop_signals, wait_for_stop
from flight.engine.confine import DataRoots, set_worker_roots
from flight.engine.duck.engine import configure
from flight.engine.settings import EngineSettings
from flight.errors import PlanError
from flight.security import Security
from flight.sources.storage import FileSystems, load_options, set_filesystems
from flight.wire.limits import DEFAULT_MEMORY_FRACTION, parse_size, physical_memory
from flight.worker.auth import ServerSecurity, read_tokens
from flight.worker.capacity import CLIENT_MEMORY_SHARE, CLIENT_SHARE, MAX_QUEUED_PER_CLIENT
from flight.worker.memory import limit_malloc_arenas, reexec_with_arrow_pool, use_jemalloc
from flight.worker.metrics import serve_metrics
from flight.worker.server import WorkerServer

__all__ = ["main"]

log = logging.getLogger("flight.worker")

IO_MARGIN = 16
"""I/O pool threads beyond --source-threads, for readers that use the pool themselves."""
SHUTDOWN_WAIT_S = 3.0
"""After draining, how long the Flight server may take to end its calls before the process exits."""


def _parser() -> argparse.ArgumentParser:
    """The flags, in the order ``--help`` lists them: each group's helper adds its own."""
    d = WorkerOptions()
    p = argparse.ArgumentParser(prog="flight-worker", description="Run a flight-exec worker (an Arrow Flight server).")
    _task_flags(p, d)
    _data_flags(p)
    _capacity_flags(p, d)
    _engine_flags(p)
    _security_flags(p)
    p.add_argument("--log-level", default="INFO", help="logging level on stderr (default: %(default)s)")
    p.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="serve Prometheus metrics on this port of --host (0: any; the log says which): tasks, queue, memory, spill, bytes")
    p.add_argument(
        "--parent-fd", type=int, default=None, metavar="FD",
        help="an inherited pipe's read end: at its end of file (the program holding the write end is gone) the worker drains and exits",
    )
    p.add_argument("--version", action="version", version=f"flight-worker {__version__}")
    return p


def _task_flags(p: argparse.ArgumentParser, d: WorkerOptions) -> None:
    """Where the worker listens, and what its tasks get unless they ask otherwise: grace, windows, buffers, a delay."""
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    p.add_argument("--port", type=int, default=50051, help="port to bind; 0 picks a free one (default: %(default)s)")
    p.add_argument("--grace", type=float, default=d.grace, help="seconds running tasks get on SIGTERM (default: %(default)s)")
    p.add_argument(
        "--get-wait", type=float, default=d.get_wait,
        help="seconds a read (DoGet, input call, shuffle read) of a task not yet here waits for it before NOT_FOUND (default: %(default)s)",
    )
    p.add_argument("--feed-window", type=int, default=d.feed_window, help="default credit window per feed partition")
    p.add_argument("--output-buffer-mb", type=int, default=d.output_buffer_bytes >> 20, help="default output buffer per task, MiB")
    p.add_argument(
        "--unit-delay-ms",
        type=float,
        default=d.unit_delay_ms,
        help="add this many ms per work unit (an artificially slow worker, for skew tests and benchmarks)",
    )


def _data_flags(p: argparse.ArgumentParser) -> None:
    """What the worker's readers may read, and how they reach it."""
    p.add_argument(
        "--extension",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE at start (it may register readers); repeatable",
    )
    p.add_argument(
        "--data-root",
        action="append",
        default=[],
        metavar="DIR",
        help="the file readers read only under DIR (symlinks and '..' resolved first), or under a store's "
        "prefix (s3://bucket/prefix); repeatable; without any, every path a work unit names is refused",
    )
    p.add_argument(
        "--fs-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="how to reach an object store, e.g. s3.endpoint_override=host:port, s3.region=..., s3.scheme=http; "
        "repeatable (docs/storage.md). Credentials are better left to the environment or --fs-config: "
        "a command line is visible to every user of the machine",
    )
    p.add_argument("--fs-config", metavar="FILE", help="a JSON object of --fs-option keys and values (read at start)")


def _capacity_flags(p: argparse.ArgumentParser, d: WorkerOptions) -> None:
    """How much the worker takes on, per identity too (admission.py), and when it frees a silent coordinator's task."""
    p.add_argument("--max-tasks", type=int, default=d.max_tasks, help="tasks running at once; more are refused as busy (default: %(default)s)")
    p.add_argument(
        "--source-threads",
        type=int,
        default=d.source_threads,
        help="threads admitted tasks' sources may hold while waiting; the Arrow I/O pool gets this many plus a margin (default: %(default)s)",
    )
    p.add_argument(
        "--memory-budget-mb",
        type=int,
        default=None,
        help="MiB admitted tasks may reserve (output buffers, input queues, kept outputs); beyond it tasks wait or are refused as "
        f"busy (default: half the --memory-limit, at least 256 and at most {d.memory_budget >> 20}: the engine and the buffers share one limit)",
    )
    p.add_argument("--queue-length", type=int, default=d.queue_length, help="tasks that may wait for capacity at once (default: %(default)s)")
    p.add_argument(
        "--queue-wait", type=float, default=d.queue_wait,
        help="seconds a task may wait for capacity before it is refused as busy (default: %(default)s)",
    )
    p.add_argument(
        "--max-tasks-per-client",
        type=int,
        default=None,
        metavar="N",
        help="slots one identity (a token's name, a client certificate) may hold at once, so that another finds room at once "
        f"(default: {int(CLIENT_SHARE * 100)}%% of --max-tasks with --auth-token-file or --tls-client-ca; without them "
        "every caller is one identity, 'anonymous', and the default is --max-tasks)",
    )
    p.add_argument(
        "--max-queued-per-client",
        type=int,
        default=None,
        metavar="N",
        help="tasks one identity may have waiting for capacity at once (each holds a thread); one more is refused as busy "
        f"(default: {MAX_QUEUED_PER_CLIENT} with --auth-token-file or --tls-client-ca, else --queue-length)",
    )
    p.add_argument(
        "--memory-budget-per-client-mb",
        type=int,
        default=None,
        metavar="MIB",
        help="MiB one identity's admitted tasks may reserve (output buffers, input queues, unread units); past it its tasks wait "
        f"(default: {int(CLIENT_MEMORY_SHARE * 100)}%% of --memory-budget-mb with --auth-token-file or --tls-client-ca, "
        "else --memory-budget-mb)",
    )
    p.add_argument(
        "--peer-timeout",
        type=float,
        default=d.peer_timeout,
        help="seconds without a message (heartbeats included) from a task's coordinator before the task is freed (default: %(default)s)",
    )


def _engine_flags(p: argparse.ArgumentParser) -> None:
    """The per-task engine's settings, shared by the process (engine/settings.py)."""
    eng = p.add_argument_group("engine (docs/engine.md)")
    eng.add_argument("--engine", choices=("duckdb", "acero"), default="duckdb",
                     help="the per-task engine; plans DuckDB cannot run with the plan's meaning run on Acero either way (default: %(default)s)")
    eng.add_argument("--memory-limit", type=parse_size, default=None, metavar="SIZE",
                     help="memory the engine may use before it spills, e.g. 4GB or 512MB "
                          f"(default: {int(DEFAULT_MEMORY_FRACTION * 100)}%% of this machine's memory)")
    eng.add_argument("--spill-dir", type=Path, default=None, metavar="DIR",
                     help="where the engine spills joins, aggregates and sorts past --memory-limit, and retained outputs past their bound "
                          "(default: a fresh temporary directory, removed at exit)")
    eng.add_argument("--engine-threads", type=int, default=None, metavar="N", help="engine threads (default: one per core)")


def _security_flags(p: argparse.ArgumentParser) -> None:
    """Who may call the worker, and how it proves itself to callers and to other workers (read by ``_security``)."""
    sec = p.add_argument_group("security (docs/security.md)")
    sec.add_argument(
        "--auth-token-file",
        metavar="FILE",
        help="require a bearer token from FILE on every call: one 'name:token' (or a bare token, named token-N by position) "
        "per line; the name is the caller's identity for fair shares. To rotate, list the new token under a new name",
    )
    sec.add_argument("--public-health", action="store_true", help="with --auth-token-file: let the health action through without a token")
    sec.add_argument("--tls-cert", metavar="FILE", help="serve grpc+tls:// with this PEM certificate chain (needs --tls-key)")
    sec.add_argument("--tls-key", metavar="FILE", help="the PEM private key of --tls-cert")
    sec.add_argument("--tls-client-ca", metavar="FILE", help="require client certificates signed by this PEM CA (mutual TLS)")
    sec.add_argument(
        "--tls-ca",
        metavar="FILE",
        help="PEM CA to verify other workers' certificates when reading their outputs (default: --tls-client-ca, else the system's)",
    )


def _security(args: argparse.Namespace) -> ServerSecurity:
    """The worker's security settings from its flags; files are read once, here."""
    if bool(args.tls_cert) != bool(args.tls_key):
        raise ValueError("--tls-cert and --tls-key go together")
    if args.public_health and not args.auth_token_file:
        raise ValueError("--public-health only makes sense with --auth-token-file")
    if args.tls_client_ca and not args.tls_cert:
        raise ValueError("--tls-client-ca (mutual TLS) needs --tls-cert and --tls-key")
    cert = Path(args.tls_cert).read_bytes() if args.tls_cert else None
    key = Path(args.tls_key).read_bytes() if args.tls_key else None
    client_ca = Path(args.tls_client_ca).read_bytes() if args.tls_client_ca else None
    peer_ca = Path(args.tls_ca).read_bytes() if args.tls_ca else client_ca
    tokens = read_tokens(args.auth_token_file) if args.auth_token_file else []
    peer = Security(
        token=tokens[0].secret.decode() if tokens else None,
        tls_root_certs=peer_ca,
        cert_chain=cert if client_ca else None,  # peers that require client certificates get this worker's own
        private_key=key if client_ca else None,
    )
    return ServerSecurity(cert, key, client_ca, tokens, args.public_health, peer)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    if argv is None:  # run as a program (not called with arguments, e.g. by a test): Arrow's C++ pool too
        reexec_with_arrow_pool(sys.argv[1:])
    limit_malloc_arenas()  # before any thread of ours starts (worker/memory.py)
    use_jemalloc()  # before Arrow allocates: it gives freed memory back (worker/memory.py)
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        roots = DataRoots.of(args.data_root)
    except ValueError as exc:
        parser.error(f"--data-root: {exc}")
    try:
        filesystems = FileSystems(load_options(args.fs_option, args.fs_config))
    except ValueError as exc:
        parser.error(str(exc))
    _prepare_process(args)
    # The engine's spills and the retained outputs (TaskOptions.retain_output) past their bound.
    spill_dir = args.spill_dir
    own_spill = spill_dir is None
    if own_spill:
        spill_dir = Path(tempfile.mkdtemp(prefix="flight-spill-"))
    else:
        spill_dir.mkdir(parents=True, exist_ok=True)
    options = _options(args, roots, spill_dir)
    _configure_readers_and_engine(args, roots, filesystems, spill_dir)
    if args.parent_fd is not None:
        try:
            os.fstat(args.parent_fd)
        except OSError:
            parser.error(f"--parent-fd: {args.parent_fd} is not an open file descriptor")
    wake_r, stop_signals = catch_stop_signals()
    security = _checked_security(args)
    server = _serve(args, options, security)
    log.info("%s; draining", wait_for_stop(wake_r, stop_signals, args.parent_fd))
    _stop(server, args.grace)
    # Leave without interpreter finalization: Arrow and gRPC threads that are still winding down
    # (a stream to a dead peer, say) must not run Python code while the interpreter tears down.
    if own_spill:
        shutil.rmtree(spill_dir, ignore_errors=True)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _prepare_process(args: argparse.Namespace) -> None:
    """What the process needs before any task: the environment, logging, the I/O pool's size, extensions."""
    # Batches that arrive over Flight may sit at any offset; Acero warns on each unless told
    # how to handle them. Copying into aligned memory is the safe choice on every CPU.
    os.environ.setdefault("ACERO_ALIGNMENT_HANDLING", "reallocate")
    logging.basicConfig(
        stream=sys.stderr, level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # Acero runs each task's sources (feed scans, shuffle reads, exchange input) on the I/O pool,
    # where they wait for units or rows. Admission never lets admitted tasks hold more than
    # --source-threads of them; the margin is for file reads that use the pool themselves.
    pa.set_io_thread_count(args.source_threads + IO_MARGIN)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID` dumps every thread's stack
    for module in args.extension:
        importlib.import_module(module)
        log.info("loaded extension %s", module)


MIN_BUDGET = 256 << 20
"""The least a worker's default budget is, whatever its memory limit: a task with many sources reserves 100+ MiB."""


def _memory_limit(args: argparse.Namespace) -> int:
    return int(args.memory_limit or int(physical_memory() * DEFAULT_MEMORY_FRACTION))


def _budget(args: argparse.Namespace) -> int:
    """What admitted tasks may reserve: ``--memory-budget-mb``, else half the memory limit (at most the default).

    Why half: the engine (DuckDB's memory limit, Acero's pool) and the reservations (output buffers,
    input queues, kept outputs) live in one process; with a budget of its own (8 GiB), 48 unread
    queries on a worker limited to 1 GB reserved 3.5 GB and it reached 3.8 GB resident (issue 41)."""
    if args.memory_budget_mb is not None:
        return int(args.memory_budget_mb) << 20
    return min(WorkerOptions().memory_budget, max(_memory_limit(args) // 2, MIN_BUDGET))


def _options(args: argparse.Namespace, roots: DataRoots, spill_dir: Path) -> WorkerOptions:
    """The worker's options from its flags (MiB flags in bytes)."""
    return WorkerOptions(
        feed_window=args.feed_window,
        output_buffer_bytes=args.output_buffer_mb << 20,
        grace=args.grace,
        get_wait=max(0.0, args.get_wait),
        unit_delay_ms=args.unit_delay_ms,
        max_tasks=args.max_tasks,
        source_threads=args.source_threads,
        memory_budget=_budget(args),
        memory_ceiling=_memory_limit(args),
        peer_timeout=args.peer_timeout,
        queue_length=args.queue_length,
        queue_wait=args.queue_wait,
        max_tasks_per_client=args.max_tasks_per_client,
        max_queued_per_client=args.max_queued_per_client,
        memory_budget_per_client=None if args.memory_budget_per_client_mb is None else args.memory_budget_per_client_mb << 20,
        data_roots=roots.paths,
        spill_dir=str(spill_dir),
    )


def _configure_readers_and_engine(args: argparse.Namespace, roots: DataRoots, filesystems: FileSystems, spill_dir: Path) -> None:
    """The process's settings every task shares: what its readers may read and how, and the engine's limits."""
    set_worker_roots(roots)  # what this process's tasks may read (compile_task's default)
    set_filesystems(filesystems)  # how its readers reach the stores URIs name
    memory_limit = _memory_limit(args)
    configure(EngineSettings(engine=args.engine, memory_limit=memory_limit, spill_dir=str(spill_dir), threads=args.engine_threads))
    log.info("engine %s, memory limit %d MiB, spilling to %s", args.engine, memory_limit >> 20, spill_dir)
    if roots:
        log.info("file readers confined to %s", ", ".join([*roots.paths, *map(str, roots.locations)]))
        if roots.locations:
            log.info("object stores: %s", filesystems.describe())
    else:
        log.info("no --data-root: the file readers refuse every path")


def _checked_security(args: argparse.Namespace) -> ServerSecurity:
    """The security settings, and the per-client flags checked; a bad one ends the process (status 2)."""
    try:
        security = _security(args)
    except (OSError, ValueError) as exc:
        print(f"flight-worker: {exc}", file=sys.stderr)
        sys.exit(2)
    for flag, value in (
        ("--max-tasks-per-client", args.max_tasks_per_client),
        ("--max-queued-per-client", args.max_queued_per_client),
        ("--memory-budget-per-client-mb", args.memory_budget_per_client_mb),
    ):
        if value is not None and value < 1:
            print(f"flight-worker: {flag} must be at least 1 (got {value})", file=sys.stderr)
            sys.exit(2)
    return security


def _serve(args: argparse.Namespace, options: WorkerOptions, security: ServerSecurity) -> WorkerServer:
    """The worker, serving; its first line on stdout says where (tools wait for it)."""
    if security.tokens:
        log.info("accepting %d tokens: %s", len(security.tokens), ", ".join(t.name for t in security.tokens))
    server = WorkerServer(
        args.host,
        args.port,
        options,
        security=security,
    )
    cap = server.admission.capacity
    log.info("capacity: %d tasks, %d per client, %d waiting per client, %d MiB per client",
             cap.tasks, cap.client_cap, cap.client_queue, cap.client_budget >> 20)
    if args.metrics_port is not None:
        try:
            port = serve_metrics(server, args.host, args.metrics_port)
        except (PlanError, OSError) as exc:
            print(f"flight-worker: --metrics-port: {exc}", file=sys.stderr)
            sys.exit(2)
        log.info("metrics on http://%s:%d/metrics", args.host, port)
    print(f"flight-worker listening on {server.url}", flush=True)
    # Nobody reads stdout after that line (LocalCluster stops at it): anything a library prints
    # there later would fill the pipe and block the worker, so stdout goes to stderr from here.
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    log.info("flight-worker %s serving on %s", __version__, server.url)
    return server


def _stop(server: WorkerServer, grace: float) -> None:
    """Drain, then stop serving, waiting only a little for calls of clients that never let go."""
    server.drain(grace)
    # shutdown() waits for every call to end; a client that never half-closes an exchange, or
    # stops reading a DoGet, would hold it forever. The tasks are freed already: wait a little.
    stopper = threading.Thread(target=server.shutdown, name="shutdown", daemon=True)
    stopper.start()
    stopper.join(SHUTDOWN_WAIT_S)
    log.info("stopped" if not stopper.is_alive() else "stopped (calls of unresponsive clients were left open)")


if __name__ == "__main__":
    sys.exit(main())
