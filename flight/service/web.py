"""The service's live view: a web page, the JSON API behind it, and Prometheus metrics (``--http-port``).

Starlette routes the requests and uvicorn serves them (no HTTP parsing of ours), on a thread of its
own beside the Flight server. The page is static HTML, JavaScript and CSS shipped in the package
(``static/``, no build step) that polls the API every second:

* ``POST /api/login`` (and ``logout``, ``GET /api/me``): a session cookie when the service knows its users
  (``webauth.py``); the other ``/api`` routes answer 401 without one;
* ``GET /api/queries``: running and the last ended queries (id, state, user, SQL and its first line,
  start, seconds, result rows, error);
* ``GET /api/queries/{id}``: one query with its stages, each with its consumers, output, rows and bytes
  beside the planner's estimate, time line and tasks (worker label, state, rows, bytes, spilled bytes,
  seconds, and when it opened, was admitted and finished), the planner's decisions, the workers'
  labels, and its work-unit feeds (units found, sent, taken; the lag);
* ``GET /api/queries/{id}/explain``: ``explain()``, with what each task measured once it ended;
* ``POST /api/queries/{id}/cancel``: cancel a running query (its user or an operator);
* ``GET /api/workers``: each worker's ``info`` (capacity, running tasks, memory, buffered bytes);
* ``GET /metrics``: Prometheus's text format (``prometheus-client``): queries by state, their
  latency, the rows and bytes they returned.

What the API shows is the service's own view: SQL texts are the users' (the page escapes them), and
no token, secret or ticket ever appears in it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable
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
from flight.service.users import ServiceAuth
from flight.service.webauth import WebAuth
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


def _first_line(sql: str) -> str:
    line = next((x.strip() for x in sql.splitlines() if x.strip() and not x.strip().startswith("--")), sql.strip())
    return line if len(line) <= 200 else line[:199] + "…"


def summary(query: Query, now: float) -> dict[str, Any]:
    """A query as the list shows it: its SQL (and the first line of it), state, user, start, time and result rows."""
    end = query.ended if query.ended is not None else now
    head = query.detached.progress()[-1]
    return {"id": query.query_id, "state": query.state, "user": query.user, "sql": query.sql, "first_line": _first_line(query.sql),
            "started_at": round(query.wall_started, 3), "seconds": round(end - query.started, 3),
            "rows": sum(t.rows_out for t in head.tasks), "error": query.error}


def _stage(stage: StageProgress, label: Callable[[str], str]) -> dict[str, Any]:
    """A stage with its tasks, totals and the planner's estimate, and its time line: from its first task's open to its
    last one's output (seconds after the query began; ``end`` None while a task still runs)."""
    tasks = [{"worker": label(t.worker_url), "state": t.state, "rows": t.rows_out, "bytes": t.bytes_out,
              "seconds": round(t.seconds, 3), "spilled": t.bytes_spilled,
              "opened": t.opened, "ready": t.ready, "finished": t.finished} for t in stage.tasks]
    opened = [t.opened for t in stage.tasks if t.opened is not None]
    ends = [t.finished for t in stage.tasks]
    done = bool(ends) and all(e is not None for e in ends)
    return {"id": stage.stage_id, "consumers": list(stage.consumers), "output": stage.output, "done": stage.done,
            "rows": sum(t.rows_out for t in stage.tasks), "bytes": sum(t.bytes_out for t in stage.tasks),
            "estimated_rows": stage.estimated_rows, "estimated_bytes": stage.estimated_bytes,
            "start": min(opened) if opened else None, "end": max(e for e in ends if e is not None) if done else None,
            "tasks": tasks}


def detail(query: Query, now: float, label: Callable[[str], str]) -> dict[str, Any]:
    """A query with its stages (``_stage``), the planner's decisions (``explain()``'s rewrites), the workers it ran on,
    and its work-unit feeds: units found, sent to tasks and taken by them, and the lag (how long the oldest unit not
    yet sent has waited)."""
    feeds = [{"feed": f.feed_id, "discovered": f.discovered, "sent": f.sent, "taken": f.taken,
              "discovery_ended": f.ended, "waiting": f.discovered - f.sent, "lag_seconds": round(f.oldest_waiting, 3)}
             for f in query.detached.feeds()]
    stages = query.detached.progress()
    urls = sorted({t.worker_url for s in stages for t in s.tasks}, key=label)
    return {**summary(query, now), "stages": [_stage(s, label) for s in stages], "feeds": feeds,
            "workers": [{"label": label(u), "url": u} for u in urls],
            "decisions": list(query.ex.plan.rewrites) if query.ex is not None else []}


