"""Families that hold resources or use the input call: hoarders, floods, and mutated input calls."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from google.protobuf.descriptor import FieldDescriptor

from benchmarks.fuzz.ipc_family import copy_header
from benchmarks.fuzz.mutator import INTS
from benchmarks.fuzz.proto import P, ser
from benchmarks.fuzz.scripts import feed_end_frame, frame_bytes, op
from benchmarks.fuzz.seeds import make_seed, make_ticket
from benchmarks.fuzz.settings import FLOOD_UNIT_SIZES, HOARD_TASKS

if TYPE_CHECKING:
    from benchmarks.fuzz.mutator import Mutator

__all__ = ["ABANDON", "FLOOD_VARIANTS", "INPUT_MUTATIONS", "INPUT_MUTATIONS_W", "MAX_OUTPUT_BUFFER", "flood_case", "hoard_case"]


def _input_raw_attach(rng: random.Random, m: Mutator, messages: list[dict[str, Any]], header: Any) -> None:
    messages[0] = op("frame", data=m.raw(messages[0]["data"], "CoordinatorFrame(attach)"))


def _input_other_key(rng: random.Random, m: Mutator, messages: list[dict[str, Any]], header: Any) -> None:
    key = P.StageKey()
    key.CopyFrom(header.stage_key)
    setattr(key, rng.choice(["stage_id", "task_number", "epoch"]), rng.choice([1, 7, 2**32 - 1]))
    secret = header.query_secret if rng.random() < 0.5 else rng.choice([b"", b"x" * 16, b"y" * 65])
    messages[0] = op("frame", data=frame_bytes(attach=P.InputAttach(stage_key=key, query_secret=secret)))
    m.note("input: attach to another key or with another secret")


def _input_drop(rng: random.Random, m: Mutator, messages: list[dict[str, Any]], header: Any) -> None:
    i = rng.randrange(len(messages))
    m.note(f"input: message {i} ({messages[i]['op']}) left out")
    del messages[i]


def _input_repeat(rng: random.Random, m: Mutator, messages: list[dict[str, Any]], header: Any) -> None:
    i = rng.randrange(len(messages))
    m.note(f"input: message {i} ({messages[i]['op']}) sent twice")
    messages.insert(i, dict(messages[i]))


def _input_end(rng: random.Random, m: Mutator, messages: list[dict[str, Any]], header: Any) -> None:
    rows, batches = rng.choice(INTS[FieldDescriptor.CPPTYPE_UINT64]), rng.choice(INTS[FieldDescriptor.CPPTYPE_UINT64])
    messages[-1] = op("frame", data=frame_bytes(input_end=P.InputEnd(rows=rows, batches=batches)))
    m.note(f"input: InputEnd says {rows} rows in {batches} batches")


def _input_foreign(rng: random.Random, m: Mutator, messages: list[dict[str, Any]], header: Any) -> None:
    other = rng.choice([frame_bytes(cancel=P.Cancel(reason="from an input call")), frame_bytes(release=P.Release()),
                        feed_end_frame("f", 0), b"", b"\xff" * 9, ser(P.WorkerFrame(heartbeat=P.Heartbeat()))])
    messages.insert(rng.randrange(len(messages) + 1), op("frame", data=other) if other else op("empty"))
    m.note("input: a frame an input call does not carry")


INPUT_MUTATIONS: dict[str, Callable[[random.Random, Mutator, list[dict[str, Any]], Any], None]] = {
    "raw_attach": _input_raw_attach, "other_key": _input_other_key, "drop": _input_drop, "repeat": _input_repeat,
    "end": _input_end, "foreign": _input_foreign,
}
INPUT_MUTATIONS_W = [("raw_attach", 3), ("other_key", 2), ("drop", 2), ("repeat", 2), ("end", 2), ("foreign", 2)]


# -- hoard and flood: a client holding what it may, within the protocol

ABANDON = ("cancel", "half-close", "release", "cancel-frame", "silent")
"""How a hoarder lets an exchange go: each then cancels the call (a hoarder that waited for the end of a
call still queued for capacity would wait for the worker's queue wait, 60 s)."""


def hoard_case(rng: random.Random, m: Mutator, qid: str) -> list[dict[str, Any]]:
    """20-70 exchanges of one query, each a task that waits for its client (a feed, a map stage's input),
    kept alive with Heartbeat frames for a few rounds, the worker's health asked meanwhile, then abandoned;
    afterwards the worker's ``info`` must count no running task."""
    count = rng.randint(*HOARD_TASKS)
    seed = make_seed(rng.choice(["parquet", "units", "exchange"]), "identity", qid, window=rng.choice([1, 4, 256]))
    cmds = []
    for i in range(count):
        header = copy_header(seed)
        header.stage_key.task_number = i
        header.task_count = count
        cmds.append(ser(header))
    how = rng.choice([*ABANDON, "mixed"])
    beats = rng.randint(2, 4)
    m.note(f"hoard {count} {seed.kind} tasks, {beats} heartbeat rounds, abandoned: {how}")
    return [op("hoard", cmds=cmds, beats=beats, abandon=how), op("await_idle")]


FLOOD_VARIANTS = ("units", "output", "map")


def flood_case(rng: random.Random, m: Mutator, qid: str) -> list[dict[str, Any]]:
    """(units) a units task with the largest credit window flooded with units of up to 1 MiB, as fast as
    credit allows; (output) the same with the largest output buffer while a DoGet of its output is open and
    never read; (map) a map stage sent 12 MiB batches while its output is never read. The worker must
    refuse (a protocol error, field ``app_metadata.units``) or hold the client back (the calls stall until
    their FLOOD_WAIT deadline); afterwards ``info`` must count no running task."""
    variant = rng.choice(FLOOD_VARIANTS)
    window = rng.choice([1 << 16, 2**32 - 1])
    m.note(f"flood: {variant}, window {window}")
    if variant == "map":
        seed = make_seed("exchange", rng.choice(["identity", "project"]), qid)
        header = copy_header(seed)
        header.options.output_buffer_bytes = rng.choice([MAX_OUTPUT_BUFFER, 1 << 30])
        batches = rng.randint(4, 16)
        return [op("flood", cmd=ser(header), batches=batches), op("await_idle")]
    template = "identity" if variant == "output" else rng.choice(["identity", "count", "filter_len"])
    seed = make_seed("units", template, qid, window=window)
    header = copy_header(seed)
    header.options.feed_window = window
    header.feeds[0].window = rng.choice([0, window])
    header.options.retain_output = False
    ticket = None
    if variant == "output":
        header.options.output_buffer_bytes = rng.choice([MAX_OUTPUT_BUFFER, 1 << 30])
        ticket = ser(make_ticket(header.stage_key, 0, 1))
    size = rng.choice(FLOOD_UNIT_SIZES)
    total = (MAX_OUTPUT_BUFFER + (64 << 20)) if variant == "output" else rng.choice([32 << 20, 96 << 20])
    m.note(f"units of {size >> 10} KiB, {total >> 20} MiB in all")
    return [op("flood", cmd=ser(header), feed="u", partition=0, unit=size, total=total, ticket=ticket), op("await_idle")]


MAX_OUTPUT_BUFFER = 256 << 20
"""The largest output buffer a worker grants (flight/wire/limits.py MAX_OUTPUT_BUFFER_BYTES); a larger one asked for is clamped."""
