"""Opening one attempt's tasks: all at once, worker by worker in one global order, or in turns.

The first try opens every task on every worker at once; the workers almost always have room, and
then that is all. When a worker says it queued a task (a ``LoadInfo`` frame), every task of the
try is let go (nothing was sent to any of them yet), and the attempt learns how many source
threads and task slots each of its workers has (a queued task's ``LoadInfo`` says it; the others are
asked with the ``info`` action), then:

* **the plan fits its workers** (the tasks bound to each need at most its threads, its memory and
  its slots together): the
  workers are busy with other queries. Tasks are opened again worker by worker in sorted URL
  order, the next worker's only once every task on this one was admitted, retried after a backoff
  when a worker refuses (docs/architecture.md, "Capacity");
* **it does not** (TPC-DS q14 on one worker: 69 source threads of 64; or across two hosts with its
  files cut: 131 tasks a worker reserving 3.6 GB of a 2 GB memory budget even with 1 MiB output
  buffers; or more tasks on a worker than its ``--max-tasks``): however long it waited, it would never be
  admitted whole. The tasks are opened in turns
  (``waves.Waves`` decides, ``Turns`` carries it out): a stage once the stages it reads were admitted,
  while the query's open tasks on a worker hold at most its threads, its memory budget and its slots; each task
  is sent its units as soon as it is admitted, and gives its threads (and its memory but its output
  buffer) back on the worker when it made all its output. Every stage keeps its
  output (memory, then spill) so that a producer finishes before its readers start. A worker that
  refuses one of them as busy gets it again after a backoff, alone: the tasks admitted meanwhile
  need nothing more to finish. ``Run.launch`` returns once every task was admitted (the head's
  last, which may wait for stages below it to give their threads back), so ``execute()`` returns
  later than it would. Losing a worker, then or later, fails the attempt as a lost worker's, and
  ``exec._Attempts`` runs the query again from the start on the workers that remain, in turns
  again: running the lost tasks again in place (``stagereplay.py``) would open them all at once
  on the survivors, beside the attempt's own tasks there, which is what the turns avoid.

A task that could never fit its worker is refused before anything runs, naming it.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.flight as fl

from flight.coordinator.budget import fitted_buffer, usable_budget
from flight.coordinator.channel import TaskChannel
from flight.coordinator.turns import BACKOFF_S, MAX_BACKOFF_S, Turns
from flight.coordinator.waves import TaskNeed, Waves
from flight.engine.acero.pipeline import source_threads
from flight.errors import FlightExecError, InvalidTaskError, PlanError, WorkerBusyError
from flight.threads import spawn
from flight.wire._proto import plan_pb2, protocol_pb2
from flight.wire.clients import ClientPool
from flight.wire.limits import MAX_OUTPUT_BUFFER_BYTES, task_reserve
from flight.wire.protocol import format_stage_key, make_stage_key

if TYPE_CHECKING:
    from flight.coordinator.run import Run

__all__ = ["MAX_SLOTS", "Opening", "worker_loads"]

_MIB = 1 << 20
log = logging.getLogger("flight.coordinator.exec")

MAX_SLOTS = 1 << 16
"""The most tasks a worker's ``LoadInfo.max_tasks`` is taken to say it runs at once (a peer's number, clamped: beyond
any plan's tasks on one worker, it means no limit)."""

_INFO_TIMEOUT_S = 2.0
"""How long the ``info`` action of one worker is waited for (at most ``connect_timeout``)."""


def worker_loads(clients: ClientPool, urls: list[str], timeout: float) -> dict[str, protocol_pb2.LoadInfo]:
    """Each worker's load (its ``info``: source threads, memory budget, default buffer); a worker that did not answer
    is left out.

    Asked in parallel (as ``recovery.probe_lost`` does), one call and one thread per worker, within one
    bound for all: a silent worker costs ``timeout`` once, not once for each worker asked after it.
    """
    out: dict[str, protocol_pb2.LoadInfo] = {}
    lock = threading.Lock()

    def ask(url: str) -> None:
        try:
            results = list(clients.get(url).do_action(fl.Action("info", b""), fl.FlightCallOptions(timeout=timeout)))
            info = protocol_pb2.WorkerInfo.FromString(results[0].body.to_pybytes())
        except (pa.ArrowException, OSError, IndexError, FlightExecError) as exc:
            log.debug("worker %s: no info (%s)", url, exc)
            return
        with lock:
            out[url] = info.load

    jobs = [spawn(ask, url, name=f"info-{url}") for url in urls]
    end = time.monotonic() + timeout + 1.0  # the calls' own deadline, and a margin for their threads to start
    for job in jobs:
        job.join(max(0.0, end - time.monotonic()))
    with lock:  # an answer past the bound is left out, as a silent worker's
        return dict(out)


