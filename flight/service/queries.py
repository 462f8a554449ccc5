"""The service's queries: started, read by clients (from the workers or through the service), ended.

A statement is planned from its text, started detached (``DistributedExec.start_detached``: the
head tasks' outputs wait on the workers) and kept here until its results were read, it was
cancelled, or ``result_ttl`` passed since it started: a client that vanishes, or never reads,
frees the query's tasks on every worker within the TTL. The last ``keep`` ended queries stay for
whoever asks what ran.

Relay handles: a client that can only reach the service redeems a random handle per head partition
(a capability, like the query's secret it stands for, and ending with the query) and the service
reads that partition from its worker with its own credentials and streams it on.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.flight as fl

from flight.coordinator.detached import DetachedQuery
from flight.coordinator.exec import DistributedExec
from flight.coordinator.resolver import WorkerResolver
from flight.errors import FlightExecError, TaskCancelledError
from flight.plan.query import Query as PlannedQuery
from flight.security import Security
from flight.service.admission import Admission
from flight.sql import sql as plan_sql
from flight.sql.catalog import Catalog
from flight.threads import spawn
from flight.wire.clients import ClientPool, read_stream
from flight.wire.integrity import StreamIntegrityError
from flight.wire.stall import SAFE_STALL_S

__all__ = ["Queries", "Query"]

log = logging.getLogger("flight.service")


@dataclass
class Query:
    """One statement the service ran or runs."""

    query_id: str
    sql: str
    user: str
    started: float
    detached: DetachedQuery
    retained: bool = False  # its results may be read more than once, until its deadline (hints.py)
    tag: str = ""  # the name its client gave it (hints.py), by which the client asks its progress (watch.py)
    ex: DistributedExec | None = None  # its plan and, once it ended, what its tasks measured (EXPLAIN ANALYZE)
    handles: dict[bytes, int] = field(default_factory=dict)  # relay handle -> head partition
    state: str = "running"  # running, finished, failed, cancelled
    error: str = ""
    ended: float | None = None
    wall_started: float = field(default_factory=time.time)  # when it started, as the web page shows it

    @property
    def schema(self) -> pa.Schema:
        return self.detached.schema


class Queries:
    """Every live query by id and by relay handle; a reaper ends those past the TTL."""

    def __init__(
        self,
        catalog: Catalog,
        resolver: WorkerResolver,
        security: Security | None,
        result_ttl: float,
        *,
        admission: Admission | None = None,
        query_timeout: float | None = None,
        keep: int = 100,
        on_end: Callable[[Query], None] | None = None,
        operators: frozenset[str] = frozenset(),
    ) -> None:
        self.catalog = catalog
        self.resolver = resolver
        self.security = security
        self.result_ttl = result_ttl
        self.admission = admission or Admission(64, 64, 60.0)
        self.query_timeout = query_timeout
        self.on_end = on_end  # told of every query that ended (the metrics)
        self.operators = operators  # who may cancel anyone's query (--operators)
        self.clients = ClientPool(security)
        self._live: dict[str, Query] = {}
        self._handles: dict[bytes, Query] = {}
        self._ended: deque[Query] = deque(maxlen=keep)
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        spawn(self._reap, name="service-reaper")

    def start(
        self, text: str, user: str, params: Mapping[str, object] | None = None, planned: PlannedQuery | None = None,
        *, retain: float = 0.0, dialect: str = "duckdb", tag: str = "",
    ) -> Query:
        """Plan ``text`` (unless ``planned`` is its plan already) and start it on the workers, once admitted;
        raises ``PlanError`` (nothing started), ``AdmissionRefused`` (no slot within the queue wait) or the start's error.

        ``retain`` > 0 (``hints.py``): its head outputs may be read any number of times for that long, at
        most the result TTL; its slot is given back once they are all made (it computes nothing more).
        ``dialect``: the text's (``hints.dialect_of``: DuckDB's unless the call's header says Spark's).
        ``tag``: the name its client gave it (``hints.tag_of``).
        """
        retain = min(max(0.0, retain), self.result_ttl)
        self.admission.acquire(user)
        try:
            plan = planned if planned is not None else plan_sql(text, self.catalog, params=params, dialect=dialect)
            ex = DistributedExec(plan, self.resolver, security=self.security, deadline=self.query_timeout)
            detached = ex.start_detached(retain)
        except BaseException:
            self.admission.release(user)
            raise
        query = Query(detached.query_id, text, user, time.monotonic(), detached, retained=retain > 0, tag=tag, ex=ex)
        for i in range(len(detached.partitions)):
            query.handles[secrets.token_bytes(16)] = i
        with self._lock:
            self._live[query.query_id] = query
            for handle in query.handles:
                self._handles[handle] = query
        spawn(self._follow, query, name=f"service-{query.query_id}")
        log.info("query %s started for %s: %d head partition(s)", query.query_id, user, len(detached.partitions))
        return query

    def explain(self, planned: PlannedQuery) -> str:
        """``planned``'s stages, operators, tasks and estimates on the workers there are now (nothing runs)."""
        return DistributedExec(planned, self.resolver, security=self.security, deadline=self.query_timeout).explain()

    def by_handle(self, handle: bytes) -> tuple[Query, int] | None:
        with self._lock:
            query = self._handles.get(handle)
        return None if query is None else (query, query.handles[handle])

    def relay(self, query: Query, partition: int) -> Iterator[pa.RecordBatch]:
        """Partition ``partition``'s rows, read from its worker with the service's credentials."""
        head = query.detached.partitions[partition]
        try:
            yield from read_stream(self.clients.get(head.url), head.ticket, stall=SAFE_STALL_S, url=head.url)
        except StreamIntegrityError as exc:  # a Flight status the client can act on, not pyarrow's traceback
            raise fl.FlightUnavailableError(str(exc)) from None

    def read_all(self, query: Query) -> int:
        """Read every head partition of ``query`` through the service, dropping the rows; how many there were."""
        return sum(batch.num_rows for i in range(len(query.detached.partitions)) for batch in self.relay(query, i))

    def tagged(self, user: str, tag: str) -> Query | None:
        """``user``'s latest query named ``tag``, running or ended (another user's is never found)."""
        if not tag:
            return None
        with self._lock:
            found = [q for q in [*self._ended, *self._live.values()] if q.tag == tag and q.user == user]
        return found[-1] if found else None

    def cancel(self, query_id: str, why: str = "cancelled by the client") -> bool:
        """End a live query now, freeing its tasks; whether it was live."""
        with self._lock:
            query = self._live.get(query_id)
        if query is None:
            return False
        query.state, query.error = "cancelled", why
        query.detached.close()
        return True

    def may_cancel(self, query: Query, caller: str) -> bool:
        """Whether ``caller`` may cancel ``query``: its own user, or an operator (Flight SQL's cancel and the web page's)."""
        return caller == query.user or caller in self.operators

    def find(self, predicate: Callable[[Query], bool]) -> list[Query]:
        with self._lock:
            return [q for q in self._live.values() if predicate(q)]

    def live(self) -> list[Query]:
        with self._lock:
            return list(self._live.values())

    def ended(self) -> list[Query]:
        with self._lock:
            return list(self._ended)

    def _follow(self, query: Query) -> None:
        """Wait for the query to end (its results read, or closed; retained: released at its deadline),
        then move it to the ended ones. A retained query's slot is given back once its outputs are made."""
        slot = True
        try:
            if query.retained and query.detached.computed():
                self.admission.release(query.user)
                slot = False
            query.detached.wait()
            if query.state == "running":
                query.state = "finished"
        except TaskCancelledError as exc:
            if query.state == "running":
                query.state, query.error = "cancelled", str(exc)
        except FlightExecError as exc:
            query.state, query.error = "failed", str(exc)
        except Exception as exc:  # noqa: BLE001 - whatever ended it, the query is over; say so, do not die
            query.state, query.error = "failed", f"{type(exc).__name__}: {exc}"
        finally:
            if slot:
                self.admission.release(query.user)
            query.ended = time.monotonic()
            with self._lock:
                self._live.pop(query.query_id, None)
                for handle in query.handles:
                    self._handles.pop(handle, None)
                self._ended.append(query)
            log.info("query %s %s%s", query.query_id, query.state, f": {query.error}" if query.error else "")
            if self.on_end is not None:
                self.on_end(query)

    def _reap(self) -> None:
        while not self._stopped.wait(min(1.0, self.result_ttl / 4)):
            oldest = time.monotonic() - self.result_ttl
            # A retained query ends itself at its deadline (at most the TTL), read or not.
            for query in self.find(lambda q: q.started < oldest and not q.retained):  # noqa: B023 - used at once, in this iteration
                self.cancel(query.query_id, f"its results were not read within the result TTL ({self.result_ttl:g} s)")

    def close(self) -> None:
        """Cancel every live query (the service stops)."""
        self._stopped.set()
        for query in self.live():
            self.cancel(query.query_id, "the service stopped")
