"""``flight-worker --metrics-port``: the worker's state in Prometheus's text format, read at each scrape.

``prometheus-client`` (the ``service`` extra) serves ``/metrics`` on a thread of its own; the values
come from the same place the ``info`` action's do (the task registry and admission) at the moment
of the scrape, so nothing is counted twice and nothing runs between scrapes. Identities appear as
the names the token file gives them (never a token); the spill is the bytes retained outputs keep
in spill files now.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from flight.errors import PlanError

__all__ = ["serve_metrics"]


def serve_metrics(server: Any, host: str, port: int) -> int:
    """Serve ``server``'s (a ``WorkerServer``) metrics on ``host:port``; the port bound."""
    try:
        from prometheus_client import CollectorRegistry, start_http_server
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    except ImportError:
        raise PlanError("--metrics-port needs prometheus-client: pip install 'flight-exec[service]'") from None

    class _Worker:
        def collect(self) -> Iterator[Any]:
            info = server.info()
            load = info.load
            gauges = {
                "flight_worker_running_tasks": ("Tasks running now", info.running_tasks),
                "flight_worker_queued_tasks": ("Tasks waiting for capacity", load.queued_tasks),
                "flight_worker_buffered_bytes": ("Output, units and input the tasks hold in memory", info.buffered_bytes),
                "flight_worker_reserved_bytes": ("Memory admitted tasks reserved", load.reserved_bytes),
                "flight_worker_memory_budget_bytes": ("--memory-budget-mb", load.memory_budget),
                "flight_worker_source_threads": ("Source threads admitted tasks hold", load.source_threads),
                "flight_worker_source_threads_max": ("The worker's source threads", load.source_threads_max),
                "flight_worker_spilled_bytes": ("Retained outputs in spill files now", _spilled(server)),
                "flight_worker_draining": ("1 while the worker drains", int(info.draining)),
            }
            for name, (text, value) in gauges.items():
                yield GaugeMetricFamily(name, text, value=value)
            ended = CounterMetricFamily("flight_worker_tasks_ended", "Tasks ended since the worker started", labels=["how"])
            for how, n in server.registry.ended_count.items():
                ended.add_metric([how], n)
            yield ended
            yield CounterMetricFamily("flight_worker_rows_out", "Rows the ended tasks made", value=server.registry.rows_out)
            served = server.registry.bytes_out
            yield CounterMetricFamily("flight_worker_bytes_out", "Bytes the ended tasks made (what readers were served)", value=served)
            clients = GaugeMetricFamily("flight_worker_client_running_tasks", "Running tasks per identity", labels=["identity"])
            for client in info.clients:
                clients.add_metric([client.identity], client.running_tasks)
            yield clients

    registry = CollectorRegistry()
    registry.register(_Worker())
    http, _ = start_http_server(port, addr=host, registry=registry)
    return int(http.server_port)


def _spilled(server: Any) -> int:
    return sum(t.output.spilled_bytes for t in server.registry.tasks() if getattr(t, "output", None) is not None)
