"""``Generator``: case ``i`` of a seed, a function of the seed and ``i`` only, drawn from the families."""

from __future__ import annotations

import random
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from google.protobuf.message import DecodeError, EncodeError

from benchmarks.fuzz.calls import action_case, ticket_case
from benchmarks.fuzz.cases import Case, unsafe_reason
from benchmarks.fuzz.data import DATA_SCHEMA, schema_bytes
from benchmarks.fuzz.frames import all_ended, mutate_frames
from benchmarks.fuzz.headers import HEADER_MUTATIONS, HEADER_OPS, HEADER_OPS_W
from benchmarks.fuzz.ipc_family import IPC_FAMILY, IPC_TARGETS
from benchmarks.fuzz.maps import MAP_UPLOADS, MAP_VARIANTS, insert_extra, mutate_exchange_schema, set_exchange_schema
from benchmarks.fuzz.mutator import Mutator, weighted
from benchmarks.fuzz.proto import L, P, parse, ser
from benchmarks.fuzz.resources import INPUT_MUTATIONS, INPUT_MUTATIONS_W, flood_case, hoard_case
from benchmarks.fuzz.scripts import assigned, exchange_step, frame_bytes, op, seed_steps, task_script, walk
from benchmarks.fuzz.seeds import SOURCES, make_seed, make_ticket, templates_for
from benchmarks.fuzz.settings import GET_WAIT_S, SELF_URL

if TYPE_CHECKING:
    from benchmarks.fuzz.seeds import Seed

__all__ = ["FAMILIES", "GENERATION_ERRORS", "RESOURCE_FAMILIES", "Generator", "seed_case"]


# ----------------------------------------------------------------- generator

GENERATION_ERRORS = (pa.ArrowException, OSError, ValueError, TypeError, IndexError, struct.error, RecursionError, DecodeError, EncodeError)
FAMILIES: dict[str, float] = {"header": 30, "frames": 20, "map": 15, "ipc": 20, "ticket": 8, "action": 7}
RESOURCE_FAMILIES: dict[str, float] = {"hoard": 1.5, "flood": 1.5, "input": 2}
"""Cases per 100 drawn with a random generator of their own, so that every other case of a seed stays what it
was before they existed: those that hold the worker's resources (tasks, memory) rather than send it malformed
input (hoard, flood), and input calls (input: protocol 5), added after the others."""


