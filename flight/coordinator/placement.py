"""Where an execution's stages start: a plan run again goes back to the workers that ran it, unless they are busier.

Stage ``s`` of an execution puts its task ``t`` on ``urls[(start + s + t) % n]``; this module picks ``start``.

Why not simply the next worker each time (as before): a worker keeps what a plan cost it to start (its
translation to SQL, its bind check, decoded expressions: ``flight.engine.seen``, keyed by the plan's bytes) and
its DuckDB database is warm for the plan's tables. A query run again (a dashboard's, a notebook cell's, a
benchmark's runs) that took turns over two workers met each one cold half the time. Measured on TPC-H SF 1,
one task per query on two workers of one host, the same SQL text run on the worker and then in this process
alternately (5 runs each, 21 queries): the worker's DuckDB took 1.068 times this process's time (geomean)
when the runs took turns over the workers, 1.006 when they all went to one (``docs/engine.md``).

So the start is the plan's own (a digest of its stages' operators as they are sent, which every execution encodes
anyway: no query id, no URL), and a busier
worker gives way: when the preferred worker has more of this process's executions running than the least
busy one, the execution starts at the least busy one nearest after it. Two runs of one query at once land
on two workers; different queries spread by their hash. The choice is this process's view only (another
coordinator's queries are not counted): a preference, never a correctness matter.
"""

from __future__ import annotations

import hashlib
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

from flight.planner.stages import StageSpec

__all__ = ["PLACEMENT", "Placement", "plan_key"]


def plan_key(stages: Sequence[StageSpec]) -> bytes:
    """A digest of the stages' operators (``StageSpec.root_proto``, made once per stage and kept for its tasks' plans),
    equal for equal plans whatever the execution. The stages' subtree keys (``flight.planner.reuse``) say the same,
    but walking a new plan to make them cost 0.28 ms of a TPC-H query's start (geomean), where the messages are made
    for the tasks anyway and serializing them is one call into protobuf's C code."""
    return hashlib.sha256(b"".join(stage.root_proto().SerializeToString(deterministic=True) for stage in stages)).digest()


class Placement:
    """This process's executions per worker URL, and the start an execution of a plan takes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: Counter[str] = Counter()

    def start(self, key: bytes, urls: Sequence[str]) -> int:
        """The index in ``urls`` where an execution of the plan with ``key`` starts its stages."""
        n = len(urls)
        preferred = int.from_bytes(key[:8], "big") % n
        with self._lock:
            loads = [self._running[u] for u in urls]
        least = min(loads)
        return next(i % n for i in range(preferred, preferred + n) if loads[i % n] == least)

    def hold(self, urls: Iterable[str]) -> Callable[[], None]:
        """Count one execution on each of ``urls`` until the returned release is called (once; later calls do nothing)."""
        held = sorted(set(urls))
        with self._lock:
            self._running.update(held)
        released = False

        def release() -> None:
            nonlocal released
            with self._lock:
                if released:
                    return
                released = True
                self._running -= Counter(held)  # drops the URLs it leaves at 0

        return release

    def running(self, url: str) -> int:
        """This process's executions holding ``url`` now."""
        with self._lock:
            return self._running[url]


PLACEMENT = Placement()
"""The process's placement: every ``DistributedExec`` of this process counts in it."""
