"""``flight.threads.spawn``: a function on a thread of its own, without waiting for a thread to start.

The oracle is the threading module itself: thread identities, names and ``threading.excepthook``.
"""

from __future__ import annotations

import os
import threading
import time

import pytest
from support import wait_until

from flight import threads


def test_a_spawned_function_runs_with_its_arguments_under_its_name_and_can_be_joined() -> None:
    seen: list[tuple[str, int]] = []
    gate = threading.Event()

    def work(a: str, b: int) -> None:
        gate.wait(10)
        seen.append((threading.current_thread().name, a, b))  # type: ignore[arg-type]

    job = threads.spawn(work, "x", 2, name="worker-x")
    assert job.is_alive() and job.name == "worker-x"
    job.join(0.05)
    assert job.is_alive() and not seen  # still waiting at the gate
    gate.set()
    job.join(10)
    assert not job.is_alive() and seen == [("worker-x", "x", 2)]


def test_an_idle_thread_takes_the_next_function_and_loses_the_last_one_s_name() -> None:
    threads.spawn(lambda: None, name="first").join(10)
    wait_until(lambda: any(t.name == "flight-idle" for t in threading.enumerate()), what="an idle pool thread")
    before = {t.ident for t in threading.enumerate()}
    idents: list[int | None] = []
    threads.spawn(lambda: idents.append(threading.get_ident()), name="second").join(10)
    assert idents and idents[0] in before  # a thread that was already there ran it: no thread was started
    assert "first" not in {t.name for t in threading.enumerate()}


def test_functions_that_wait_for_each_other_all_get_a_thread() -> None:
    """No bound: 40 functions that each wait until all 40 run would deadlock on a bounded pool."""
    barrier = threading.Barrier(40, timeout=20)
    jobs = [threads.spawn(barrier.wait, name=f"b{i}") for i in range(40)]
    for job in jobs:
        job.join(30)
    assert not any(job.is_alive() for job in jobs) and not barrier.broken


def test_an_escaping_exception_goes_to_threading_excepthook_and_the_thread_serves_on(monkeypatch: pytest.MonkeyPatch) -> None:
    caught: list[tuple[type[BaseException], str, str]] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: caught.append((args.exc_type, str(args.exc_value), args.thread.name)))

    def boom() -> None:
        raise ValueError("bad unit")

    job = threads.spawn(boom, name="boom")
    job.join(10)
    assert caught == [(ValueError, "bad unit", "boom")] and not job.is_alive()
    after = threads.spawn(lambda: None, name="after")
    after.join(10)
    assert not after.is_alive()


def test_idle_threads_end_after_idle_s(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "IDLE_S", 0.2)
    with threads._POOL._lock:  # threads idle since earlier tests wait again, with the new IDLE_S
        threads._POOL._ready.notify_all()
        threads._POOL._wake_starter.notify_all()
    jobs = [threads.spawn(time.sleep, 0.3, name=f"sleep-{i}") for i in range(6)]  # more than are idle: new threads
    for job in jobs:
        job.join(10)
    wait_until(lambda: not [t for t in threading.enumerate() if t.name in ("flight-idle", "flight-thread-starter")], timeout=15,
               what="idle pool threads to end")
    job = threads.spawn(lambda: None, name="later")  # and the pool starts threads again afterwards
    job.join(10)
    assert not job.is_alive()


def test_retire_idle_ends_the_idle_threads_now_and_the_pool_serves_on() -> None:
    jobs = [threads.spawn(time.sleep, 0.2, name=f"nap-{i}") for i in range(4)]
    for job in jobs:
        job.join(10)
    wait_until(lambda: len([t for t in threading.enumerate() if t.name == "flight-idle"]) >= 4, timeout=10,
               what="the pool's threads to become idle")
    threads.retire_idle()  # IDLE_S is 30 s: only retire_idle ends them within the wait below
    wait_until(lambda: not [t for t in threading.enumerate() if t.name == "flight-idle"], timeout=5,
               what="idle pool threads to end")
    done = threading.Event()
    threads.spawn(done.set, name="after-retire").join(10)
    assert done.is_set()


def test_a_forked_child_gets_threads_of_its_own() -> None:
    """A Spark Python worker is a fork: the parent's idle threads are not in the child, so the
    child must not hand them functions (they would never run)."""
    threads.spawn(lambda: None, name="warm").join(10)
    wait_until(lambda: any(t.name == "flight-idle" for t in threading.enumerate()), what="an idle pool thread")
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if a spawned function ran
        code = 1
        try:
            ran = threading.Event()
            threads.spawn(ran.set, name="in-child")
            code = 0 if ran.wait(10) else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child's spawned function never ran"


def test_every_calls_each_function_on_one_thread_until_it_returns_false() -> None:
    calls: dict[str, list[str]] = {"a": [], "b": []}

    def ticking(name: str, times: int):  # type: ignore[no-untyped-def]
        def fn() -> bool:
            calls[name].append(threading.current_thread().name)
            return len(calls[name]) < times
        return fn

    threads.every(0.01, ticking("a", 3))
    threads.every(0.02, ticking("b", 2))
    wait_until(lambda: len(calls["a"]) == 3 and len(calls["b"]) == 2, 10.0, "both functions to be called until they stop")
    assert {*calls["a"], *calls["b"]} == {"flight-ticker"}  # one thread for all
    settled = time.monotonic() + 0.1
    wait_until(lambda: time.monotonic() > settled, 5.0, "a few more ticks' time")
    assert (len(calls["a"]), len(calls["b"])) == (3, 2)  # never called again after False


def test_a_raising_function_is_reported_and_the_ticker_serves_on(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_value))
    later: list[int] = []

    def boom() -> bool:
        raise RuntimeError("a failing beat")

    threads.every(0.01, boom)
    threads.every(0.01, lambda: later.append(1) is None and len(later) < 3)
    wait_until(lambda: len(later) == 3 and seen, 10.0, "the error to be reported and the other function to go on")
    assert isinstance(seen[0], RuntimeError)
