"""Who looks at the web view, and who may cancel a query there: the service's own users, logged in.

When the service authenticates its Flight SQL clients (``--auth-token-file``, ``--users-file``), its web
view does too, with the same credentials: the page's login form sends a user's password or a token to
``POST /api/login``, which checks it as ``Handshake`` would (``ServiceAuth``) and answers with a session
cookie (a session token as Handshake's, 12 hours; ``HttpOnly``, ``SameSite=Strict``, so that no other
site's page can send it, nor its script read it). The API's calls carry the cookie, or an
``authorization: Bearer`` header as a Flight client's call would. Without either, the API answers 401.

A query may be cancelled by its user or by an operator (``--operators NAME,...``), as by Flight SQL
(``Queries.may_cancel``). A service that authenticates nobody has one user, ``anonymous``, who is both.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from flight.service.users import ServiceAuth

__all__ = ["COOKIE", "WebAuth"]

COOKIE = "flight_session"
ANONYMOUS = "anonymous"
SESSION_SECONDS = 12 * 3600
MAX_LOGIN_BYTES = 4096


class WebAuth:
    """The web view's callers: ``auth`` None is a service open to anyone (everyone is ``anonymous``)."""

    def __init__(self, auth: ServiceAuth | None, operators: frozenset[str]) -> None:
        self.auth = auth
        self.operators = operators

    def caller(self, request: Request) -> str | None:
        """Who sends ``request``; None when the service authenticates and the request carries nothing valid."""
        if self.auth is None:
            return ANONYMOUS
        cookie = request.cookies.get(COOKIE)
        if cookie and len(cookie) < 256:
            name = self.auth.who(b"Bearer " + cookie.encode("ascii", "replace"))
            if name is not None:
                return name
        header = request.headers.get("authorization", "")
        return self.auth.who(header.encode("latin-1", "replace")) if header and len(header) < 4096 else None

    def me(self, name: str) -> dict[str, Any]:
        return {"user": name, "operator": self.auth is None or name in self.operators, "login": self.auth is not None}

    async def log_in(self, request: Request) -> Response:
        """``{"user", "password"}`` or ``{"token"}`` for a session cookie; the same refusal for every wrong one."""
        if self.auth is None:
            return JSONResponse(self.me(ANONYMOUS))
        body = b""
        async for chunk in request.stream():  # read as it comes: a hostile body is dropped before it is held
            body += chunk
            if len(body) > MAX_LOGIN_BYTES:
                return JSONResponse({"error": f"a login is at most {MAX_LOGIN_BYTES} bytes"}, status_code=413)
        fields = _fields(body)
        name = None
        session = None
        if fields.get("token"):
            name = self.auth.who(b"Bearer " + fields["token"].encode())
            session = self.auth.session(name) if name is not None else None
        elif fields.get("user") is not None and fields.get("password") is not None:
            session = self.auth.log_in(fields["user"], fields["password"])
            name = fields["user"] if session is not None else None
        if name is None or session is None:
            return JSONResponse({"error": "wrong user, password or token"}, status_code=401)
        response = JSONResponse(self.me(name))
        response.set_cookie(COOKIE, session, max_age=SESSION_SECONDS, httponly=True, samesite="strict", path="/",
                            secure=request.url.scheme == "https")
        return response

    def log_out(self) -> Response:
        response = JSONResponse({"user": None})
        response.delete_cookie(COOKIE, path="/")
        return response


def _fields(body: bytes) -> dict[str, str]:
    """A login body's string fields; nothing from a body that is too long, no JSON object, or holds other types."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if k in ("user", "password", "token") and isinstance(v, str) and len(v) <= 1024}
