"""Fair shares of a worker (issue 24), decided by ``Admission`` alone: no sockets, no worker.

Turns between identities and between an identity's queries, the cap per identity,
the bound on an identity's waiting tasks, release, and the per-identity report.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator

import pytest
from support import wait_until

from flight.config import WorkerOptions
from flight.wire._proto import protocol_pb2
from flight.worker.admission import ANONYMOUS, Admission, Refusal
from flight.worker.beats import Heartbeats
from flight.worker.capacity import Capacity, Need, worker_capacity

ONE = Need(1, 1)


def capacity(
    tasks: int = 1, per_client: int = 0, client_queue: int = 0, queue: int = 64, wait: float = 30.0, client_memory: int = 0,
    memory: int = 1 << 30,
) -> Capacity:
    return Capacity(
        tasks=tasks, threads=64, memory=memory, queue=queue, wait=wait, per_client=per_client, client_queue=client_queue,
        client_memory=client_memory,
    )


class Line:
    """Tasks that wait in an ``Admission`` on threads of their own; ``order`` is the order they got in."""

    def __init__(self, adm: Admission) -> None:
        self.adm = adm
        self.order: list[str] = []
        self.refused: dict[str, Refusal] = {}
        self.threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def join(self, key: str, client: str, query: str = "q", need: Need = ONE) -> None:
        """Start a task that waits, and wait until it is in the queue (so arrival order is fixed)."""
        before = self.adm.waiting

        def run() -> None:
            refusal = self.adm.admit(key, need, client=client, query=query)
            with self._lock:
                if refusal is None:
                    self.order.append(key)
                else:
                    self.refused[key] = refusal

        t = threading.Thread(target=run, name=f"wait-{key}", daemon=True)
        t.start()
        self.threads.append(t)
        wait_until(lambda: self.adm.waiting == before + 1, 5.0, f"{key} to queue")

    def admitted(self, n: int) -> list[str]:
        wait_until(lambda: len(self.order) >= n, 5.0, f"{n} tasks admitted")
        with self._lock:
            return list(self.order)

    def release_all(self) -> None:
        """Release whatever got in until every waiting thread is done."""
        while any(t.is_alive() for t in self.threads) or self.order:
            with self._lock:
                keys, self.order = self.order, []
            for key in keys:
                self.adm.release(key)
            for t in self.threads:
                t.join(0.05)


@pytest.fixture
def line() -> Iterator[Line]:
    lines: list[Line] = []

    def make(adm: Admission) -> Line:
        lines.append(Line(adm))
        return lines[-1]

    yield make  # type: ignore[misc]
    for ln in lines:
        ln.release_all()


def test_slots_go_round_robin_between_identities(line) -> None:  # type: ignore[no-untyped-def]
    adm = Admission(capacity(tasks=1))
    assert adm.admit("holder", ONE, client="a") is None
    ln = line(adm)
    for key, client in [("a1", "a"), ("a2", "a"), ("a3", "a"), ("b1", "b"), ("b2", "b"), ("c1", "c")]:
        ln.join(key, client)
    adm.release("holder")
    for n in range(1, 7):
        got = ln.admitted(n)
        adm.release(got[-1])
    assert ln.order == ["a1", "b1", "c1", "a2", "b2", "a3"]


def test_an_identitys_queries_are_served_in_the_order_they_began_to_wait_each_whole(line) -> None:  # type: ignore[no-untyped-def]
    adm = Admission(capacity(tasks=1))
    assert adm.admit("holder", ONE) is None
    ln = line(adm)
    for key, query in [("q1.0", "q1"), ("q1.1", "q1"), ("q1.2", "q1"), ("q2.0", "q2"), ("q3.0", "q3"), ("q2.1", "q2")]:
        ln.join(key, ANONYMOUS, query)
    adm.release("holder")
    for n in range(1, 7):
        adm.release(ln.admitted(n)[-1])
    assert ln.order == ["q1.0", "q1.1", "q1.2", "q2.0", "q2.1", "q3.0"]


def test_an_identity_never_holds_more_than_its_cap_and_another_gets_in_at_once(line) -> None:  # type: ignore[no-untyped-def]
    adm = Admission(capacity(tasks=4, per_client=3))
    for i in range(3):
        assert adm.admit(f"a{i}", ONE, client="a") is None
    ln = line(adm)
    ln.join("a3", "a")  # a slot is free, but not for "a": it waits, alone
    assert len(adm) == 3 and adm.waiting == 1
    assert adm.admit("b0", ONE, client="b") is None  # the waiting task of a capped identity blocks nobody
    adm.release("b0")
    assert adm.waiting == 1 and not ln.order
    adm.release("a0")  # one of its own ends: now it may
    assert ln.admitted(1) == ["a3"]
    loads = {c.identity: c for c in adm.clients()}
    assert loads["a"].running_tasks == 3 and loads["b"].running_tasks == 0


def test_the_cap_times_out_with_a_message_naming_it() -> None:
    adm = Admission(capacity(tasks=4, per_client=1, wait=0.2))
    assert adm.admit("a0", ONE, client="alice") is None
    refusal = adm.admit("a1", ONE, client="alice")
    assert refusal is not None and refusal.fits_ever
    assert "at capacity for 0.2s" in refusal.reason and "'alice' holds 1 of the 1 tasks one client may hold" in refusal.reason
    assert "--max-tasks-per-client" in refusal.reason


def test_an_identitys_waiting_tasks_are_bounded_and_one_more_is_refused_at_once(line) -> None:  # type: ignore[no-untyped-def]
    adm = Admission(capacity(tasks=2, per_client=1, client_queue=2))
    assert adm.admit("a0", ONE, client="alice") is None
    ln = line(adm)
    ln.join("a1", "alice")
    ln.join("a2", "alice")
    refusal = adm.admit("a3", ONE, client="alice")
    assert refusal is not None and refusal.fits_ever
    assert "'alice' has 2 tasks waiting already" in refusal.reason and "--max-queued-per-client 2" in refusal.reason
    assert adm.waiting == 2
    assert adm.admit("b0", ONE, client="bob") is None  # another identity is not affected
    loads = {c.identity: c for c in adm.clients()}
    assert (loads["alice"].running_tasks, loads["alice"].queued_tasks, loads["alice"].refused) == (1, 2, 1)
    assert (loads["bob"].running_tasks, loads["bob"].queued_tasks, loads["bob"].refused) == (1, 0, 0)
    assert [c.identity for c in adm.clients()] == ["alice", "bob"]  # busiest first
    adm.release("a0")
    assert ln.admitted(1) == ["a1"]
    adm.release("a1")
    assert ln.admitted(2) == ["a1", "a2"]


def test_a_task_in_turn_that_does_not_fit_stops_the_line(line) -> None:  # type: ignore[no-untyped-def]
    adm = Admission(Capacity(tasks=8, threads=4, memory=1 << 30, queue=8, wait=30.0, per_client=2))
    assert adm.admit("big0", Need(3, 1), client="a") is None
    ln = line(adm)
    ln.join("big1", "b", need=Need(3, 1))  # in turn, does not fit the one thread left
    ln.join("small", "c")
    assert adm.waiting == 2 and not ln.order  # no overtaking: "small" waits behind "big1"
    adm.release("big0")
    assert sorted(ln.admitted(2)) == ["big1", "small"]  # granted together: their threads wake in any order


def test_giving_up_leaves_the_line_and_lets_the_next_one_in(line) -> None:  # type: ignore[no-untyped-def]
    adm = Admission(capacity(tasks=1))
    assert adm.admit("holder", ONE) is None
    stop = threading.Event()
    result: list[Refusal | None] = []
    t = threading.Thread(target=lambda: result.append(adm.admit("quitter", ONE, client="q", give_up=stop.is_set)))
    t.start()
    wait_until(lambda: adm.waiting == 1, 5.0, "the quitter to queue")
    ln = line(adm)
    ln.join("next", "n")
    stop.set()
    t.join(5)
    assert result and result[0] is not None and adm.waiting == 1
    adm.release("holder")
    assert ln.admitted(1) == ["next"]
    adm.release("holder")  # idempotent
    adm.release("never-admitted")
    assert len(adm) == 1


def test_random_orders_keep_every_bound() -> None:
    """Many identities and queries, tasks admitted and released in random order: no bound is ever crossed."""
    rng = random.Random(24)
    cap = capacity(tasks=6, per_client=4, client_queue=3, queue=10, wait=30.0)
    adm = Admission(cap)
    held: set[str] = set()
    lock = threading.Lock()
    threads = []

    def ask(key: str, client: str, query: str) -> None:
        if adm.admit(key, ONE, client=client, query=query) is None:
            with lock:
                held.add(key)

    for i in range(60):
        client, query = rng.choice("abcd"), rng.choice(["x", "y"])
        t = threading.Thread(target=ask, args=(f"t{i}", client, f"{client}.{query}"), daemon=True)
        t.start()
        threads.append(t)
        if rng.random() < 0.5:
            with lock:
                victim = rng.choice(sorted(held)) if held else None
                held.discard(victim or "")
            if victim:
                adm.release(victim)
        loads = adm.clients()
        assert len(adm) <= cap.tasks and adm.waiting <= cap.queue
        assert all(c.running_tasks <= cap.per_client and c.queued_tasks <= cap.client_queue for c in loads)
        assert sum(c.running_tasks for c in loads) == len(adm)
    while any(t.is_alive() for t in threads) or held:
        with lock:
            keys = list(held)
            held.clear()
        for key in keys:
            adm.release(key)
        for t in threads:
            t.join(0.01)
    assert len(adm) == 0 and adm.waiting == 0


def _limits(cap: Capacity) -> tuple[int, int, int]:
    return cap.client_cap, cap.client_queue, cap.client_budget >> 20


def test_default_limits_depend_on_whether_callers_have_identities() -> None:
    o = WorkerOptions(max_tasks=64, queue_length=256, memory_budget=8 << 30)
    assert _limits(worker_capacity(o, True)) == (48, 16, 4096)
    assert _limits(worker_capacity(o, False)) == (64, 256, 8192)  # one identity for all: the whole worker
    given = WorkerOptions(max_tasks=64, max_tasks_per_client=10, max_queued_per_client=2, memory_budget_per_client=100 << 20)
    assert _limits(worker_capacity(given, True)) == (10, 2, 100)
    assert worker_capacity(WorkerOptions(max_tasks=1), True).client_cap == 1
    assert Capacity(tasks=4, threads=1, memory=1, per_client=9).client_cap == 4


def test_an_identity_past_its_memory_budget_waits_and_blocks_nobody(line) -> None:  # type: ignore[no-untyped-def]
    mib = Need(threads=1, memory=1 << 20)
    adm = Admission(capacity(tasks=8, per_client=8, client_memory=2 << 20))
    assert adm.admit("a0", mib, client="a") is None
    assert adm.admit("a1", mib, client="a") is None
    ln = line(adm)
    ln.join("a2", "a", need=mib)  # a third MiB would pass a's 2 MiB budget: it waits
    assert adm.admit("b0", mib, client="b") is None  # another identity is not held up
    adm.release("a0")
    assert ln.admitted(1) == ["a2"]
    # A task that alone reserves more than a's budget reserves all of it: it waits until a holds nothing.
    ln.join("a3", "a", need=Need(threads=1, memory=3 << 20))
    adm.release("a1")
    assert ln.admitted(1) == ["a2"]  # a3 still waits: a2 holds a MiB
    adm.release("a2")
    assert ln.admitted(2) == ["a2", "a3"]
    assert adm.load(0, 0).reserved_bytes == (1 << 20) + (2 << 20)  # b0's MiB and a3's clamped 2


def test_a_task_larger_than_the_workers_budget_runs_alone(line) -> None:  # type: ignore[no-untyped-def]
    """The chaos run's one-task query of 35 scans reserved 288 MiB of a 256 MiB budget: refused, it could never run."""
    adm = Admission(capacity(tasks=8, memory=256 << 20))
    assert adm.admit("small", Need(threads=1, memory=8 << 20)) is None
    ln = line(adm)
    ln.join("huge", "anon", need=Need(threads=36, memory=288 << 20))
    assert ln.refused == {} and ln.order == []  # it waits, while the small task holds 8 MiB
    adm.release("small")
    assert ln.admitted(1) == ["huge"]
    assert adm.load(0, 0).reserved_bytes == 256 << 20  # the whole budget, no more


