"""``flight-coordinator``: the coordinator service's command line (a daemon, like ``flight-worker``).

The first line on stdout is exactly ``flight-coordinator listening on grpc://HOST:PORT``; logs go
to stderr. Workers come from ``--workers URL,URL``, ``--workers-file F`` (re-read as it changes) or
``--local-workers N`` (a ``LocalCluster`` the service owns: its workers go with it, even when it is
SIGKILLed); with none of them, two local workers. Tables come from ``--table NAME=URI`` (a Parquet
file, directory, glob or ``s3://`` prefix). SIGTERM drains: no new queries, running ones get
``--grace`` seconds, then the service exits 0.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from flight._version import __version__
from flight.coordinator.resolver import FileWorkerResolver, StaticWorkerResolver, WorkerResolver
from flight.daemon import catch_stop_signals, wait_for_stop
from flight.dev.cluster import LocalCluster
from flight.errors import PlanError
from flight.service.queries import Queries
from flight.service.server import CoordinatorServer
from flight.sql.catalog import Catalog

__all__ = ["main"]

log = logging.getLogger("flight.service")

SHUTDOWN_WAIT_S = 3.0
"""After draining, how long the Flight server may take to end its calls before the process exits."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flight-coordinator", description="Serve SQL over Arrow Flight SQL, run on flight-exec workers.")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    p.add_argument("--port", type=int, default=31337, help="port to bind; 0 picks a free one (default: %(default)s)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--workers", default=None, help="the workers' URLs, comma-separated")
    where.add_argument("--workers-file", type=Path, default=None, help="a file of worker URLs, one per line, re-read as it changes")
    where.add_argument("--local-workers", type=int, default=None, metavar="N", help="start N workers the service owns (default: 2)")
    p.add_argument("--data-root", action="append", default=[], help="what --local-workers may read (default: the tables' directories)")
    p.add_argument("--table", action="append", default=[], metavar="NAME=URI", help="a table: Parquet file, directory, glob or s3:// prefix")
    p.add_argument("--endpoints", choices=("direct", "relay"), default="direct",
                   help="results read from the workers (direct), or through the service (relay) (default: %(default)s)")
    p.add_argument("--result-ttl", type=float, default=300.0, help="seconds a query's results wait to be read before it is cancelled")
    p.add_argument("--grace", type=float, default=30.0, help="seconds running queries get on SIGTERM (default: %(default)s)")
    p.add_argument("--parent-fd", type=int, default=None, metavar="FD", help="drain and exit at this inherited pipe's end of file")
    p.add_argument("--log-level", default="INFO", help="logging level on stderr (default: %(default)s)")
    p.add_argument("--version", action="version", version=f"flight-coordinator {__version__}")
    return p


def _catalog(parser: argparse.ArgumentParser, specs: list[str]) -> Catalog:
    catalog = Catalog()
    for spec in specs:
        name, sep, uri = spec.partition("=")
        if not sep or not name or not uri:
            parser.error(f"--table {spec!r}: give NAME=URI")
        try:
            catalog.register(name, uri)
        except (PlanError, ValueError, OSError) as exc:
            parser.error(f"--table {name}: {exc}")
    return catalog


def _roots(args: argparse.Namespace) -> list[str]:
    """What local workers may read: the given roots, else each local table's directory."""
    if args.data_root:
        return list(args.data_root)
    roots = []
    for spec in args.table:
        uri = spec.partition("=")[2]
        if "://" in uri:
            continue
        path = Path(uri.split("*", 1)[0]).resolve()
        roots.append(str(path if path.is_dir() else path.parent))
    return sorted(set(roots))


def main(argv: Sequence[str] | None = None) -> NoReturn:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.parent_fd is not None:
        try:
            os.fstat(args.parent_fd)
        except OSError:
            parser.error(f"--parent-fd: {args.parent_fd} is not an open file descriptor")
    catalog = _catalog(parser, args.table)
    cluster: LocalCluster | None = None
    resolver: WorkerResolver
    if args.workers:
        resolver = StaticWorkerResolver([u.strip() for u in args.workers.split(",") if u.strip()])
    elif args.workers_file is not None:
        resolver = FileWorkerResolver(args.workers_file)
    else:
        count = 2 if args.local_workers is None else args.local_workers
        if count < 1:
            parser.error(f"--local-workers must be at least 1 (got {count})")
        cluster = LocalCluster(count, data_roots=_roots(args)).start()
        resolver = cluster.resolver()
    wake_r, stop_signals = catch_stop_signals()
    queries = Queries(catalog, resolver, None, args.result_ttl)
    server = CoordinatorServer(f"grpc://{args.host}:{args.port}", queries, endpoints=args.endpoints)
    print(f"flight-coordinator listening on {server.url}", flush=True)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # nobody reads stdout after that line
    log.info("flight-coordinator %s serving %d table(s) on %s, %s endpoints", __version__, len(catalog), server.url, args.endpoints)
    log.info("%s; draining", wait_for_stop(wake_r, stop_signals, args.parent_fd))
    _drain(server, queries, args.grace)
    if cluster is not None:
        cluster.stop()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _drain(server: CoordinatorServer, queries: Queries, grace: float) -> None:
    """No new queries; running ones get ``grace`` seconds; then stop serving."""
    server.draining.set()
    deadline = time.monotonic() + grace
    while queries.live() and time.monotonic() < deadline:
        time.sleep(0.1)
    queries.close()
    stopper = threading.Thread(target=server.shutdown, name="shutdown", daemon=True)
    stopper.start()
    stopper.join(SHUTDOWN_WAIT_S)


if __name__ == "__main__":
    main()
