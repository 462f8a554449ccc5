"""``Runner``: plays a case's steps against one worker, every call bounded by the case's deadline."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.flight as fl
from google.protobuf.message import DecodeError

from benchmarks.fuzz.data import DATA_TOKEN, zeros_batch
from benchmarks.fuzz.exchange import Exchange, Outcome, Status, abandon_exchange, flood_map, flood_units, ipc_batch, is_input_end, timed_out
from benchmarks.fuzz.mutator import short_repr
from benchmarks.fuzz.proto import FRAME_MEMBERS, INPUT_CALL_PATH, P, parse
from benchmarks.fuzz.resources import ABANDON
from benchmarks.fuzz.scripts import frame_bytes
from benchmarks.fuzz.settings import FLOOD_WAIT, HEALTH_TIMEOUT, HOARD_BEAT, SELF_URL, SETTLE, SHORT_WAIT
from benchmarks.fuzz.verdicts import check_health, clean_message

if TYPE_CHECKING:
    from benchmarks.fuzz.cases import Case

__all__ = ["Runner"]


class Runner:
    """Plays a case's steps against one worker, every call bounded by the case's deadline."""

    def __init__(self, client: fl.FlightClient, url: str, timeout: float, data_dir: Path) -> None:
        self.client = client
        self.url = url
        self.timeout = timeout
        self.data_dir = data_dir
        self.deadline = 0.0

    def run(self, case: Case) -> Outcome:
        out = Outcome()
        self._write_files(case)
        self.deadline = time.monotonic() + self.timeout
        for step in case.steps:
            self._step(step, out, None)
        return out

    def _write_files(self, case: Case) -> None:
        for name, content in case.files.items():
            path = self.data_dir / name
            if not path.exists():
                path.write_bytes(content)

    def left(self) -> float:
        return max(0.05, self.deadline - time.monotonic())

    def options(self, most: float | None = None) -> fl.FlightCallOptions:
        return fl.FlightCallOptions(timeout=min(self.left(), most) if most else self.left())

    def _step(self, step: dict[str, Any], out: Outcome, ex: Exchange | None) -> bool:
        """One step; False when the rest of this exchange's script cannot be sent."""
        kind = step["op"]
        if kind == "exchange":
            self._exchange(step, out)
        elif kind in ("doget", "output"):
            self._doget(step["ticket"], out, short=bool(step.get("short")), output=kind == "output")
        elif kind == "action":
            self._call(out, f"DoAction {short_repr(step['type'])}", lambda: list(self.client.do_action(
                fl.Action(step["type"], pa.py_buffer(step["body"])), options=self.options())))
        elif kind == "list_actions":
            self._call(out, "ListActions", lambda: list(self.client.list_actions(options=self.options())))
        elif kind == "hoard":
            self._hoard(step, out)
        elif kind == "flood":
            self._flood(step, out)
        elif kind == "await_idle":
            self._await_idle(out)
        elif kind == "extend":
            self.deadline += step["seconds"]
        elif ex is not None:
            return self._exchange_step(step, ex)
        return True

    def _exchange_step(self, step: dict[str, Any], ex: Exchange) -> bool:
        kind = step["op"]
        if kind == "wait_credits":
            count = step["count"]
            if ex.kinds.count("credit") < count:  # the first windows came in Ready (protocol version 12)
                ex.read_until(lambda k: k in ("error", "finished") or ex.kinds.count("credit") >= count)
        elif kind == "half_close":
            ex.finish()
        elif kind == "await_finished":
            # A map stage whose input ended with an InputEnd must finish (or fail) on its own; one
            # whose input did not may rightly wait for more, so the half-close comes at once.
            if ex.sent_input_end:
                ex.read_until(lambda k: k in ("finished", "error"))
        elif kind == "frame":
            ex.sent_input_end |= is_input_end(step["data"])
            return ex.send(lambda w: w.write_metadata(pa.py_buffer(self._localize(step["data"]))))
        elif kind == "empty":
            return ex.send(lambda w: w.write_metadata(pa.py_buffer(b"")))
        elif kind == "begin":
            options = pa.ipc.IpcWriteOptions(compression=step.get("compression"))
            return ex.send(lambda w: w.begin(pa.ipc.read_schema(pa.py_buffer(step["schema"])), options=options))
        elif kind == "batch":
            return ex.send(lambda w: w.write_batch(ipc_batch(step["ipc"])))
        elif kind == "batch_frame":
            return ex.send(lambda w: w.write_with_metadata(ipc_batch(step["ipc"]), pa.py_buffer(self._localize(step["data"]))))
        elif kind == "zeros":
            return ex.send(lambda w: w.write_batch(zeros_batch(step["rows"])))
        elif kind == "input_call":
            self._input_call(step, ex)
        return True

    def _input_call(self, step: dict[str, Any], task: Exchange) -> None:
        """An input call (docs/protocol.md, section 16) beside the task's own exchange: its messages, then its status."""
        label = "DoExchange(input call)"
        out = task.out
        short = bool(step.get("short"))  # it names a task that is not there: the worker rightly waits 10 s for it
        try:
            call = Exchange(self.client, b"", self.options(SHORT_WAIT if short else None), label, path=INPUT_CALL_PATH)
        except (pa.ArrowException, OSError) as exc:
            if out is not None:
                self._record(out, label, exc)
            return
        for message in step["messages"]:
            if not self._exchange_step(message, call):
                break
        call.finish()
        if out is not None:
            out.bad_frames += call.bad
            out.frames += [f"{label}: {k}" for k in call.kinds][:10]
            if call.status is not None and short and timed_out(call.status):
                out.expected_waits += 1
            elif call.status is not None:
                self._record(out, label, call.status)

    def _exchange(self, step: dict[str, Any], out: Outcome) -> None:
        cmd = self._localize(step["cmd"])
        label = f"DoExchange({step.get('label', 'task')})"
        try:
            ex = Exchange(self.client, cmd, self.options(), label)
        except (pa.ArrowException, OSError) as exc:
            self._record(out, label, exc)
            return
        ex.out = out
        if ex.read_until(lambda k: k not in ("load", "heartbeat")) == "ready":  # a task may wait for capacity first
            for inner in step["script"]:
                if not self._step(inner, out, ex):
                    break
        ex.finish()
        out.frames += [f"{label}: {k}" for k in ex.kinds if k not in ("credit", "batch", "heartbeat")][:20]
        out.error_infos += ex.errors
        out.bad_frames += ex.bad
        if ex.status is not None:
            self._record(out, label, ex.status)

    def _hoard(self, step: dict[str, Any], out: Outcome) -> None:
        """Open every exchange, beat on each for a few rounds (reading nothing), ask health, let them all go."""
        beat = frame_bytes(heartbeat=P.Heartbeat()) if "heartbeat" in FRAME_MEMBERS else b""
        held: list[Exchange] = []
        try:
            for cmd in step["cmds"]:
                try:
                    held.append(Exchange(self.client, self._localize(cmd), self.options(), "DoExchange(hoard)"))
                except (pa.ArrowException, OSError) as exc:
                    self._record(out, "DoExchange(hoard)", exc)
                    break
            for _ in range(step["beats"]):
                if self.deadline - time.monotonic() < self.timeout / 2:
                    break  # keep half the case's time for letting go and for the worker to free them
                threading.Event().wait(HOARD_BEAT)
                for ex in held:
                    ex.send(lambda w: w.write_metadata(pa.py_buffer(beat)))
            health = check_health(self.client, min(HEALTH_TIMEOUT, self.left()))
            out.frames.append(f"hoard: {len(held)} exchanges held, the worker running {self._running(out)} tasks")
            if health == "timeout":
                out.timeouts.append(f"health while {len(held)} exchanges were held: no answer in time")
            elif health != "ok":
                out.statuses.append(Status("health while hoarding", "HealthFailed", health))
        finally:
            for i, ex in enumerate(held):
                how = step["abandon"] if step["abandon"] != "mixed" else ABANDON[i % len(ABANDON)]
                abandon_exchange(ex, how)

    def _flood(self, step: dict[str, Any], out: Outcome) -> None:
        """A flood (``flood_case``) on an exchange whose calls end at FLOOD_WAIT: a stall there is back-pressure."""
        label = "DoExchange(flood)"
        try:
            ex = Exchange(self.client, self._localize(step["cmd"]), self.options(FLOOD_WAIT), label)
        except (pa.ArrowException, OSError) as exc:
            self._record(out, label, exc)
            return
        getter = None
        try:
            if ex.read_until(lambda k: k not in ("load", "heartbeat")) == "ready":
                if step.get("ticket"):
                    with contextlib.suppress(pa.ArrowException, OSError):  # opened, never read
                        getter = self.client.do_get(fl.Ticket(step["ticket"]), options=self.options(FLOOD_WAIT))
                if "batches" in step:
                    flood_map(ex, step["batches"])
                else:
                    flood_units(ex, step["feed"], step["partition"], step["unit"], step["total"])
        finally:
            if getter is not None:
                with contextlib.suppress(pa.ArrowException, OSError):
                    getter.cancel()
            ex.finish()
        out.frames += [f"{label}: {k}" for k in ex.kinds if k not in ("credit", "batch", "heartbeat")][:20]
        out.error_infos += ex.errors
        out.bad_frames += ex.bad
        if ex.status is not None:
            if timed_out(ex.status):
                out.expected_waits += 1  # held back: what the worker should do
            else:
                self._record(out, label, ex.status)

    def _running(self, out: Outcome) -> int:
        """The worker's running tasks (``info``), or -1 when it did not say (recorded in ``out``)."""
        try:
            (result,) = list(self.client.do_action(fl.Action("info", b""), options=self.options(HEALTH_TIMEOUT)))
            return int(P.WorkerInfo.FromString(result.body.to_pybytes()).running_tasks)
        except (pa.ArrowException, OSError, ValueError, DecodeError) as exc:
            self._record(out, "DoAction info", exc)
            return -1

    def _await_idle(self, out: Outcome) -> None:
        """Wait (within the case's deadline) until the worker's ``info`` counts no running task: a leftover is a hang."""
        while True:
            running = self._running(out)
            if running <= 0:
                return
            if time.monotonic() >= self.deadline:
                out.timeouts.append(f"info: {running} tasks still running at the end of the case (a leftover is a hang)")
                return
            threading.Event().wait(0.05)

    def _localize(self, data: bytes) -> bytes:
        """The worker's own URL where the seed said SELF_URL, the data directory where it said DATA_TOKEN
        (only when lengths match: protobuf length prefixes stay valid)."""
        if len(self.url) == len(SELF_URL):
            data = data.replace(SELF_URL.encode(), self.url.encode())
        if len(str(self.data_dir)) == len(DATA_TOKEN):
            data = data.replace(DATA_TOKEN.encode(), str(self.data_dir).encode())
        return data

    def _doget(self, ticket: bytes, out: Outcome, short: bool = False, output: bool = False) -> None:
        """A DoGet read to its end. ``short``: the ticket names a task that never ran (the worker rightly waits
        10 s for it); ``output``: the case's own task's output, which a mutated task may never finish."""
        most = SHORT_WAIT if short else SETTLE if output else None
        try:
            reader = self.client.do_get(fl.Ticket(ticket), options=self.options(most))
            with contextlib.suppress(StopIteration):
                while True:
                    reader.read_chunk()
        except (pa.ArrowException, OSError) as exc:
            if most is not None and timed_out(exc):
                out.expected_waits += 1
            else:
                self._record(out, "DoGet", exc)

    def _call(self, out: Outcome, label: str, call_: Callable[[], object]) -> None:
        try:
            call_()
        except (pa.ArrowException, OSError) as exc:
            self._record(out, label, exc)

    @staticmethod
    def _record(out: Outcome, label: str, exc: BaseException) -> None:
        if timed_out(exc):
            out.timeouts.append(f"{label}: {clean_message(str(exc))[:300]}")
            return
        extra = getattr(exc, "extra_info", None) or b""
        status = parse(P.RpcStatus, bytes(extra)) if extra else None  # docs/protocol.md section 10: the ErrorInfo is its detail
        info = parse(P.ErrorInfo, status.details[0].value) if status is not None and len(status.details) == 1 else None
        out.statuses.append(Status(label, type(exc).__name__, str(exc), info.message if info is not None else ""))