# --------------------------------------------------------------- heartbeats


class FakeSender:
    """A sender that counts beats; ``block`` makes its next write hang until released."""

    def __init__(self, block: bool = False, busy: bool = False) -> None:
        self.beats = 0
        self.busy = busy
        self.release = threading.Event()
        self.blocked = threading.Event()
        self._block = block

    def try_frame(self, frame: protocol_pb2.WorkerFrame) -> bool:
        assert frame.WhichOneof("frame") == "heartbeat"
        if self.busy:
            return False
        if self._block:
            self.blocked.set()
            self.release.wait(30)
            self._block = False
        self.beats += 1
        return True


def test_one_thread_beats_for_every_sender_and_skips_a_busy_one() -> None:
    beats = Heartbeats(stall=5.0)
    try:
        senders = [FakeSender() for _ in range(20)]
        busy = FakeSender(busy=True)
        for s in [*senders, busy]:
            beats.add(s, 0.05)
        wait_until(lambda: all(s.beats >= 3 for s in senders), 10.0, "three beats on every sender")
        assert busy.beats == 0 and len(beats) == 21
        beats.remove(senders[0])
        n = senders[0].beats
        wait_until(lambda: senders[1].beats >= n + 5, 10.0, "more beats on the others")
        assert senders[0].beats <= n + 1  # removed: at most the beat in flight
    finally:
        beats.close()


