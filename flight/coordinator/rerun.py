"""Which tasks of a multi-stage query run again when workers are lost: a decision apart from I/O.

Why: a query whose rows already reached the caller cannot run again from the start, and a
lost worker takes with it the outputs of its tasks and the state of the tasks it ran. The
design (docs/architecture.md, "Losing a worker"), after Spark's and Ballista's re-run of lost
map tasks and Trino's spooled exchange:

* every stage below the head keeps its outputs until the query ends (``retain_output``:
  memory, then spill files), so that any of its consumers may read them again from the start;
* a head task's rows reach the caller only once its whole output was read
  (``HeldOutput``): a head task is either delivered, whole, or its rows were never seen;
* when workers are lost, ``StageRecovery.lose`` decides what runs again: a lost task whose
  output is still needed (a consumer of it has not finished, or runs again; a head task not
  delivered), and every task that had not finished and reads from a task that runs again (it
  may have consumed part of the old output). Finished tasks on surviving workers keep their
  retained outputs and are read again; delivered head tasks never run again;
* each task run again gets the next **epoch** (``StageKey.epoch``): a new key, so its
  consumers are bound to it alone and the old run's late outputs are read by nobody (fenced);
  ``delivered`` and ``finished`` of an old epoch are refused.

Exactness needs a producer's output to be the same *set* of rows per consumer partition
whichever run made it: true of hash, gather and broadcast outputs of deterministic operators.
A stage that deals rows round-robin, or holds a ``LIMIT`` (any rows may be kept), is not: when
it runs again its output changes, and so does the output of every task that runs again reading
it; every consumer of a changed task runs again too, finished or not, and if that reaches a
delivered head task the loss cannot be recovered (``Unrecoverable``).

Guarantees, checked by the property tests in ``tests/coordinator/test_rerun.py``: under any
interleaving of finishes, partial reads, deliveries and losses, every head task is delivered
exactly once, no consumer mixes rows of two runs of one producer, and nothing is bound to a
lost worker.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Rerun", "StageRecovery", "TaskRun", "Unrecoverable"]

TaskId = tuple[int, int]
"""(stage id, task number)."""


class Unrecoverable(Exception):
    """No survivor is left, or what must run again includes a head task already delivered."""


@dataclass
class TaskRun:
    """The current run of one task: where, which epoch, and how far it got."""

    url: str
    epoch: int = 0
    finished: bool = False  # produced its whole output (it read all its inputs)
    delivered: bool = False  # a head task whose rows reached the caller


@dataclass(frozen=True)
class Rerun:
    """One task to run again: its new epoch and worker, and whether its own worker was lost."""

    stage: int
    task: int
    epoch: int
    url: str
    lost: bool


class StageRecovery:
    """The tasks of one execution of a multi-stage plan, and what a loss of workers makes run again.

    ``reads`` maps a stage to the stages it reads (each consumer task reads every producer task
    of those); ``counts`` the tasks of each stage; ``bound`` the worker of each task; ``head``
    is the stage whose outputs make the result; ``retained_head``: its outputs are read by others
    any number of times (a detached query's), so a lost head task always runs again;
    ``nondeterministic``: stages whose output differs between runs; ``workers``: where tasks may
    run again (besides those already bound).
    """

    def __init__(
        self,
        reads: Mapping[int, Sequence[int]],
        bound: Mapping[int, Sequence[str]],
        head: int,
        *,
        retained_head: bool = False,
        nondeterministic: Iterable[int] = (),
        workers: Iterable[str] = (),
    ) -> None:
        self.reads = {s: tuple(reads.get(s, ())) for s in bound}
        self.consumers: dict[int, list[int]] = {s: [] for s in bound}
        for stage, producers in self.reads.items():
            for p in producers:
                self.consumers[p].append(stage)
        self.head = head
        self.retained_head = retained_head
        self.nondeterministic = frozenset(nondeterministic)
        self.tasks: dict[TaskId, TaskRun] = {(s, t): TaskRun(url) for s, urls in bound.items() for t, url in enumerate(urls)}
        self.workers = set(workers) | {r.url for r in self.tasks.values()}  # a rerun may go to any of them
        self.used: dict[TaskId, set[str]] = {k: {r.url} for k, r in self.tasks.items()}  # where each task's runs went
        self.lost_urls: set[str] = set()

    def current(self, stage: int, task: int, epoch: int) -> bool:
        return self.tasks[(stage, task)].epoch == epoch

    def finished(self, stage: int, task: int, epoch: int) -> None:
        """A run produced its whole output (an old epoch's news is ignored)."""
        run = self.tasks[(stage, task)]
        if run.epoch == epoch:
            run.finished = True

    def delivered(self, stage: int, task: int, epoch: int) -> bool:
        """A head run's whole output was read: whether its rows may go to the caller (False: it
        was superseded by a new run, its rows must be dropped)."""
        run = self.tasks[(stage, task)]
        if run.epoch != epoch or run.url in self.lost_urls or run.delivered:
            return False
        run.finished = run.delivered = True
        return True

    def epochs(self) -> dict[TaskId, int]:
        return {k: r.epoch for k, r in self.tasks.items() if r.epoch}

    def lose(self, urls: Iterable[str]) -> tuple[list[Rerun], list[TaskId]]:
        """Workers ``urls`` are gone: the tasks to run again (new epoch, a survivor each), and the
        lost tasks nobody needs any more. Raises ``Unrecoverable`` when it cannot go on."""
        now = set(urls) - self.lost_urls
        self.lost_urls |= now
        survivors = sorted(self.workers - self.lost_urls)
        rerun = self._closure()
        if rerun and not survivors:
            raise Unrecoverable(f"no worker is left: lost {', '.join(sorted(self.lost_urls))}")
        delivered = sorted(k for k in rerun if self.tasks[k].delivered)
        if delivered:
            raise Unrecoverable(
                f"head task(s) {delivered} already delivered their rows and would have to run again "
                f"(a stage below them gives different rows each run)"
            )
        load = Counter(r.url for k, r in self.tasks.items() if k not in rerun and r.url not in self.lost_urls and not r.finished)
        out: list[Rerun] = []
        for key in sorted(rerun):
            run = self.tasks[key]
            # A retained head task keeps its key (its readers look for it by ticket elsewhere): a worker
            # none of its runs went to (a key runs once per worker).
            elsewhere = [u for u in survivors if u not in self.used[key]] if key[0] == self.head and self.retained_head else []
            url = min(elsewhere or survivors, key=lambda u: (load[u], u))
            load[url] += 1
            self.used[key].add(url)
            out.append(Rerun(key[0], key[1], run.epoch + 1, url, run.url in self.lost_urls))
            self.tasks[key] = TaskRun(url, run.epoch + 1)
        dropped = sorted(k for k, r in self.tasks.items() if r.url in now and k not in rerun)
        return out, dropped

    def _wanted(self, key: TaskId, rerun: set[TaskId]) -> bool:
        """Whether the task's output is still wanted: a head task's until it is delivered (a retained
        one's always), any other's while a consumer of it runs again, or has not finished and is
        wanted itself (once the result is whole, nothing is)."""
        stage = key[0]
        if stage == self.head:
            return self.retained_head or not self.tasks[key].delivered
        return any(
            (c, t) in rerun or (not run.finished and self._wanted((c, t), rerun))
            for c in self.consumers[stage]
            for t, run in self._stage(c)
        )

    def _stage(self, stage: int) -> list[tuple[int, TaskRun]]:
        return [(t, r) for (s, t), r in self.tasks.items() if s == stage]

    def _closure(self) -> set[TaskId]:
        """The tasks that run again, to a fixpoint; ``changed``: those of them whose output will differ
        (a nondeterministic stage's, or one reading a changed task's)."""
        rerun: set[TaskId] = set()
        changed: set[TaskId] = set()
        grew = True
        while grew:
            grew = False
            for key, run in self.tasks.items():
                if key not in rerun and self._must_rerun(key, run, rerun, changed):
                    rerun.add(key)
                    grew = True
                if key in rerun and key not in changed and (
                    key[0] in self.nondeterministic or any(p in changed for p in self._producers(key[0]))
                ):
                    changed.add(key)
                    grew = True
        return rerun

    def _producers(self, stage: int) -> list[TaskId]:
        return [(p, t) for p in self.reads[stage] for t, _ in self._stage(p)]

    def _must_rerun(self, key: TaskId, run: TaskRun, rerun: set[TaskId], changed: set[TaskId]) -> bool:
        producers = self._producers(key[0])
        if run.finished and any(p in changed for p in producers):
            return True  # it read rows its producer's new run will not give: wanted or not, it is stale
        if not self._wanted(key, rerun):
            return False
        if run.url in self.lost_urls:
            return True
        return not run.finished and any(p in rerun for p in producers)  # it may have read part of an old run
