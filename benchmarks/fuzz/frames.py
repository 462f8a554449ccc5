"""The ``frames`` family: a leaf task's CoordinatorFrames mutated, reordered, duplicated or out of credit."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from benchmarks.fuzz.data import DATA_SCHEMA, data_table, ipc_stream, schema_bytes
from benchmarks.fuzz.mutator import weighted
from benchmarks.fuzz.proto import FRAME_MEMBERS, P, parse, ser
from benchmarks.fuzz.scripts import feed_end_frame, frame_bytes, op, units_frame

if TYPE_CHECKING:
    from benchmarks.fuzz.mutator import Mutator
    from benchmarks.fuzz.seeds import Seed

__all__ = ["FRAME_OPS", "all_ended", "member_frame", "mutate_frames"]


# -- frames: a leaf task's CoordinatorFrames (and what else a client can put on its exchange)

FRAME_OPS: list[tuple[str, float]] = [
    ("frame-raw", 20), ("frame-struct", 22), ("member", 10), ("duplicate", 6), ("drop", 6), ("swap", 4), ("empty", 6),
    ("garbage", 5), ("concat", 4), ("over-credit", 5), ("huge-body", 2), ("many-units", 2), ("batch", 4), ("cancel", 5),
    ("unassigned", 4), ("after-end", 4), ("bundle", 5),
]


def all_ended(script: list[dict[str, Any]], pairs: list[tuple[str, int]]) -> bool:
    """Whether the script's frames end every assigned feed partition (else the task rightly waits for ever)."""
    ended = set()
    for step in script:
        frame = parse(P.CoordinatorFrame, step["data"]) if step["op"] == "frame" else None
        if frame is not None and frame.WhichOneof("frame") == "feed_end":
            ended.add((frame.feed_end.feed_id, frame.feed_end.partition))
        elif frame is not None and frame.WhichOneof("frame") == "feeds":
            ended.update((e.feed_id, e.partition) for e in frame.feeds.ends)
    return set(pairs) <= ended


def _frame_indexes(script: list[dict[str, Any]]) -> list[int]:
    return [i for i, s in enumerate(script) if s["op"] == "frame"]


def _insert(m: Mutator, script: list[dict[str, Any]], *items: dict[str, Any]) -> None:
    """Insert ``items`` somewhere between the first wait and the final output read / half-close."""
    first = 1 if script and script[0]["op"] == "wait_credits" else 0
    last = next((i for i, s in enumerate(script) if s["op"] in ("output", "half_close")), len(script))
    at = m.rng.randint(first, max(first, last))
    script[at:at] = list(items)


def member_frame(m: Mutator, seed: Seed) -> bytes:
    """A CoordinatorFrame with a random oneof member (whatever this protocol version has), maybe mutated."""
    member = m.rng.choice(FRAME_MEMBERS)
    frame = P.CoordinatorFrame()
    pair = m.rng.choice(list(seed.units) or [("files", 0)])
    if member == "units":
        units = [P.WorkUnit(body=b, id=i) for i, b in enumerate(seed.units.get(pair, []))]
        frame.units.CopyFrom(P.WorkUnitBatch(feed_id=pair[0], partition=pair[1], units=units))
    elif member == "feed_end":
        frame.feed_end.CopyFrom(P.FeedEnd(feed_id=pair[0], partition=pair[1]))
    elif member == "feeds":  # several partitions' units, then ends (protocol 13), some of them maybe not the task's
        pairs = list(seed.units) or [("files", 0)]
        for feed, partition in pairs:
            units = [P.WorkUnit(body=b, id=i) for i, b in enumerate(seed.units.get((feed, partition), []))]
            frame.feeds.units.add().CopyFrom(P.WorkUnitBatch(feed_id=feed, partition=partition, units=units))
        ends = pairs + ([("files", 99)] if m.rng.random() < 0.2 else [])
        frame.feeds.ends.extend(P.FeedEnd(feed_id=f, partition=p) for f, p in ends)
    elif member == "cancel":
        frame.cancel.reason = m.rng.choice(["fuzz", "", "x" * 70_000, "\n\x00"])
    elif member == "input_end":
        frame.input_end.CopyFrom(P.InputEnd(rows=m.rng.choice([0, 30, 2**64 - 1]), batches=m.rng.choice([0, 3, 2**64 - 1])))
    else:
        getattr(frame, member).SetInParent()
    if m.rng.random() < 0.4:
        m.message(frame, "CoordinatorFrame")
    m.note(f"frame member {member}")
    return ser(frame)


