"""The worker's half of the heartbeat, for every task at once: one thread, not one per task.

Each running task's coordinator must hear from the worker at least every heartbeat
interval (it notices a silent worker by its absence). A thread per task for that was a
third of the threads of a worker full of tasks that wait (issue 24), so the handler
registers its task's ``Sender`` here and one thread writes every due beat.

One frozen peer must never stop the beats of all the others:

* a beat is written with ``Sender.try_frame``: a sender another thread is writing on
  (a batch, maybe blocked on a coordinator that reads nothing) is skipped and tried
  again shortly; that write is itself the sign of life, or the peer does not read;
* a beat's own write may still block (a peer that stopped reading while nothing else
  was written): a guard thread notices a write that has not returned within ``stall``
  seconds, leaves that sender to the blocked thread, and starts a fresh thread for the
  others. The blocked thread ends when its write returns (when the connection ends);
  at most ``MAX_STALLED`` threads wait so, after which a warning is logged.

No task state here: the handler adds its sender once the task is ready and removes it
before it closes the sender.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

import pyarrow as pa

from flight.wire._proto import protocol_pb2

__all__ = ["MAX_STALLED", "Heartbeats"]

log = logging.getLogger(__name__)

MAX_STALLED = 16
"""Beat threads that may wait in a blocked write at once before the guard stops replacing them."""
_RETRY_S = 0.05
"""After a skipped beat (the sender was busy), try again this soon (or at the interval, if shorter)."""


class Beating(Protocol):
    def try_frame(self, frame: protocol_pb2.WorkerFrame) -> bool: ...


class _Entry:
    __slots__ = ("due", "interval", "sender", "stuck")

    def __init__(self, sender: Beating, interval: float) -> None:
        self.sender = sender
        self.interval = interval
        self.due = time.monotonic() + interval
        self.stuck = False
        """A write of this beat has not returned: left to the thread that waits in it."""


class Heartbeats:
    """Sends a heartbeat frame on every registered sender at its interval, from one thread."""

    def __init__(self, stall: float = 5.0) -> None:
        self.stall = stall
        self._entries: dict[int, _Entry] = {}
        self._lock = threading.Condition()
        self._generation = 0
        """The live writer thread's number; a writer with another number was replaced while blocked."""
        self._writing: tuple[_Entry, float] | None = None
        """The live writer's write in progress and when it began."""
        self._stalled = 0
        self._warned = False
        self._started = False
        self._closed = threading.Event()
        self.beats = 0
        """Beats written (for tests and diagnostics)."""

    def add(self, sender: Beating, interval: float) -> None:
        with self._lock:
            self._entries[id(sender)] = _Entry(sender, interval)
            if not self._started:
                self._started = True
                threading.Thread(target=self._write, args=(0,), name="heartbeats", daemon=True).start()
                threading.Thread(target=self._guard, name="heartbeats-guard", daemon=True).start()
            self._lock.notify_all()

    def remove(self, sender: Beating) -> None:
        with self._lock:
            self._entries.pop(id(sender), None)

    def close(self) -> None:
        """Stop the threads (a writer blocked in a write ends when the write returns)."""
        self._closed.set()
        with self._lock:
            self._entries.clear()
            self._lock.notify_all()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @property
    def stalled(self) -> int:
        """Writer threads left waiting in a blocked write."""
        with self._lock:
            return self._stalled

    def _write(self, generation: int) -> None:
        frame = protocol_pb2.WorkerFrame(heartbeat=protocol_pb2.Heartbeat())
        while True:
            with self._lock:
                due: list[_Entry] = []
                while not due:
                    if self._closed.is_set() or generation != self._generation:
                        return
                    now = time.monotonic()
                    live = [e for e in self._entries.values() if not e.stuck]
                    due = [e for e in live if e.due <= now]
                    if not due:
                        self._lock.wait(min((e.due for e in live), default=now + 1.0) - now)
            for entry in due:
                with self._lock:
                    if generation != self._generation:
                        return
                    if self._entries.get(id(entry.sender)) is not entry:
                        continue  # removed meanwhile
                    self._writing = (entry, time.monotonic())
                try:
                    sent: bool | None = entry.sender.try_frame(frame)
                except (pa.ArrowException, OSError) as exc:
                    log.debug("a heartbeat could not be sent (the coordinator is gone?): %s", exc)
                    sent = None
                with self._lock:
                    replaced = generation != self._generation
                    if replaced:  # the guard gave up on this write: the sender is the new writer's again
                        entry.stuck = False
                        self._stalled -= 1
                    else:
                        self._writing = None
                    if sent is None:
                        if self._entries.get(id(entry.sender)) is entry:
                            del self._entries[id(entry.sender)]
                    else:
                        self.beats += int(sent)
                        entry.due = time.monotonic() + (entry.interval if sent else min(entry.interval, _RETRY_S))
                    self._lock.notify_all()
                    if replaced:
                        return

    def _guard(self) -> None:
        while not self._closed.wait(max(0.05, self.stall / 4)):
            with self._lock:
                writing = self._writing
                if writing is None or time.monotonic() - writing[1] < self.stall:
                    continue
                if self._stalled >= MAX_STALLED:
                    if not self._warned:
                        self._warned = True
                        log.warning("%d heartbeat writes are blocked on peers that do not read; no more writers start", self._stalled)
                    continue
                entry, _ = writing
                entry.stuck = True
                self._writing = None
                self._stalled += 1
                self._generation += 1
                generation = self._generation
            log.info("a heartbeat write blocked for %.0fs (a peer that does not read); a new thread beats for the others", self.stall)
            threading.Thread(target=self._write, args=(generation,), name=f"heartbeats-{generation}", daemon=True).start()
