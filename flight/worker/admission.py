"""The worker's capacity and who holds it: admission control as a plain object.

Why it exists: a task's sources (feed scans, shuffle reads, map input, and the
nested readers of limits, unions and top-k sorts) block a thread while they
wait for units, rows or producers. Acero runs them on the process's I/O pool,
so before admission control ~65 waiting sources on one worker froze every other
query on it while ``health`` still answered ok.

The rule that holds for any engine: a task is started only when the worker can
give it everything it may hold while waiting — one thread per blocking source
and a memory reservation — and the pool is sized to the capacity, so every
admitted task stays runnable whatever the others wait for. A task that does not
fit now waits in a bounded queue (holding nothing but its call) for at most
``Capacity.wait`` seconds; past that, or when the queue is full, it is refused
as *busy* (retryable, with the worker's load in the message). A task that could
never fit (more threads than the worker has) is refused as too large.
Coordinators open a query's tasks worker by worker in one global order, so
queued tasks can never wait for each other in a cycle (``docs/architecture.md``,
"Capacity").

Fair shares (issue 24). Every task is asked for by an *identity* (the bearer
token's name, a client certificate's identity, or ``anonymous``) for one query.
Before, one client that opened tasks and kept them alive doing nothing took all
``--max-tasks`` slots and the queue, and a second client's query waited until
it was refused. Now:

* **Turns.** Free capacity goes to waiting tasks identity by identity in
  round-robin order. Within an identity, its queries are served in the order they
  began to wait, each query's tasks together (first come, first served within a
  query, so a query's producers still start before its consumers). Not round-robin
  between one identity's queries: a query's tasks are only useful together (a
  consumer admitted before its producer holds its slot and waits for the producer,
  and its read fails after the DoGet wait), and turns between 200 queries of one
  client spread each query's admission out until 44 of them failed so in
  ``benchmarks/micro/concurrency.py``. The next task in turn that does not fit the threads or memory
  left stops the line (no overtaking: a large task is never starved by small ones).
* **A cap per identity, always** (``Capacity.per_client``, ``--max-tasks-per-client``):
  an identity never holds more slots than that, even when nobody else asks. The
  simpler "cap only while another identity waits" cannot keep its promise: the
  first client holds every slot before the second arrives, and a task cannot be
  taken back. With the cap below ``--max-tasks`` (the CLI's default is 3/4 of it
  on a worker that authenticates callers), a second identity finds free slots at
  once, whatever the first does. A task of an identity at its cap waits (it is
  skipped in the turns, it blocks nobody) until one of its own ends.
* **A memory budget per identity** (``Capacity.client_memory``, ``--memory-budget-per-client-mb``),
  the same way: what an identity's admitted tasks reserve (output buffers, input
  queues, unread units: all a client can make the worker hold, each bounded by its
  task's reservation) stays within it, by default half of ``--memory-budget-mb`` on a
  worker that tells callers apart. A task that alone reserves more is refused as too large.
* **A queue bound per identity** (``Capacity.client_queue``, ``--max-queued-per-client``):
  a waiting task holds a gRPC handler thread, so one identity may have only so
  many waiting; one more is refused as busy at once, naming the limit. With the
  cap, this bounds the threads one identity can make the worker hold.

No sockets: the Flight handler calls ``admit`` and ``release``; time only
bounds the wait.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from flight.wire._proto import protocol_pb2
from flight.worker.capacity import Capacity, Need

__all__ = ["ANONYMOUS", "Admission", "Refusal"]

ANONYMOUS = "anonymous"
"""The one identity of every caller a worker cannot tell apart (no token, no client certificate)."""
MAX_REPORTED_CLIENTS = 64
"""``WorkerInfo.clients`` lists at most this many identities, busiest first."""
_KEPT_CLIENTS = 1024
"""Idle identities' counts (refusals) are forgotten past this many known identities."""


@dataclass(frozen=True)
class Refusal:
    """Why a task was not admitted; ``fits_ever`` is False when it never could be."""

    reason: str
    fits_ever: bool


