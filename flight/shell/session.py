"""The shell's connection to a ``flight-coordinator``: statements and metadata over ADBC, progress and cancel
over plain Flight.

Statements go through ADBC's Flight SQL driver, as any client's do: the shell tests the service the
way users reach it. Each statement carries a random ``x-flight-exec-tag`` (a call header), by which a
second connection, a pyarrow Flight client with the same credentials, asks the service its progress
(``flight-exec.progress``) while the ADBC call waits for rows, and cancels it on Ctrl-C
(``flight-exec.cancel``: its tasks end on every worker), beside ADBC's own ``adbc_cancel``, which ends
the driver's call. The ADBC call runs on a thread of its own, so that Ctrl-C reaches the shell while
the driver waits in Go; each connection is used by one thread at a time (``adbc_cancel`` is made to
be called from another).
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl
from adbc_driver_flightsql import dbapi

from flight.shell.render import clean_error
from flight.wire.protocol import DIALECT_HEADER, TAG_HEADER

__all__ = ["Cancelled", "Credentials", "Result", "Session", "StatementError"]

HEADER = "adbc.flight.sql.rpc.call_header."
CANCEL_WAIT_S = 15.0
"""How long a cancelled statement's call may take to end before the shell stops waiting for it."""
ACTION_TIMEOUT_S = 5.0


class StatementError(Exception):
    """A statement failed; the text is the service's (``render.clean_error``)."""


class Cancelled(Exception):
    """The user cancelled the statement (Ctrl-C); ``seconds`` after it started."""

    def __init__(self, seconds: float, ended: bool) -> None:
        super().__init__(f"cancelled after {seconds:.1f} s")
        self.seconds = seconds
        self.ended = ended  # the service said it cancelled the query (its tasks end on the workers)


@dataclass(frozen=True)
class Credentials:
    """How to reach the service: each field one flag of ``flight-sql``'s."""

    token: str | None = None  # sent as "authorization: Bearer TOKEN"
    username: str | None = None  # with password: Handshake (Basic), then the session token
    password: str | None = None
    tls_root_certs: str | None = None  # PEM: whom to trust for grpc+tls://
    cert_chain: str | None = None  # PEM: mutual TLS
    private_key: str | None = None

    def adbc(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.token:
            out["adbc.flight.sql.authorization_header"] = f"Bearer {self.token}"
        if self.username is not None:
            out["username"], out["password"] = self.username, self.password or ""
        if self.tls_root_certs:
            out["adbc.flight.sql.client_option.tls_root_certs"] = self.tls_root_certs
        if self.cert_chain and self.private_key:
            out["adbc.flight.sql.client_option.mtls_cert_chain"] = self.cert_chain
            out["adbc.flight.sql.client_option.mtls_private_key"] = self.private_key
        return out


@dataclass(frozen=True)
class Result:
    table: pa.Table
    seconds: float


class Session:
    """One shell's connection: ``run`` a statement, list ``tables``, give a table's ``schema``."""

    def __init__(self, url: str, credentials: Credentials, dialect: str = "duckdb") -> None:
        self.url = url
        self.dialect = dialect
        try:
            self.conn = dbapi.connect(url, db_kwargs=credentials.adbc(), autocommit=True)
        except dbapi.Error as exc:
            raise StatementError(f"cannot connect to {url}: {_text(exc)}") from None
        self._flight = fl.FlightClient(url, tls_root_certs=credentials.tls_root_certs, cert_chain=credentials.cert_chain,
                                       private_key=credentials.private_key)
        headers: list[tuple[bytes, bytes]] = []
        if credentials.token:
            headers.append((b"authorization", f"Bearer {credentials.token}".encode()))
        elif credentials.username is not None:
            name, value = self._flight.authenticate_basic_token(credentials.username, credentials.password or "")
            headers.append((_bytes(name), _bytes(value)))
        # pyarrow wants bytes here; its stubs say str.
        self._call = fl.FlightCallOptions(headers=headers, timeout=ACTION_TIMEOUT_S)  # type: ignore[arg-type]

    def run(self, text: str, on_progress: Callable[[dict[str, Any], float], None] | None = None, poll: float = 0.25) -> Result:
        """Run ``text`` and read all its rows; ``on_progress(progress, seconds)`` every ``poll`` seconds while it runs.

        Raises ``StatementError`` with the service's words, or ``Cancelled`` after a Ctrl-C (KeyboardInterrupt)."""
        tag = secrets.token_hex(16)
        cursor = self.conn.cursor()
        cursor.adbc_statement.set_options(**{HEADER + TAG_HEADER: tag, HEADER + DIALECT_HEADER: self.dialect})
        outcome: list[pa.Table | BaseException] = []

        def call() -> None:
            try:
                cursor.execute(text)
                outcome.append(cursor.fetch_arrow_table())
            except BaseException as exc:  # noqa: BLE001 - handed to the shell's thread
                outcome.append(exc)

        started = time.monotonic()
        caller = threading.Thread(target=call, name="flight-sql-statement", daemon=True)
        caller.start()
        try:
            while caller.is_alive():
                caller.join(poll)
                if caller.is_alive() and on_progress is not None:
                    on_progress(self._action("flight-exec.progress", tag), time.monotonic() - started)
        except KeyboardInterrupt:
            ended = bool(self._action("flight-exec.cancel", tag).get("cancelled"))
            cursor.adbc_cancel()
            caller.join(CANCEL_WAIT_S)
            raise Cancelled(time.monotonic() - started, ended) from None
        finally:
            if not caller.is_alive():
                cursor.close()
        got = outcome[0]
        if isinstance(got, BaseException):
            raise StatementError(_text(got)) from None
        return Result(got, time.monotonic() - started)

    def _action(self, kind: str, tag: str) -> dict[str, Any]:
        """The service's JSON answer to ``kind`` for ``tag``; ``{}`` when it could not be asked (the statement goes on)."""
        try:
            results = list(self._flight.do_action(fl.Action(kind, tag.encode()), self._call))
            return dict(json.loads(results[0].body.to_pybytes())) if results else {}
        except (fl.FlightError, pa.ArrowException, ValueError, OSError):
            return {}

    def tables(self) -> list[tuple[str, str, str]]:
        """Every table as ``(catalog, schema, name)``, from the service's metadata (Flight SQL's GetTables)."""
        objects = self.conn.adbc_get_objects(depth="tables").read_all().to_pylist()
        return [(c["catalog_name"], s["db_schema_name"], t["table_name"])
                for c in objects for s in c["catalog_db_schemas"] or [] for t in s["db_schema_tables"] or []]

    def schema(self, name: str) -> pa.Schema:
        """The columns of table ``name`` (``schema.table`` or ``table``)."""
        schema_name, _, table = name.rpartition(".")
        try:
            return self.conn.adbc_get_table_schema(table, db_schema_filter=schema_name or None)
        except dbapi.Error as exc:
            raise StatementError(f"no table {name!r}: {_text(exc)}") from None

    def close(self) -> None:
        self.conn.close()
        self._flight.close()


def _bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else value


def _text(exc: BaseException) -> str:
    return clean_error(str(exc))
