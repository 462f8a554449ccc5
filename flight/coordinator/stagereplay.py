"""Losing a worker within a multi-stage attempt: the tasks it took, and their readers, run again.

``rerun.StageRecovery`` decides (apart from I/O) which tasks run again and where; this carries
it out for one ``Run`` (docs/architecture.md, "Losing a worker"):

1. Every task is watched. When one fails with a worker's error, the attempt's workers are probed
   (``health``, in parallel); those that are dead or silent are lost. None lost: the error fails
   the query, as before. More lost than ``ExecOptions.retries`` allows, or none left: it fails
   naming them.
   An attempt whose tasks were opened in turns (``opening.py``) fails instead, as a lost worker's:
   the query runs again from the start (``_in_turns`` says why).
2. The decision's tasks get their new epoch and worker in the attempt's binding first, all of
   them, so that each re-run consumer is bound to its producers' new runs; then each old task is
   let go (``FeedDispatcher.task_lost``: a leaf's units, every one it was sent, go to its
   replacement alone) and its replacement opened with the old header rebound.
3. Head tasks' rows are held (``held.HeldOutput``) until their stream ended whole; only then are
   they delivered, once (``StageRecovery.delivered`` refuses a superseded run's).

Stages below the head keep their outputs (``TaskOptions.retain_output``), so a re-run consumer
reads its surviving producers again from the start.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

import pyarrow as pa

from flight.coordinator.binding import task_plan
from flight.coordinator.channel import TaskChannel
from flight.coordinator.events import ReplaceTask
from flight.coordinator.held import HeldOutput
from flight.coordinator.recovery import PROBE_TIMEOUT_S, Attempt, may_retry, named_unreachable, probe_lost
from flight.coordinator.replay import Replay
from flight.coordinator.rerun import Rerun, StageRecovery, Unrecoverable
from flight.coordinator.results import DONE as _DONE
from flight.coordinator.results import offer as _offer
from flight.errors import FlightExecError, ProtocolError, WorkerError, WorkerUnavailableError
from flight.threads import spawn
from flight.wire._proto import protocol_pb2
from flight.wire.clients import read_stream, translate_flight_error
from flight.wire.integrity import StreamIntegrityError
from flight.wire.limits import clip
from flight.wire.operators import operators
from flight.wire.protocol import format_stage_key

if TYPE_CHECKING:
    from flight.coordinator.run import Run
    from flight.planner.stages import QueryPlan

__all__ = ["StageReplay", "nondeterministic_stages"]

log = logging.getLogger("flight.coordinator.exec")


def nondeterministic_stages(plan: QueryPlan) -> list[int]:
    """Stages below the head whose output may differ between two runs: rows dealt round-robin,
    a ``LIMIT`` (which rows it keeps is anyone's), or a window (``row_number`` and ``rank`` among
    ties)."""
    out = []
    for stage in plan.stages:
        if stage is plan.head:
            continue
        roots = stage.task_roots or [stage.root]
        if stage.output_mode == "round_robin" or any(
            op.WhichOneof("kind") in ("limit", "window") for root in roots for op in operators(root.to_proto())
        ):
            out.append(stage.stage_id)
    return out


class StageReplay(Replay):
    """A multi-stage attempt's tasks, watched for lost workers; the decision's tasks run again."""

    def __init__(self, run: Run) -> None:
        super().__init__(run, "stages")
        self.recovery: StageRecovery | None = None
        self._pending: dict[str, Rerun] = {}
        self._epoch_of: dict[str, int] = {}  # a channel's run, where its key does not say (a retained head's)
        self._runs: dict[str, int] = {}  # replacements made per task, for their names
        self._kept_key_on: dict[tuple[int, int], set[str]] = {}  # a retained head task's epoch-0 key: where it ran
        self._deciding = threading.Lock()

    def bind(self) -> None:
        """The attempt's tasks are bound (``Run.bound``): the decision starts from them."""
        run = self.run
        plan = run.plan
        self.recovery = StageRecovery(
            {s.stage_id: [r.stage_id for r in s.reads] for s in plan.stages},
            run.bound,
            plan.head.stage_id,
            retained_head=run.retain,
            nondeterministic=nondeterministic_stages(plan),
            workers=run.urls,
        )

    def finished(self, channel: TaskChannel) -> None:
        """A task's final metrics arrived: its output is whole (kept on its worker)."""
        if self.recovery is not None and channel.metrics is not None:
            key = channel.header.stage_key
            with self._deciding:
                self.recovery.finished(key.stage_id, key.task_number, self._epoch_of.get(channel.key, key.epoch))

    def head(self) -> list[TaskChannel]:
        return [c for c in self.run.by_stage[self.run.plan.head.stage_id] if c.key not in self.gone]

    # ------------------------------------------------------------ a loss

    def lost(self, channel: TaskChannel, error: BaseException) -> None:
        """A task failed: if workers are lost, what they took runs again; else the attempt fails.

        The probe (seconds, for a frozen worker) runs outside the decision's lock: a channel's reader
        reporting its task finished must not wait for it, or its own worker would look silent.
        """
        run = self.run
        with self._deciding:
            if run.failed.is_set() or channel.key in self.gone:
                return  # a consequence of a loss already handled (or of the failure)
            assert self.recovery is not None
            alive = [u for u in run.urls if u not in self.recovery.lost_urls]
        if not may_retry(error, False, 0, 1):
            run.fail(error)
            return
        options = run.options
        lost = probe_lost(alive, options.security, min(PROBE_TIMEOUT_S, options.connect_timeout))
        with self._deciding:
            if run.failed.is_set() or channel.key in self.gone:
                return  # another report of the same loss decided it meanwhile
            lost = [u for u in lost if u not in self.recovery.lost_urls] or self._unreachable_peer(channel, error)
            if not lost:
                run.fail(error)  # every worker answers: the task's own error
                return
            if run.opening.turned:
                run.fail(self._in_turns(lost, error))
                return
            failure, actions = self._decide(lost, error)
        if failure is not None:
            run.fail(failure)
            return
        self._carry_out(actions, f"lost {', '.join(lost)}: {clip(error, 200)}", lost[0])
        if channel.key not in self.gone:  # its worker is fine, and it reads nothing lost: its own error
            run.fail(error)

    def _in_turns(self, lost: list[str], error: BaseException) -> WorkerUnavailableError:
        """The attempt's failure when it lost ``lost`` after its tasks were opened in turns (``opening.py``).

        They are not run again in place: their replacements and re-run readers would all be opened at
        once on the survivors, beside the attempt's own tasks there, whatever their source threads, and
        that is the deadlock the turns avoid (two workers each running TPC-DS q14's shape, one lost: its
        producer and head and the survivor's own need more threads than the survivor has). The attempt
        fails as a lost worker's instead (retryable, naming it), and ``exec._Attempts`` runs the query
        again from the start on the workers that remain, where it is opened in turns again.
        """
        run = self.run
        return WorkerUnavailableError(
            f"query {run.query_id} lost {', '.join(lost)}; its tasks were opened in turns, so they are not run again in "
            f"place: the attempt fails, to run again from the start on the workers that remain ({clip(error, 300)})",
            worker_url=lost[0],
        )

    def _unreachable_peer(self, channel: TaskChannel, error: BaseException) -> list[str]:
        """A worker the probe finds answering that the task's UNAVAILABLE error names (a partition, healed
        or between two workers; ``named_unreachable``), counted as lost like a dead one."""
        assert self.recovery is not None
        peer = named_unreachable(error, [u for u in self.run.urls if u not in self.recovery.lost_urls])
        if peer:
            log.warning("query %s: task %s on %s: %s was out of reach: counted as lost", self.run.query_id, channel.key, channel.url, peer[0])
        return peer

    def _decide(self, lost: list[str], error: BaseException) -> tuple[FlightExecError | None, list[tuple[TaskChannel, Rerun | None]]]:
        """The decision for workers ``lost`` (lock held): the error that fails the query, or the old
        channels to let go (with their re-run, or None: not needed any more), already bound anew."""
        run, recovery = self.run, self.recovery
        assert recovery is not None
        every = sorted(recovery.lost_urls | set(lost))
        if len(every) > run.options.retries:
            return WorkerUnavailableError(
                f"query {run.query_id} lost {len(every)} workers ({', '.join(every)}), more than retries={run.options.retries} "
                f"allows; the last error: {clip(error, 300)}",
                worker_url=lost[0],
            ), []
        self.lost_urls |= set(lost)
        before = {k: r.epoch for k, r in recovery.tasks.items()}  # the runs the channels now carry
        try:
            reruns, dropped = recovery.lose(lost)
        except Unrecoverable as exc:
            return WorkerUnavailableError(f"query {run.query_id} cannot go on: {exc}", worker_url=lost[0]), []
        for url in lost:
            run.clients.forget(url)
        wanted = {(r.stage, r.task): r for r in reruns}
        actions: list[tuple[TaskChannel, Rerun | None]] = []
        with run.lock:
            for ch in list(run.channels):
                key = ch.header.stage_key
                ids = (key.stage_id, key.task_number)
                if before[ids] != self._epoch_of.get(ch.key, key.epoch):
                    continue  # a superseded run's channel
                which = wanted.pop(ids, None)
                if which is not None:  # a task dropped at an earlier loss, needed again, counts too
                    actions.append((ch, which))
                    run.bound[which.stage][which.task] = which.url
                elif ids in dropped and ch.key not in self.gone:
                    actions.append((ch, None))
                if which is not None or ids in dropped:
                    self.gone.add(ch.key)
        if wanted:
            return WorkerError(f"query {run.query_id}: no channel carries task(s) {sorted(wanted)} to run again"), []
        log.warning("query %s: lost %s; %d task(s) run again", run.query_id, ", ".join(lost), len(reruns))
        rerun_from = {ch.url for ch, which in actions if which is not None and which.lost}
        for url in sorted(set(lost) - rerun_from):  # a loss that made nothing run again is still told
            run.context.attempts.append(Attempt(run.query_id, (url,), clip(error, 300), replayed=0))
        for ch, which in actions:
            if which is not None:
                self._pending[ch.key] = which
        return None, actions

    def _carry_out(self, actions: list[tuple[TaskChannel, Rerun | None]], reason: str, lost: str) -> None:
        """Let the old channels go (outside the lock: an abort may wait for its call); each re-run's
        replacement comes through ``replace``. A re-run's old task is told the lost worker that
        moved it: its worker then sends a reader of its ticket looking elsewhere (spark/_source.py)."""
        for ch, which in actions:
            ch.detach()
            if which is not None:
                ch.abort(f"runs again elsewhere: {reason}", lost_worker=lost)
                self.run.dispatcher.task_lost(ch, reason)
            else:
                ch.abort(f"not needed any more: {reason}")

    def replace(self, ins: ReplaceTask) -> None:
        """The state machine's ``ReplaceTask``: the old header, rebound, on the decided worker."""
        run = self.run
        try:
            which = self._pending.pop(ins.task)
            old = self._channels[ins.task]
            assert self.recovery is not None
            stage = run.plan.stage(which.stage)
            with run.lock:
                header = protocol_pb2.TaskHeader()
                header.CopyFrom(old.header)
                header.target_worker_url = which.url
                header.plan = task_plan(stage, which.task, run.counts, run.query_id, run.bound, self.recovery.epochs())
                name = None
                ran_on = self._kept_key_on.setdefault((which.stage, which.task), {old.url} if not old.header.stage_key.epoch else set())
                if stage is run.plan.head and run.retain and which.url not in ran_on and not old.header.stage_key.epoch:
                    # Spark's readers find a retained head task by its ticket on the query's other
                    # workers (spark/_source.py): it keeps its key, on a worker it never ran on.
                    ran_on.add(which.url)  # a key runs once per worker
                    base = format_stage_key(header.stage_key)
                    self._runs[base] = self._runs.get(base, 0) + 1
                    name = f"{base}+{self._runs[base]}"
                else:
                    header.stage_key.epoch = which.epoch
                channel = run.make_channel(header, name=name)
                self._epoch_of[channel.key] = which.epoch
                run.by_stage[which.stage].append(channel)
                run.channels.append(channel)
            if which.lost:
                run.context.attempts.append(
                    Attempt(run.query_id, (old.url,), ins.reason, replayed=ins.units, task=old.key, replaced_by=which.url)
                )
            run.dispatcher.replace(old.key, channel)
        except FlightExecError as exc:
            run.fail(exc)
            return
        spawn(self._start, channel, name=f"rerun-{channel.key}")

    def _is_head(self, channel: TaskChannel) -> bool:
        return channel.header.stage_key.stage_id == self.run.plan.head.stage_id

    def _reads(self, channel: TaskChannel) -> bool:
        return self._is_head(channel) and not self.run.retain

    # ------------------------------------------------------------ the head streams

    def read(self, channel: TaskChannel) -> None:
        """A head task's stream, held whole, then delivered once (unless a new run superseded it)."""
        run = self.run
        held = HeldOutput(run.options.held_output_bytes)
        try:
            try:
                for batch in read_stream(run.clients.get(channel.url), run.head_ticket(channel), stall=run.options.peer_timeout, url=channel.url,
                                     checksums=run.options.stream_checksums):
                    if run.failed.is_set() or channel.key in self.gone:
                        return
                    try:
                        held.add(batch)
                    except (OSError, pa.ArrowException) as exc:  # this process's disk, not the worker
                        run.fail(FlightExecError(f"holding the rows of head task {channel.key} failed here: {exc}"))
                        return
            except ProtocolError as exc:
                run.fail(WorkerError(str(exc), worker_url=channel.url, stage_key=channel.key))
                return
            except StreamIntegrityError as exc:  # the stream broke its trailer: as a lost worker's stream
                run.channel_error(channel, exc)
                return
            except (pa.ArrowException, OSError) as exc:
                channel.done.wait(2.0)  # the task's own error frame says more than the broken stream
                run.channel_error(channel, channel.error or translate_flight_error(exc, channel.url, channel.key))
                return
            try:
                self._deliver(channel, held)
            except (OSError, pa.ArrowException) as exc:  # reading back what this process held
                run.fail(FlightExecError(f"delivering the held rows of head task {channel.key} failed: {exc}"))
        finally:
            held.close()

    def _deliver(self, channel: TaskChannel, held: HeldOutput) -> None:
        run = self.run
        key = channel.header.stage_key
        with self._deciding:
            assert self.recovery is not None
            epoch = self._epoch_of.get(channel.key, key.epoch)
            if channel.key in self.gone or not self.recovery.delivered(key.stage_id, key.task_number, epoch):
                return
        run.dispatcher.output_read(channel)
        for batch in held.batches():
            if not _offer(run.results, batch, run.failed):
                return
        _offer(run.results, (_DONE, channel), run.failed)
        log.debug("query %s: head task %s delivered %d rows", run.query_id, format_stage_key(key), held.rows)