def test_a_frozen_peer_does_not_stop_the_others_beats() -> None:
    beats = Heartbeats(stall=0.2)
    frozen = FakeSender(block=True)
    other = FakeSender()
    try:
        beats.add(frozen, 0.05)
        assert frozen.blocked.wait(10)
        beats.add(other, 0.05)
        wait_until(lambda: other.beats >= 5, 10.0, "beats on the live sender while one write hangs")
        assert beats.stalled == 1
        frozen.release.set()  # the connection ended: the blocked thread returns and bows out
        wait_until(lambda: beats.stalled == 0, 10.0, "the blocked writer to end")
        n = frozen.beats
        wait_until(lambda: frozen.beats > n, 10.0, "the sender to get beats again")
    finally:
        frozen.release.set()
        beats.close()


def test_a_computed_task_gives_back_its_source_threads_and_keeps_its_outputs_memory() -> None:
    """A task whose output is all made (kept for re-reads) holds its buffer's bytes, not its source threads:
    a waiting task that needs the threads gets in (TPC-DS q14's stages on one worker waited for them)."""
    adm = Admission(Capacity(tasks=8, threads=64, memory=1 << 30, queue=8, wait=30.0, per_client=0, client_queue=0, client_memory=0))
    assert adm.admit("producer", Need(threads=61, memory=300 << 20)) is None
    got: list[Refusal | None] = []
    waiter = threading.Thread(target=lambda: got.append(adm.admit("consumer", Need(threads=8, memory=10 << 20))), daemon=True)
    waiter.start()
    wait_until(lambda: adm.waiting == 1, 5.0, "the consumer to wait for threads")
    adm.computed("producer", 100 << 20)
    waiter.join(5.0)
    assert got == [None]
    load = adm.load(2, 0)
    assert load.source_threads == 8
    assert load.reserved_bytes == (100 << 20) + (10 << 20)
    adm.computed("producer", 1 << 40)  # never more than it reserved, and again changes nothing
    assert adm.load(2, 0).reserved_bytes == (100 << 20) + (10 << 20)
    adm.release("producer")
    adm.release("consumer")
    assert adm.load(0, 0).source_threads == 0 and adm.load(0, 0).reserved_bytes == 0


