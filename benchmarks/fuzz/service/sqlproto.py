"""Flight SQL's messages for the service fuzzer, loaded as the worker fuzzer loads its own (by path, never ``flight``).

A Flight SQL command travels as a ``google.protobuf.Any`` whose ``type_url`` names a message of
``FlightSql.proto``; the service unpacks it (``flight/service/commands.py``). The fuzzer writes the
envelope itself so that it can lie in it: a wrong or huge ``type_url``, a value of another message,
bytes that are not UTF-8 where a string belongs.
"""

from __future__ import annotations

import base64
import hashlib
import random
from typing import Any

from google.protobuf import any_pb2
from google.protobuf.message import Message

from benchmarks.fuzz.proto import load_proto, pb_field, ser

__all__ = [
    "FLIPPED",
    "HANDLE",
    "PASSWORD",
    "PREFIX",
    "RELAY",
    "TABLES",
    "TOKEN",
    "USER",
    "F",
    "S",
    "command_seed",
    "envelope",
    "hash_password",
    "pack",
    "parameter_queries",
    "statements",
]

S = load_proto("FlightSql_pb2")
F = load_proto("Flight_pb2")
PREFIX = "type.googleapis.com/arrow.flight.protocol.sql."

HANDLE = b"\x00fuzz:prepared\x00\x00"
"""Stands for the prepared statement a case created (16 bytes, as the service's handles): the runner puts it in."""
FLIPPED = b"\x00fuzz:flipped\x00\x00\x00"
"""Stands for that handle with one bit flipped (the step's ``flip`` says which)."""
RELAY = b"\x00fuzz:relayhnd\x00\x00"
"""Stands for the relay handle of the case's last statement (a ``TicketStatementQuery``'s)."""
TOKEN = "fuzz-token-7f3c9a1e5b2d4c6f8a0b1c2d3e4f5a6b"
USER, PASSWORD = "fuzzer", "fuzz-password"
TABLES = ("t", "lineitem_fuzz_table")
"""The owned service's tables (the same Parquet file): a long name gives a LIKE pattern room to backtrack."""


def pack(message: Message) -> bytes:
    return envelope(PREFIX + message.DESCRIPTOR.name, ser(message))


def envelope(type_url: str | bytes, value: bytes) -> bytes:
    """An ``Any`` written field by field: ``type_url`` may be bytes that are not UTF-8."""
    url = type_url.encode() if isinstance(type_url, str) else type_url
    return pb_field(1, url) + pb_field(2, value) if value else pb_field(1, url)


def hash_password(password: str, salt: bytes = b"flight-exec-fuzz") -> str:
    """A ``--users-file`` line's hash (``scrypt$N$r$p$SALT$HASH``), as ``flight-coordinator hash-password`` writes it."""
    n, r, p = 2**14, 8, 1
    digest = hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, dklen=32)
    return f"scrypt${n}${r}${p}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def statements() -> list[str]:
    """Statements the service runs on its table quickly (each case reads its results to the end)."""
    return ["SELECT 1 AS one", "SELECT id, name FROM t WHERE id < 5", "SELECT name, count(*) AS n FROM t GROUP BY name ORDER BY name",
            "SELECT * FROM t ORDER BY id LIMIT 3", "SELECT max(score) AS top FROM lineitem_fuzz_table",
            "EXPLAIN SELECT name, count(*) AS n FROM t GROUP BY name", "-- why\nexplain analyze SELECT * FROM t WHERE id < 3",
            "EXPLAIN EXPLAIN SELECT 1", "EXPLAIN ANALYZE"]


def parameter_queries() -> list[str]:
    return ["SELECT id, name FROM t WHERE id = ?", "SELECT ? + 1 AS x", "SELECT name FROM t WHERE name LIKE ?",
            "SELECT id FROM t WHERE score > ? AND name = ?"]


def command_seed(rng: random.Random) -> tuple[str, Any]:
    """A command the service answers (or refuses by name), and where it goes: ``info``, ``schema``, ``doget`` or an action."""
    kind = rng.choice(["statement", "statement", "tables", "tables", "schemas", "catalogs", "table_types", "sql_info", "ticket",
                       "prepared", "unsupported", "create", "close", "cancel_query", "cancel_info"])
    if kind == "statement":
        return rng.choice(["info", "info", "schema"]), S.CommandStatementQuery(query=rng.choice(statements()))
    if kind == "tables":
        return rng.choice(["info", "schema", "doget"]), S.CommandGetTables(
            catalog="flight", db_schema_filter_pattern="pub%", table_name_filter_pattern="%t%", table_types=["TABLE"], include_schema=True)
    if kind == "schemas":
        return rng.choice(["info", "doget"]), S.CommandGetDbSchemas(catalog="flight", db_schema_filter_pattern="p_blic")
    if kind == "catalogs":
        return rng.choice(["info", "doget"]), S.CommandGetCatalogs()
    if kind == "table_types":
        return rng.choice(["info", "doget"]), S.CommandGetTableTypes()
    if kind == "sql_info":
        return rng.choice(["info", "doget"]), S.CommandGetSqlInfo(info=[0, 1, 2, 500, 504])
    if kind == "ticket":
        return "doget", S.TicketStatementQuery(statement_handle=RELAY)
    if kind == "prepared":
        return rng.choice(["info", "schema", "put"]), S.CommandPreparedStatementQuery(prepared_statement_handle=HANDLE)
    if kind == "unsupported":
        return rng.choice(["info", "put"]), rng.choice([S.CommandStatementUpdate(query="DELETE FROM t"), S.CommandGetPrimaryKeys(table="t"),
                                                        S.CommandGetXdbcTypeInfo(), S.CommandStatementSubstraitPlan()])
    if kind == "create":
        return "CreatePreparedStatement", S.ActionCreatePreparedStatementRequest(query=rng.choice(statements() + parameter_queries()))
    if kind == "close":
        return "ClosePreparedStatement", S.ActionClosePreparedStatementRequest(prepared_statement_handle=HANDLE)
    if kind == "cancel_query":
        return "CancelQuery", S.ActionCancelQueryRequest(info=b"")
    return "CancelFlightInfo", F.CancelFlightInfoRequest()


def unpack_any(data: bytes) -> tuple[str, bytes]:
    """(type_url, value) of a reply the service packed."""
    found = any_pb2.Any()
    found.ParseFromString(data)
    return found.type_url, found.value
