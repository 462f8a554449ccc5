"""A query's output buffers fitted to its workers' memory budgets (flight.coordinator.budget), without sockets.

The chaos run's hangs: TPC-H Q5 with every join shuffled put 12 tasks of ~40 MiB on each worker of a 256 MiB
budget; opened worker by worker, it waited at the first for memory it could never have. Here: the buffer that
makes every worker's tasks fit, the workers that need nothing, and the smallest buffer when not even 1 MiB fits
(the query is then opened in turns: tests/coordinator/test_waves.py).
"""

from __future__ import annotations

from flight.coordinator.budget import fitted_buffer, usable_budget
from flight.wire._proto import protocol_pb2
from flight.wire.limits import MIN_OUTPUT_BUFFER_BYTES, task_reserve

MIB = 1 << 20


def load(budget_mib: int, default_mib: int = 32) -> protocol_pb2.LoadInfo:
    return protocol_pb2.LoadInfo(memory_budget=budget_mib * MIB, output_buffer_bytes=default_mib * MIB)


def test_tasks_that_fit_keep_the_buffer_they_asked_for() -> None:
    tasks = [("w0", 1)] * 5 + [("w1", 2)] * 5
    assert fitted_buffer(tasks, {"w0": load(256), "w1": load(256)}, 0) == (0, [])
    assert fitted_buffer(tasks, {"w0": load(256)}, 16 * MIB) == (16 * MIB, [])
    assert fitted_buffer(tasks, {}, 0) == (0, [])  # workers that said nothing are taken to have room


def test_the_buffer_shrinks_until_every_workers_tasks_fit_its_budget_together() -> None:
    tasks = [("w0", 1)] * 12 + [("w1", 2)] * 12 + [("w2", 1)] * 2
    loads = {"w0": load(256), "w1": load(512), "w2": load(64)}
    buffer, why = fitted_buffer(tasks, loads, 0)
    assert MIB <= buffer < 32 * MIB and buffer % MIB == 0
    for url, budget in (("w0", 256), ("w1", 512), ("w2", 64)):
        threads = [t for u, t in tasks if u == url]
        assert sum(task_reserve(buffer, t) for t in threads) <= budget * MIB, url
    assert sum(task_reserve(buffer + MIB, t) for u, t in tasks if u == "w0") > 256 * MIB  # the largest that fits w0
    assert len(why) == 1 and "w0" in why[0] and "256 MiB" in why[0], why


def test_tasks_that_would_not_fit_with_the_smallest_buffer_get_it_and_the_note_says_turns() -> None:
    buffer, why = fitted_buffer([("w1", 1)] * 30, {"w1": load(256)}, 0)
    assert buffer == MIN_OUTPUT_BUFFER_BYTES
    assert len(why) == 1 and "30 tasks on w1 reserve at least 270 MiB" in why[0] and "opened in turns" in why[0], why


def test_one_task_on_a_worker_always_fits_it_runs_alone_with_the_whole_budget() -> None:
    assert fitted_buffer([("w1", 35)], {"w1": load(256)}, 0) == (0, [])  # 288 MiB: the worker clamps it to 256
    buffer, why = fitted_buffer([("w1", 35), ("w1", 1)], {"w1": load(256)}, 0)  # two must fit together: they cannot
    assert buffer == MIN_OUTPUT_BUFFER_BYTES and "2 tasks on w1" in why[0], why


def test_a_secured_workers_budget_per_identity_is_the_one_that_counts() -> None:
    # A secured worker lets one identity reserve half its budget (--memory-budget-per-client-mb): a query is one identity.
    secured = protocol_pb2.LoadInfo(memory_budget=256 * MIB, client_memory_budget=128 * MIB, output_buffer_bytes=32 * MIB)
    tasks = [("w1", 1)] * 6  # 6 x (32 + 8) = 240 MiB: within 256, past 128
    buffer, why = fitted_buffer(tasks, {"w1": secured}, 0)
    assert sum(task_reserve(buffer, 1) for _ in tasks) <= 128 * MIB < sum(task_reserve(buffer + MIB, 1) for _ in tasks)
    assert "128 MiB" in why[0], why
    assert usable_budget(protocol_pb2.LoadInfo(memory_budget=256 * MIB)) == 256 * MIB  # an older worker says no per-identity budget
    assert usable_budget(protocol_pb2.LoadInfo()) == 0


def test_a_workers_budgets_of_any_size_give_a_usable_one() -> None:
    # A worker's LoadInfo is a peer's word: any uint64 there gives a budget within what it said, never more.
    for budget, client in ((256 * MIB, 0), (256 * MIB, 1), (256 * MIB, 2**64 - 1), (0, 128 * MIB), (2**64 - 1, 2**64 - 1)):
        got = usable_budget(protocol_pb2.LoadInfo(memory_budget=budget, client_memory_budget=client))
        assert got == min(b for b in (budget, client) if b), (budget, client, got)
    # A one-byte budget: every task's reservation counts as the whole of it, so they open one by one (or are refused).
    buffer, why = fitted_buffer([("w1", 1)] * 3, {"w1": protocol_pb2.LoadInfo(memory_budget=256 * MIB, client_memory_budget=1)}, 0)
    assert buffer == MIN_OUTPUT_BUFFER_BYTES and "opened in turns" in why[0], why
