"""The service's live view: a web page, the JSON API behind it, and Prometheus metrics (``--http-port``).

Starlette routes the requests and uvicorn serves them (no HTTP parsing of ours), on a thread of its
own beside the Flight server. The page is static HTML, JavaScript and CSS shipped in the package
(``static/``, no build step) that polls the API every second:

* ``GET /api/queries``: running and the last ended queries (id, state, user, SQL, seconds, error);
* ``GET /api/queries/{id}``: one query with its stages, each with its consumers, output, time line
  and tasks (worker, state, rows, bytes, spilled bytes, seconds, and when it opened, was admitted
  and finished), and its work-unit feeds (units found, sent, taken; the lag);
* ``POST /api/queries/{id}/cancel``: cancel a running query;
* ``GET /api/workers``: each worker's ``info`` (capacity, running tasks, memory, buffered bytes);
* ``GET /metrics``: Prometheus's text format (``prometheus-client``): queries by state, their
  latency, the rows and bytes they returned.

What the API shows is the service's own view: SQL texts are the users' (the page escapes them), and
no token, secret or ticket ever appears in it.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from flight.coordinator.detached import StageProgress
from flight.service.queries import Queries, Query
from flight.wire.clients import worker_info_dict

__all__ = ["Metrics", "WebView"]

STATIC = Path(__file__).parent / "static"


class Metrics:
    """The service's Prometheus metrics, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.queries = Counter("flight_queries_ended", "Queries that ended, by state", ["state"], registry=self.registry)
        self.running = Gauge("flight_queries_running", "Queries running now", registry=self.registry)
        self.seconds = Histogram("flight_query_seconds", "From start to end, per query", registry=self.registry,
                                 buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))
        self.rows = Counter("flight_result_rows", "Rows the head tasks of ended queries made", registry=self.registry)
        self.bytes = Counter("flight_result_bytes", "Bytes the head tasks of ended queries made", registry=self.registry)

    def ended(self, query: Query) -> None:
        self.queries.labels(query.state).inc()
        if query.ended is not None:
            self.seconds.observe(query.ended - query.started)
        head = query.detached.progress()[-1]
        self.rows.inc(sum(t.rows_out for t in head.tasks))
        self.bytes.inc(sum(t.bytes_out for t in head.tasks))


def summary(query: Query, now: float) -> dict[str, Any]:
    end = query.ended if query.ended is not None else now
    return {"id": query.query_id, "state": query.state, "user": query.user, "sql": query.sql,
            "seconds": round(end - query.started, 3), "error": query.error}


def _stage(stage: StageProgress) -> dict[str, Any]:
    """A stage with its tasks, and its time line: from its first task's open to its last one's output
    (seconds after the query began; ``end`` None while a task still runs)."""
    tasks = [{"worker": t.worker_url, "state": t.state, "rows": t.rows_out, "bytes": t.bytes_out,
              "seconds": round(t.seconds, 3), "spilled": t.bytes_spilled,
              "opened": t.opened, "ready": t.ready, "finished": t.finished} for t in stage.tasks]
    opened = [t.opened for t in stage.tasks if t.opened is not None]
    ends = [t.finished for t in stage.tasks]
    done = bool(ends) and all(e is not None for e in ends)
    return {"id": stage.stage_id, "consumers": list(stage.consumers), "output": stage.output, "done": stage.done,
            "start": min(opened) if opened else None, "end": max(e for e in ends if e is not None) if done else None,
            "tasks": tasks}


def detail(query: Query, now: float) -> dict[str, Any]:
    """A query with its stages (``_stage``) and its work-unit feeds: units found, sent to tasks and taken
    by them, and the lag (how long the oldest unit not yet sent has waited)."""
    feeds = [{"feed": f.feed_id, "discovered": f.discovered, "sent": f.sent, "taken": f.taken,
              "discovery_ended": f.ended, "waiting": f.discovered - f.sent, "lag_seconds": round(f.oldest_waiting, 3)}
             for f in query.detached.feeds()]
    return {**summary(query, now), "stages": [_stage(s) for s in query.detached.progress()], "feeds": feeds}


class WebView:
    """The page, the API and the metrics over ``queries``, served on ``host:port`` by uvicorn on a thread."""

    def __init__(self, queries: Queries, metrics: Metrics, host: str, port: int) -> None:
        self.queries = queries
        self.metrics = metrics
        self.app = Starlette(routes=[
            Route("/", self.index),
            Route("/api/queries", self.list_queries),
            Route("/api/queries/{query_id}", self.one_query),
            Route("/api/queries/{query_id}/cancel", self.cancel, methods=["POST"]),
            Route("/api/workers", self.workers),
            Route("/metrics", self.prometheus),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ])
        import uvicorn

        self._server = uvicorn.Server(uvicorn.Config(self.app, host=host, port=port, log_level="warning", access_log=False))
        self._thread = threading.Thread(target=self._server.run, name="web", daemon=True)

    def start(self, timeout: float = 10.0) -> str:
        """Serve; the page's URL once it listens."""
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started and time.monotonic() < deadline and self._thread.is_alive():
            time.sleep(0.02)
        if not self._server.started:
            raise OSError("the web view did not start (is --http-port taken?)")
        socket = self._server.servers[0].sockets[0].getsockname()
        return f"http://{socket[0]}:{socket[1]}/"

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(5)

    async def index(self, request: Request) -> Response:
        return FileResponse(STATIC / "index.html")

    async def list_queries(self, request: Request) -> Response:
        now = time.monotonic()
        ended = sorted(self.queries.ended(), key=lambda q: q.ended or 0, reverse=True)
        return JSONResponse({"running": [summary(q, now) for q in self.queries.live()], "ended": [summary(q, now) for q in ended],
                             "queued": self.queries.admission.queued()})

    def _find(self, query_id: str) -> Query | None:
        return next((q for q in [*self.queries.live(), *self.queries.ended()] if q.query_id == query_id), None)

    async def one_query(self, request: Request) -> Response:
        query = self._find(request.path_params["query_id"])
        if query is None:
            return JSONResponse({"error": "no such query (ended queries are kept for a while, then forgotten)"}, status_code=404)
        return JSONResponse(detail(query, time.monotonic()))

    async def cancel(self, request: Request) -> Response:
        cancelled = self.queries.cancel(request.path_params["query_id"], "cancelled from the web page")
        return JSONResponse({"cancelled": cancelled}, status_code=200 if cancelled else 404)

    async def workers(self, request: Request) -> Response:
        urls = self.queries.resolver.get_urls()
        return JSONResponse({"workers": [worker_info_dict(self.queries.clients, url) for url in urls]})

    async def prometheus(self, request: Request) -> Response:
        self.metrics.running.set(len(self.queries.live()))
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)
