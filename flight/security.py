"""How a client proves who it is to workers and checks who they are: one object, one place.

``Security`` holds a bearer token and TLS material (PEM bytes). ``connect`` is the
only way this package opens a Flight client, so the coordinator, ``map_batches``,
workers reading each other's outputs and the Spark adapters all present the same
credentials: the token rides in an ``authorization: Bearer …`` header added by
client middleware on every call (so no call site can forget it), and TLS verifies
the worker's certificate against ``tls_root_certs`` (and, for mutual TLS, presents
``cert_chain`` / ``private_key``).

Secrets never travel in a plan or a unit and never appear in a ``repr``, a log
line or an error. Where they must reach another process (Spark executors),
``Security.from_env`` reads them from files named by environment variables, so
only file paths travel (docs/security.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow.flight as fl

__all__ = ["ENV_CA", "ENV_CERT", "ENV_KEY", "ENV_TOKEN_FILE", "Security", "SecurityFiles", "connect"]

ENV_TOKEN_FILE = "FLIGHT_EXEC_TOKEN_FILE"
ENV_CA = "FLIGHT_EXEC_TLS_CA"
ENV_CERT = "FLIGHT_EXEC_TLS_CERT"
ENV_KEY = "FLIGHT_EXEC_TLS_KEY"


@dataclass(frozen=True)
class Security:
    """Credentials for talking to workers. All optional: ``Security()`` is plaintext, no token."""

    token: str | None = None
    """A bearer token the workers accept (``flight-worker --auth-token-file``)."""
    tls_root_certs: bytes | None = None
    """PEM of the CA(s) that signed the workers' certificates (for ``grpc+tls://`` URLs)."""
    cert_chain: bytes | None = None
    """PEM client certificate, for workers that require one (``--tls-client-ca``)."""
    private_key: bytes | None = None
    """PEM key of ``cert_chain``."""

    def __repr__(self) -> str:
        parts = [
            "token=<set>" if self.token else "",
            "tls_root_certs=<set>" if self.tls_root_certs else "",
            "client_cert=<set>" if self.cert_chain else "",
        ]
        return f"Security({', '.join(p for p in parts if p)})"

    __str__ = __repr__

    @classmethod
    def from_files(
        cls,
        token_file: str | os.PathLike[str] | None = None,
        ca_file: str | os.PathLike[str] | None = None,
        cert_file: str | os.PathLike[str] | None = None,
        key_file: str | os.PathLike[str] | None = None,
    ) -> Security:
        """Read credentials from files; a token file's first line that is not blank or a ``#`` comment is the token."""
        token = _first_token(Path(token_file)) if token_file else None
        return cls(
            token=token,
            tls_root_certs=Path(ca_file).read_bytes() if ca_file else None,
            cert_chain=Path(cert_file).read_bytes() if cert_file else None,
            private_key=Path(key_file).read_bytes() if key_file else None,
        )

    @classmethod
    def from_env(cls) -> Security:
        """Credentials from the files ``FLIGHT_EXEC_TOKEN_FILE`` / ``_TLS_CA`` / ``_TLS_CERT`` / ``_TLS_KEY`` name."""
        env = os.environ
        return cls.from_files(env.get(ENV_TOKEN_FILE), env.get(ENV_CA), env.get(ENV_CERT), env.get(ENV_KEY))

    @property
    def enabled(self) -> bool:
        return bool(self.token or self.tls_root_certs or self.cert_chain)


@dataclass(frozen=True)
class SecurityFiles:
    """Where credentials are, not what they are: safe to pickle into a Spark closure or put in options.

    Each process that needs the credentials reads the files itself (``load``); with no
    paths set, it falls back to the ``FLIGHT_EXEC_*`` environment variables.
    """

    token_file: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def load(self) -> Security:
        if not any((self.token_file, self.ca_file, self.cert_file, self.key_file)):
            return Security.from_env()
        return Security.from_files(self.token_file, self.ca_file, self.cert_file, self.key_file)

    def to_dict(self) -> dict[str, str]:
        return {k: v for k, v in vars(self).items() if v}

    @classmethod
    def from_dict(cls, values: dict[str, object]) -> SecurityFiles:
        known = {"token_file", "ca_file", "cert_file", "key_file"}
        return cls(**{k: str(v) for k, v in values.items() if k in known and v})


def _first_token(path: Path) -> str:
    """The first line that is neither blank nor a ``#`` comment: the worker's token files skip the same."""
    for line in path.read_text().splitlines():
        if line.strip() and not line.strip().startswith("#"):
            return line.strip()
    raise ValueError(f"the token file {path.name!r} holds no token")


class _BearerFactory(fl.ClientMiddlewareFactory):
    def __init__(self, token: str) -> None:
        self._value = f"Bearer {token}"

    def start_call(self, info: fl.CallInfo) -> fl.ClientMiddleware:
        return _Bearer(self._value)


class _Bearer(fl.ClientMiddleware):
    def __init__(self, value: str) -> None:
        self._value = value

    def sending_headers(self) -> dict[str, list[str] | list[bytes]]:
        return {"authorization": [self._value]}


def connect(url: str, security: Security | None = None) -> fl.FlightClient:
    """A Flight client to ``url`` presenting ``security``'s credentials on every call."""
    sec = security or Security()
    kwargs: dict[str, object] = {}
    if sec.token:
        kwargs["middleware"] = [_BearerFactory(sec.token)]
    if sec.tls_root_certs:
        kwargs["tls_root_certs"] = sec.tls_root_certs
    if sec.cert_chain and sec.private_key:
        kwargs["cert_chain"] = sec.cert_chain
        kwargs["private_key"] = sec.private_key
    # A client outlives its worker's restarts (flight.wire.clients.shared_pool): gRPC would wait up to
    # two minutes between reconnect attempts to a worker that was down; one second is enough.
    kwargs["generic_options"] = [("grpc.max_reconnect_backoff_ms", 1000)]
    return fl.FlightClient(url, **kwargs)  # type: ignore[arg-type]
