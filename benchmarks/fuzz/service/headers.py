"""Family ``headers``: the gRPC headers the service reads, hostile: ``authorization`` and the ``x-flight-exec-*`` hints.

Why: ``flight/service/users.py`` reads ``authorization`` on every call before any handler runs (a
bearer token, or a Basic user and password on ``Handshake``, checked with scrypt), and
``flight/service/hints.py`` reads ``x-flight-exec-retain`` (a number of seconds) and
``x-flight-exec-dialect``, and ``x-flight-exec-tag`` (a statement's name, by which ``flight-exec.progress``
and ``flight-exec.cancel`` find it, ``watch.py``). A bad value must be refused by name or ignored, never be a traceback,
and never let a call through without a valid token. gRPC carries only printable ASCII in a
header's value (``-bin`` keys excepted), so that is what the values are made of.
"""

from __future__ import annotations

import base64
import random
from typing import Any

from benchmarks.fuzz.mutator import Mutator
from benchmarks.fuzz.scripts import op
from benchmarks.fuzz.service.sqlproto import PASSWORD, TOKEN, USER, S, pack, statements

__all__ = ["DIALECTS", "RETAINS", "TAGS", "TAG_BODIES", "headers_case"]

RETAIN, DIALECT, TAG = "x-flight-exec-retain", "x-flight-exec-dialect", "x-flight-exec-tag"
TAGS = ["t", "fuzz-tag_1", "", " ", "x" * 64, "x" * 65, "x" * 5_000, "bad tag", "t;t", "%C3%A9", "../..", "-", "_" * 64]
TAG_BODIES = [b"", b"fuzz-tag_1", b"t", b"x" * 64, b"x" * 65, b"x" * 100_000, b"\x00" * 16, "\u00e9t\u00e9".encode(), b"\xff\xfe",
              b"bad tag", b"{}", b'{"tag": "t"}']
RETAINS = ["nan", "NaN", "inf", "-inf", "infinity", "-1", "0", "1e308", "1e999", "0x10", "", " 5 ", "9" * 5_000, "1_000", "5", "2.5",
           "1e-320", "-0", "+3", "1e", "..", "5" * 300 + ".5"]
DIALECTS = ["spark", "SPARK", " duckdb ", "", "postgres", "x" * 5_000, "spark duckdb", "%C5%9Dpark", "spark x", "duckdb;spark", "Spark "]


def _basic(name: str, password: str, pad: bool = True) -> str:
    encoded = base64.b64encode(f"{name}:{password}".encode()).decode()
    return "Basic " + (encoded if pad else encoded.rstrip("="))


def _authorization(rng: random.Random) -> list[str]:
    """Values of ``authorization`` (several, or none), mostly wrong."""
    kind = rng.choice(["none", "empty", "bearer-empty", "wrong", "trailing", "lower", "huge", "many", "basic-wrong", "basic-junk", "basic-huge",
                       "basic-right", "basic-unpadded", "valid-late", "basic-no-colon"])
    return {
        "none": [], "empty": [""], "bearer-empty": ["Bearer "], "wrong": ["Bearer " + TOKEN[::-1]], "trailing": ["Bearer " + TOKEN + " "],
        "lower": ["bearer " + TOKEN], "huge": ["Bearer " + "A" * rng.choice([2_000, 6_000])],
        "many": ["Bearer x"] * rng.choice([4, 50]) + ["Bearer " + TOKEN],
        "basic-wrong": [_basic(USER, "wrong")], "basic-junk": ["Basic " + rng.choice(["!!!", "====", "a", "\\x00", "%%%%"])],
        "basic-huge": [_basic("u" * 2_000, "p" * 2_000)], "basic-right": [_basic(USER, PASSWORD)],
        "basic-unpadded": [_basic(USER, PASSWORD, pad=False)], "valid-late": ["Bearer a", "Bearer b", "Bearer c", "Bearer d", "Bearer " + TOKEN],
        "basic-no-colon": ["Basic " + base64.b64encode(b"no colon here").decode()],
    }[kind]


def _call(rng: random.Random) -> dict[str, Any]:
    """What carries the headers: a statement, a metadata command, a prepared statement's creation, or a handshake."""
    kind = rng.choice(["statement", "statement", "tables", "create", "handshake", "actions", "watch"])
    if kind == "watch":  # a statement's progress or cancel by its tag: a hostile tag names nothing
        return op("action", type=rng.choice(["flight-exec.progress", "flight-exec.cancel"]), body=rng.choice(TAG_BODIES))
    if kind == "statement":
        return op("info", cmd=pack(S.CommandStatementQuery(query=rng.choice(statements()))), read=True)
    if kind == "tables":
        return op("info", cmd=pack(S.CommandGetTables(include_schema=True)), read=True)
    if kind == "create":
        return op("action", type="CreatePreparedStatement", body=pack(S.ActionCreatePreparedStatementRequest(query="SELECT 1 AS one")))
    if kind == "actions":
        return op("list_actions")
    return op("handshake")


def headers_case(rng: random.Random, m: Mutator) -> list[dict[str, Any]]:
    """One call with hostile headers (the valid token kept or not), then the same call's kind with the right token."""
    call = _call(rng)
    headers: list[list[str]] = []
    auth = "default"
    parts = rng.sample(["authorization", "retain", "dialect", "tag", "junk"], k=rng.choice([1, 1, 2, 3]))
    if "authorization" in parts:
        auth = "none"
        headers += [["authorization", v] for v in _authorization(rng)]
    if "retain" in parts:
        headers += [[RETAIN, rng.choice(RETAINS)] for _ in range(rng.choice([1, 1, 2]))]
    if "dialect" in parts:
        headers += [[DIALECT, rng.choice(DIALECTS)] for _ in range(rng.choice([1, 1, 2]))]
    if "tag" in parts:
        headers += [[TAG, rng.choice(TAGS)] for _ in range(rng.choice([1, 1, 2]))]
    if "junk" in parts:
        count = rng.choice([1, 20, 60])  # gRPC refuses a call whose headers pass 16 KiB, before the service sees them
        headers += [[rng.choice([f"x-flight-exec-{i}", f"x-fuzz-{i}", RETAIN + "-bin", DIALECT + "-bin"]), "v" * rng.choice([1, 100])]
                    for i in range(count)]
    m.note(f"headers on {call['op']}: " + "; ".join(f"{k}={v[:24]!r}" + ("..." if len(v) > 24 else "") for k, v in headers[:6])
           + (f" (+{len(headers) - 6})" if len(headers) > 6 else ""))
    return [{**call, "headers": headers, "auth": auth}, op("close_all")]
