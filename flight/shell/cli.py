"""``flight-sql``: a SQL shell for flight-exec.

``flight-sql grpc://HOST:PORT`` connects to a ``flight-coordinator`` (ADBC; ``--token-file``, ``--user``,
``--tls-root-certs``, ``--tls-cert``/``--tls-key``, as the service's flags secure it); without a URL it
starts its own service and ``--local-workers`` workers over ``--table NAME=URI`` and ``--catalog FILE``.
``-c SQL`` (repeatable), ``-f FILE`` or piped input run as a script: the first error stops it and the exit
code is 1. Otherwise the prompt (``shell.Shell.interactive``). docs/shell.md has the rest.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from flight._version import __version__
from flight.service.cli import catalog_from_flags, local_roots
from flight.shell.local import LocalService
from flight.shell.session import Credentials, Session, StatementError
from flight.shell.shell import Shell
from flight.worker.auth import read_tokens

__all__ = ["main"]

PASSWORD_ENV = "FLIGHT_SQL_PASSWORD"
HISTORY = Path.home() / ".flight_sql_history"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flight-sql", description="A SQL shell for flight-exec: a flight-coordinator's, or its own workers'.")
    p.add_argument("url", nargs="?", help="the service, grpc://HOST:PORT or grpc+tls://HOST:PORT (none: start local workers)")
    p.add_argument("-c", "--command", action="append", default=[], metavar="SQL", help="run these statements and exit (repeatable)")
    p.add_argument("-f", "--file", type=Path, default=None, help="run the statements of this file and exit")
    p.add_argument("--dialect", choices=("duckdb", "spark"), default="duckdb", help="the SQL dialect of the text (default: %(default)s)")
    p.add_argument("--format", choices=("table", "csv"), default="table", help="how results are shown (default: %(default)s)")
    p.add_argument("--max-rows", type=int, default=40, help="rows a table shows before it elides the middle (default: %(default)s)")
    p.add_argument("--history", type=Path, default=HISTORY, help="the prompt's history file (default: %(default)s)")
    p.add_argument("--no-progress", action="store_true", help="no progress line while a statement runs")
    p.add_argument("--version", action="version", version=f"flight-sql {__version__}")
    sec = p.add_argument_group("connecting to a secured service (docs/service.md)")
    sec.add_argument("--token-file", type=Path, help="send the bearer token in FILE (its first 'name:token' or bare line, as the service's file)")
    sec.add_argument("--user", help=f"log in as USER; the password is read from ${PASSWORD_ENV}, or asked for")
    sec.add_argument("--tls-root-certs", type=Path, metavar="PEM", help="trust the service's certificate from this CA (grpc+tls://)")
    sec.add_argument("--tls-cert", type=Path, metavar="PEM", help="a client certificate, for a service that requires one (with --tls-key)")
    sec.add_argument("--tls-key", type=Path, metavar="PEM", help="the private key of --tls-cert")
    local = p.add_argument_group("without a URL: the shell's own workers")
    local.add_argument("--table", action="append", default=[], metavar="NAME=URI",
                       help="a table: Parquet file, directory, glob, s3:// prefix, or a comma-separated list of files")
    local.add_argument("--catalog", type=Path, default=None, metavar="FILE", help="a TOML catalog, as flight-coordinator's (docs/service.md)")
    local.add_argument("--local-workers", type=int, default=2, metavar="N", help="workers to start (default: %(default)s)")
    local.add_argument("--data-root", action="append", default=[], help="what the workers may read (default: the tables' directories)")
    local.add_argument("--http-port", type=int, default=None, help="serve the web view on this port of 127.0.0.1 (0: any)")
    return p


def _credentials(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Credentials:
    if bool(args.tls_cert) != bool(args.tls_key):
        parser.error("--tls-cert and --tls-key go together")
    if args.token_file and args.user:
        parser.error("--token-file and --user are two ways to log in: give one")
    try:
        # The token file's format is the service's and the workers' (``name:token`` or bare lines): its first token is sent.
        token = read_tokens(args.token_file)[0].secret.decode() if args.token_file else None
        password = None
        if args.user:
            password = os.environ.get(PASSWORD_ENV) or (getpass.getpass(f"password for {args.user}: ") if sys.stdin.isatty() else None)
            if not password:
                parser.error(f"--user {args.user}: no password (set ${PASSWORD_ENV}, or run on a terminal to be asked)")

        def pem(path: Path | None) -> str | None:
            return path.read_text() if path is not None else None

        return Credentials(token, args.user, password, pem(args.tls_root_certs), pem(args.tls_cert), pem(args.tls_key))
    except OSError as exc:
        parser.error(f"{exc.filename}: {exc.strerror}")
    except ValueError as exc:  # read_tokens names the file and the line, never a token
        parser.error(f"--token-file: {exc}")


def main(argv: Sequence[str] | None = None) -> NoReturn:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.url and (args.table or args.catalog):
        parser.error("--table and --catalog are for the shell's own workers; a service at a URL has its own tables")
    if args.max_rows < 2:
        parser.error("--max-rows must be 2 or more")
    credentials = _credentials(parser, args)
    local: LocalService | None = None
    try:
        if args.url is None:
            local = _start_local(parser, args)
            url = local.url
        else:
            url = args.url
        session = Session(url, credentials, args.dialect)
    except StatementError as exc:
        print(f"flight-sql: {exc}", file=sys.stderr)
        _exit(local, 2)
    except KeyboardInterrupt:
        _exit(local, 130)
    shell = Shell(session, progress=not args.no_progress)
    shell.settings.mode, shell.settings.max_rows = args.format, args.max_rows
    try:
        if args.command:
            code = 0
            for text in args.command:
                code = code or shell.run_script(text)
        elif args.file is not None:
            code = shell.run_script(_read(parser, args.file))
        elif not sys.stdin.isatty():
            code = shell.run_script(sys.stdin.read())
        else:
            code = shell.interactive(args.history)
    finally:
        session.close()
    _exit(local, code)


def _start_local(parser: argparse.ArgumentParser, args: argparse.Namespace) -> LocalService:
    if args.local_workers < 1:
        parser.error(f"--local-workers must be at least 1 (got {args.local_workers})")
    catalog = catalog_from_flags(parser, args.table, args.catalog)
    print(f"Starting {args.local_workers} local worker(s) over {len(catalog)} table(s)…", file=sys.stderr, flush=True)
    local = LocalService(catalog, args.local_workers, local_roots(args), http_port=args.http_port)
    if local.page is not None:
        print(f"Web view: {local.page}", file=sys.stderr)
    print(f"Logs: {local.log_file}", file=sys.stderr, flush=True)
    return local


def _read(parser: argparse.ArgumentParser, path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        parser.error(f"-f {path}: {exc.strerror}")


def _exit(local: LocalService | None, code: int) -> NoReturn:
    if local is not None:
        local.stop()
    sys.stdout.flush()
    sys.exit(code)