class Generator:
    """Case ``index`` for ``seed``: depends on nothing else (so any case can be produced again)."""

    def __init__(self, seed: int, families: Sequence[str] | None = None) -> None:
        self.seed = seed
        self.families = [(f, w) for f, w in FAMILIES.items() if not families or f in families]
        self.resource = [(f, w) for f, w in RESOURCE_FAMILIES.items() if not families or f in families]
        if not self.families and not self.resource:
            raise ValueError(f"no such families {families}; known: {', '.join([*FAMILIES, *RESOURCE_FAMILIES])}")
        donors = [make_seed(k, t, "donor") for k, t in (("values", "project"), ("parquet", "join"), ("exchange", "sort"))]
        self.donors = [ser(s.header) for s in donors] + [frame_bytes(cancel=P.Cancel(reason="donor"))]

    def case(self, index: int) -> Case:
        rng = random.Random(f"flight-exec-fuzz/{self.seed}/{index}")
        family = self._family(index, rng)
        make = getattr(self, f"_{family}")
        for _ in range(20):
            m = Mutator(rng, self.donors)
            try:
                steps, files = make(rng, m, f"fz{self.seed}-{index}")
            except GENERATION_ERRORS:
                continue  # a corruption the client side cannot build (too deep for pyarrow, say): draw again
            case = Case(family, index, self.seed, "; ".join(m.notes) or "unmutated", steps, files)
            if unsafe_reason(case) is None:
                return case
        seed = make_seed("values", "identity", f"fz{self.seed}-{index}")
        return Case(family, index, self.seed, "unmutated (every mutation drawn was unsafe)", seed_steps(ser(seed.header), seed))

    def _family(self, index: int, rng: random.Random) -> str:
        """A resource family in RESOURCE_FAMILIES' share of cases (its own draw), else one of FAMILIES (from ``rng``)."""
        if self.resource:
            own = random.Random(f"flight-exec-fuzz/{self.seed}/{index}/resource")
            if not self.families or own.random() * 100 < sum(w for _, w in self.resource):
                return str(weighted(own, self.resource))
        return str(weighted(rng, self.families))

    def pick_seed(self, rng: random.Random, qid: str, kinds: Sequence[str] = SOURCES, templates: Sequence[str] | None = None) -> Seed:
        kind = rng.choice(list(kinds))
        allowed = [t for t in templates_for(kind) if templates is None or t in templates] or list(templates_for(kind))
        return make_seed(kind, rng.choice(allowed), qid, window=rng.choice([1, 2, 4, 8]), compression=rng.choice([0, 0, 1, 2]))

    # -- header: the DoExchange descriptor
    def _header(self, rng: random.Random, m: Mutator, qid: str) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
        seed = self.pick_seed(rng, qid)
        header = P.TaskHeader()
        header.CopyFrom(seed.header)
        ops = sorted(rng.choices(HEADER_OPS, weights=[w for _, w in HEADER_OPS_W], k=rng.choice([1, 1, 1, 2, 3])),
                     key=lambda o: o in ("raw", "splice"))
        cmd = b""
        for name in ops:  # structured ones first: raw bytes cannot be mutated structurally
            if name == "raw":
                cmd = m.raw(cmd or ser(header), "TaskHeader")
            elif name == "splice":
                cmd = bytes(m.splice(bytearray(cmd or ser(header))))
                m.note("TaskHeader: splice with another seed")
            else:
                HEADER_MUTATIONS[name](m, header)
        steps = seed_steps(cmd or ser(header), seed)
        if SELF_URL.encode() in (cmd or ser(header)):  # it reads producers on this worker that never run: each waits --get-wait
            steps.insert(0, op("extend", seconds=GET_WAIT_S))
        return steps, {}

    # -- frames: CoordinatorFrames and other messages on an open leaf exchange
    def _frames(self, rng: random.Random, m: Mutator, qid: str) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
        seed = self.pick_seed(rng, qid, kinds=("parquet", "csv", "ipc", "units"))
        cmd = ser(seed.header)
        script = task_script(cmd, seed)
        for _ in range(rng.choice([1, 1, 2, 3])):
            mutate_frames(m, script, seed)
        if not all_ended(script, assigned(seed.header)):
            script = [s for s in script if s["op"] != "output"]  # it cannot finish: do not wait for its output
        return seed_steps(cmd, seed, script), {}

    # -- input: an input call feeding a task whose ExchangeInput has separate_input (docs/protocol.md §16)
    def _input(self, rng: random.Random, m: Mutator, qid: str) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
        seed = self.pick_seed(rng, qid, kinds=("exchange",))
        header = P.TaskHeader()
        header.CopyFrom(seed.header)
        plan = L.StagePlan.FromString(header.plan)
        inputs: list[Any] = [msg for msg in walk(plan, skip=("Expression",)) if msg.DESCRIPTOR.name == "ExchangeInput"]
        for msg in inputs:
            msg.separate_input, msg.input_id = True, "fuzz:input"
        header.plan = ser(plan)
        cmd = ser(header)
        attach = frame_bytes(attach=P.InputAttach(stage_key=header.stage_key, query_secret=header.query_secret))
        messages = [op("frame", data=attach), op("begin", schema=schema_bytes(DATA_SCHEMA), compression=None)]
        messages += [op("batch", ipc=b) for b in seed.upload]
        messages.append(op("frame", data=frame_bytes(input_end=P.InputEnd(rows=30, batches=len(seed.upload)))))
        for _ in range(rng.choice([1, 1, 2])):
            INPUT_MUTATIONS[weighted(rng, INPUT_MUTATIONS_W)](rng, m, messages, header)
        first = parse(P.CoordinatorFrame, messages[0]["data"]) if messages and messages[0]["op"] == "frame" else None
        named = first.attach.stage_key if first is not None and first.WhichOneof("frame") == "attach" else None
        script = [op("input_call", messages=messages, short=named is not None and named != header.stage_key)]
        if rng.random() < 0.2:
            script.append(op("input_call", messages=[op("frame", data=attach)]))  # a second call for the same task
            m.note("input: a second input call")
        script += [op("output", ticket=ser(make_ticket(header.stage_key, 0, 1))), op("half_close")]
        return [exchange_step(cmd, script)], {}

    # -- map: record batches (and frames) up a map stage's exchange
    def _map(self, rng: random.Random, m: Mutator, qid: str) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
        variant = weighted(rng, MAP_VARIANTS)
        # Hundreds of MB of zeros go to an aggregate: the point is the inflation, not streaming them back.
        seed = self.pick_seed(rng, qid, kinds=("exchange",), templates=("aggregate",) if variant == "zeros" else None)
        declared, upload = MAP_UPLOADS[variant](m)
        m.note(f"map input {variant}")
        header = P.TaskHeader()
        header.CopyFrom(seed.header)
        if declared is not None:
            set_exchange_schema(header, declared)
        if rng.random() < 0.15:
            mutate_exchange_schema(m, header)
        cmd = ser(header)
        script = [s for s in task_script(cmd, seed) if s["op"] not in ("begin", "batch", "frame", "await_finished", "half_close")]
        script += upload
        for _ in range(rng.choice([0, 1, 1, 2])):
            insert_extra(m, script, seed, map_stage=True)
        return seed_steps(cmd, seed, script), {}

    # -- ipc: Arrow IPC payloads inside plans and in the files units name
    def _ipc(self, rng: random.Random, m: Mutator, qid: str) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
        target = weighted(rng, IPC_TARGETS)
        return IPC_FAMILY[target](self, rng, m, qid)

    # -- ticket: DoGet
    def _ticket(self, rng: random.Random, m: Mutator, qid: str) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
        return ticket_case(rng, m, qid), {}

    # -- action: DoAction (never drain) and ListActions
    def _action(self, rng: random.Random, m: Mutator, qid: str) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
        return action_case(rng, m, qid), {}

    # -- hoard: many live exchanges kept alive with heartbeats, then abandoned
    def _hoard(self, rng: random.Random, m: Mutator, qid: str) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
        return hoard_case(rng, m, qid), {}

    # -- flood: as much memory as a client may make a task hold
    def _flood(self, rng: random.Random, m: Mutator, qid: str) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
        return flood_case(rng, m, qid), {}


def seed_case(kind: str, template: str, index: int) -> Case:
    """The unmutated seed ``kind``/``template`` as a case (``--check-seeds``)."""
    seed = make_seed(kind, template, f"seed-{kind}-{template}-{index}")
    return Case("seed", index, 0, f"seed {kind}/{template}", seed_steps(ser(seed.header), seed))