def mutate_frames(m: Mutator, script: list[dict[str, Any]], seed: Seed) -> None:
    kind = weighted(m.rng, FRAME_OPS)
    frames = _frame_indexes(script)
    pair = m.rng.choice(list(seed.units) or [("files", 0)])
    if kind in ("frame-raw", "frame-struct", "duplicate", "drop", "swap", "concat") and not frames:
        kind = "member"
    m.note(f"frames: {kind}")
    if kind == "frame-raw":
        i = m.rng.choice(frames)
        script[i] = op("frame", data=m.raw(script[i]["data"], "frame"))
    elif kind == "frame-struct":
        i = m.rng.choice(frames)
        frame = parse(P.CoordinatorFrame, script[i]["data"]) or P.CoordinatorFrame()
        m.message(frame, "CoordinatorFrame")
        script[i] = op("frame", data=ser(frame))
    elif kind == "member":
        _insert(m, script, op("frame", data=member_frame(m, seed)))
    elif kind == "duplicate":
        i = m.rng.choice(frames)
        script.insert(i + 1, dict(script[i]))
    elif kind == "drop":
        del script[m.rng.choice(frames)]
    elif kind == "swap":
        i, j = m.rng.choice(frames), m.rng.choice(frames)
        script[i], script[j] = script[j], script[i]
    elif kind == "empty":
        _insert(m, script, op("empty"))
    elif kind == "garbage":
        _insert(m, script, op("frame", data=m.rng.randbytes(m.rng.choice([1, 7, 64, 4096]))))
    elif kind == "concat":
        i, j = m.rng.choice(frames), m.rng.choice(frames)
        script[i] = op("frame", data=script[i]["data"] + script[j]["data"])
    elif kind == "over-credit":
        bodies = (seed.units.get(pair) or [b"x"]) * (seed.window * m.rng.choice([1, 2, 4]) + 1)
        _insert(m, script, op("frame", data=units_frame(*pair, bodies[: seed.window * 4 + 1])))
    elif kind == "huge-body":
        _insert(m, script, op("frame", data=units_frame(*pair, [b"\x00" * m.rng.choice([1 << 20, 17 << 20])])))
    elif kind == "many-units":
        _insert(m, script, op("frame", data=units_frame(*pair, [b"x"] * m.rng.choice([5_000, 70_000]))))
    elif kind == "batch":
        batch = data_table(3).to_batches()[0]
        _insert(m, script, op("begin", schema=schema_bytes(DATA_SCHEMA), compression=None), op("batch", ipc=ipc_stream(DATA_SCHEMA, [batch])))
    elif kind == "cancel":
        _insert(m, script, op("frame", data=frame_bytes(cancel=P.Cancel(reason="fuzz"))))
    elif kind == "unassigned":
        feed, partition = m.rng.choice([("nope", 0), (pair[0], 99), (pair[0], 2**32 - 1), ("", 0)])
        member = units_frame(feed, partition, [b"x"]) if m.rng.random() < 0.5 else feed_end_frame(feed, partition)
        _insert(m, script, op("frame", data=member))
    elif kind == "bundle":  # the script's units and feed ends as one FeedFrames, where the first of them was
        _bundle(script)
    else:  # units after the partition's FeedEnd
        at = max(frames) + 1 if frames else len(script)
        script.insert(at, op("frame", data=units_frame(*pair, seed.units.get(pair) or [b"x"])))


def _bundle(script: list[dict[str, Any]]) -> None:
    """A run of consecutive ``units`` and ``feed_end`` frames of the script as one ``FeedFrames`` (protocol 13) in its
    place: its units in order, then its ends, as a coordinator bundles them. Only frames next to each other: folding
    frames from either side of another step (a cancel, units a mutation put after their end) would make a script the
    fuzzer meant to be wrong a right one."""
    runs: list[list[tuple[int, Any]]] = [[]]
    for i, step in enumerate(script):
        frame = parse(P.CoordinatorFrame, step["data"]) if step["op"] == "frame" else None
        if frame is not None and frame.WhichOneof("frame") in ("units", "feed_end"):
            runs[-1].append((i, frame))
        elif runs[-1]:
            runs.append([])
    run = max(runs, key=len)
    if len(run) < 2 or "feeds" not in FRAME_MEMBERS:
        return
    bundle = P.FeedFrames()
    for _, frame in run:
        if frame.WhichOneof("frame") == "units":
            bundle.units.add().CopyFrom(frame.units)
    for _, frame in run:
        if frame.WhichOneof("frame") == "feed_end":
            bundle.ends.add().CopyFrom(frame.feed_end)
    first = run[0][0]
    script[first] = op("frame", data=frame_bytes(feeds=bundle))
    for i, _ in reversed(run[1:]):
        del script[i]
