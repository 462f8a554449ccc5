"""The feed state machine's driver (``FeedDispatcher``) with recording channels: threads, no sockets.

The state machine's rules are tested alone (``test_state.py``); here, that the driver
carries its instructions out faithfully: every unit of every partition reaches its task
once, in discovery order, never past the credit granted, before that partition's feed
end; a half-close follows the task's finish; an abort cancels each open task once and
stops discovery.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from support import wait_until

from flight.coordinator.dispatch import FeedDispatcher
from flight.sources.feed import FeedContext, WorkUnitFeed, WorkUnitFeedProvider
from flight.wire._proto import protocol_pb2


def _parts(frame: protocol_pb2.CoordinatorFrame) -> list[protocol_pb2.CoordinatorFrame]:
    """A ``FeedFrames`` as the worker acts on it: each partition's units, then each end; any other frame as it is."""
    if not frame.HasField("feeds"):
        return [frame]
    return [protocol_pb2.CoordinatorFrame(units=u) for u in frame.feeds.units] + [
        protocol_pb2.CoordinatorFrame(feed_end=e) for e in frame.feeds.ends
    ]


class Recording:
    """Stands in for a ``TaskChannel``: what the driver asked of it, in order."""

    def __init__(self, key: str, url: str) -> None:
        self.key, self.url = key, url
        self.frames: list[protocol_pb2.CoordinatorFrame] = []  # a bundle's parts as frames of their own, in its order
        self.written: list[protocol_pb2.CoordinatorFrame] = []  # as sent
        self.closed = 0
        self.aborts: list[str] = []
        self.lock = threading.Lock()
        self.sent = threading.Event()  # set on every frame: what the test's worker stand-in waits for

    def send(self, frame: protocol_pb2.CoordinatorFrame) -> None:
        with self.lock:
            self.written.append(frame)
            self.frames.extend(_parts(frame))
        self.sent.set()

    def close(self) -> None:
        self.closed += 1

    def abort(self, reason: str) -> None:
        self.aborts.append(reason)

    def units(self, partition: int) -> list[bytes]:
        return [u.body for f in self.frames if f.HasField("units") and f.units.partition == partition for u in f.units.units]

    def ended(self, partition: int) -> bool:
        return any(f.HasField("feed_end") and f.feed_end.partition == partition for f in self.frames)


class Numbers(WorkUnitFeedProvider):
    def __init__(self, n: int, endless: bool = False) -> None:
        self.n, self.endless = n, endless

    def partitions(self) -> int | None:
        return None

    def feed(self, partition: int, ctx: FeedContext) -> Iterator[bytes]:
        i = 0
        while i < self.n or (self.endless and not ctx.is_cancelled()):
            yield f"{partition}:{i}".encode()
            i += 1


def test_every_unit_reaches_its_task_once_in_order_within_credit_then_the_feed_ends() -> None:
    errors: list[BaseException] = []
    d = FeedDispatcher("q", discovery_buffer=64, max_units_per_frame=16, on_error=errors.append)
    feed = WorkUnitFeed(Numbers(500), "f")
    channels = [Recording("q/0/0", "grpc://a:1"), Recording("q/0/1", "grpc://b:1")]
    for p in range(4):  # four partitions, two per task
        d.add_slot(d.add_source(feed, p, 4, shared=False), p, channels[p % 2])  # type: ignore[arg-type]
    d.start_discovery()
    d.start_sending()
    granted = {p: 0 for p in range(4)}
    deadline = time.monotonic() + 20
    while not all(channels[p % 2].ended(p) for p in range(4)):
        assert time.monotonic() < deadline, "the feeds did not end"
        for p in range(4):  # a worker's credit: a window of 10 ahead of what it received
            have = len(channels[p % 2].units(p))
            assert have <= granted[p], f"partition {p} got {have} units for {granted[p]} credit"
            if granted[p] - have < 10:
                d.on_credit(channels[p % 2], "f", p, 10)  # type: ignore[arg-type]
                granted[p] += 10
        for ch in channels:  # until a frame arrives (a short bound: credit may be what it waits for)
            ch.sent.wait(0.01)
            ch.sent.clear()
    for p in range(4):
        ch = channels[p % 2]
        assert ch.units(p) == [f"{p}:{i}".encode() for i in range(500)]  # all, once, in discovery order
        ends = [i for i, f in enumerate(ch.frames) if f.HasField("feed_end") and f.feed_end.partition == p]
        last_units = max(i for i, f in enumerate(ch.frames) if f.HasField("units") and f.units.partition == p)
        assert len(ends) == 1 and ends[0] > last_units  # one feed end, after the partition's last unit
    assert all(len(f.units.units) <= 16 for ch in channels for f in ch.frames if f.HasField("units"))
    assert errors == []
    d.stop()
    assert [ch.aborts for ch in channels] == [["the query ended"], ["the query ended"]]  # not half-closed: cancelled


def test_half_close_follows_the_finish_once_the_result_is_complete() -> None:
    d = FeedDispatcher("q", discovery_buffer=8, max_units_per_frame=8, close_grace_s=30, on_error=print)
    done, running = Recording("q/0/0", "grpc://a:1"), Recording("q/0/1", "grpc://b:1")
    d.add_task(done)  # type: ignore[arg-type]
    d.add_task(running)  # type: ignore[arg-type]
    d.start_sending()
    d.on_finished(done)  # type: ignore[arg-type]
    assert not d.state.tasks[done.key].closed and done.closed == 0  # decided at once: not before the result is complete
    d.result_complete()
    wait_until(lambda: done.closed == 1, what="the finished task's half-close")
    assert running.closed == 0  # not finished: waits for its finish (or the grace)
    d.on_finished(running)  # type: ignore[arg-type]
    wait_until(lambda: running.closed == 1, what="the second task's half-close")
    d.stop()
    assert done.aborts == running.aborts == []  # closed tasks are not cancelled


def test_an_abort_cancels_each_open_task_once_and_stops_an_endless_discovery() -> None:
    d = FeedDispatcher("q", discovery_buffer=32, max_units_per_frame=8, on_error=print)
    feed = WorkUnitFeed(Numbers(0, endless=True), "f")
    ch = Recording("q/0/0", "grpc://a:1")
    d.add_slot(d.add_source(feed, 0, 1, shared=True), 0, ch)  # type: ignore[arg-type]
    d.start_discovery()
    d.start_sending()
    d.on_credit(ch, "f", 0, 5)  # type: ignore[arg-type]
    wait_until(lambda: len(ch.units(0)) == 5, what="the credited units")
    threads = {t.name for t in threading.enumerate()}
    assert "discover-f-0" in threads
    d.stop("the caller stopped reading")
    d.stop("again")
    assert ch.aborts == ["the caller stopped reading"]
    wait_until(lambda: "discover-f-0" not in {t.name for t in threading.enumerate()}, what="discovery to stop")
    assert len(ch.units(0)) == 5 and not ch.ended(0)  # nothing after the abort, and no feed end
