"""A case's script: the steps a runner plays on a task's exchange (frames, input batches, the output read),
built from the header as sent, so that an accepted mutated task can still finish.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from google.protobuf.message import Message

from benchmarks.fuzz.data import DATA_SCHEMA, schema_bytes
from benchmarks.fuzz.proto import FRAME_MEMBERS, L, P, field_number, parse, pb_field, ser
from benchmarks.fuzz.seeds import make_ticket
from benchmarks.fuzz.settings import MAX_ENDS, T0

if TYPE_CHECKING:
    from benchmarks.fuzz.seeds import Seed

__all__ = [
    "assigned", "exchange_step", "feed_end_frame", "frame_bytes", "has_exchange_input", "input_end_frame", "is_map_field", "map_upload", "op",
    "seed_steps", "task_script", "units_frame", "walk",
]


# ---------------------------------------------------------------- case scripts


def op(name: str, **fields: Any) -> dict[str, Any]:
    return {"op": name, **fields}


def frame_bytes(**member: Any) -> bytes:
    return ser(P.CoordinatorFrame(**member))


def units_frame(feed: str, partition: int, bodies: Sequence[bytes]) -> bytes:
    """A WorkUnitBatch frame, written field by field (70,000 units as messages would take seconds)."""
    times = ser(P.WorkUnit(created_unix_nanos=T0, sent_unix_nanos=T0 + 1_000))
    units_no, body_no = field_number(P.WorkUnitBatch, "units"), field_number(P.WorkUnit, "body")
    encoded = {body: pb_field(units_no, (pb_field(body_no, body) if body else b"") + times) for body in set(bodies)}
    batch = ser(P.WorkUnitBatch(feed_id=feed, partition=partition)) + b"".join(encoded[body] for body in bodies)
    return pb_field(field_number(P.CoordinatorFrame, "units"), batch)


def feed_end_frame(feed: str, partition: int) -> bytes:
    return frame_bytes(feed_end=P.FeedEnd(feed_id=feed, partition=partition))


def input_end_frame(rows: int, batches: int) -> bytes | None:
    """The map stage's end-of-input frame, if this protocol version has one."""
    if "input_end" not in FRAME_MEMBERS:
        return None
    return frame_bytes(input_end=P.InputEnd(rows=rows, batches=batches))


def walk(msg: Message, skip: tuple[str, ...] = ()) -> Iterator[Message]:
    """``msg`` and every message inside it (not inside bytes fields, nor inside messages of a type in ``skip``)."""
    yield msg
    for fd, value in msg.ListFields():
        if fd.message_type is None or is_map_field(fd) or fd.message_type.name in skip:
            continue
        for item in value if fd.is_repeated else [value]:
            yield from walk(item, skip)


def is_map_field(fd: Any) -> bool:
    return bool(fd.message_type is not None and fd.message_type.GetOptions().map_entry)


def assigned(header: Any) -> list[tuple[str, int]]:
    pairs: dict[tuple[str, int], None] = {}
    for feed in header.feeds:
        for partition in feed.partitions:
            pairs[(feed.feed_id, partition)] = None
            if len(pairs) >= MAX_ENDS:
                return list(pairs)
    return list(pairs)


def has_exchange_input(plan: Any) -> bool:
    return any(m.DESCRIPTOR.name == "ExchangeInput" for m in walk(plan, skip=("Expression",)))


def map_upload(seed: Seed, batches: Sequence[bytes] | None = None) -> list[dict[str, Any]]:
    """A map stage's input: schema, batches, end-of-input frame, half-close."""
    batches = seed.upload if batches is None else batches
    script = [op("begin", schema=schema_bytes(DATA_SCHEMA), compression=None)]
    script += [op("batch", ipc=b) for b in batches]
    end = input_end_frame(30 if batches is seed.upload else 0, len(batches))
    if end is not None and batches is seed.upload:
        script.append(op("frame", data=end))
    return script + [op("await_finished"), op("half_close")]


def task_script(cmd: bytes, seed: Seed) -> list[dict[str, Any]]:
    """What follows ``Ready``: units and feed ends for every assigned partition (or a map stage's input),
    a DoGet of the output (for at most SETTLE seconds: a mutated task may rightly wait for ever), the
    half-close. Built from the header as sent, mutations included, so that an accepted task can finish."""
    header = parse(P.TaskHeader, cmd)
    plan = parse(L.StagePlan, header.plan) if header is not None else None
    pairs = assigned(header) if header is not None else list(seed.units)
    is_map = has_exchange_input(plan) if plan is not None else seed.is_map
    script: list[dict[str, Any]] = []
    if pairs:
        script.append(op("wait_credits", count=len(pairs)))
    script += [op("frame", data=units_frame(f, p, seed.units[(f, p)])) for f, p in pairs if seed.units.get((f, p))]
    script += [op("frame", data=feed_end_frame(f, p)) for f, p in pairs]
    if is_map:
        return script + map_upload(seed)
    if header is not None and header.HasField("stage_key"):
        parts = plan.output.partitions if plan is not None and 1 <= plan.output.partitions <= MAX_ENDS else 1
        script.append(op("output", ticket=ser(make_ticket(header.stage_key, 0, parts))))
    script.append(op("half_close"))
    return script


def exchange_step(cmd: bytes, script: list[dict[str, Any]], label: str = "task") -> dict[str, Any]:
    return op("exchange", cmd=cmd, script=script, label=label)


def seed_steps(cmd: bytes, seed: Seed, script: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The case's steps: the task's exchange, inside its producer's when it reads one."""
    task = exchange_step(cmd, task_script(cmd, seed) if script is None else script)
    if seed.producer is None:
        return [task]
    return [exchange_step(seed.producer, [task, op("half_close")], "producer")]
