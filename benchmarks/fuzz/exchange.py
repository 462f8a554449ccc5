"""One DoExchange driven from a single thread, what a case saw (``Outcome``), and the resource families' helpers."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl
from google.protobuf.message import DecodeError

from benchmarks.fuzz.data import DATA_SCHEMA, zeros_batch
from benchmarks.fuzz.proto import FRAME_MEMBERS, P, parse
from benchmarks.fuzz.scripts import frame_bytes, input_end_frame, units_frame
from benchmarks.fuzz.settings import FLOOD_BATCH_ROWS, FLOOD_FRAME_BYTES, FLOOD_UNIT_SIZES, MAX_MESSAGE

__all__ = ["Exchange", "Outcome", "Status", "abandon_exchange", "flood_map", "flood_units", "ipc_batch", "is_input_end", "timed_out"]


# ---------------------------------------------------------------------- runner


@dataclass
class Status:
    call: str
    kind: str  # the pyarrow exception's type name
    message: str
    info: str = ""  # the ErrorInfo message in the status's extra_info, if any


@dataclass
class Outcome:
    """What a case saw: error statuses, ErrorInfo messages, calls past their deadline."""

    statuses: list[Status] = field(default_factory=list)
    error_infos: list[str] = field(default_factory=list)
    bad_frames: list[str] = field(default_factory=list)
    timeouts: list[str] = field(default_factory=list)
    frames: list[str] = field(default_factory=list)
    expected_waits: int = 0
    wedged: bool = False
    internal: str = ""

    def brief(self) -> dict[str, Any]:
        return {"statuses": [[s.call, s.kind, s.message[:MAX_MESSAGE]] for s in self.statuses[:10]],
                "error_infos": [e[:MAX_MESSAGE] for e in self.error_infos[:10]], "bad_frames": self.bad_frames[:5],
                "timeouts": self.timeouts, "frames": self.frames[:40], "wedged": self.wedged, "internal": self.internal}


def timed_out(exc: BaseException) -> bool:
    return isinstance(exc, fl.FlightTimedOutError) or "deadline exceeded" in str(exc).lower()


class Exchange:
    """One DoExchange, driven from a single thread.

    Reads and writes alternate on the case's thread, never overlap: when a pyarrow
    write fails (the worker ended the call), the writer finishes the call and
    drains its read side itself, and a read pending on another thread at that
    moment makes gRPC abort the whole process. Waiting for a task's output with a
    time limit is done with a DoGet, another call.
    """

    def __init__(self, client: fl.FlightClient, cmd: bytes, options: fl.FlightCallOptions, label: str, path: str = "") -> None:
        self.label = label
        descriptor = fl.FlightDescriptor.for_path(path) if path else fl.FlightDescriptor.for_command(cmd)
        self.writer, self.reader = client.do_exchange(descriptor, options=options)
        self.kinds: list[str] = []
        self.errors: list[str] = []
        self.bad: list[str] = []
        self.status: BaseException | None = None
        self.ended = False
        self.broken = False
        self.sent_end = False
        self.sent_input_end = False
        self._first_windows = 0
        self.out: Outcome | None = None  # the case's outcome (an input call beside this exchange records its status there)

    def read(self) -> str | None:
        """The next message's kind (a WorkerFrame member, ``batch``...), or None at the end of the call."""
        if self.ended:
            return None
        try:
            chunk = self.reader.read_chunk()
        except StopIteration:
            self.ended = True
            return None
        except (pa.ArrowException, OSError) as exc:
            self.status, self.ended = exc, True
            return None
        kind = self._kind(chunk.app_metadata, chunk.data is not None)
        self.kinds.append(kind)
        self.kinds += ["credit"] * self._first_windows  # a Ready frame's credits count as the credits they are
        self._first_windows = 0
        return kind

    def _kind(self, metadata: pa.Buffer | None, data: bool) -> str:
        if metadata is None or not metadata.size:
            return "batch" if data else "empty"
        try:
            frame = P.WorkerFrame.FromString(metadata.to_pybytes())
        except DecodeError as exc:
            self.bad.append(f"{self.label}: {exc}")
            return "unparsable"
        kind = frame.WhichOneof("frame") or "no-member"
        if kind == "ready":
            self._first_windows = len(frame.ready.credits)  # each partition's first window (protocol version 12)
        if kind == "error":
            self.errors.append(frame.error.message)
        return kind

    def read_until(self, done: Callable[[str], bool]) -> str | None:
        """Read until ``done`` says so; the last message's kind (None: the call ended)."""
        while (kind := self.read()) is not None and not done(kind):
            pass
        return kind

    def send(self, write: Callable[[Any], None]) -> bool:
        """Write something; False once the call is over (then nothing more is written)."""
        if self.broken or self.ended:
            return False
        try:
            write(self.writer)
            return True
        except (pa.ArrowException, OSError):
            self.broken = True
            return False

    def half_close(self) -> None:
        if not self.sent_end:
            self.sent_end = True
            with contextlib.suppress(pa.ArrowException, OSError):
                self.writer.done_writing()

    def finish(self) -> None:
        """Half-close, read to the end of the call (its final status), close the writer."""
        self.half_close()
        self.read_until(lambda kind: False)
        with contextlib.suppress(pa.ArrowException, OSError):
            self.writer.close()  # re-raises the call's final status: already read