class WebView:
    """The page, the API and the metrics over ``queries``, served on ``host:port`` by uvicorn on a thread.

    ``auth``: the service's users (``webauth.py``); None, a service open to anyone."""

    def __init__(self, queries: Queries, metrics: Metrics, host: str, port: int, auth: ServiceAuth | None = None) -> None:
        self.queries = queries
        self.metrics = metrics
        self.web_auth = WebAuth(auth, queries.operators)
        self._labels: dict[str, str] = {}
        self._labels_lock = threading.Lock()
        self.app = Starlette(routes=[
            Route("/", self.index),
            Route("/api/me", self._authed(self.me)),
            Route("/api/login", self.web_auth.log_in, methods=["POST"]),
            Route("/api/logout", self.log_out, methods=["POST"]),
            Route("/api/queries", self._authed(self.list_queries)),
            Route("/api/queries/{query_id}", self._authed(self.one_query)),
            Route("/api/queries/{query_id}/explain", self._authed(self.explain)),
            Route("/api/queries/{query_id}/cancel", self._authed(self.cancel), methods=["POST"]),
            Route("/api/workers", self._authed(self.workers)),
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

    def label(self, url: str) -> str:
        """A worker's short name on the page, ``w1``, ``w2``, ...: in the resolver's order, the same for the service's life."""
        with self._labels_lock:
            if url not in self._labels:
                for known in [*self.queries.resolver.get_urls(), url]:
                    self._labels.setdefault(known, f"w{len(self._labels) + 1}")
            return self._labels[url]

    def _authed(self, handler: Callable[[Request, str], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        """``handler(request, caller)`` for a caller the service knows; 401 for anyone else."""

        async def checked(request: Request) -> Response:
            caller = self.web_auth.caller(request)
            if caller is None:
                return JSONResponse({"error": "log in: this service knows its users (docs/service.md)"}, status_code=401)
            return await handler(request, caller)

        return checked

    async def index(self, request: Request) -> Response:
        return FileResponse(STATIC / "index.html")

    async def me(self, request: Request, caller: str) -> Response:
        return JSONResponse(self.web_auth.me(caller))

    async def log_out(self, request: Request) -> Response:
        return self.web_auth.log_out()

    async def list_queries(self, request: Request, caller: str) -> Response:
        now = time.monotonic()
        ended = sorted(self.queries.ended(), key=lambda q: q.ended or 0, reverse=True)
        return JSONResponse({"running": [summary(q, now) for q in self.queries.live()], "ended": [summary(q, now) for q in ended],
                             "queued": self.queries.admission.queued()})

    def _find(self, query_id: str) -> Query | None:
        return next((q for q in [*self.queries.live(), *self.queries.ended()] if q.query_id == query_id), None)

    async def one_query(self, request: Request, caller: str) -> Response:
        query = self._find(request.path_params["query_id"])
        if query is None:
            return JSONResponse({"error": "no such query (ended queries are kept for a while, then forgotten)"}, status_code=404)
        return JSONResponse(detail(query, time.monotonic(), self.label))

    async def explain(self, request: Request, caller: str) -> Response:
        """``explain()`` of a query: after it ended, with what each task measured."""
        query = self._find(request.path_params["query_id"])
        if query is None or query.ex is None:
            return JSONResponse({"error": "no such query (ended queries are kept for a while, then forgotten)"}, status_code=404)
        return JSONResponse({"analyzed": query.ended is not None, "text": query.ex.explain(analyze=query.ended is not None)})

    async def cancel(self, request: Request, caller: str) -> Response:
        query = next((q for q in self.queries.live() if q.query_id == request.path_params["query_id"]), None)
        if query is None:
            return JSONResponse({"cancelled": False, "error": "it is not running"}, status_code=404)
        if not self.queries.may_cancel(query, caller):
            return JSONResponse({"cancelled": False, "error": f"only its user ({query.user}) or an operator may cancel it"}, status_code=403)
        cancelled = self.queries.cancel(query.query_id, f"cancelled from the web page by {caller}")
        return JSONResponse({"cancelled": cancelled}, status_code=200 if cancelled else 404)

    async def workers(self, request: Request, caller: str) -> Response:
        urls = self.queries.resolver.get_urls()
        return JSONResponse({"workers": [{"label": self.label(url), **worker_info_dict(self.queries.clients, url)} for url in urls]})

    async def prometheus(self, request: Request) -> Response:
        self.metrics.running.set(len(self.queries.live()))
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)
