"""What a client may ask of a statement beside its text, in a call header: how long to keep its results.

Flight SQL has no word for "let me read each result more than once", and a Spark job needs it: a
retried or speculative task, or the sample a sort takes first, reads a partition again. The
``flight`` data source sends ``x-flight-exec-retain: SECONDS`` with its ``GetFlightInfo``; the
service then keeps the statement's head outputs on the workers (memory, then spill files) for
that long, at most its ``--result-ttl``, each readable any number of times, as ``flight.spark.read``
does in-process (``DetachedQuery`` retained). Other clients send nothing and get read-once results.
"""

from __future__ import annotations

import pyarrow.flight as fl

from flight.wire.protocol import RETAIN_HEADER

__all__ = ["HINTS_KEY", "Hints", "retain_of"]

HINTS_KEY = "flight-exec-hints"


class _Hinted(fl.ServerMiddleware):
    def __init__(self, retain: float) -> None:
        self.retain = retain


class Hints(fl.ServerMiddlewareFactory):
    """Reads the hint headers of each call (a number, or nothing: a bad value is ignored, never an error)."""

    def start_call(self, info: fl.CallInfo, headers: dict[str, list[str] | list[bytes]]) -> fl.ServerMiddleware | None:
        values = headers.get(RETAIN_HEADER) or []
        if not values:
            return None
        raw = values[0]
        try:
            retain = float(raw.decode("ascii") if isinstance(raw, bytes) else raw)
        except (ValueError, UnicodeDecodeError):
            return None
        return _Hinted(retain) if retain > 0 and retain == retain else None


def retain_of(context: fl.ServerCallContext) -> float:
    """Seconds the caller asked the statement's results be kept, 0 for read-once (the service clamps it)."""
    hinted = context.get_middleware(HINTS_KEY)
    return hinted.retain if isinstance(hinted, _Hinted) else 0.0
