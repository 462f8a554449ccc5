"""Families ``prepared`` and ``params``: prepared-statement handles forged, flipped, closed or another client's,
and parameters uploaded with the wrong columns, types, rows or sizes.

Why: a handle is a capability (16 random bytes) the service looks up on every later call, and a
DoPut's batches become the statement's parameter values (``flight/service/server.py``, ``do_put``):
a handle must never reach another statement's state, and no batch may crash the reader of its
values or be held whole before it is refused.
"""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa

from benchmarks.fuzz.data import ipc_stream, schema_bytes
from benchmarks.fuzz.ipc import item_names, offsets_array
from benchmarks.fuzz.mutator import Mutator
from benchmarks.fuzz.schemas import odd_types
from benchmarks.fuzz.scripts import op
from benchmarks.fuzz.service.sqlproto import FLIPPED, HANDLE, RELAY, S, pack, parameter_queries, statements

__all__ = ["params_case", "prepared_case"]


def _create(query: str) -> dict[str, Any]:
    return op("action", type="CreatePreparedStatement", body=pack(S.ActionCreatePreparedStatementRequest(query=query)))


def _use(rng: random.Random, handle: bytes, read: bool = True) -> dict[str, Any]:
    """A call naming ``handle``: run it, ask its schema, send it parameters, or redeem it as a relay ticket."""
    where = rng.choice(["info", "info", "schema", "put", "ticket"])
    if where == "ticket":
        return op("doget", ticket=pack(S.TicketStatementQuery(statement_handle=handle)))
    cmd = pack(S.CommandPreparedStatementQuery(prepared_statement_handle=handle))
    if where == "put":
        batch = pa.record_batch([pa.array([3], pa.int64())], names=["1"])
        return op("put", cmd=cmd, schema=schema_bytes(batch.schema), batches=[ipc_stream(batch.schema, [batch])], compression=None)
    return op(where, cmd=cmd, read=read)


FORGED = [b"", b"\x00", b"x" * 15, b"x" * 17, b"\xff" * 16, b"\x00" * 16, b"h" * 65_536, b"h" * (1 << 20), b"nope"]


def prepared_case(rng: random.Random, m: Mutator) -> list[dict[str, Any]]:
    """A prepared statement made, then named wrongly: flipped, closed, forged, another client's, a relay handle."""
    variant = rng.choice(["valid", "flipped", "closed", "forged", "other-client", "relay-as-prepared", "prepared-as-relay", "cancel-read",
                          "read-twice", "transaction", "close-garbage"])
    m.note(f"prepared: {variant}")
    steps = [_create(rng.choice(statements()))]
    if variant == "valid":
        steps.append(_use(rng, HANDLE))
    elif variant == "flipped":
        steps.append({**_use(rng, FLIPPED), "flip": rng.randrange(128)})
    elif variant == "closed":
        close = op("action", type="ClosePreparedStatement", body=pack(S.ActionClosePreparedStatementRequest(prepared_statement_handle=HANDLE)))
        steps += [close, _use(rng, HANDLE)] + ([close] if rng.random() < 0.5 else [])
    elif variant == "forged":
        steps.append(_use(rng, rng.choice(FORGED + [rng.randbytes(16)])))
    elif variant == "other-client":
        steps.append({**_use(rng, HANDLE), "client": "fresh"})
    elif variant in ("relay-as-prepared", "prepared-as-relay", "cancel-read", "read-twice"):
        steps.append(op("info", cmd=pack(S.CommandStatementQuery(query=rng.choice(statements()))), read=False, keep_relay=True))
        if variant == "relay-as-prepared":
            steps.append(_use(rng, RELAY))
        elif variant == "prepared-as-relay":
            steps.append(op("doget", ticket=pack(S.TicketStatementQuery(statement_handle=HANDLE))))
        elif variant == "cancel-read":
            steps += [op("cancel_last", how=rng.choice(["CancelFlightInfo", "CancelQuery"])), op("read_last")]
        else:
            steps += [op("read_last"), op("read_last")]
    elif variant == "transaction":
        request = S.ActionCreatePreparedStatementRequest(query="SELECT 1 AS one", transaction_id=rng.choice([b"", b"tx", b"\xff" * 64]))
        steps.append(op("action", type="CreatePreparedStatement", body=pack(request)))
    else:
        body = rng.choice([b"", b"\xff" * 9, pack(S.ActionClosePreparedStatementRequest(prepared_statement_handle=rng.choice(FORGED))),
                           pack(S.CommandStatementQuery(query="SELECT 1"))])
        steps.append(op("action", type="ClosePreparedStatement", body=body))
    return steps + [op("close_all")]


