"""The ``ipc`` family: where Arrow IPC payloads travel (Values, literals, value sets, schemas, IPC files)."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from benchmarks.fuzz.data import DATA_SCHEMA, DATA_TOKEN, data_table, ipc_file, schema_bytes, table_stream
from benchmarks.fuzz.headers import plan_of
from benchmarks.fuzz.ipc import item_names, offsets_array, replace_name
from benchmarks.fuzz.proto import P, ser
from benchmarks.fuzz.scripts import seed_steps
from benchmarks.fuzz.seeds import NAME_TEMPLATES, file_unit, make_seed

if TYPE_CHECKING:
    from benchmarks.fuzz.generator import Generator
    from benchmarks.fuzz.mutator import Mutator
    from benchmarks.fuzz.seeds import Seed

__all__ = ["IPC_FAMILY", "IPC_TARGETS", "copy_header", "ipc_target_file", "ipc_target_output_schema", "ipc_target_scan_schema", "ipc_target_values"]


# -- ipc: where Arrow IPC payloads travel

def _replace(m: Mutator, header: Any, owner: str, name: str, make: Callable[[bytes, str], bytes]) -> bool:
    """Set one embedded bytes field ``owner.name`` in the header's tree to ``make(old, path)``."""
    slots = [s for s in m.slots(header, "TaskHeader") if s.owner.DESCRIPTOR.name == owner and s.fd.name == name]
    if not slots:
        return False
    slot = slots[0] if m.rng.random() < 0.7 else m.rng.choice(slots)
    setattr(slot.owner, name, make(getattr(slot.owner, name), slot.path))
    slot.commit()
    return True


def _ipc_case(seed: Seed, header: Any) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
    return seed_steps(ser(header), seed), {}


def copy_header(seed: Seed) -> Any:
    header = P.TaskHeader()
    header.CopyFrom(seed.header)
    return header


def ipc_target_values(gen: Generator, rng: random.Random, m: Mutator, qid: str) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
    seed = make_seed("values", rng.choice(NAME_TEMPLATES), qid, compression=rng.choice([0, 1, 2]))
    header = copy_header(seed)
    _replace(m, header, "Values", "ipc_stream", lambda d, p: m.ipc(d, "values", p))
    return _ipc_case(seed, header)


def _ipc_in_expression(
    owner: str, name: str, role: str,
) -> Callable[[Generator, random.Random, Mutator, str], tuple[list[dict[str, Any]], dict[str, bytes]]]:
    def make(gen: Generator, rng: random.Random, m: Mutator, qid: str) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
        seed = make_seed(rng.choice(["values", "parquet", "exchange"]), "project", qid)
        header = copy_header(seed)
        if role == "schema":
            _replace(m, header, owner, name, m.schema)
        else:
            _replace(m, header, owner, name, lambda d, p: m.ipc(d, role, p))
        return _ipc_case(seed, header)

    return make


def ipc_target_scan_schema(gen: Generator, rng: random.Random, m: Mutator, qid: str) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
    seed = gen.pick_seed(rng, qid, kinds=("parquet", "csv", "ipc", "units", "exchange", "shuffle"))
    header = copy_header(seed)
    for owner in ("FeedScan", "ExchangeInput", "ShuffleRead"):
        if _replace(m, header, owner, "schema", m.schema):
            break
    return _ipc_case(seed, header)


def ipc_target_output_schema(gen: Generator, rng: random.Random, m: Mutator, qid: str) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
    seed = gen.pick_seed(rng, qid)
    header = copy_header(seed)
    plan = plan_of(header)
    plan.output_schema = m.schema(schema_bytes(DATA_SCHEMA), "StagePlan.output_schema")
    header.plan = ser(plan)
    return _ipc_case(seed, header)


def ipc_target_file(gen: Generator, rng: random.Random, m: Mutator, qid: str) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
    """A feed scan with the ``ipc`` reader over a corrupted Arrow IPC file (stream or file format)."""
    seed = make_seed("ipc", rng.choice(NAME_TEMPLATES[:-2] + ("limit", "filter")), qid)
    how = rng.choice(["stream", "stream", "file-offsets", "file-raw"])
    if how == "stream":
        content = m.ipc(table_stream(data_table(20)), "values", "file")
    elif how == "file-offsets":
        column, kind = offsets_array(pa.string(), item_names(20), rng)
        m.note(f"IPC file, name offsets {kind}")
        table = replace_name(data_table(20), column)
        content = ipc_file(table.schema, table.to_batches())
    else:
        content = m.raw(ipc_file(DATA_SCHEMA, data_table(20).to_batches()), "IPC file")
    name = f"c-{hashlib.sha256(content).hexdigest()[:16]}.arrow"
    seed.units = {pair: [file_unit(f"{DATA_TOKEN}/{name}")] for pair in seed.units}
    return seed_steps(ser(seed.header), seed), {name: content}


IPC_TARGETS: list[tuple[str, float]] = [
    ("values", 40), ("literal", 7), ("value_set", 7), ("target_type", 7), ("scan_schema", 14), ("file", 20), ("output_schema", 5),
]
IPC_FAMILY: dict[str, Callable[[Generator, random.Random, Mutator, str], tuple[list[dict[str, Any]], dict[str, bytes]]]] = {
    "values": ipc_target_values,
    "literal": _ipc_in_expression("Literal", "arrow", "literal"),
    "value_set": _ipc_in_expression("SetLookupOptions", "value_set", "value_set"),
    "target_type": _ipc_in_expression("CastOptions", "target_type", "schema"),
    "scan_schema": ipc_target_scan_schema,
    "output_schema": ipc_target_output_schema,
    "file": ipc_target_file,
}
