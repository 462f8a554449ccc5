"""``python -m flight.worker.probe``: is a worker up and taking tasks? A container's health check.

Exit status 0 when the worker answers the ``health`` action with ``ok``; 1 otherwise (it is
draining, unreachable, silent past ``--timeout``, refuses the credentials, or the flags are
wrong), with one line on stderr saying why. Never 2: Docker reserves it in a HEALTHCHECK.

Why a file of its own that imports nothing of ``flight``: Docker's HEALTHCHECK and a Kubernetes
readiness probe run it every few seconds inside the worker's container, where its CPU and memory
count against the worker's limits. ``import flight`` loads the whole package (about 2 s of CPU and
140 MB here); this file alone needs only pyarrow.flight (0.5 s, 65 MB), so the image runs it as a
plain file, ``python -P .../flight/worker/probe.py`` (``flight-probe`` in the image, docs/deploy.md).

Secrets come from files, never from the command line (which every user of the machine can read):
``--token-file`` (its first line that is not blank or a ``#`` comment, as a worker presents its own)
and ``--tls-ca``; each flag falls back to the ``FLIGHT_EXEC_*`` variable clients already use. With
``--public-health`` on the worker no token is needed. ``--tls-server-name`` checks the worker's
certificate for that name while dialling another (a probe inside a pod dials 127.0.0.1).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import pyarrow as pa
import pyarrow.flight as fl

__all__ = ["DEFAULT_URL", "check", "main"]

DEFAULT_URL = "grpc://127.0.0.1:50051"
"""``flight-worker``'s own default address."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's status 2 means "reserved" to Docker
        self.exit(1, f"unhealthy: {self.prog}: {message}\n")


class _Bearer(fl.ClientMiddlewareFactory):
    def __init__(self, token: str) -> None:
        self._headers: dict[str, list[str] | list[bytes]] = {"authorization": [f"Bearer {token}"]}

    def start_call(self, info: fl.CallInfo) -> fl.ClientMiddleware:
        return _SendHeaders(self._headers)


class _SendHeaders(fl.ClientMiddleware):
    def __init__(self, headers: dict[str, list[str] | list[bytes]]) -> None:
        self._headers = headers

    def sending_headers(self) -> dict[str, list[str] | list[bytes]]:
        return self._headers


def _token(path: Path) -> str:
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            return line.strip()
    raise ValueError(f"the token file {str(path)!r} holds no token")


def _reason(exc: BaseException) -> str:
    """pyarrow's message without gRPC's debug context, on one line."""
    text = str(exc).split(". gRPC client debug context", 1)[0].split(". Detail:", 1)[0]
    text = text.replace("Flight returned ", "").replace("Flight error: ", "")
    return " ".join(text.split())[:300] or type(exc).__name__


def check(
    url: str,
    timeout: float = 3.0,
    token_file: str | None = None,
    tls_ca: str | None = None,
    tls_server_name: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
) -> str | None:
    """None if the worker at ``url`` answered ``health`` with ok within ``timeout`` seconds; otherwise why not."""
    kwargs: dict[str, object] = {}
    try:
        if token_file:
            kwargs["middleware"] = [_Bearer(_token(Path(token_file)))]
        if tls_ca:
            kwargs["tls_root_certs"] = Path(tls_ca).read_bytes()
        if tls_cert and tls_key:
            kwargs["cert_chain"], kwargs["private_key"] = Path(tls_cert).read_bytes(), Path(tls_key).read_bytes()
    except (OSError, ValueError) as exc:
        return f"cannot read the probe's credentials: {exc}"
    if tls_server_name:
        kwargs["override_hostname"] = tls_server_name
    try:
        with fl.FlightClient(url, **kwargs) as client:  # type: ignore[arg-type]  # the options' types vary per keyword
            answers = [r.body.to_pybytes() for r in client.do_action(fl.Action("health", b""), fl.FlightCallOptions(timeout=timeout))]
    except (pa.ArrowException, OSError) as exc:
        return _reason(exc)
    return None if answers == [b"ok"] else f"it answered health with {answers!r:.100}"


def _parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = _Parser(prog="flight-probe", description="Exit 0 if a flight-exec worker answers its health action, else 1 with the reason.")
    p.add_argument("--url", default=env("FLIGHT_EXEC_PROBE_URL", DEFAULT_URL),
                   help="the worker (default: $FLIGHT_EXEC_PROBE_URL, else %(default)s); grpc+tls:// for TLS")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds the worker has to answer (default: %(default)s)")
    p.add_argument("--token-file", default=env("FLIGHT_EXEC_TOKEN_FILE"), metavar="FILE",
                   help="bearer token: the file's first line (default: $FLIGHT_EXEC_TOKEN_FILE; none for --public-health workers)")
    p.add_argument("--tls-ca", default=env("FLIGHT_EXEC_TLS_CA"), metavar="FILE",
                   help="PEM CA of the worker's certificate (default: $FLIGHT_EXEC_TLS_CA, else the system's)")
    p.add_argument("--tls-server-name", default=env("FLIGHT_EXEC_PROBE_SERVER_NAME"), metavar="NAME",
                   help="check the certificate for NAME, not --url's host (a pod's probe dials 127.0.0.1; default: $FLIGHT_EXEC_PROBE_SERVER_NAME)")
    p.add_argument("--tls-cert", default=env("FLIGHT_EXEC_TLS_CERT"), metavar="FILE",
                   help="PEM client certificate, for mutual-TLS workers (default: $FLIGHT_EXEC_TLS_CERT)")
    p.add_argument("--tls-key", default=env("FLIGHT_EXEC_TLS_KEY"), metavar="FILE", help="its PEM key (default: $FLIGHT_EXEC_TLS_KEY)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if bool(args.tls_cert) != bool(args.tls_key):
        print(f"unhealthy: {args.url}: --tls-cert and --tls-key go together", file=sys.stderr)
        return 1
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # gRPC's own log lines would bury the one line of ours
    why = check(args.url, args.timeout, args.token_file, args.tls_ca, args.tls_server_name, args.tls_cert, args.tls_key)
    if why is not None:
        print(f"unhealthy: {args.url}: {why}", file=sys.stderr)
        return 1
    print(f"healthy: {args.url} answered health with ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
