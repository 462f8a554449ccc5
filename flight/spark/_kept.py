"""Kept results let go when nothing can read them: the DataFrame collected, or its session stopped.

Why: ``flight.spark.sql`` and ``read`` return a DataFrame whose query's head outputs stay on the
workers for Spark's re-reads, up to ``retain`` seconds (600). A notebook running query after
query piled them up: they held the workers' slots and memory, and the eighth query of a
session waited for capacity that only old results held (issue 41). The user holds no handle
to release them (``start_read`` gives one); nor should they need one.

When can nothing read a result any more?
* **Its session stopped**: no Spark job of that session runs again.
* **Its DataFrame, and every DataFrame made from it, was collected**: Spark plans a job from
  a Dataset's logical plan, and a derived Dataset (``df.filter(...)``, a join, a temp view,
  a cache) holds the plan of the one it came from, in the JVM; the Python DataFrame does not
  (a derived Python DataFrame wraps only its own JVM Dataset). So a ``WeakReference`` to the
  read's logical plan, made in the JVM, is cleared exactly when no Dataset that could read it
  remains. The JVM clears it at its next garbage collection; with results waiting, this module
  asks for one (``System.gc()``) at most every ``GC_EVERY_S``.

Spark Connect sessions have no JVM in this process: theirs are let go when the session stops,
or at ``retain``. One daemon thread per process looks every ``POLL_S``.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from flight.coordinator.exec import DetachedQuery
from flight.threads import spawn

__all__ = ["GC_EVERY_S", "POLL_S", "keep", "kept"]

log = logging.getLogger(__name__)

POLL_S = 2.0
GC_EVERY_S = 30.0


@dataclass
class _Kept:
    query: DetachedQuery
    session: Any
    plan: Any  # a JVM WeakReference to the read's logical plan; None for a Connect session


_kept: list[_Kept] = []
_lock = threading.Lock()
_started = False


def keep(query: DetachedQuery, df: Any) -> None:
    """Let ``query`` go once nothing can read ``df`` (this module's docstring)."""
    global _started
    session = df.sparkSession
    plan = None
    jdf = getattr(df, "_jdf", None)
    if jdf is not None:  # a classic session: the JVM is here
        try:
            plan = session._jvm.java.lang.ref.WeakReference(jdf.logicalPlan())
        except Exception as exc:  # noqa: BLE001 - py4j's errors; without the reference: session end and retain
            log.debug("no weak reference to the read's plan: %s", exc)
    with _lock:
        _kept.append(_Kept(query, session, plan))
        if not _started:
            _started = True
            spawn(_watch, name="flight-spark-kept")


def kept() -> int:
    """How many results this process keeps for Spark's re-reads now."""
    with _lock:
        return len(_kept)


def _stopped(session: Any) -> bool:
    try:
        client = getattr(session, "_client", None)
        if client is not None and not hasattr(session, "_jsc"):  # Spark Connect
            return bool(getattr(client, "is_closed", False))
        sc = session.sparkContext
        return sc._jsc is None or bool(sc._jsc.sc().isStopped())
    except Exception:  # noqa: BLE001 - a session torn down under us is a stopped one
        return True


def _unreachable(entry: _Kept) -> bool:
    if entry.plan is None:
        return False
    try:
        return entry.plan.get() is None
    except Exception:  # noqa: BLE001 - the gateway is gone: so is the session
        return True


def _watch() -> None:
    last_gc = time.monotonic()
    while True:
        time.sleep(POLL_S)
        with _lock:
            entries = list(_kept)
        if not entries:
            continue
        if time.monotonic() - last_gc > GC_EVERY_S and any(e.plan is not None for e in entries):
            last_gc = time.monotonic()
            _collect(entries)
        for entry in entries:
            why = ""
            if _ended(entry.query):
                why = "ended"
            elif _stopped(entry.session):
                why = "its Spark session stopped"
            elif _unreachable(entry):
                why = "no DataFrame can read it any more"
            if why:
                if why != "ended":
                    log.info("query %s: releasing its kept results: %s", entry.query.query_id, why)
                    _release(entry.query)
                with _lock:
                    _kept.remove(entry)


def _ended(query: DetachedQuery) -> bool:
    try:
        return query.wait(0)
    except Exception:  # noqa: BLE001 - it failed: ended too
        return True


def _collect(entries: list[_Kept]) -> None:
    for entry in entries:
        if entry.plan is not None and not _stopped(entry.session):
            try:
                entry.session._jvm.java.lang.System.gc()
            except Exception as exc:  # noqa: BLE001 - a gateway that went away: the session check sees it
                log.debug("System.gc() failed: %s", exc)
            return


def _release(query: DetachedQuery) -> None:
    try:
        query.release()
    except Exception as exc:  # noqa: BLE001 - a failed query has nothing left to release
        log.debug("releasing query %s: %s", query.query_id, exc)
