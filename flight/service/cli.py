"""``flight-coordinator``: the coordinator service's command line (a daemon, like ``flight-worker``).

The first line on stdout is exactly ``flight-coordinator listening on grpc://HOST:PORT`` (with
``--http-port``, the second is ``flight-coordinator web view on http://HOST:PORT/``); logs go to
stderr. Workers come from ``--workers URL,URL``, ``--workers-file F`` (re-read as it changes) or
``--local-workers N`` (a ``LocalCluster`` the service owns: its workers go with it, even when it is
SIGKILLed); with none of them, two local workers. Tables come from ``--table NAME=URI`` (a Parquet
file, directory, glob or ``s3://`` prefix). SIGTERM drains: no new queries, running ones get
``--grace`` seconds, then the service exits 0.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from flight._version import __version__
from flight.coordinator.dns import DnsWorkerResolver
from flight.coordinator.resolver import FileWorkerResolver, StaticWorkerResolver, WorkerResolver
from flight.daemon import catch_stop_signals, wait_for_stop
from flight.dev.cluster import LocalCluster
from flight.errors import PlanError, ResolverError
from flight.plan.query import read_parquet
from flight.security import Security
from flight.service.admission import Admission
from flight.service.queries import Queries
from flight.service.server import CoordinatorServer
from flight.service.users import HandshakeDone, ServiceAuth, hash_password, read_users
from flight.service.web import Metrics, WebView
from flight.sql.catalog import Catalog
from flight.sql.catalog_file import load_catalog_file, local_paths
from flight.worker.auth import MIDDLEWARE_KEY, read_tokens

__all__ = ["catalog_from_flags", "local_roots", "main"]

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
    where.add_argument("--workers-dns", default=None, metavar="URL",
                       help="workers found in DNS, re-resolved every 5 s: grpc[+tls]://NAME:PORT (A/AAAA records, e.g. a Kubernetes "
                       "headless Service) or grpc[+tls]://_SERVICE._tcp.NAME (SRV records); needs the fleet extra (dnspython)")
    where.add_argument("--local-workers", type=int, default=None, metavar="N", help="start N workers the service owns (default: 2)")
    p.add_argument("--data-root", action="append", default=[], help="what --local-workers may read (default: the tables' directories)")
    p.add_argument("--table", action="append", default=[], metavar="NAME=URI",
                   help="a table: Parquet file, directory, glob, s3:// prefix, or a comma-separated list of files")
    p.add_argument("--catalog", type=Path, default=None, metavar="FILE",
                   help="a TOML catalog: [tables] (Parquet, Delta) and [iceberg.NAME] catalogs (docs/service.md)")
    p.add_argument("--endpoints", choices=("auto", "direct", "relay"), default="auto",
                   help="results read from the workers (direct), or through the service (relay); auto: direct unless clients "
                   "authenticate or the workers want credentials (default: %(default)s)")
    p.add_argument("--max-queries", type=int, default=16, help="queries run at once; the rest wait (default: %(default)s)")
    p.add_argument("--max-queries-per-user", type=int, default=None,
                   help="queries one user runs at once while others wait (default: half of --max-queries, at least 1)")
    p.add_argument("--queue-wait", type=float, default=60.0, help="seconds a query waits for a slot before it is refused (default: %(default)s)")
    p.add_argument("--query-timeout", type=float, default=None, help="seconds a query may run, from its start (default: no limit)")
    p.add_argument("--http-port", type=int, default=None, help="serve the web page, its JSON API and /metrics on this port (0: any)")
    p.add_argument("--result-ttl", type=float, default=300.0, help="seconds a query's results wait to be read before it is cancelled")
    p.add_argument("--grace", type=float, default=30.0, help="seconds running queries get on SIGTERM (default: %(default)s)")
    p.add_argument("--parent-fd", type=int, default=None, metavar="FD", help="drain and exit at this inherited pipe's end of file")
    p.add_argument("--log-level", default="INFO", help="logging level on stderr (default: %(default)s)")
    p.add_argument("--version", action="version", version=f"flight-coordinator {__version__}")
    sec = p.add_argument_group("security (docs/service.md)")
    sec.add_argument("--auth-token-file", metavar="FILE", help="require a bearer token from FILE ('name:token' lines, as flight-worker's)")
    sec.add_argument("--users-file", metavar="FILE",
                     help="users with passwords ('name:scrypt$...' lines: flight-coordinator hash-password), traded on Handshake for a session token")
    sec.add_argument("--operators", default="", metavar="NAME,NAME",
                     help="users (of --auth-token-file or --users-file) who may cancel anyone's query, on the web page too")
    sec.add_argument("--tls-cert", metavar="FILE", help="serve grpc+tls:// with this PEM certificate chain (needs --tls-key)")
    sec.add_argument("--tls-key", metavar="FILE", help="the PEM private key of --tls-cert")
    sec.add_argument("--tls-client-ca", metavar="FILE", help="require client certificates signed by this PEM CA (mutual TLS)")
    sec.add_argument("--worker-token-file", metavar="FILE", help="the bearer token the service presents to the workers")
    sec.add_argument("--worker-tls-ca", metavar="FILE", help="PEM CA of the workers' certificates (grpc+tls:// workers)")
    sec.add_argument("--worker-cert", metavar="FILE", help="PEM client certificate for workers that require one (with --worker-key)")
    sec.add_argument("--worker-key", metavar="FILE", help="the PEM private key of --worker-cert")
    return p


def _server_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, object]:
    """The Flight server's TLS and authentication settings from the flags; a bad one ends the process."""
    if bool(args.tls_cert) != bool(args.tls_key):
        parser.error("--tls-cert and --tls-key go together")
    if args.tls_client_ca and not args.tls_cert:
        parser.error("--tls-client-ca (mutual TLS) needs --tls-cert and --tls-key")
    options: dict[str, object] = {}
    try:
        if args.tls_cert:
            options["tls_certificates"] = [(Path(args.tls_cert).read_bytes(), Path(args.tls_key).read_bytes())]
        if args.tls_client_ca:
            options["verify_client"] = True
            options["root_certificates"] = Path(args.tls_client_ca).read_bytes()
        if args.auth_token_file or args.users_file:
            tokens = read_tokens(args.auth_token_file) if args.auth_token_file else []
            users = read_users(args.users_file) if args.users_file else {}
            options["middleware"] = {MIDDLEWARE_KEY: ServiceAuth(tokens, users)}
            if users:
                options["auth_handler"] = HandshakeDone()
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    return options


