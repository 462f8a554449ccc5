"""Opening a query's tasks in turns when together they need more source threads, memory or task slots than their workers have.

Why: a worker admits a task only when it can give the task a thread for each of its blocking sources
(``worker/admission.py``) and its memory (its output buffer and 8 MiB per source thread, within the
worker's memory budget), and a query's stages normally all start at once, their rows streaming
between them. When the tasks bound to one worker need more source threads together than that worker
has (TPC-DS q14 on one worker: a producer of 61 and the head of 8, of 64), or more memory than its
budget even with the smallest output buffers (q14 across two hosts with its files cut: 131 tasks a
worker, 3.6 GB against 2 GB), they can never all be admitted: whichever comes first holds what it
was given while it waits for the other, and nothing moves until the worker's queue wait runs out.

The rule here, a decision apart from I/O (``opening.py`` carries it out):

* a task is opened only once every task of the stages it reads was admitted, so an admitted task
  never waits for one that is not (each stage below the head keeps its output, memory then spill,
  so a producer finishes whether or not its readers run yet);
* and only while the threads, the memory and the number of the query's open tasks on its worker, its own
  included, stay within what the worker has (its ``--max-tasks``, or one caller's share of them: beyond it the
  worker queues a task, and a reader queued behind its producer's slot waits out the queue); a task gives its
  threads and its task slot back once it made all its output (the slot: once its output is kept, which every
  stage's is in turns but a detached query's head without ``retain``: that head must fit at once, ``head_fits``,
  and a task of it opened as a sibling ends may wait in the worker's queue until the slot is free)
  (``Admission.computed`` on the worker, its ``finished`` frame here), and its memory but its output
  buffer (``keeps``: what its kept output may hold in memory until its readers drained it; counted
  here until the query ends, which is never less than the worker counts).

So every admitted task can finish, and when none of the query's tasks holds threads on a worker,
the first task not yet opened (its producers all admitted and finished) fits there whatever it
needs, as long as it fits the worker at all (``too_large``, refused before anything runs), and the
outputs kept there leave room for it (``starved``, refused too). A task that alone reserves more
than a worker's budget is counted as the whole budget (the worker clamps it so, and runs it alone).
When the whole plan fits (``fits``), it is opened at once, as before.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["TaskId", "TaskNeed", "Waves"]

TaskId = tuple[int, int]
"""(stage id, task number)."""


@dataclass(frozen=True)
class TaskNeed:
    """One task: where it is bound, the source threads and memory its worker reserves for it, and the memory it
    still holds once it made all its output (its output buffer, for readers not yet admitted)."""

    stage: int
    task: int
    url: str
    threads: int
    memory: int = 0
    keeps: int = 0

    @property
    def id(self) -> TaskId:
        return (self.stage, self.task)


class Waves:
    """Which tasks of one attempt open when, from their needs and their workers' source threads.

    ``reads``: each stage's id -> the stages it reads, children before their consumers (the plan's
    order, which is the order tasks are opened in); ``tasks``: every task's need; ``capacity``: each
    worker's source threads, ``budget``: each worker's memory budget, bytes, ``slots``: the tasks each worker runs
    at once for the query's caller (a worker missing from any is taken to have room for anything).
    """

    def __init__(
        self, reads: Mapping[int, Sequence[int]], tasks: Sequence[TaskNeed], capacity: Mapping[str, int],
        budget: Mapping[str, int] | None = None, slots: Mapping[str, int] | None = None,
    ) -> None:
        self.reads = {stage: tuple(children) for stage, children in reads.items()}
        rank = {stage: i for i, stage in enumerate(self.reads)}
        self.tasks = sorted(tasks, key=lambda n: (rank[n.stage], n.task))
        self.by_id = {n.id: n for n in self.tasks}
        self.capacity = dict(capacity)
        self.budget = {url: b for url, b in (budget or {}).items() if b > 0}
        self.slots = {url: n for url, n in (slots or {}).items() if n > 0}
        self._left: dict[int, int] = {}  # stage -> its tasks not yet admitted
        for n in self.tasks:
            self._left[n.stage] = self._left.get(n.stage, 0) + 1
        self.held: dict[str, int] = {}  # url -> threads of the open tasks there that have not made their output
        self.reserved: dict[str, int] = {}  # url -> memory of the open tasks there (their kept outputs' once made)
        self.running: dict[str, int] = {}  # url -> the open tasks there that have not made their output (task slots)
        self.opened: set[TaskId] = set()
        self.admitted: set[TaskId] = set()
        self.computed: set[TaskId] = set()

    # ------------------------------------------------------------ before anything runs

    def too_large(self) -> list[TaskNeed]:
        """The tasks that need more source threads than their worker has at all: they can never run."""
        return [n for n in self.tasks if n.url in self.capacity and n.threads > self.capacity[n.url]]

    def starved(self) -> dict[str, int]:
        """The workers where some task would find no room even opened last: the outputs the query's other tasks
        there keep (``keeps``, held until the query ends) beside its own reservation exceed the memory budget.
        Each such worker's largest need, bytes (only asked when the plan does not fit at once)."""
        out: dict[str, int] = {}
        for url, budget in self.budget.items():
            here = [n for n in self.tasks if n.url == url]
            if not here:
                continue
            kept = sum(self._kept(n) for n in here)
            need = max(kept - self._kept(n) + self._memory(n) for n in here)
            if need > budget:
                out[url] = need
        return out

    def head_fits(self, head: int) -> bool:
        """Whether the head stage's tasks fit at once once every other task made its output (its threads given back,
        its kept output's buffer not): a detached query's head must run whole before anyone reads it."""
        threads = all(total <= self.capacity.get(url, total) for url, total in self.totals(head).items())
        threads = threads and self._slots_fit(head)
        memory = {url: 0 for url in self.budget}
        for n in self.tasks:
            if n.url in memory:
                memory[n.url] += self._memory(n) if n.stage == head else self._kept(n)
        return threads and all(total <= self.budget[url] for url, total in memory.items())

    def memory_totals(self, stage: int | None = None) -> dict[str, int]:
        """The memory the plan's tasks (or ``stage``'s) reserve together, per worker, bytes."""
        out: dict[str, int] = {}
        for n in self.tasks:
            if stage is None or n.stage == stage:
                out[n.url] = out.get(n.url, 0) + self._memory(n)
        return out

    def totals(self, stage: int | None = None) -> dict[str, int]:
        """The source threads the plan's tasks (or ``stage``'s) need together, per worker."""
        out: dict[str, int] = {}
        for n in self.tasks:
            if stage is None or n.stage == stage:
                out[n.url] = out.get(n.url, 0) + n.threads
        return out

    def fits(self, stage: int | None = None) -> bool:
        """Whether every task (of ``stage``) may hold its threads and memory at once: then nothing needs turns (among them)."""
        threads = all(total <= self.capacity.get(url, total) for url, total in self.totals(stage).items())
        tasks = Counter(n.url for n in self.tasks if stage is None or n.stage == stage)
        memory = all(total <= self.budget.get(url, total) or tasks[url] == 1 for url, total in self.memory_totals(stage).items())
        return threads and memory and self._slots_fit(stage)

    def task_counts(self, stage: int | None = None) -> dict[str, int]:
        """How many of the plan's tasks (or ``stage``'s) are bound to each worker."""
        return dict(Counter(n.url for n in self.tasks if stage is None or n.stage == stage))

    def _slots_fit(self, stage: int | None = None) -> bool:
        return all(count <= self.slots.get(url, count) for url, count in self.task_counts(stage).items())

    def _memory(self, n: TaskNeed) -> int:
        """What ``n`` reserves on its worker: at most the worker's whole budget (the worker clamps it so)."""
        return min(n.memory, self.budget.get(n.url, n.memory))

    def _kept(self, n: TaskNeed) -> int:
        """What ``n`` still holds once it made its output."""
        return min(n.keeps, self._memory(n))

    # ------------------------------------------------------------ events

    def next(self) -> list[TaskNeed]:
        """The tasks to open now (marked opened, their threads held), in the plan's order."""
        out = []
        for n in self.tasks:
            if n.id in self.opened or any(self._left[child] for child in self.reads[n.stage]):
                continue
            held, reserved = self.held.get(n.url, 0), self.reserved.get(n.url, 0)
            if n.url in self.capacity and held + n.threads > self.capacity[n.url]:
                continue
            if n.url in self.budget and reserved + self._memory(n) > self.budget[n.url]:
                continue
            if n.url in self.slots and self.running.get(n.url, 0) >= self.slots[n.url]:
                continue
            self.running[n.url] = self.running.get(n.url, 0) + 1
            self.held[n.url] = held + n.threads
            self.reserved[n.url] = reserved + self._memory(n)
            self.opened.add(n.id)
            out.append(n)
        return out

    def admit(self, task: TaskId) -> list[TaskNeed]:
        """``task``'s worker admitted it; the tasks that may open now."""
        if task in self.opened and task not in self.admitted:
            self.admitted.add(task)
            self._left[task[0]] -= 1
        return self.next()

    def compute(self, task: TaskId) -> list[TaskNeed]:
        """``task`` made all its output: its worker gave its threads back, and its memory but what its output
        keeps; the tasks that may open now."""
        if task in self.admitted and task not in self.computed:
            self.computed.add(task)
            n = self.by_id[task]
            self.held[n.url] -= n.threads
            self.running[n.url] -= 1
            self.reserved[n.url] -= self._memory(n) - self._kept(n)
        return self.next()

    @property
    def done(self) -> bool:
        """Every task was admitted: nothing is left to open."""
        return len(self.admitted) == len(self.tasks)

    def waiting(self) -> list[TaskNeed]:
        """The tasks not opened yet."""
        return [n for n in self.tasks if n.id not in self.opened]
