"""Who may call a worker, and who is calling: bearer tokens checked by Flight server middleware.

With ``flight-worker --auth-token-file FILE`` every call must carry
``authorization: Bearer <token>`` with one of the file's tokens. The check runs
in ``start_call``, before any handler: a call without a valid token is refused
with ``UNAUTHENTICATED`` and the worker does no work for it. ``--public-health``
lets the ``health`` action through without a token (for load balancers); every
other action still needs one, which ``do_action`` checks through the call's
middleware. Tokens are compared in constant time and never logged. (Mutual TLS,
the other method, is enforced by gRPC itself.)

Tokens have names, the *identity* admission shares the worker by (issue 24).
A line of the file is ``name:token`` or, the older format, a bare token. A bare
token's name is ``token-N``, N its position among the file's tokens (1 for the
first): derived from nothing secret, so a name in a log or in the ``info``
action reveals nothing of the token (a hash prefix would let whoever sees it test
guesses of a weak token offline). Names are 1 to 64 characters of
``A-Z a-z 0-9 . _ -``, starting with a letter or digit; ``anonymous`` is
reserved; a name or a token listed twice is refused, naming the lines (never the
token). For a ``name:token`` line the worker also accepts the whole line as the
token, so an old bare token that happens to contain ``:`` keeps working.
Rotation: list the new token under a new name beside the old one, move the
clients, remove the old line.

Without tokens, a client certificate (mutual TLS) names the caller:
``cert:<identity>``, the identity gRPC reads from the certificate (its subject
alternative name, else its common name). A caller with neither is ``anonymous``.
"""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.flight as fl

from flight.security import Security
from flight.worker.admission import ANONYMOUS

__all__ = [
    "MIDDLEWARE_KEY",
    "ServerSecurity",
    "Token",
    "TokenAuth",
    "identity",
    "is_anonymous",
    "read_tokens",
    "same_secret",
]

MIDDLEWARE_KEY = "auth"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_MAX_CERT_IDENTITY = 128


@dataclass(frozen=True)
class Token:
    """One accepted bearer token and the identity it stands for; its ``repr`` shows only the name."""

    name: str
    secret: bytes = field(repr=False)
    also: bytes = field(default=b"", repr=False)
    """The whole ``name:token`` line, accepted too (a bare token that contained ``:``)."""


def read_tokens(path: str | Path) -> list[Token]:
    """The named tokens of a token file: ``name:token`` or bare-token lines; blank lines and ``#`` comments ignored."""
    where = f"the token file {Path(path).name!r}"
    tokens: list[Token] = []
    lines: dict[str, int] = {}  # name -> line number
    seen: dict[bytes, int] = {}  # accepted token -> line number
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        name, sep, secret = text.partition(":")
        if not sep or not _NAME.fullmatch(name):  # a bare token (one with a colon in it, too, when no name precedes)
            name, secret, also = f"token-{len(tokens) + 1}", text, b""
        else:
            secret, also = secret.strip(), text.encode()
            if not secret:
                raise ValueError(f"{where}, line {number}: the token named {name!r} is empty")
            if name == ANONYMOUS:
                raise ValueError(f"{where}, line {number}: the name {ANONYMOUS!r} is reserved for callers without a token")
        if name in lines:
            raise ValueError(
                f"{where}, line {number}: the name {name!r} is already used on line {lines[name]}; "
                "every token needs a name of its own (bare tokens are named token-1, token-2, ... by position)"
            )
        for accepted in (secret.encode(), also):
            if accepted and accepted in seen:
                raise ValueError(f"{where}, line {number}: the same token is listed on line {seen[accepted]}")
        lines[name] = number
        seen.update({a: number for a in (secret.encode(), also) if a})
        tokens.append(Token(name, secret.encode(), also))
    if not tokens:
        raise ValueError(f"{where} lists no token")
    return tokens


class _Caller(fl.ServerMiddleware):
    def __init__(self, name: str | None) -> None:
        self.name = name
        """The token's name; None: no valid token (only the health action gets this far without one)."""

    @property
    def authenticated(self) -> bool:
        return self.name is not None


class TokenAuth(fl.ServerMiddlewareFactory):
    """Refuses every call without a valid bearer token (``public_health``: except the health action)."""

    def __init__(self, tokens: list[Token], public_health: bool = False, who: str = "this worker") -> None:
        self._expected = [(b"Bearer " + accepted, t.name) for t in tokens for accepted in (t.secret, t.also) if accepted]
        self._public_health = public_health
        self._who = who

    def start_call(self, info: fl.CallInfo, headers: dict[str, list[str] | list[bytes]]) -> fl.ServerMiddleware | None:
        given = headers.get("authorization", [])
        for value in given[:4]:
            raw = value.encode() if isinstance(value, str) else bytes(value)
            name = None
            for expected, candidate in self._expected:  # every comparison made: the time says nothing of which matched
                if hmac.compare_digest(raw, expected):
                    name = candidate
            if name is not None:
                return _Caller(name)
        if self._public_health and info.method == fl.FlightMethod.DO_ACTION:
            return _Caller(None)  # do_action admits only "health" for it
        what = "an invalid token" if given else "no token"
        raise fl.FlightUnauthenticatedError(
            f"{self._who} requires a bearer token (authorization: Bearer …); the call carried {what}"
        )


def is_anonymous(context: fl.ServerCallContext) -> bool:
    """Whether this call came in without a valid token (only possible with ``--public-health``)."""
    caller = context.get_middleware(MIDDLEWARE_KEY)
    return isinstance(caller, _Caller) and not caller.authenticated


def identity(context: fl.ServerCallContext) -> str:
    """Who is calling: the token's name, else ``cert:<identity>`` of a client certificate, else ``anonymous``."""
    caller = context.get_middleware(MIDDLEWARE_KEY)
    if isinstance(caller, _Caller) and caller.name is not None:
        return caller.name
    peer = context.peer_identity()  # under mutual TLS: gRPC's identity of the certificate (SAN, else CN)
    raw = peer.decode("utf-8", "replace") if isinstance(peer, bytes) else str(peer or "")
    text = "".join(ch if ch.isprintable() else "?" for ch in raw)[:_MAX_CERT_IDENTITY]
    return f"cert:{text}" if text else ANONYMOUS


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
    tokens: list[Token] = field(default_factory=list)
    public_health: bool = False
    peer: Security = field(default_factory=Security)
    """What this worker presents when it reads other workers' outputs."""

    @property
    def identifies_callers(self) -> bool:
        """Whether callers can be told apart (tokens or client certificates): else every one is ``anonymous``."""
        return bool(self.tokens) or self.client_ca is not None

    def __repr__(self) -> str:
        return (
            f"ServerSecurity(tls={self.tls_cert is not None}, mtls={self.client_ca is not None}, "
            f"tokens={len(self.tokens)}, public_health={self.public_health})"
        )