# ------------------------------------------------------------------ params


def _column(rng: random.Random, m: Mutator) -> pa.Array:
    """One value of a hostile type or size."""
    kind = rng.choice(["odd-type", "odd-type", "huge-string", "offsets", "extreme", "null", "nested", "binary"])
    m.note(f"parameter {kind}")
    if kind == "odd-type":
        odd: pa.DataType = rng.choice(odd_types())
        return pa.nulls(1, odd)  # type: ignore[call-overload]  # any type has nulls; the stubs list them one by one
    if kind == "huge-string":
        return pa.array(["x" * rng.choice([1 << 10, (1 << 20) - 200, (1 << 20) + 1, 4 << 20])])
    if kind == "offsets":
        texts: list[pa.DataType] = [pa.string(), pa.binary()]
        text = rng.choice(texts)
        column, how = offsets_array(text, item_names(3), rng)
        m.note(f"offsets {how}")
        return column.slice(0, 1) if rng.random() < 0.5 else column
    if kind == "extreme":
        return rng.choice([pa.array([2**63 - 1]), pa.array([-(2**63)]), pa.array([2**64 - 1], pa.uint64()), pa.array([float("nan")]),
                           pa.array([float("inf")]), pa.array([10**37], pa.decimal128(38, 0)), pa.array([2**31 - 1], pa.date32()),
                           pa.array([-(2**62)], pa.timestamp("ns", tz="UTC")), pa.array([2**62], pa.duration("s"))])
    if kind == "null":
        return pa.nulls(1)
    if kind == "nested":
        typ: pa.DataType = pa.int64()
        for _ in range(rng.choice([2, 30, 60])):
            typ = pa.struct([("s", typ)]) if rng.random() < 0.5 else pa.list_(typ)
        return pa.nulls(1, typ)  # type: ignore[call-overload]  # as above
    return pa.array([b"\xff\xfe\x00"], pa.binary())


def _batches(rng: random.Random, m: Mutator) -> tuple[pa.Schema, list[pa.RecordBatch]]:
    shape = rng.choice(["one", "one", "no-columns", "extra", "two-rows", "zero-rows", "many-batches", "wide", "no-batches", "duplicate"])
    m.note(f"parameters: {shape}")
    one = _column(rng, m)
    if shape == "no-columns":
        schema = pa.schema([])
        return schema, [pa.RecordBatch.from_arrays([], schema=schema)]
    if shape == "extra":
        arrays = [one, pa.array([1]), pa.array(["a"]), pa.array([2.5])]
        arrays = [a.slice(0, 1) for a in arrays]
        return _batch(arrays, ["1", "2", "3", "4"])
    if shape == "two-rows":
        return _batch([pa.array([1, 2])], ["1"])
    if shape == "zero-rows":
        return _batch([pa.array([], pa.int64())], ["1"])
    if shape == "many-batches":
        schema, batch = _batch([pa.array([], pa.int64())], ["1"])
        return schema, batch * rng.choice([100, 5_000])
    if shape == "wide":
        return _wide(rng.choice([1_000, 5_000]))
    if shape == "no-batches":
        return pa.schema([pa.field("1", pa.int64())]), []
    if shape == "duplicate":
        return _batch([pa.array([1]), pa.array(["x"])], ["1", "1"])
    return _batch([one], ["1"])


def _batch(arrays: list[pa.Array], names: list[str]) -> tuple[pa.Schema, list[pa.RecordBatch]]:
    batch = pa.RecordBatch.from_arrays(arrays, names=names)
    return batch.schema, [batch]


def _wide(count: int) -> tuple[pa.Schema, list[pa.RecordBatch]]:
    return _batch([pa.array([i]) for i in range(count)], [str(i + 1) for i in range(count)])


def params_case(rng: random.Random, m: Mutator) -> list[dict[str, Any]]:
    """A prepared statement with parameters, sent hostile parameter batches, then run and read."""
    query = rng.choice(parameter_queries() + statements()[:1])
    schema, batches = _batches(rng, m)
    compression = rng.choice([None, None, "zstd", "lz4"])
    cmd = pack(S.CommandPreparedStatementQuery(prepared_statement_handle=HANDLE))
    put = op("put", cmd=cmd, schema=schema_bytes(schema), batches=[ipc_stream(schema, [b]) for b in batches], compression=compression)
    if rng.random() < 0.1:
        put["schema"] = m.schema(put["schema"], "parameters' schema")
    steps = [_create(query), put, op("info", cmd=cmd, read=True)]
    if rng.random() < 0.2:
        steps.insert(2, dict(put))  # parameters twice
    return steps + [op("close_all")]

