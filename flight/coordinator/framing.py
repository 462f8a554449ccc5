"""One task's instructions as the frames its exchange carries: a decision apart from I/O (tested without sockets).

Consecutive units of one feed partition share a frame (``WorkUnitBatch``), up to the dispatcher's
``max_units_per_frame``. Since protocol 13, the units and feed ends of consecutive instructions for several
partitions go out together as one ``FeedFrames``: a one-task plan's every scan is granted its first window in
the task's ``Ready`` (protocol 12), and its units and ends were then a frame per partition and one per end,
written one after another by the task's sender and read one after another by the worker (TPC-H Q2's eight
scans: sixteen frames, 1.9 ms from the first sent to the last delivered, geomean over eight queries; one
frame now). A frame for one partition alone keeps its own kind (``units`` or ``feed_end``).

A bundle is bounded as a worker bounds it: at most ``max_units`` units (never more than ``MAX_UNITS_PER_FRAME``:
``flight.wire.protocol.decode_coordinator_frame``) and ``MAX_FEED_PARTITIONS`` entries, and at most ``BUNDLE_BYTES``
of unit bodies, the unread units a task may hold (``INPUT_RESERVE_BYTES``): the worker takes a bundle's entries one
by one, each as a frame of its own, and lets only the first past that reservation when the task holds nothing.
Past those, the next instructions start a bundle of their own (the first entry of a bundle may be as large as a
lone frame may).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from flight.coordinator.events import HalfClose, Instruction, SendFeedEnd, SendUnits
from flight.sources.feed import now_ns
from flight.wire._proto import protocol_pb2
from flight.wire.limits import INPUT_RESERVE_BYTES, MAX_FEED_PARTITIONS, MAX_UNITS_PER_FRAME

__all__ = ["BUNDLE_BYTES", "frames"]

BUNDLE_BYTES = INPUT_RESERVE_BYTES
"""Most bytes of unit bodies one ``FeedFrames`` carries past its first entry: the unread units a worker lets a task hold
(8 MiB). At 16 MiB, two partitions' 5 MiB units made one bundle the worker refused every time (a reviewer's case)."""

Frame = protocol_pb2.CoordinatorFrame


def frames(batch: Sequence[Instruction], max_units: int) -> Iterator[Frame | None]:
    """Frames for ``batch``, in its order (None: the half-close): each partition's units and ends, bundled."""
    return _bundled(_per_partition(batch, max(1, max_units)), min(max(1, max_units), MAX_UNITS_PER_FRAME))


def _per_partition(batch: Sequence[Instruction], max_units: int) -> Iterator[Frame | None]:
    """A frame per instruction, consecutive units of one partition sharing one (at most ``max_units``)."""
    i = 0
    while i < len(batch):
        ins = batch[i]
        if isinstance(ins, SendUnits):
            items = list(ins.items)
            while (
                i + 1 < len(batch)
                and isinstance(nxt := batch[i + 1], SendUnits)
                and (nxt.feed_id, nxt.partition) == (ins.feed_id, ins.partition)
                and len(items) + len(nxt.items) <= max_units
            ):
                items.extend(nxt.items)
                i += 1
            sent = now_ns()
            units = [protocol_pb2.WorkUnit(body=u.body, created_unix_nanos=u.created_ns, sent_unix_nanos=sent, id=u.id) for u in items]
            yield Frame(units=protocol_pb2.WorkUnitBatch(feed_id=ins.feed_id, partition=ins.partition, units=units))
        elif isinstance(ins, SendFeedEnd):
            yield Frame(feed_end=protocol_pb2.FeedEnd(feed_id=ins.feed_id, partition=ins.partition))
        elif isinstance(ins, HalfClose):
            yield None
        i += 1


def _bundled(parts: Iterator[Frame | None], max_units: int) -> Iterator[Frame | None]:
    """``parts`` with each run of consecutive ``units`` and ``feed_end`` frames as one ``FeedFrames`` (a run of one
    as it was): its units in order, then its ends in order, so no partition's end comes before its units."""
    run: list[Frame] = []
    units = size = 0
    for part in parts:
        kind = None if part is None else part.WhichOneof("frame")
        if kind == "units" or kind == "feed_end":
            assert part is not None
            n = len(part.units.units) if kind == "units" else 0
            b = sum(len(u.body) for u in part.units.units) if kind == "units" else 0
            if run and (units + n > max_units or size + b > BUNDLE_BYTES or len(run) >= MAX_FEED_PARTITIONS):
                yield _one(run)
                run, units, size = [], 0, 0
            run.append(part)
            units, size = units + n, size + b
            continue
        if run:
            yield _one(run)
            run, units, size = [], 0, 0
        yield part
    if run:
        yield _one(run)


def _one(run: list[Frame]) -> Frame:
    if len(run) == 1:
        return run[0]
    bundle = protocol_pb2.FeedFrames()
    for frame in run:
        if frame.HasField("units"):
            bundle.units.add().CopyFrom(frame.units)
    for frame in run:
        if frame.HasField("feed_end"):
            bundle.ends.add().CopyFrom(frame.feed_end)
    return Frame(feeds=bundle)