def test_a_kept_output_holds_its_bytes_but_no_task_slot() -> None:
    """An output kept for re-reads whose computation ended no longer counts against ``--max-tasks``: a Spark
    session's old results filled a worker's slots query after query (issue 41). Its bytes still count, until
    it is released."""
    adm = Admission(Capacity(tasks=2, threads=64, memory=1 << 30, queue=8, wait=30.0, per_client=0, client_queue=0, client_memory=0))
    for key in ("old-1", "old-2"):
        assert adm.admit(key, Need(threads=4, memory=32 << 20)) is None
        adm.computed(key, 3 << 20, kept=True)
    assert len(adm) == 0
    assert adm.admit("new-1", Need(threads=4, memory=32 << 20)) is None
    assert adm.admit("new-2", Need(threads=4, memory=32 << 20)) is None
    load = adm.load(4, 0)
    assert (load.kept_outputs, load.kept_bytes) == (2, 6 << 20)
    assert load.reserved_bytes == (6 << 20) + (64 << 20) and load.source_threads == 8
    (client,) = adm.clients()
    assert client.running_tasks == 2 and client.reserved_bytes == (6 << 20) + (64 << 20)
    for key in ("old-1", "old-2", "new-1", "new-2", "old-1"):  # released once each: a second release is nothing
        adm.release(key)
    load = adm.load(0, 0)
    assert (load.kept_outputs, load.kept_bytes, load.reserved_bytes, load.source_threads) == (0, 0, 0, 0)
