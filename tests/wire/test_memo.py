"""``flight.wire.memo.Memo``: answers kept per process, bounded, least recently used out first, from many threads."""

from __future__ import annotations

import threading

from flight.wire.memo import Memo


def test_a_memo_keeps_at_most_its_bound_and_lets_the_least_recently_used_go_first() -> None:
    memo: Memo[str, int] = Memo(2)
    memo.put("a", 1)
    memo.put("b", 2)
    assert memo.get("a") == 1  # "a" is now the most recently used
    memo.put("c", 3)
    assert (memo.get("a"), memo.get("b"), memo.get("c"), len(memo)) == (1, None, 3, 2)
    memo.clear()
    assert len(memo) == 0 and memo.get("a") is None


def test_a_memo_used_from_many_threads_stays_within_its_bound() -> None:
    memo: Memo[int, int] = Memo(50)

    def fill(base: int) -> None:
        for i in range(2000):
            memo.put(base + i, i)
            memo.get(base + i // 2)

    threads = [threading.Thread(target=fill, args=(k * 10_000,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(memo) == 50
