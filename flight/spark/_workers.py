"""Which worker a Spark task talks to.

A Spark closure carries the workers as plain data (URLs, or a resolver's
``describe()`` dict), never a live client. Inside the task, Spark partition
``p`` goes to ``urls[p % n]``; a worker that fails a quick ``health`` action is
skipped for the next one, and remembered as down for a while in this Python
worker process, so a dead URL among live ones costs one failed call per
process, not one per task.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from flight.coordinator.resolver import StaticWorkerResolver, WorkerResolver, resolver_from_description
from flight.errors import ResolverError, WorkerUnavailableError
from flight.security import Security, SecurityFiles
from flight.wire.clients import health_check

__all__ = ["Workers", "describe_workers"]

log = logging.getLogger(__name__)

_DOWN_FOR_S = 30.0
_down: dict[str, float] = {}  # url -> until when (monotonic) this process skips it
_down_lock = threading.Lock()


def describe_workers(workers: str | Sequence[str] | WorkerResolver) -> dict[str, object]:
    """Workers as a small JSON-able description; bad URLs fail here, where they were written."""
    if isinstance(workers, WorkerResolver):
        return workers.describe()
    if isinstance(workers, str):
        workers = [u for u in workers.split(",") if u.strip()]
    resolver = StaticWorkerResolver(list(workers))
    if not resolver.get_urls():
        raise ResolverError("no worker URLs given; pass a list such as ['grpc://host:8815'] or a WorkerResolver")
    return resolver.describe()


def _resolve(description: dict[str, object]) -> list[str]:
    resolver = resolver_from_description(description)
    try:
        urls = resolver.get_urls()
    finally:
        resolver.close()
    if not urls:
        raise ResolverError(f"the worker resolver {description} returned no worker URLs")
    return urls


def mark_down(url: str) -> None:
    with _down_lock:
        _down[url] = time.monotonic() + _DOWN_FOR_S


def _is_down(url: str) -> bool:
    with _down_lock:
        until = _down.get(url)
        if until is not None and until <= time.monotonic():
            del _down[url]
            return False
        return until is not None


@dataclass(frozen=True)
class Workers:
    """The workers of a Spark closure: plain data, cheap to pickle."""

    description: dict[str, object]
    health_timeout: float = 2.0
    security_files: SecurityFiles = field(default_factory=SecurityFiles)
    """Where the executor finds its credentials (paths only; the closure carries no secret)."""

    def security(self) -> Security:
        return self.security_files.load()

    def urls(self) -> list[str]:
        return _resolve(self.description)

    def candidates(self, partition: int, failures: list[str]) -> Iterator[str]:
        """Healthy workers for Spark partition ``partition``: ``urls[p % n]`` first, then the next ones.

        Workers known to be down are tried last. A caller whose attempt on a
        yielded worker fails adds why to ``failures`` and asks for the next one.
        Raises WorkerUnavailableError naming every URL tried when none is left.
        """
        urls = self.urls()
        n = len(urls)
        ring = [urls[(partition + i) % n] for i in range(n)]
        ordered = [u for u in ring if not _is_down(u)] + [u for u in ring if _is_down(u)]
        for url in ordered:
            problem = health_check(url, self.health_timeout, self.security())
            if problem is None:
                yield url
                continue
            mark_down(url)
            log.warning("worker %s failed its health check, trying the next one: %s", url, problem)
            failures.append(f"{url}: {getattr(problem, 'cause', None) or problem}")
        raise WorkerUnavailableError(
            "no worker could run the Spark task (" + "; ".join(failures) + ")",
            worker_url=",".join(urls),
        )
