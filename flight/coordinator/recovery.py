"""Query retry when a worker is lost: which failures qualify, and which workers are gone.

Why a whole-query retry: until the caller has received a row, nothing of a failed
attempt is visible, so running the query again on the workers that remain gives
the exact result (Distributed DataFusion fails the query on any node loss;
Trino needs an external spool for task retries). A retry runs everything again,
discovery included: a feed's provider is asked for its units once more, as when
the caller re-runs the query (docs/architecture.md, "Losing a worker").

A failure qualifies when it came from a worker (``WorkerError``) and a probe
finds a worker of the attempt dead or silent: it refuses connections, or does not
answer ``health`` within the probe's deadline (a frozen process), or the failure is
UNAVAILABLE naming a worker of the attempt (``named_unreachable``). Errors the
query itself causes (a bad plan, a provider's exception, the deadline, the
caller stopping) never do, nor does a failure with every worker healthy.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from flight.errors import (
    FlightExecError,
    InvalidTaskError,
    PermissionDeniedError,
    PlanError,
    ProtocolError,
    QueryTimeoutError,
    UnauthenticatedError,
    WorkerBusyError,
    WorkerError,
    WorkerUnavailableError,
)
from flight.security import Security
from flight.wire.clients import health_check
from flight.wire.limits import clip

__all__ = ["Attempt", "may_retry", "named_unreachable", "probe_lost"]

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 2.0
"""How long a worker has to answer ``health`` before the probe calls it lost."""
PROBE_TRIES = 2
"""Health checks a worker fails in a row before it counts as lost (``probe_lost``)."""

_NEVER = (PlanError, ProtocolError, InvalidTaskError, QueryTimeoutError, UnauthenticatedError, PermissionDeniedError, WorkerBusyError)


@dataclass(frozen=True)
class Attempt:
    """One failed attempt of a query, as ``explain(analyze=True)`` shows it."""

    query_id: str
    lost: tuple[str, ...]
    """The workers found dead or silent, excluded from later attempts."""
    error: str
    """What failed the attempt (clipped)."""
    replayed: int | None = None
    """For a streaming scan's lost task (unit-level recovery): how many of its units were replayed,
    the query going on; None: the attempt failed and the query ran again."""
    task: str = ""
    replaced_by: str = ""

    def describe(self) -> str:
        if self.replayed is not None and not self.task:
            return f"lost {', '.join(self.lost)}; nothing it held was needed any more ({self.error})"
        if self.replayed is not None:
            return (
                f"task {self.task} lost with {', '.join(self.lost)}: {self.replayed} unit(s) it had not delivered replayed "
                f"on {self.replaced_by} ({self.error})"
            )
        return f"attempt {self.query_id} lost {', '.join(self.lost)}: {self.error}"


def may_retry(error: BaseException, rows_delivered: bool, attempts: int, retries: int) -> bool:
    """Whether a failed attempt may be run again, before probing the workers.

    ``attempts`` is how many attempts failed before this one.
    """
    if rows_delivered or attempts >= retries:
        return False
    if not isinstance(error, FlightExecError) or isinstance(error, _NEVER):
        return False
    return isinstance(error, WorkerError)


def named_unreachable(error: BaseException, urls: Iterable[str]) -> list[str]:
    """The worker of ``urls`` that an UNAVAILABLE failure names, counted lost though a probe may find it answering.

    Such an error says the worker was out of reach for a whole ``peer_timeout``: the coordinator's
    channel heard nothing from it, a peer's task could not read it, or it heard nothing from the
    coordinator and freed its tasks (its readers are told so). Its tasks of this attempt are gone
    whatever a later probe finds: a cut that heals within the probe's seconds (the fleet's partition
    test, healed 9 s after the cut, lost that race on a loaded CI machine) is still a loss.
    """
    peer = error.worker_url if isinstance(error, WorkerUnavailableError) else ""
    return [peer] if peer and peer in set(urls) else []


def probe_lost(urls: Iterable[str], security: Security | None, timeout: float = PROBE_TIMEOUT_S) -> list[str]:
    """The URLs among ``urls`` whose worker is dead or does not answer ``health`` in time (in parallel).

    A worker that answers with an error other than unavailable (say, a refused token) is alive:
    not ours to retry around. One that fails is asked once more before it counts as lost: a dead
    worker refuses at once both times, a frozen one is silent both times, but a busy one that missed
    one deadline (2 s, on a loaded machine) is not taken for gone, with the re-runs that would follow.
    """
    suspects = sorted(set(urls))
    for _ in range(PROBE_TRIES):
        problems = _probe(suspects, security, timeout)
        suspects = [u for u in suspects if u not in problems or isinstance(problems[u], WorkerUnavailableError)]
        if not suspects:
            break
    for url in suspects:
        log.debug("worker %s is lost: %s", url, clip(problems.get(url), 200))
    return suspects


def _probe(targets: list[str], security: Security | None, timeout: float) -> dict[str, BaseException | None]:
    """Each of ``targets``'s health check, in parallel: None (it answered) or why not. A probe that did not
    finish past its deadline is missing from the result: it counts as silence."""
    problems: dict[str, BaseException | None] = {}

    def probe(url: str) -> None:
        problems[url] = health_check(url, timeout, security)

    threads = [threading.Thread(target=probe, args=(u,), name=f"probe-{u}", daemon=True) for u in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 1.0)
    return dict(problems)
