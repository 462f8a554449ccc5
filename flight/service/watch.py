"""A client's view of its own running statement, by the tag it gave it: progress, and cancel.

``flight-sql`` names each statement with a random ``x-flight-exec-tag`` (``hints.py``) and, while
its ADBC call waits for rows, asks the service over plain Flight:

* ``flight-exec.progress`` (body: the tag): one JSON result, the query's state, time, stages and
  tasks done, and rows its finished tasks made (a task reports its rows when it ends);
* ``flight-exec.cancel`` (body: the tag): the query is cancelled and its tasks end on every worker,
  as ``CancelFlightInfo`` does for a client that holds the ``FlightInfo`` (ADBC's driver does not
  send that one, and its ``adbc_cancel`` only ends the driver's own call).

Only the user who ran a statement finds it by its tag: another user's tag names nothing, and the
answer is the same as for a tag never used. The tag is a name, not a capability: it is checked
together with the caller's identity.
"""

from __future__ import annotations

import json
import time
from typing import Any

from flight.service.queries import Queries, Query

__all__ = ["CANCEL_ACTION", "PROGRESS_ACTION", "progress_of", "tag_body"]

PROGRESS_ACTION = "flight-exec.progress"
CANCEL_ACTION = "flight-exec.cancel"
MAX_TAG_BYTES = 64


def tag_body(body: bytes) -> str:
    """An action's body as a tag; ``""`` (names nothing) when it is not one."""
    if not 0 < len(body) <= MAX_TAG_BYTES:
        return ""
    try:
        text = body.decode("ascii")
    except UnicodeDecodeError:
        return ""
    return text if all(c.isalnum() or c in "-_" for c in text) else ""


def progress_of(query: Query | None, now: float) -> dict[str, Any]:
    """What a progress line shows of ``query`` (``{"state": "unknown"}`` when no query of the caller has the tag)."""
    if query is None:
        return {"state": "unknown"}
    stages = query.detached.progress()
    tasks = [t for s in stages for t in s.tasks]
    end = query.ended if query.ended is not None else now
    return {
        "query": query.query_id, "state": query.state, "seconds": round(end - query.started, 3),
        "stages": len(stages), "stages_done": sum(bool(s.tasks) and s.done == len(s.tasks) for s in stages),
        "tasks": len(tasks), "tasks_done": sum(t.state != "running" for t in tasks),
        "rows": sum(t.rows_out for t in tasks), "bytes": sum(t.bytes_out for t in tasks), "error": query.error,
    }


def answer(queries: Queries, kind: str, user: str, body: bytes) -> bytes:
    """The JSON answer to a ``PROGRESS_ACTION`` or ``CANCEL_ACTION`` from ``user``."""
    query = queries.tagged(user, tag_body(body))
    if kind == CANCEL_ACTION:
        cancelled = query is not None and query.state == "running" and queries.cancel(query.query_id, "cancelled by its client (flight-exec.cancel)")
        return json.dumps({"cancelled": cancelled}).encode()
    return json.dumps(progress_of(query, time.monotonic())).encode()
