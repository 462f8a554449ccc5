"""Where an execution's stages start (``flight.coordinator.placement``): decisions alone, no sockets."""

from __future__ import annotations

import hashlib

import pytest

from flight.coordinator.placement import Placement

URLS = ["grpc://a:1", "grpc://b:1", "grpc://c:1"]


def _key(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def test_a_plan_starts_at_its_own_worker_every_time_while_none_is_busy() -> None:
    p = Placement()
    starts = {p.start(_key("q1"), URLS) for _ in range(5)}
    assert starts == {int.from_bytes(_key("q1")[:8], "big") % 3}


def test_plans_spread_by_their_key() -> None:
    p = Placement()
    assert len({p.start(_key(f"q{i}"), URLS) for i in range(30)}) == 3


def test_a_busier_preferred_worker_gives_way_to_the_least_busy_one_after_it() -> None:
    p = Placement()
    key = _key("q1")
    preferred = p.start(key, URLS)
    release = p.hold([URLS[preferred]])
    second = p.start(key, URLS)
    assert second == (preferred + 1) % 3  # the next idle worker after the preferred one
    release_second = p.hold([URLS[second]])
    assert p.start(key, URLS) == (preferred + 2) % 3
    release()
    assert p.start(key, URLS) == preferred  # free again: back to its own
    release_second()
    assert all(p.running(u) == 0 for u in URLS)


def test_an_execution_on_every_worker_changes_no_choice() -> None:
    p = Placement()
    key = _key("q7")
    before = p.start(key, URLS)
    release = p.hold(URLS)
    assert p.start(key, URLS) == before
    release()


def test_release_counts_once_and_repeated_urls_count_once() -> None:
    p = Placement()
    release = p.hold([URLS[0], URLS[0], URLS[1]])
    assert (p.running(URLS[0]), p.running(URLS[1])) == (1, 1)
    release()
    release()
    assert (p.running(URLS[0]), p.running(URLS[1])) == (0, 0)


@pytest.mark.parametrize("n", [1, 2, 5])
def test_the_start_is_an_index_of_the_urls(n: int) -> None:
    urls = [f"grpc://w{i}:1" for i in range(n)]
    p = Placement()
    for i in range(20):
        assert 0 <= p.start(_key(str(i)), urls) < n
