"""What a client may ask of a statement beside its text, in call headers: how long to keep its results,
and which SQL dialect the text is in.

Flight SQL has no word for "let me read each result more than once", and a Spark job needs it: a
retried or speculative task, or the sample a sort takes first, reads a partition again. The
``flight`` data source sends ``x-flight-exec-retain: SECONDS`` with its ``GetFlightInfo``; the
service then keeps the statement's head outputs on the workers (memory, then spill files) for
that long, at most its ``--result-ttl``, each readable any number of times, as ``flight.spark.read``
does in-process (``DetachedQuery`` retained). Other clients send nothing and get read-once results.

``x-flight-exec-dialect: spark`` plans the text in Spark's dialect, with Spark's answers (docs/sql.md); the
``flight`` data source sends it unless its ``dialect`` option says ``duckdb``. Without it, DuckDB's. A
dialect the service does not know fails the call, naming the header: answers in another dialect than the
client meant would differ silently.

``x-flight-exec-tag: NAME`` names the statement for its client, who may then ask its progress or cancel it by
that name (``watch.py``; ``flight-sql`` sends a random one per statement). A tag that is not 1 to 64 letters,
digits, ``-`` or ``_`` is ignored, as a bad retention is: it only names, it changes no answer.
"""

from __future__ import annotations

import re

import pyarrow.flight as fl

from flight.errors import ProtocolError
from flight.sql.frontend import DIALECTS
from flight.wire.protocol import DIALECT_HEADER, RETAIN_HEADER, TAG_HEADER

__all__ = ["HINTS_KEY", "Hints", "dialect_of", "retain_of", "tag_of"]

HINTS_KEY = "flight-exec-hints"
_TAG = re.compile(r"[A-Za-z0-9_-]{1,64}")


class _Hinted(fl.ServerMiddleware):
    def __init__(self, retain: float, dialect: str | None, tag: str) -> None:
        self.retain = retain
        self.dialect = dialect
        self.tag = tag


def _first(headers: dict[str, list[str] | list[bytes]], name: str) -> str | None:
    values = headers.get(name) or []
    if not values:
        return None
    raw = values[0]
    try:
        return raw.decode("ascii") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError:
        return "\ufffd"  # not ASCII: no number and no dialect's name


class Hints(fl.ServerMiddlewareFactory):
    """Reads the hint headers of each call: a retention (a number, or nothing: a bad value is ignored, never an
    error) and a dialect (checked when a statement is planned, ``dialect_of``)."""

    def start_call(self, info: fl.CallInfo, headers: dict[str, list[str] | list[bytes]]) -> fl.ServerMiddleware | None:
        raw_retain, dialect, tag = _first(headers, RETAIN_HEADER), _first(headers, DIALECT_HEADER), _first(headers, TAG_HEADER)
        retain = 0.0
        if raw_retain is not None:
            try:
                retain = float(raw_retain)
            except ValueError:
                retain = 0.0
            retain = retain if retain > 0 and retain == retain else 0.0
        tag = tag if tag is not None and _TAG.fullmatch(tag) else ""
        if not retain and dialect is None and not tag:
            return None
        return _Hinted(retain, dialect, tag)


def retain_of(context: fl.ServerCallContext) -> float:
    """Seconds the caller asked the statement's results be kept, 0 for read-once (the service clamps it)."""
    hinted = context.get_middleware(HINTS_KEY)
    return hinted.retain if isinstance(hinted, _Hinted) else 0.0


def tag_of(context: fl.ServerCallContext) -> str:
    """The name the caller gave its statement (``""``: none)."""
    hinted = context.get_middleware(HINTS_KEY)
    return hinted.tag if isinstance(hinted, _Hinted) else ""


def dialect_of(context: fl.ServerCallContext) -> str:
    """The SQL dialect the caller's text is in (``duckdb`` unless its header says otherwise); a ``ProtocolError``
    naming the header for a dialect the service does not plan."""
    hinted = context.get_middleware(HINTS_KEY)
    dialect = hinted.dialect if isinstance(hinted, _Hinted) else None
    if dialect is None:
        return "duckdb"
    if dialect.strip().lower() not in DIALECTS:
        raise ProtocolError(f"header {DIALECT_HEADER}: {dialect[:40]!r} is not one of {', '.join(DIALECTS)}", field=DIALECT_HEADER)
    return dialect.strip().lower()
