"""One task's instructions as frames (``flight.coordinator.framing``): decisions alone, no sockets."""

from __future__ import annotations

import pytest

from flight.coordinator.events import HalfClose, Item, SendFeedEnd, SendUnits
from flight.coordinator.framing import BUNDLE_BYTES, frames
from flight.errors import ProtocolError
from flight.wire._proto import protocol_pb2
from flight.wire.limits import INPUT_RESERVE_BYTES
from flight.wire.protocol import decode_coordinator_frame

TASK = "q/0/0"


def units(feed: str, partition: int, *bodies: bytes) -> SendUnits:
    return SendUnits(TASK, feed, partition, tuple(Item(body, id=i) for i, body in enumerate(bodies)))


def end(feed: str, partition: int) -> SendFeedEnd:
    return SendFeedEnd(TASK, feed, partition)


def kinds(out: list[protocol_pb2.CoordinatorFrame | None]) -> list[str | None]:
    return [None if f is None else f.WhichOneof("frame") for f in out]


def test_a_one_task_start_is_one_frame_each_partitions_units_then_the_ends() -> None:
    """TPC-H Q2's shape: eight scans' units and ends were sixteen frames."""
    batch = [x for p in range(3) for x in (units("f", p, b"a%d" % p, b"b%d" % p), end("f", p))]
    (frame,) = frames(batch, 4096)
    assert frame is not None and frame.WhichOneof("frame") == "feeds"
    assert [(u.partition, [x.body for x in u.units]) for u in frame.feeds.units] == [(p, [b"a%d" % p, b"b%d" % p]) for p in range(3)]
    assert [e.partition for e in frame.feeds.ends] == [0, 1, 2]


def test_one_partitions_frame_keeps_its_own_kind() -> None:
    assert kinds(list(frames([units("f", 0, b"x")], 16))) == ["units"]
    assert kinds(list(frames([end("f", 0)], 16))) == ["feed_end"]
    merged = list(frames([units("f", 0, b"x"), units("f", 0, b"y")], 16))  # consecutive units of one partition: one batch
    assert kinds(merged) == ["units"] and [u.body for u in merged[0].units.units] == [b"x", b"y"]  # type: ignore[union-attr]


def test_a_half_close_ends_a_bundle_and_keeps_its_place() -> None:
    out = list(frames([units("f", 0, b"x"), end("f", 0), HalfClose(TASK), end("g", 1)], 16))
    assert kinds(out) == ["feeds", None, "feed_end"]


def test_a_bundle_holds_at_most_max_units_and_no_unit_is_lost_or_reordered() -> None:
    batch = [units("f", p, *(b"%d:%d" % (p, i) for i in range(5))) for p in range(6)] + [end("f", p) for p in range(6)]
    out = list(frames(batch, 12))
    assert all(f is not None for f in out) and len(out) > 1
    sent: list[bytes] = []
    ended: list[int] = []
    for f in out:
        assert f is not None
        parts = [f.units] if f.HasField("units") else list(f.feeds.units)
        assert sum(len(b.units) for b in parts) <= 12
        sent += [u.body for b in parts for u in b.units]
        ended += [f.feed_end.partition] if f.HasField("feed_end") else [e.partition for e in f.feeds.ends]
    assert sent == [b"%d:%d" % (p, i) for p in range(6) for i in range(5)] and ended == list(range(6))


def test_a_bundle_holds_at_most_its_bytes() -> None:
    big = b"x" * (BUNDLE_BYTES // 2 + 1)
    out = list(frames([units("f", 0, big), units("f", 1, big), end("f", 0), end("f", 1)], 16))
    assert kinds(out) == ["units", "feeds"]  # the second partition's units start a bundle of their own, with the ends
    assert out[1] is not None and [u.partition for u in out[1].feeds.units] == [1] and len(out[1].feeds.ends) == 2


def test_a_bundle_past_its_first_entry_fits_the_unread_units_a_task_may_hold() -> None:
    """A worker takes a bundle's entries one by one and lets only the first past a task's input reservation when the
    task holds nothing: two partitions' 5 MiB units in one bundle were refused every time (a reviewer's case)."""
    five = b"x" * (5 << 20)
    out = list(frames([units("f", 0, five), units("f", 1, five), end("f", 0), end("f", 1)], 16))
    assert BUNDLE_BYTES == INPUT_RESERVE_BYTES and kinds(out) == ["units", "feeds"]
    for f in out:
        assert f is not None
        parts = [f.units] if f.HasField("units") else list(f.feeds.units)
        assert sum(len(u.body) for b in parts[1:] for u in b.units) <= INPUT_RESERVE_BYTES


def test_what_the_coordinator_bundles_the_worker_decodes_and_what_none_sends_it_refuses() -> None:
    batch = [x for p in range(4) for x in (units("f", p, b"a", b"b"), end("f", p))]
    (frame,) = frames(batch, 4096)
    assert frame is not None and decode_coordinator_frame(frame.SerializeToString()) == frame
    for bad, field in (
        (protocol_pb2.FeedFrames(), "app_metadata.feeds"),
        (protocol_pb2.FeedFrames(units=[protocol_pb2.WorkUnitBatch(feed_id="f", partition=0)]), "app_metadata.feeds.units[0].units"),
        (protocol_pb2.FeedFrames(units=[protocol_pb2.WorkUnitBatch(feed_id="f", partition=p, units=[protocol_pb2.WorkUnit(body=b"x")] * 40_000)
                                        for p in range(2)]), "app_metadata.feeds.units"),
    ):
        with pytest.raises(ProtocolError) as raised:
            decode_coordinator_frame(protocol_pb2.CoordinatorFrame(feeds=bad).SerializeToString())
        assert raised.value.field == field, raised.value
