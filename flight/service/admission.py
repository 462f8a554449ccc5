"""How many queries the service runs at once, and whose turn it is when they wait.

At most ``max_queries`` run at once, at most ``max_per_user`` of them for one user. A query that
finds no slot waits up to ``queue_wait`` seconds, then is refused, saying which limit held it.
Slots freed while queries wait go round-robin between the users who wait (a user with many
queued queries gets every other turn against a user with one, not all of them before), as Trino's
resource groups share a group's slots: the workers see the service as one client, so fairness
between its users is the service's job. Decisions are made under one lock with no I/O, and the
rules are tested without sockets.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from flight.errors import WorkerBusyError

__all__ = ["Admission", "AdmissionRefused"]


class AdmissionRefused(WorkerBusyError):
    """No slot within the queue wait: the limit that held the query is in the message."""


@dataclass
class _Waiter:
    user: str
    granted: threading.Event = field(default_factory=threading.Event)


class Admission:
    def __init__(self, max_queries: int, max_per_user: int, queue_wait: float) -> None:
        if max_queries < 1 or max_per_user < 1 or queue_wait < 0:
            raise ValueError("max_queries and max_per_user must be at least 1, queue_wait at least 0")
        self.max_queries = max_queries
        self.max_per_user = max_per_user
        self.queue_wait = queue_wait
        self.running: dict[str, int] = {}
        self._waiting: OrderedDict[str, deque[_Waiter]] = OrderedDict()  # users in turn order
        self._lock = threading.Lock()

    @property
    def total(self) -> int:
        return sum(self.running.values())

    def queued(self) -> dict[str, int]:
        with self._lock:
            return {u: len(q) for u, q in self._waiting.items()}

    def acquire(self, user: str) -> None:
        """A slot for one of ``user``'s queries, waiting up to ``queue_wait``; raises ``AdmissionRefused``."""
        waiter = _Waiter(user)
        with self._lock:
            self._waiting.setdefault(user, deque()).append(waiter)
            self._grant()
        if waiter.granted.wait(self.queue_wait):
            return
        with self._lock:
            if waiter.granted.is_set():  # granted just as the wait ended
                return
            queue = self._waiting.get(user)
            if queue is not None and waiter in queue:
                queue.remove(waiter)
                if not queue:
                    del self._waiting[user]
            held, total = self.running.get(user, 0), self.total
        limit = (
            f"the service runs {total} queries (--max-queries {self.max_queries})"
            if total >= self.max_queries
            else f"{user} runs {held} queries (--max-queries-per-user {self.max_per_user})"
        )
        raise AdmissionRefused(f"no slot after {self.queue_wait:g} s of waiting: {limit}; try again later")

    def release(self, user: str) -> None:
        """One of ``user``'s queries ended: its slot goes to the next user in turn."""
        with self._lock:
            held = self.running.get(user, 0) - 1
            if held > 0:
                self.running[user] = held
            else:
                self.running.pop(user, None)
            self._grant()

    def _grant(self) -> None:
        """Give free slots to waiters, one user at a time in turn order (under the lock)."""
        while self.total < self.max_queries:
            user = next((u for u in self._waiting if self.running.get(u, 0) < self.max_per_user), None)
            if user is None:
                return
            queue = self._waiting.pop(user)
            waiter = queue.popleft()
            if queue:
                self._waiting[user] = queue  # back of the turn order
            self.running[user] = self.running.get(user, 0) + 1
            waiter.granted.set()

    def wait_idle(self, timeout: float) -> bool:
        """Whether every query ended within ``timeout`` seconds (for draining)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not self.running:
                    return True
            time.sleep(0.05)
        with self._lock:
            return not self.running
