"""Who may call a worker: bearer tokens checked by Flight server middleware.

With ``flight-worker --auth-token-file FILE`` every call must carry
``authorization: Bearer <token>`` with one of the file's tokens (one per line:
list the new token beside the old one while clients move over, then drop the old
one). The check runs in ``start_call``, before any handler: a call without a
valid token is refused with ``UNAUTHENTICATED`` and the worker does no work for
it. ``--public-health`` lets the ``health`` action through without a token (for
load balancers); every other action still needs one, which ``do_action`` checks
through the call's middleware. Tokens are compared in constant time and never
logged. (Mutual TLS, the other method, is enforced by gRPC itself.)
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.flight as fl

from flight.security import Security

__all__ = ["MIDDLEWARE_KEY", "ServerSecurity", "TokenAuth", "is_anonymous", "read_tokens", "same_secret"]

MIDDLEWARE_KEY = "auth"


def read_tokens(path: str | Path) -> list[bytes]:
    """The tokens of a token file: one per line, blank lines and ``#`` comments ignored."""
    tokens = []
    for line in Path(path).read_text().splitlines():
        text = line.strip()
        if text and not text.startswith("#"):
            tokens.append(text.encode())
    if not tokens:
        raise ValueError(f"the token file {Path(path).name!r} lists no token")
    return tokens


class _Caller(fl.ServerMiddleware):
    def __init__(self, authenticated: bool) -> None:
        self.authenticated = authenticated


class TokenAuth(fl.ServerMiddlewareFactory):
    """Refuses every call without a valid bearer token (``public_health``: except the health action)."""

    def __init__(self, tokens: list[bytes], public_health: bool = False) -> None:
        self._expected = [b"Bearer " + t for t in tokens]
        self._public_health = public_health

    def start_call(self, info: fl.CallInfo, headers: dict[str, list[str] | list[bytes]]) -> fl.ServerMiddleware | None:
        given = headers.get("authorization", [])
        for value in given[:4]:
            raw = value.encode() if isinstance(value, str) else bytes(value)
            if any(hmac.compare_digest(raw, expected) for expected in self._expected):
                return _Caller(True)
        if self._public_health and info.method == fl.FlightMethod.DO_ACTION:
            return _Caller(False)  # do_action admits only "health" for it
        what = "an invalid token" if given else "no token"
        raise fl.FlightUnauthenticatedError(
            f"this worker requires a bearer token (authorization: Bearer …); the call carried {what}"
        )


def is_anonymous(context: fl.ServerCallContext) -> bool:
    """Whether this call came in without a valid token (only possible with ``--public-health``)."""
    caller = context.get_middleware(MIDDLEWARE_KEY)
    return isinstance(caller, _Caller) and not caller.authenticated


def same_secret(given: bytes, expected: bytes) -> bool:
    """Constant-time comparison of query secrets (an empty expected secret matches nothing)."""
    return bool(expected) and hmac.compare_digest(given, expected)


@dataclass(frozen=True)
class ServerSecurity:
    """A worker's security settings (``flight-worker --tls-* --auth-token-file --public-health``)."""

    tls_cert: bytes | None = None
    tls_key: bytes | None = None
    client_ca: bytes | None = None
    """PEM CA that client certificates must chain to; set = mutual TLS required."""
    tokens: list[bytes] = field(default_factory=list)
    public_health: bool = False
    peer: Security = field(default_factory=Security)
    """What this worker presents when it reads other workers' outputs."""

    def __repr__(self) -> str:
        return (
            f"ServerSecurity(tls={self.tls_cert is not None}, mtls={self.client_ca is not None}, "
            f"tokens={len(self.tokens)}, public_health={self.public_health})"
        )
