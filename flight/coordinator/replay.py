"""Losing a worker within an attempt: a lost head task's units replayed on another worker.

A whole-query retry (``recovery.py``) is only exact while no row has left; these two
cases go on instead (docs/architecture.md, "Losing a worker"):

* ``"units"`` — ``execute()`` of a streaming scan (one stage of filters and
  projections over one feed). Its tasks tag their rows with their work unit
  (``TaskOptions.tag_units``); each head stream goes through a ``UnitGate``, which
  hands a unit's rows to the caller once the unit is complete and tells the state
  machine so (``UnitsDone``). A lost task's undelivered units go back to their
  queue, for any task with credit; its held rows are dropped.
* ``"task"`` — a retained detached query of one stage (``flight.spark.read``).
  Others read its head outputs by partition, any number of times, so the
  replacement must make the lost task's output again whole: it replays every unit
  the lost task was sent, and nothing else (``exclusive`` in the state machine).
  Spark tasks that cannot reach the lost worker find it among the query's workers
  under the same stage key (``spark/_source.py``).

Either way the replacement has the lost task's header (stage key, feed partitions)
on the least loaded surviving worker; each lost worker costs one of
``ExecOptions.retries``, and a worker counts as lost only if a ``health`` probe
says so (a task's own error, or a healthy worker, fails the attempt as before).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Literal

import pyarrow as pa

from flight.coordinator.channel import TaskChannel
from flight.coordinator.events import ReplaceTask
from flight.coordinator.recovery import PROBE_TIMEOUT_S, Attempt, may_retry, probe_lost
from flight.coordinator.results import DONE as _DONE
from flight.coordinator.results import offer as _offer
from flight.coordinator.units import UnitGate
from flight.errors import FlightExecError, ProtocolError, WorkerError, WorkerUnavailableError
from flight.plan.nodes import InputCallNode
from flight.threads import spawn
from flight.wire._proto import protocol_pb2
from flight.wire.clients import read_stream, translate_flight_error
from flight.wire.integrity import StreamIntegrityError
from flight.wire.limits import clip
from flight.wire.operators import taggable
from flight.wire.protocol import format_stage_key

if TYPE_CHECKING:
    from flight.config import ExecOptions
    from flight.coordinator.run import Run
    from flight.planner.stages import QueryPlan

__all__ = ["Mode", "Replay", "replay_mode"]

log = logging.getLogger("flight.coordinator.exec")

Mode = Literal["units", "task", "stages"]


def replay_mode(plan: QueryPlan, options: ExecOptions, retain: bool) -> Mode | None:
    """How an execution of ``plan`` survives a lost worker after it started, if it can."""
    if options.retries <= 0:
        return None
    if any(isinstance(n, InputCallNode) for s in plan.stages for n in s.root.walk()):
        return None  # rows another process sent once (a Spark DataFrame) cannot be sent to a replacement
    if len(plan.stages) != 1:
        return "stages" if options.stage_recovery else None  # ``stagereplay.py``
    if retain:
        return "task"
    if options.unit_recovery and taggable(plan.head.root_proto()):
        return "units"
    return None


class Replay:
    """One attempt's head tasks, watched for lost workers, and the replacements made for them."""

    def __init__(self, run: Run, mode: Mode) -> None:
        self.run = run
        self.mode = mode
        self.gates: dict[str, UnitGate] = {}  # by task: a "units" task's rows (a "task" one's loss guard only)
        self.lost_urls: set[str] = set()
        self.gone: set[str] = set()  # tasks lost (or whose worker went after their output was read)
        self._channels: dict[str, TaskChannel] = {}
        self._probing = threading.Lock()
        self._replacements: Counter[str] = Counter()

    def track(self, channel: TaskChannel) -> None:
        self.gates[channel.key] = UnitGate(f"task {channel.key} on {channel.url}")
        self._channels[channel.key] = channel

    def reset(self) -> None:
        """The attempt let its tasks go before sending anything (capacity): forget them."""
        self.gates, self._channels = {}, {}

    def watches(self, channel: TaskChannel) -> bool:
        return channel.key in self.gates

    def head(self) -> list[TaskChannel]:
        """The head tasks whose outputs make the result now: replacements in, lost ones out."""
        return [c for c in self.run.by_stage[self.run.plan.head.stage_id] if c.key not in self.gone]

    # ------------------------------------------------------------ a loss

    def lost(self, channel: TaskChannel, error: BaseException) -> None:
        """A watched task failed: if its worker is lost, its units are replayed elsewhere; else the attempt fails."""
        run = self.run
        gate = self.gates[channel.key]
        with gate.lock:  # no unit of this task is handed over meanwhile
            if gate.lost or run.failed.is_set():
                return
            if gate.read_all:  # everything it had to give reached the caller: nothing to replay
                self.gone.add(channel.key)
                return
            if not may_retry(error, False, 0, 1) or not self._worker_lost(channel.url):
                run.fail(error)
                return
            gate.lost = True
            self.gone.add(channel.key)
            dropped = gate.drop()
        log.warning(
            "query %s: task %s on %s was lost (%s); its units are replayed on another worker%s",
            run.query_id, channel.key, channel.url, clip(error, 200),
            f" ({dropped} rows held back are dropped)" if dropped else "",
        )
        run.dispatcher.task_lost(channel, clip(error, 300))

    def _worker_lost(self, url: str) -> bool:
        """Whether ``url`` is lost (dead, or no ``health`` answer in time) and may be recovered from."""
        options = self.run.options
        with self._probing:
            if url in self.lost_urls:
                return True
            if len(self.lost_urls) >= options.retries or not set(self.run.urls) - self.lost_urls - {url}:
                return False  # no retries left, or no worker would be left to replay on
            if not probe_lost([url], options.security, min(PROBE_TIMEOUT_S, options.connect_timeout)):
                return False
            self.lost_urls.add(url)
            return True

    def replace(self, ins: ReplaceTask) -> None:
        """The state machine's ``ReplaceTask``: the lost task's header on the least loaded surviving worker."""
        run = self.run
        try:
            old = self._channels[ins.task]
            survivors = [u for u in run.urls if u not in self.lost_urls]
            if not survivors:
                raise WorkerUnavailableError(
                    f"task {old.key} on {old.url} was lost ({ins.reason}) and no worker is left to replay its units on",
                    worker_url=old.url,
                    stage_key=old.key,
                )
            stage_id = run.plan.head.stage_id
            with run.lock:
                load = Counter(c.url for c in self.head())
                url = min(survivors, key=lambda u: load[u])
                header = protocol_pb2.TaskHeader()
                header.CopyFrom(old.header)
                header.target_worker_url = url
                base = format_stage_key(old.header.stage_key)
                self._replacements[base] += 1
                channel = run.make_channel(header, name=f"{base}+{self._replacements[base]}")
                run.bound[stage_id][header.stage_key.task_number] = url
                run.by_stage[stage_id].append(channel)
                run.channels.append(channel)
            run.context.attempts.append(Attempt(run.query_id, (old.url,), ins.reason, replayed=ins.units, task=base, replaced_by=url))
            run.dispatcher.replace(old.key, channel)
        except FlightExecError as exc:
            run.fail(exc)
            return
        spawn(self._start, channel, name=f"replace-{channel.key}")

    def _start(self, channel: TaskChannel) -> None:
        """Open a replacement; never after the query ended (nothing would free it on its worker)."""
        run = self.run
        try:
            if run.failed.is_set():
                return
            channel.open(run.clients.get(channel.url))
            if run.failed.is_set():  # it ended while this opened, after it cancelled what was open
                channel.abort("the query ended")
                return
            # A busy survivor queues it (first come, first served): as long as admission may wait.
            channel.wait_ready(run.options.connect_timeout, time.monotonic() + run.options.admission_wait)
            if self._is_head(channel):
                run.check_schema(channel)
        except FlightExecError as exc:
            run.channel_error(channel, exc)
            return
        run.dispatcher.task_ready(channel)
        if self._reads(channel):
            self.read(channel)

    def _is_head(self, channel: TaskChannel) -> bool:
        return True  # only head tasks are replaced here

    def _reads(self, channel: TaskChannel) -> bool:
        """Whether this process reads the replacement's output (a "task" one's is read by others)."""
        return self.mode == "units"

    # ------------------------------------------------------------ "units": the head streams

    def read(self, channel: TaskChannel) -> None:
        """A tagged head task's stream: each unit's rows go to the caller once the unit is complete."""
        run = self.run
        gate = self.gates[channel.key]
        try:
            for batch in read_stream(run.clients.get(channel.url), run.head_ticket(channel), stall=run.options.peer_timeout, url=channel.url,
                                     checksums=run.options.stream_checksums):
                with gate.lock:
                    if gate.lost or run.failed.is_set() or not self._hand_over(channel, *gate.feed(batch)):
                        return
            with gate.lock:
                if gate.lost or run.failed.is_set() or not self._hand_over(channel, *gate.end()):
                    return
                run.dispatcher.output_read(channel)
            _offer(run.results, (_DONE, channel), run.failed)
        except ProtocolError as exc:
            run.fail(WorkerError(str(exc), worker_url=channel.url, stage_key=channel.key))
        except StreamIntegrityError as exc:  # the stream broke its trailer: the task's stream is lost
            self.lost(channel, exc)
        except (pa.ArrowException, OSError) as exc:
            channel.done.wait(2.0)  # the task's own error frame says more than the broken stream
            self.lost(channel, channel.error or translate_flight_error(exc, channel.url, channel.key))

    def _hand_over(self, channel: TaskChannel, rows: list[pa.RecordBatch], units: list[int]) -> bool:
        """Complete units' rows to the caller (False: the query is over); the state machine learns they are delivered."""
        if units:
            self.run.dispatcher.units_done(channel, units)  # a unit not outstanding fails the query here
        return not self.run.failed.is_set() and all(_offer(self.run.results, batch, self.run.failed) for batch in rows)
