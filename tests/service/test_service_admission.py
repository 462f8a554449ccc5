"""The service's admission (``flight.service.admission``), without sockets: limits, turns, refusals."""

from __future__ import annotations

import threading

import pytest
from support import wait_until

from flight.service.admission import Admission, AdmissionRefused


def waiting(admission: Admission, user: str, granted: list[str]) -> threading.Thread:
    """A thread whose query waits for a slot, then notes its user in ``granted``."""

    def run() -> None:
        admission.acquire(user)
        granted.append(user)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def settle(admission: Admission, queued: dict[str, int]) -> None:
    wait_until(lambda: admission.queued() == queued, 5.0, f"the queue to be {queued}")


def test_at_most_max_queries_run_and_a_freed_slot_goes_to_a_waiter() -> None:
    admission = Admission(2, 2, 10.0)
    admission.acquire("a")
    admission.acquire("b")
    granted: list[str] = []
    thread = waiting(admission, "c", granted)
    settle(admission, {"c": 1})
    assert granted == []
    admission.release("a")
    thread.join(5)
    assert granted == ["c"] and admission.running == {"b": 1, "c": 1}


def test_freed_slots_go_round_robin_between_the_users_who_wait() -> None:
    admission = Admission(1, 1, 10.0)
    admission.acquire("holder")
    granted: list[str] = []
    threads = [waiting(admission, "many", granted) for _ in range(3)]
    settle(admission, {"many": 3})
    threads.append(waiting(admission, "one", granted))
    settle(admission, {"many": 3, "one": 1})
    for expected in (["many"], ["many", "one"], ["many", "one", "many"], ["many", "one", "many", "many"]):
        admission.release(granted[-1] if granted else "holder")
        wanted = len(expected)
        wait_until(lambda: len(granted) >= wanted, 5.0, f"grant {wanted}")  # noqa: B023 - used at once, in this iteration
        assert granted == expected
    for t in threads:
        t.join(5)


def test_a_user_at_the_per_user_cap_leaves_the_free_slots_to_others() -> None:
    admission = Admission(4, 2, 10.0)
    admission.acquire("heavy")
    admission.acquire("heavy")
    granted: list[str] = []
    heavy = waiting(admission, "heavy", granted)
    settle(admission, {"heavy": 1})
    admission.acquire("light")  # at once: two slots are free, and the heavy user is at its cap
    assert admission.running == {"heavy": 2, "light": 1} and granted == []
    admission.release("heavy")
    heavy.join(5)
    assert granted == ["heavy"]


def test_no_slot_within_the_queue_wait_is_refused_naming_the_limit() -> None:
    admission = Admission(1, 1, 0.2)
    admission.acquire("a")
    with pytest.raises(AdmissionRefused, match=r"no slot after 0.2 s of waiting: the service runs 1 queries \(--max-queries 1\)"):
        admission.acquire("b")
    wide = Admission(3, 1, 0.2)
    wide.acquire("a")
    with pytest.raises(AdmissionRefused, match=r"a runs 1 queries \(--max-queries-per-user 1\)"):
        wide.acquire("a")
    assert admission.queued() == {} and admission.running == {"a": 1}
    admission.release("a")
    assert admission.wait_idle(1.0)


def test_limits_below_one_are_refused() -> None:
    with pytest.raises(ValueError):
        Admission(0, 1, 1.0)
