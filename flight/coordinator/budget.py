"""A query's output buffers, made small enough that its tasks on each worker fit that worker's memory budget together.

Why: a worker admits a task only while what its admitted tasks reserve (each its output buffer and 8 MiB per
source thread: ``flight.wire.limits.task_reserve``) stays within its memory budget (half its ``--memory-limit``).
A query that needs more than that on one worker together can never be admitted whole: opened worker by worker
(``opening.py``), it waited at that worker until its deadline, holding what it had been given and leaving the
other queries there waiting too (the chaos run's hangs: TPC-H Q5 with every join shuffled, 12 tasks of ~40 MiB
on each worker of a 256 MiB budget). Smaller output buffers cost some overlap between stages, not results: so
a query whose tasks do not fit is opened with the largest buffer with which they do, on every worker, and one
whose tasks would not fit even with the smallest (1 MiB) gets the smallest and is opened in turns (``waves.py``:
a stage once those it reads were admitted, while the query's tasks there fit the budget). A query
with one task on a worker always fits: a task that alone reserves more than a budget reserves all of it, and
runs when nothing else holds any (``flight.worker.admission``).

A decision apart from I/O: ``fitted_buffer`` reads the workers' ``LoadInfo`` (their budget and default buffer).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from flight.wire._proto import protocol_pb2
from flight.wire.limits import INPUT_RESERVE_BYTES, MAX_OUTPUT_BUFFER_BYTES, MIN_OUTPUT_BUFFER_BYTES, task_reserve

__all__ = ["fitted_buffer", "usable_budget"]

_MIB = 1 << 20


def usable_budget(load: protocol_pb2.LoadInfo) -> int:
    """What one query's tasks may reserve on the worker that said ``load``: its memory budget, or what one identity
    may reserve of it when that is less (``--memory-budget-per-client-mb``, half the budget on a secured worker);
    0 when it said neither."""
    return min((b for b in (load.memory_budget, load.client_memory_budget) if b), default=0)


def fitted_buffer(tasks: Sequence[tuple[str, int]], loads: Mapping[str, protocol_pb2.LoadInfo], buffer: int) -> tuple[int, list[str]]:
    """The output buffer to open the tasks with, and why it is smaller than asked (one line per worker, or none).

    ``tasks``: each task's worker URL and source threads; ``loads``: what workers said of themselves (a worker
    missing, or without a budget, is taken to have room); ``buffer``: the buffer the query asks for (0: each
    worker's default). Returns ``buffer`` unchanged when every worker's tasks fit as asked.
    """
    by_url: dict[str, list[int]] = {}
    for url, n in tasks:
        by_url.setdefault(url, []).append(n)
    fitted, notes = buffer, []
    for url, threads in sorted(by_url.items()):
        load = loads.get(url)
        budget = usable_budget(load) if load is not None else 0
        if load is None or not budget:
            continue
        asked = buffer or load.output_buffer_bytes or MAX_OUTPUT_BUFFER_BYTES
        if len(threads) == 1 or sum(task_reserve(asked, t) for t in threads) <= budget:
            continue  # one task alone reserves at most the whole budget (the worker clamps it): it runs alone
        inputs = sum(t * INPUT_RESERVE_BYTES for t in threads)
        largest = (budget - inputs) // len(threads) // _MIB * _MIB
        if largest < MIN_OUTPUT_BUFFER_BYTES:  # not even the smallest buffers fit: opened in turns (``waves.py``)
            least = sum(task_reserve(MIN_OUTPUT_BUFFER_BYTES, t) for t in threads)
            fitted = MIN_OUTPUT_BUFFER_BYTES
            notes.append(f"its {len(threads)} tasks on {url} reserve at least {least // _MIB} MiB together ("
                         f"{MIN_OUTPUT_BUFFER_BYTES // _MIB} MiB output buffers, {INPUT_RESERVE_BYTES // _MIB} MiB per source "
                         f"thread), past that worker's budget of {budget // _MIB} MiB: opened in turns")
            continue
        current = fitted or asked
        if largest < current:
            fitted = largest
            notes.append(f"its {len(threads)} tasks on {url} reserve {sum(task_reserve(asked, t) for t in threads) // _MIB} MiB "
                         f"with {asked // _MIB} MiB output buffers, past that worker's budget of {budget // _MIB} MiB")
    return fitted, notes