class Opening:
    """How one attempt (``run.Run``) opens its tasks; ``turns`` is set while they are opened in turns,
    ``turned`` from then on (the attempt's tasks were opened in turns: ``stagereplay.py`` and ``Run.launch`` ask)."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.turns: Turns | None = None
        self.turned = False
        self._loads: dict[str, protocol_pb2.LoadInfo] = {}  # what the workers said (queued tasks' ``LoadInfo``, ``info``)

    def admit(self, counts: dict[int, int]) -> None:
        """Open every task of the attempt (the module's docstring says how); raises if they cannot all be."""
        run = self.run
        started = time.monotonic()
        if self._at_once(counts):
            return
        run.retries = 1  # a worker queued a task, and every task was let go: how to open them again?
        self._rename(1)
        self._fit_memory(counts)
        waves = self._waves(counts)
        if waves is not None:
            self.turned = True
            self.turns = Turns(run, waves, counts)
            try:
                self.turns.open_all()
            finally:
                # Nothing is left to open: later finished frames and errors need no counting (and no
                # list of them growing until the query ends).
                self.turns = None
            return
        self._in_order(counts, started)

    def refused_while_opening(self, channel: TaskChannel) -> bool:
        """Whether a busy refusal of ``channel`` is the opening's to retry rather than the query's failure.

        At once or in order, nothing is sent to any task before all were admitted: every refusal is
        retried. In turns only a task not admitted yet (no ready frame) is: one already admitted was
        sent its units, and the turns' driver looks only at the tasks it still waits for, so its
        error must fail the query (else nothing would, and the driver would wait for its finished frame).
        """
        if not self.turned:
            return True
        return self.turns is not None and not channel.ready.is_set()

    def _at_once(self, counts: dict[int, int]) -> bool:
        """The first try: open every task on every worker at once, as fast as the workers accept.

        Only when a worker has no room does the order matter (a query holding one worker must not
        wait for another that another query holds): then this lets every task go and says False.
        """
        run = self.run
        for stage in run.plan.stages:
            run.stage_channels(stage, counts)
        try:
            for channel in run.channels:
                channel.open(run.clients.get(channel.url))
            deadline = time.monotonic() + run.options.connect_timeout
            if all(c.ready_or_queued(max(0.0, deadline - time.monotonic())) for c in run.channels):
                return True
        except WorkerBusyError:
            pass
        self._loads = {c.url: c.load for c in run.channels if c.load is not None}
        self._let_go()
        return False

    def _in_order(self, counts: dict[int, int], started: float) -> None:
        """Open the tasks worker by worker in the global order (sorted URLs), retrying busy refusals.

        A worker at capacity queues a task (first come, first served) and says so. Because every
        coordinator takes workers in the same order, a query holding tasks on some workers only ever
        waits for later ones, so no two queries wait for each other in a cycle. On one worker a query
        never waits in its queue: a task queued there lets every task go, to try again after a backoff
        (holding some of its tasks there while the rest waited, two queries each held what the other
        waited for until the worker's queue wait ran out: the chaos run's hangs). When a worker refuses
        (its queue is full, or the task waited too long), every task of the attempt is let go and the
        query is retried after a backoff: nothing was sent to any task yet, so a retry starts from
        scratch, under a fresh query id (task keys are never reused on a worker).
        """
        run = self.run
        backoff = BACKOFF_S
        attempt = 1
        while True:
            for stage in run.plan.stages:
                run.stage_channels(stage, counts)
            try:
                for url in sorted({c.url for c in run.channels}):
                    here = [c for c in run.channels if c.url == url]
                    for channel in here:
                        channel.open(run.clients.get(url))
                    deadline = time.monotonic() + run.options.connect_timeout
                    queued = [c for c in here if not c.ready_or_queued(max(0.0, deadline - time.monotonic()))]
                    if queued:
                        # Waiting in its queue, the query would hold what this worker admitted (or admits first)
                        # while the rest wait: two queries doing that here each wait for what the other holds.
                        raise WorkerBusyError(f"worker {url} is at capacity: it queued {len(queued)} of the query's {len(here)} "
                                              "tasks there", worker_url=url)
                return
            except WorkerBusyError as exc:
                busy = exc
            self._let_go()
            waited = time.monotonic() - started
            if waited + backoff > run.options.admission_wait or run.failed.is_set():
                raise WorkerBusyError(
                    f"the workers stayed at capacity for {waited:.1f}s ({attempt + 1} attempts); last refusal: {busy.cause}",
                    worker_url=busy.worker_url,
                )
            attempt += 1
            run.retries = attempt
            log.debug("query %s: %s; retrying in %.2fs", run.query_id, busy, backoff)
            if run.failed.wait(backoff * random.uniform(0.5, 1.0)):
                raise run.error or busy
            backoff = min(backoff * 2, MAX_BACKOFF_S)
            self._rename(attempt)

    def _fit_memory(self, counts: dict[int, int]) -> None:
        """Smaller output buffers when the tasks on some worker would reserve more than its memory budget together
        (``budget.py``): else, opened in order, they would wait there for memory they hold themselves."""
        run = self.run
        tasks = [(run.bound[s.stage_id][t], source_threads(plan_pb2.StagePlan(root=s.root_proto(t))))
                 for s in run.plan.stages for t in range(counts[s.stage_id])]
        unknown = sorted({u for u, _ in tasks} - set(self._loads))
        self._loads.update(worker_loads(run.clients, unknown, min(_INFO_TIMEOUT_S, run.options.connect_timeout)))
        buffer, why = fitted_buffer(tasks, self._loads, run.options.output_buffer_bytes)
        if buffer != run.options.output_buffer_bytes:
            log.info("query %s: opened with %d MiB output buffers: %s", run.query_id, buffer >> 20, "; ".join(why))
            run.opening_notes.append(f"output buffers of {buffer >> 20} MiB: {'; '.join(why)}")
            run.options = replace(run.options, output_buffer_bytes=buffer)

    def _buffer(self, url: str) -> int:
        """The output buffer a task on ``url`` is opened with: the query's, else that worker's default."""
        load = self._loads.get(url)
        return self.run.options.output_buffer_bytes or (load.output_buffer_bytes if load is not None else 0) or MAX_OUTPUT_BUFFER_BYTES

    def _rename(self, attempt: int) -> None:
        """A fresh query id for an admission retry: task keys are never reused on a worker."""
        run = self.run
        run.query_id = f"{run.base_id}.{attempt}"
        run.context.sink.named(run.query_id, run.secret, run.bound)

    def _let_go(self) -> None:
        """Release every task of a refused attempt and forget its channels."""
        run = self.run
        for channel in run.channels:  # all first: aborting a producer fails its consumers at once
            channel.detach()
        for channel in run.channels:
            channel.abort("the query waits for capacity and will retry")
        for channel in run.channels:
            channel.finish()
        run.channels = []
        run.by_stage = {}
        run.reset_replay()
        run.dispatcher.clear_slots()

    def _waves(self, counts: dict[int, int]) -> Waves | None:
        """The turns to open the tasks in, when together they need more source threads, memory or task slots than
        their workers have (None: they fit, and the workers are only busy). Refuses a task that can never fit."""
        run = self.run
        plan = run.plan
        waves = self._plan_waves(counts)
        for n in waves.too_large():
            key = format_stage_key(make_stage_key(run.query_id, n.stage, n.task))
            raise InvalidTaskError(
                f"task {key} (stage {n.stage}, task {n.task}) needs {n.threads} source threads, and worker {n.url} has "
                f"{waves.capacity[n.url]} in all (--source-threads): it can never run there",
                worker_url=n.url,
                stage_key=key,
            )
        if waves.fits():
            return None
        over = ", ".join([
            *(f"{u}: {t} of {waves.capacity[u]} source threads" for u, t in sorted(waves.totals().items()) if t > waves.capacity.get(u, t)),
            *(f"{u}: {m // _MIB} of {waves.budget[u] // _MIB} MiB" for u, m in sorted(waves.memory_totals().items()) if m > waves.budget.get(u, m)),
            *(f"{u}: {n} tasks, of {waves.slots[u]} it runs at once" for u, n in sorted(waves.task_counts().items()) if n > waves.slots.get(u, n)),
        ])
        for url, need in sorted(waves.starved().items()):
            raise PlanError(
                f"the query's tasks on worker {url} cannot run even in turns: one of them needs {need // _MIB} MiB beside the "
                f"outputs the others keep for their readers, and {self._budget_words(url, waves.budget[url])}: give the workers "
                "more memory, or run the query on more workers"
            )
        if run.fed:
            raise PlanError(f"the query's stages together need more source threads, memory or task slots than their workers have ({over}), "
                            "and a query whose rows another process sends must run all its stages at once: give the workers more "
                            "memory, source threads or tasks (--max-tasks), or give it more workers")
        run.keep_outputs = True  # a producer finishes, whether or not its readers were admitted yet
        # The head's outputs are kept too, whether or not the head stage alone fits, so that every admitted
        # task finishes with nobody reading it: the head is read only once every task was admitted, and a
        # head task admitted early would hold its threads until then, blocked on its full output buffer.
        # Its own query's other head tasks fit beside it; another query's, opened in turns on the same
        # workers, may not, and each query would wait for the other's threads.
        # Not a detached query's head read once by others: that query ends when its outputs were read,
        # which a worker never says of a kept output (``drained``). Its head tasks must fit together, beside
        # the buffers the stages below keep (else it needs ``retain``); one admitted early may hold its threads
        # until read, which another query in turns waits out as busy after ``admission_wait`` at worst.
        if run.retain or not run.detached:
            run.keep_head = True
        elif not waves.head_fits(plan.head.stage_id):
            head = plan.head.stage_id
            raise PlanError(f"the head stage's tasks together need more than their workers have (source threads "
                            f"{waves.totals(head)}, MiB {({u: m // _MIB for u, m in waves.memory_totals(head).items()})}, beside "
                            f"the buffers the stages below keep; tasks {waves.task_counts(head)}, of {waves.slots or 'any number'} "
                            "run at once); a detached query's head tasks must run at once: start it with retain, or give it more workers")
        log.info("query %s: its tasks need more source threads, memory or task slots than their workers have (%s): opened in turns",
                 run.query_id, over)
        run.opening_notes.append(f"opened in turns, a stage once those it reads were admitted: together its tasks need more "
                                 f"source threads, memory or task slots than their workers have ({over})")
        return waves

    def _plan_waves(self, counts: dict[int, int]) -> Waves:
        """Every task's need, and what each worker has for the query: its source threads, the tasks it runs at once for
        this caller, and its memory budget (the identity's, when smaller) less what it keeps for other queries (their
        retained outputs stay)."""
        run = self.run
        needs = []
        for s in run.plan.stages:
            for t in range(counts[s.stage_id]):
                url = run.bound[s.stage_id][t]
                threads = source_threads(plan_pb2.StagePlan(root=s.root_proto(t)))
                buffer = self._buffer(url)
                needs.append(TaskNeed(s.stage_id, t, url, threads, task_reserve(buffer, threads), task_reserve(buffer, 0)))
        unknown = sorted({n.url for n in needs} - set(self._loads))  # ``_fit_memory`` asked the others: one ``info`` each
        loads = {**self._loads, **worker_loads(run.clients, unknown, min(_INFO_TIMEOUT_S, run.options.connect_timeout))}
        capacity = {url: load.source_threads_max for url, load in loads.items() if load.source_threads_max}
        slots = {url: min(load.max_tasks, MAX_SLOTS) for url, load in loads.items() if load.max_tasks}  # a peer's count, clamped
        budget = {url: max(1, usable - load.kept_bytes) for url, load in self._loads.items() if (usable := usable_budget(load))}
        return Waves({s.stage_id: s.children for s in run.plan.stages}, needs, capacity, budget, slots)

    def _budget_words(self, url: str, left: int) -> str:
        """What the query may reserve on ``url``, in words: which budget, and what other queries keep there."""
        load = self._loads[url]
        which = ("the memory one identity may reserve there (--memory-budget-per-client-mb)"
                 if load.client_memory_budget and load.client_memory_budget < load.memory_budget else "its memory budget")
        kept = f", less {load.kept_bytes // _MIB} MiB other queries keep there," if load.kept_bytes else ""
        return f"{which}{kept} is {left // _MIB} MiB"