class _Waiter:
    """One queued task."""

    __slots__ = ("admitted", "allocated", "client", "key", "need", "query")

    def __init__(self, key: str, need: Need, client: str, query: str, allocated: Callable[[], int]) -> None:
        self.key = key
        self.need = need
        self.client = client
        self.query = query
        self.allocated = allocated
        self.admitted = False


class _Client:
    """One identity's share: what it holds, what it waits for, what it was refused."""

    __slots__ = ("queries", "queued", "refused", "reserved", "running")

    def __init__(self) -> None:
        self.running = 0
        self.reserved = 0
        self.queued = 0
        self.refused = 0
        self.queries: OrderedDict[str, deque[_Waiter]] = OrderedDict()
        """Its queries with waiting tasks, in turn order (the next in turn first)."""


class Admission:
    """Reservations of the running tasks against the worker's capacity, and the queue of those waiting."""

    def __init__(self, capacity: Capacity) -> None:
        self.capacity = capacity
        self._held: dict[str, tuple[Need, str]] = {}
        self._kept: dict[str, tuple[Need, str]] = {}
        """Outputs kept for re-reads whose computation ended: their bytes, no task slot (``computed``)."""
        self._threads = 0
        self._memory = 0
        self._refused = 0
        self._waiting = 0
        self._clients: dict[str, _Client] = {}
        self._turns: OrderedDict[str, None] = OrderedDict()
        """Identities with waiting tasks, in turn order (the next in turn first)."""
        self._lock = threading.Condition()

    def admit(
        self,
        key: str,
        need: Need,
        allocated: Callable[[], int] = lambda: 0,
        *,
        client: str = ANONYMOUS,
        query: str = "",
        give_up: Callable[[], bool] = lambda: False,
        tick: Callable[[], None] = lambda: None,
        tick_every: float = 1.0,
    ) -> Refusal | None:
        """Reserve ``need`` for task ``key`` of ``client``'s ``query``, waiting in line if need be; None when admitted, else why not.

        ``allocated()`` is what the process's memory pool holds now: above the
        budget, only a worker with nothing running admits (so it never refuses
        forever). While queued, ``tick()`` runs every ``tick_every`` seconds
        outside the lock (the handler sends the coordinator a sign of life), and
        ``give_up()`` (the call was cancelled) ends the wait.
        """
        cap = self.capacity
        if need.threads > cap.threads:
            return Refusal(f"the task needs {need.threads} source threads; this worker has {cap.threads} in all", False)
        # A task that alone reserves more than the budget its client may hold reserves all of it: it runs once
        # nothing else of that client (or, for the worker's budget, of anyone) holds any. A reservation is a bound
        # on its queues, not what the engine will allocate; refused, a one-task query of 35 scans (288 MiB of
        # 8 MiB input queues) could never run on a worker of 256 (the chaos run).
        need = replace(need, memory=min(need.memory, cap.memory, cap.client_budget))
        deadline = time.monotonic() + cap.wait
        me = _Waiter(key, need, client, query, allocated)
        with self._lock:
            if key in self._held:
                return Refusal(f"task {key} is already admitted", False)
            no_room = self._no_room(me)
            self._enqueue(me)
            self._grant()
            if me.admitted:
                return None
            if no_room is not None:
                self._dequeue(me)
                self._grant()  # it may have been the one in turn that did not fit
                self._count_refusal(client)
                return Refusal(no_room, True)
        return self._wait(me, deadline, give_up, tick, tick_every)

    def _wait(
        self, me: _Waiter, deadline: float, give_up: Callable[[], bool], tick: Callable[[], None], tick_every: float
    ) -> Refusal | None:
        """``admit``'s wait in line for queued ``me``: None at its turn, a Refusal at ``deadline`` or ``give_up()``.

        The lock is let go between rounds (``tick()`` runs outside it). However the wait ends
        (``tick()`` may raise), ``me`` leaves the queue, and a grant it can no longer take is given back.
        """
        cap, need, client, allocated, key = self.capacity, me.need, me.client, me.allocated, me.key
        admitted = False
        try:
            next_tick = time.monotonic()
            while True:
                now = time.monotonic()
                if now >= next_tick:
                    tick()
                    next_tick = now + tick_every
                with self._lock:
                    self._grant()  # what the memory pool holds changes without a release
                    if me.admitted:
                        admitted = True
                        return None
                    if now >= deadline or give_up():
                        self._dequeue(me)
                        self._grant()
                        self._count_refusal(client)
                        return Refusal(f"at capacity for {cap.wait:g}s ({self._describe(allocated(), client)}); "
                                       f"the task needs {need.threads} threads", True)
                    self._lock.wait(max(0.0, min(deadline - now, next_tick - now, 0.25)))
        finally:
            if not admitted:
                with self._lock:
                    if me.admitted:  # granted while tick() raised: give it back
                        self._unreserve(key)
                    elif self._queued(me):
                        self._dequeue(me)
                    self._grant()

    # -- the queue

    def _no_room(self, me: _Waiter) -> str | None:
        """Why ``me`` could not wait, should it not fit now (None: it may)."""
        cap = self.capacity
        mine = self._clients[me.client].queued if me.client in self._clients else 0
        if cap.wait <= 0 or self._waiting >= cap.queue:
            waiting = f"; {self._waiting} tasks wait already" if self._waiting else ""
            return f"at capacity ({self._describe(me.allocated())}{waiting}); the task needs {me.need.threads} threads"
        if cap.client_queue and mine >= cap.client_queue:
            return (
                f"client {me.client!r} has {mine} tasks waiting already, the most one client may have waiting "
                f"(--max-queued-per-client {cap.client_queue}); {self._describe(me.allocated(), me.client)}"
            )
        return None

    def _enqueue(self, w: _Waiter) -> None:
        c = self._clients.get(w.client)
        if c is None:
            self._forget_idle()
            c = self._clients[w.client] = _Client()
        c.queries.setdefault(w.query, deque()).append(w)
        c.queued += 1
        self._waiting += 1
        self._turns.setdefault(w.client)

    def _queued(self, w: _Waiter) -> bool:
        c = self._clients.get(w.client)
        return c is not None and w in c.queries.get(w.query, ())

    def _dequeue(self, w: _Waiter) -> None:
        c = self._clients[w.client]
        line = c.queries[w.query]
        line.remove(w)
        if not line:
            del c.queries[w.query]
        c.queued -= 1
        self._waiting -= 1
        if not c.queries:
            self._turns.pop(w.client, None)

    def _next(self) -> _Waiter | None:
        """The task whose turn it is: the first identity in turn below its cap, its next query's first task."""
        cap, budget = self.capacity.client_cap, self.capacity.client_budget
        for name in self._turns:
            c = self._clients[name]
            first = c.queries[next(iter(c.queries))][0]
            if c.running < cap and c.reserved + first.need.memory <= budget:
                return first
        return None

    def _grant(self) -> None:
        """Give what is free to the waiting tasks in turn, until the one in turn does not fit."""
        granted = False
        while (w := self._next()) is not None and self._fits(w.need, w.allocated()):
            self._dequeue(w)
            if w.client in self._turns:
                self._turns.move_to_end(w.client)  # and the other identities
            self._reserve(w.key, w.need, w.client)
            w.admitted = True
            granted = True
        if granted:
            self._lock.notify_all()

    def _fits(self, need: Need, allocated: int) -> bool:
        cap = self.capacity
        return not (
            len(self._held) + 1 > cap.tasks
            or self._threads + need.threads > cap.threads
            or self._memory + need.memory > cap.memory
            or (self._held and allocated > cap.memory)
        )

    # -- reservations

    def _reserve(self, key: str, need: Need, client: str) -> None:
        self._held[key] = (need, client)
        self._threads += need.threads
        self._memory += need.memory
        self._clients[client].running += 1
        self._clients[client].reserved += need.memory

    def _unreserve(self, key: str) -> bool:
        held = self._held.pop(key, None)
        kept = self._kept.pop(key, None) if held is None else None
        if held is None and kept is None:
            return False
        need, client = held or kept  # type: ignore[misc]
        self._threads -= need.threads
        self._memory -= need.memory
        if held is not None:
            self._clients[client].running -= 1
        self._clients[client].reserved -= need.memory
        return True

    def computed(self, key: str, memory: int, *, kept: bool = False) -> None:
        """``key`` has made all its output: its sources are done, so its source threads go back and its
        memory shrinks to ``memory`` (what its output may hold), while readers may still read it (a kept
        output waits for its re-reads until the query ends: holding threads, it starved the query's next
        stages on one worker, TPC-DS q14).

        ``kept``: an output kept for re-reads (``retain_output``) holds only its bytes in memory from now
        on: it no longer counts as a task against ``--max-tasks`` (a Spark session's old results filled
        the workers' slots query after query, issue 41), and ``memory`` is what it holds, not its bound."""
        with self._lock:
            held = self._held.get(key)
            if held is None:
                return
            need, client = held
            after = Need(threads=0, memory=min(need.memory, max(0, memory)))
            if kept:
                del self._held[key]
                self._kept[key] = (after, client)
                self._clients[client].running -= 1
            else:
                self._held[key] = (after, client)
            self._threads -= need.threads
            self._memory -= need.memory - after.memory
            self._clients[client].reserved -= need.memory - after.memory
            self._grant()
            self._lock.notify_all()

    def release(self, key: str) -> None:
        """Give back ``key``'s reservation (idempotent: the watchdog and the handler may both call it)."""
        with self._lock:
            if self._unreserve(key):
                self._grant()
                self._lock.notify_all()

    def _count_refusal(self, client: str) -> None:
        self._refused += 1
        self._clients[client].refused += 1

    def _forget_idle(self) -> None:
        """Bound the table of identities: past ``_KEPT_CLIENTS``, idle ones (and their refusal counts) go."""
        if len(self._clients) >= _KEPT_CLIENTS:
            for name in [n for n, c in self._clients.items() if not c.running and not c.queued]:
                del self._clients[name]

    # -- reports

    def _describe(self, allocated: int, client: str | None = None) -> str:
        cap = self.capacity
        text = (
            f"{len(self._held)}/{cap.tasks} tasks, {self._threads}/{cap.threads} source threads, "
            f"{self._memory >> 20}/{cap.memory >> 20} MiB reserved, {allocated >> 20} MiB allocated"
        )
        c = self._clients.get(client) if client is not None else None
        if c is not None and cap.client_cap < cap.tasks:
            text += f"; client {client!r} holds {c.running} of the {cap.client_cap} tasks one client may hold (--max-tasks-per-client)"
        if c is not None and cap.client_budget < cap.memory:
            text += (f"; client {client!r} reserves {c.reserved >> 20} of the {cap.client_budget >> 20} MiB one client may reserve "
                     "(--memory-budget-per-client-mb)")
        return text

    def load(self, running: int, buffered: int) -> protocol_pb2.LoadInfo:
        with self._lock:
            return protocol_pb2.LoadInfo(
                running_tasks=running,
                buffered_bytes=buffered,
                source_threads=self._threads,
                source_threads_max=self.capacity.threads,
                reserved_bytes=self._memory,
                memory_budget=self.capacity.memory,
                client_memory_budget=min(self.capacity.client_budget, self.capacity.memory),
                max_tasks=min(self.capacity.client_cap, self.capacity.tasks),
                queued_tasks=self._waiting,
                kept_outputs=len(self._kept),
                kept_bytes=sum(need.memory for need, _ in self._kept.values()),
            )

    def clients(self) -> list[protocol_pb2.ClientLoad]:
        """Load per identity, busiest first (``WorkerInfo.clients``); ``buffered_bytes`` is left to the caller."""
        with self._lock:
            rows = [
                protocol_pb2.ClientLoad(
                    identity=name, running_tasks=c.running, queued_tasks=c.queued, reserved_bytes=c.reserved, refused=c.refused
                )
                for name, c in self._clients.items()
            ]
        rows.sort(key=lambda r: (-(r.running_tasks + r.queued_tasks), -r.reserved_bytes, -r.refused, r.identity))
        return rows[:MAX_REPORTED_CLIENTS]

    @property
    def refused(self) -> int:
        with self._lock:
            return self._refused

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)

    @property
    def waiting(self) -> int:
        with self._lock:
            return self._waiting

    def is_waiting(self, key: str) -> bool:
        """Whether task ``key`` waits in the queue now."""
        with self._lock:
            return any(w.key == key for c in self._clients.values() for line in c.queries.values() for w in line)