def abandon_exchange(ex: Exchange, how: str) -> None:
    """Let a hoarded exchange go: a last frame (Release, Cancel), a half-close or nothing, then cancel the call."""
    if how == "release" and "release" in FRAME_MEMBERS:
        ex.send(lambda w: w.write_metadata(pa.py_buffer(frame_bytes(release=P.Release()))))
    elif how == "cancel-frame":
        ex.send(lambda w: w.write_metadata(pa.py_buffer(frame_bytes(cancel=P.Cancel(reason="hoarder leaves")))))
    elif how == "half-close":
        ex.half_close()
    if how != "silent":
        with contextlib.suppress(pa.ArrowException, OSError):
            ex.reader.cancel()
    ex.ended = True
    with contextlib.suppress(pa.ArrowException, OSError):
        ex.writer.close()


@functools.lru_cache(maxsize=len(FLOOD_UNIT_SIZES))
def _flood_frame(feed: str, partition: int, size: int) -> bytes:
    return units_frame(feed, partition, [b"\x00" * size] * max(1, FLOOD_FRAME_BYTES // size))


def flood_units(ex: Exchange, feed: str, partition: int, size: int, total: int) -> None:
    """Units of ``size`` bytes, ``total`` bytes in all, as fast as the credit allows (the window is huge)."""
    if "credit" not in ex.kinds:  # the first window comes in Ready (protocol version 12)
        ex.read_until(lambda k: k in ("credit", "error", "finished"))
    if "credit" not in ex.kinds or ex.kinds[-1] in ("error", "finished"):
        return
    frame = _flood_frame(feed, partition, size)
    per_frame = max(1, FLOOD_FRAME_BYTES // size) * size
    sent = 0
    while sent < total and ex.send(lambda w: w.write_metadata(pa.py_buffer(frame))):
        sent += per_frame


def flood_map(ex: Exchange, batches: int) -> None:
    """``batches`` large batches up a map stage, its output never read."""
    if not ex.send(lambda w: w.begin(DATA_SCHEMA)):
        return
    batch = zeros_batch(FLOOD_BATCH_ROWS)
    for _ in range(batches):
        if not ex.send(lambda w: w.write_batch(batch)):
            return
    end = input_end_frame(FLOOD_BATCH_ROWS * batches, batches)
    if end is not None:
        ex.send(lambda w: w.write_metadata(pa.py_buffer(end)))


def is_input_end(data: bytes) -> bool:
    frame = parse(P.CoordinatorFrame, data) if "input_end" in FRAME_MEMBERS else None
    return frame is not None and frame.WhichOneof("frame") == "input_end"


@functools.lru_cache(maxsize=256)
def ipc_batch(data: bytes) -> pa.RecordBatch:
    """The first batch of an IPC stream the generator wrote (read without validation, on purpose)."""
    return next(iter(pa.ipc.open_stream(pa.py_buffer(data))))