def _worker_security(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Security | None:
    if bool(args.worker_cert) != bool(args.worker_key):
        parser.error("--worker-cert and --worker-key go together")
    try:
        security = Security.from_files(args.worker_token_file, args.worker_tls_ca, args.worker_cert, args.worker_key)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    return security if security.enabled else None


def catalog_from_flags(parser: argparse.ArgumentParser, specs: list[str], path: Path | None) -> Catalog:
    """The catalog of ``--catalog FILE`` and ``--table NAME=URI`` flags (also ``flight-sql``'s); a bad one ends the process."""
    try:
        catalog = load_catalog_file(path) if path is not None else Catalog()
    except PlanError as exc:
        parser.error(f"--catalog: {exc}")
    for spec in specs:
        name, sep, uri = spec.partition("=")
        if not sep or not name or not uri:
            parser.error(f"--table {spec!r}: give NAME=URI")
        try:
            # A comma-separated list of files is read as that list: its size and key ranges known
            # from the footers while planning (a directory or glob is listed as the query runs).
            catalog.register(name, read_parquet(uri.split(",")) if "," in uri else uri)
        except (PlanError, ValueError, OSError) as exc:
            parser.error(f"--table {name}: {exc}")
    return catalog


def _dns_resolver(parser: argparse.ArgumentParser, url: str) -> WorkerResolver:
    """``--workers-dns``: scheme, DNS name and port (none for an SRV name) to a ``DnsWorkerResolver``."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("grpc", "grpc+tcp", "grpc+tls"):
        parser.error(f"--workers-dns: {url!r} must be grpc://NAME:PORT, grpc+tls://NAME:PORT or grpc[+tls]://_SERVICE._tcp.NAME")
    name, colon, port = rest.rpartition(":")
    if not colon or rest.endswith("]"):
        name, port = rest, ""
    try:
        return DnsWorkerResolver(name, int(port) if port else None, scheme="grpc" if scheme == "grpc+tcp" else scheme)
    except (ResolverError, ValueError) as exc:
        parser.error(f"--workers-dns: {exc}")


def local_roots(args: argparse.Namespace) -> list[str]:
    """What local workers may read: the given roots, else each local table's directory (``--table``s and the ``--catalog``'s)."""
    if args.data_root:
        return list(args.data_root)
    roots = []
    uris = [spec.partition("=")[2] for spec in args.table] + (local_paths(args.catalog) if args.catalog is not None else [])
    for uri in uris:
        if "://" in uri:
            continue
        for part in uri.split(","):
            path = Path(part.split("*", 1)[0]).resolve()
            roots.append(str(path if path.is_dir() else path.parent))
    return sorted(set(roots))


def _resolver(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[WorkerResolver, LocalCluster | None]:
    """Where the workers are, and the local cluster the service owns when it starts its own."""
    if args.workers:
        return StaticWorkerResolver([u.strip() for u in args.workers.split(",") if u.strip()]), None
    if args.workers_file is not None:
        return FileWorkerResolver(args.workers_file), None
    if args.workers_dns is not None:
        return _dns_resolver(parser, args.workers_dns), None
    count = 2 if args.local_workers is None else args.local_workers
    if count < 1:
        parser.error(f"--local-workers must be at least 1 (got {count})")
    cluster = LocalCluster(count, data_roots=local_roots(args)).start()
    return cluster.resolver(), cluster


def _admission(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Admission:
    per_user = args.max_queries_per_user if args.max_queries_per_user is not None else max(1, args.max_queries // 2)
    try:
        return Admission(args.max_queries, per_user, args.queue_wait)
    except ValueError as exc:
        parser.error(f"--max-queries, --max-queries-per-user, --queue-wait: {exc}")


def _hash_password() -> NoReturn:
    """``flight-coordinator hash-password``: a password from stdin (asked for on a terminal) as a users-file hash."""
    import getpass

    password = getpass.getpass("password: ") if sys.stdin.isatty() else sys.stdin.readline().rstrip("\n")
    if not password:
        print("flight-coordinator hash-password: an empty password is refused", file=sys.stderr)
        sys.exit(2)
    print(hash_password(password))
    sys.exit(0)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["hash-password"]:
        _hash_password()
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID` dumps every thread's stack, as a worker's does
    if args.parent_fd is not None:
        try:
            os.fstat(args.parent_fd)
        except OSError:
            parser.error(f"--parent-fd: {args.parent_fd} is not an open file descriptor")
    catalog = catalog_from_flags(parser, args.table, args.catalog)
    resolver, cluster = _resolver(parser, args)
    options = _server_options(parser, args)
    security = _worker_security(parser, args)
    # A client's credentials are for the service alone: a client reading a worker would present them
    # there (ADBC sends its headers to every location), and the workers may want others.
    guarded = security is not None or args.auth_token_file is not None or args.users_file is not None
    endpoints = args.endpoints if args.endpoints != "auto" else ("relay" if guarded else "direct")
    if endpoints == "direct" and guarded:
        log.warning("direct endpoints with credentials: clients may send theirs to the workers, and need the workers' own")
    wake_r, stop_signals = catch_stop_signals()
    metrics = Metrics()
    operators = frozenset(n.strip() for n in args.operators.split(",") if n.strip())
    queries = Queries(catalog, resolver, security, args.result_ttl, admission=_admission(parser, args), query_timeout=args.query_timeout,
                      on_end=metrics.ended, operators=operators)
    scheme = "grpc+tls" if "tls_certificates" in options else "grpc"
    server = CoordinatorServer(f"{scheme}://{args.host}:{args.port}", queries, endpoints=endpoints, **options)
    auth = options.get("middleware", {}).get(MIDDLEWARE_KEY)  # type: ignore[attr-defined]  # the clients' ServiceAuth, or none
    web = WebView(queries, metrics, args.host, args.http_port, auth) if args.http_port is not None else None
    page = web.start() if web is not None else None
    print(f"flight-coordinator listening on {server.url}", flush=True)
    if page is not None:
        print(f"flight-coordinator web view on {page}", flush=True)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # nobody reads stdout after that line
    log.info("flight-coordinator %s serving %d table(s) on %s, %s endpoints", __version__, len(catalog), server.url, endpoints)
    log.info("%s; draining", wait_for_stop(wake_r, stop_signals, args.parent_fd))
    _drain(server, queries, args.grace)
    if web is not None:
        web.stop()
    if cluster is not None:
        cluster.stop()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _drain(server: CoordinatorServer, queries: Queries, grace: float) -> None:
    """No new queries; running ones get ``grace`` seconds; then stop serving."""
    server.draining.set()
    queries.admission.wait_idle(grace)
    queries.close()
    stopper = threading.Thread(target=server.shutdown, name="shutdown", daemon=True)
    stopper.start()
    stopper.join(SHUTDOWN_WAIT_S)


if __name__ == "__main__":
    main()
