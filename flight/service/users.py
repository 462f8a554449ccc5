"""Who may use the service: bearer tokens, and usernames with passwords traded for a session token.

``--auth-token-file`` lists tokens as the workers' file does (``name:token``). ``--users-file`` lists
users as ``name:scrypt$N$r$p$SALT$HASH`` (base64 salt and hash; ``flight-coordinator hash-password``
makes a line), never a password in plain text; ``hashlib.scrypt`` derives the hash. A client sends
``authorization: Basic base64(name:password)`` on Flight's ``Handshake`` (what ADBC does with its
``username`` and ``password`` options) and gets ``authorization: Bearer <session token>`` back in the
response headers, which it sends on every later call. Session tokens are 256 random bits, expire
after ``session_seconds``, and are compared in constant time; neither they nor passwords are logged.

A call that carries neither a valid token nor (on ``Handshake``) valid credentials is refused with
``UNAUTHENTICATED`` before any handler runs. The caller's name is the query's user.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow.flight as fl

from flight.worker.auth import Token

__all__ = ["HandshakeDone", "ServiceAuth", "caller_name", "hash_password", "read_users"]

_SCRYPT = (2**14, 8, 1)
_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]{0,63}):scrypt\$(\d+)\$(\d+)\$(\d+)\$([A-Za-z0-9+/=]+)\$([A-Za-z0-9+/=]+)$")
MAX_SESSIONS = 100_000


def hash_password(password: str, salt: bytes | None = None) -> str:
    """``scrypt$N$r$p$SALT$HASH`` of ``password`` (a fresh 16-byte salt unless given)."""
    salt = salt or secrets.token_bytes(16)
    n, r, p = _SCRYPT
    digest = hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, dklen=32)
    return f"scrypt${n}${r}${p}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def read_users(path: str | Path) -> dict[str, tuple[int, int, int, bytes, bytes]]:
    """The users of a users file: name -> scrypt parameters, salt and hash. A bad line is refused by number."""
    users: dict[str, tuple[int, int, int, bytes, bytes]] = {}
    for number, raw in enumerate(Path(path).read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if m is None:
            raise ValueError(f"{path}: line {number} is not 'name:scrypt$N$r$p$SALT$HASH' (make one with flight-coordinator hash-password)")
        name, n, r, p, salt, digest = m.groups()
        if name in users:
            raise ValueError(f"{path}: user {name!r} is listed twice (line {number})")
        users[name] = (int(n), int(r), int(p), base64.b64decode(salt), base64.b64decode(digest))
    return users


class _Caller(fl.ServerMiddleware):
    def __init__(self, name: str, issued: str | None = None) -> None:
        self.name = name
        self._issued = issued

    def sending_headers(self) -> dict[str, list[str] | list[bytes]]:
        return {"authorization": [f"Bearer {self._issued}"]} if self._issued else {}


class ServiceAuth(fl.ServerMiddlewareFactory):
    """Bearer tokens (static, or issued for a password on ``Handshake``); ``None`` of either: anyone."""

    def __init__(self, tokens: list[Token], users: dict[str, tuple[int, int, int, bytes, bytes]], session_seconds: float = 12 * 3600) -> None:
        self._tokens = [(b"Bearer " + t.secret, t.name) for t in tokens]
        self._users = users
        self._session_seconds = session_seconds
        self._sessions: dict[bytes, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def start_call(self, info: fl.CallInfo, headers: dict[str, list[str] | list[bytes]]) -> fl.ServerMiddleware | None:
        for value in headers.get("authorization", [])[:4]:
            raw = value.encode() if isinstance(value, str) else bytes(value)
            name = self._bearer(raw)
            if name is not None:
                return _Caller(name)
            if raw[:6].lower() == b"basic " and info.method == fl.FlightMethod.HANDSHAKE:
                name = self._password(raw[6:])
                if name is not None:
                    return _Caller(name, self._issue(name))
                raise fl.FlightUnauthenticatedError("flight-coordinator: wrong username or password")
        what = "an invalid token" if headers.get("authorization") else "no token"
        raise fl.FlightUnauthenticatedError(
            f"flight-coordinator requires a bearer token (authorization: Bearer …), or a username and password on Handshake; the call carried {what}"
        )

    def who(self, authorization: bytes) -> str | None:
        """The name an ``authorization`` value (``Bearer <token>``: a static or a session token) stands for; None: nobody."""
        return self._bearer(authorization)

    def log_in(self, name: str, password: str) -> str | None:
        """A session token for ``name`` when ``password`` is its password (the web view's login), else None."""
        basic = base64.b64encode(f"{name}:{password}".encode())
        return self._issue(name) if self._password(basic) == name else None

    def session(self, name: str) -> str:
        """A new session token for ``name``, already authenticated (a web login by a static token)."""
        return self._issue(name)

    def _bearer(self, raw: bytes) -> str | None:
        name = None
        for expected, candidate in self._tokens:  # every comparison made: the time says nothing of which matched
            if hmac.compare_digest(raw, expected):
                name = candidate
        if name is None and raw[:7] == b"Bearer ":
            with self._lock:
                session = self._sessions.get(hashlib.sha256(raw[7:]).digest())
            if session is not None and session[1] > time.monotonic():
                name = session[0]
        return name

    def _password(self, encoded: bytes) -> str | None:
        encoded = encoded.strip()
        encoded += b"=" * (-len(encoded) % 4)  # Go's clients (ADBC's driver) send it unpadded
        try:
            name, _, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return None
        user = self._users.get(name)
        if user is None:
            hashlib.scrypt(password.encode(), salt=b"\0" * 16, n=_SCRYPT[0], r=_SCRYPT[1], p=_SCRYPT[2], dklen=32)  # as long as a real check
            return None
        n, r, p, salt, digest = user
        given = hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, dklen=len(digest))
        return name if hmac.compare_digest(given, digest) else None

    def _issue(self, name: str) -> str:
        token = secrets.token_urlsafe(32)
        now = time.monotonic()
        with self._lock:
            if len(self._sessions) >= MAX_SESSIONS:
                self._sessions = {k: v for k, v in self._sessions.items() if v[1] > now}
            # Kept by its hash: a dump of the service's memory shows no token a client could present.
            self._sessions[hashlib.sha256(token.encode()).digest()] = (name, now + self._session_seconds)
        return token


class HandshakeDone(fl.ServerAuthHandler):
    """Lets ``Handshake`` through to the middleware, which checked its Basic header and answers with the
    session token in the response headers (pyarrow refuses ``Handshake`` without an auth handler).
    Every other call is ``ServiceAuth``'s to check, so any token passes here."""

    def authenticate(self, outgoing: Any, incoming: Any) -> None:
        return None

    def is_valid(self, token: Any) -> Any:  # pyarrow's contract: the peer identity (bytes); the stubs say bool
        return b""


def caller_name(context: fl.ServerCallContext, key: str) -> str | None:
    caller = context.get_middleware(key)
    return caller.name if isinstance(caller, _Caller) else None
