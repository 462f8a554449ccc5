"""The ``ticket`` and ``action`` families: DoGet tickets and DoAction bodies mutated (never ``drain``)."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from benchmarks.fuzz.mutator import short_repr, weighted
from benchmarks.fuzz.proto import P, parse, ser
from benchmarks.fuzz.scripts import exchange_step, map_upload, op
from benchmarks.fuzz.seeds import cancel_request, make_seed, make_ticket

if TYPE_CHECKING:
    from benchmarks.fuzz.mutator import Mutator

__all__ = ["action_body", "action_case", "action_type", "expects_wait", "format_key", "ticket_case"]


# -- ticket: DoGet

def format_key(key: Any) -> str:
    """How the worker names a task (``flight.wire.protocol.format_stage_key``, written again: the
    fuzzer is the doc's reader, not the code's)."""
    epoch = getattr(key, "epoch", 0)
    return f"{key.query_id}/{key.stage_id}/{key.task_number}" + (f"@{epoch}" if epoch else "")


def expects_wait(ticket: bytes, known: Any) -> bool:
    """Whether the worker will rightly wait (10 s) for the ticket's task to appear: it names a task that never ran."""
    t = parse(P.Ticket, ticket)
    if t is None or not t.HasField("stage_key") or not t.stage_key.query_id or t.partition_end <= t.partition_start:
        return False
    return format_key(t.stage_key) != format_key(known)


def _mutate_ticket(m: Mutator, ticket: Any) -> bytes:
    kind = weighted(m.rng, [("struct", 55), ("raw", 30), ("special", 15)])
    if kind == "struct":
        m.message(ticket, "Ticket")
        return ser(ticket)
    if kind == "raw":
        return m.raw(ser(ticket), "Ticket")
    special = m.rng.choice(["empty", "end-max", "start-eq-end", "start-gt-end", "end-plus-one", "long-id", "no-key"])
    m.note(f"Ticket: {special}")
    if special == "empty":
        return b""
    if special == "end-max":
        ticket.partition_end = 2**32 - 1
    elif special == "start-eq-end":
        ticket.partition_start = ticket.partition_end
    elif special == "start-gt-end":
        ticket.partition_start = ticket.partition_end + 1
    elif special == "end-plus-one":
        ticket.partition_end += 1
    elif special == "long-id":
        ticket.stage_key.query_id = "q" * 70_000
    else:
        ticket.ClearField("stage_key")
    return ser(ticket)


def ticket_case(rng: random.Random, m: Mutator, qid: str) -> list[dict[str, Any]]:
    """A DoGet with a mutated ticket for a task that is live (its output unread), ended, or a map stage."""
    variant = rng.choice(["live", "live", "ended", "map", "twice"])
    parts = rng.choice([1, 3])
    kind = "exchange" if variant == "map" else "values"
    seed = make_seed(kind, "partitioned" if parts == 3 and kind == "values" else "identity", qid, compression=rng.choice([0, 1, 2]))
    if kind == "exchange":
        parts = 1
    key = seed.header.stage_key
    data = _mutate_ticket(m, make_ticket(key, 0, parts))
    get = op("doget", ticket=data, short=expects_wait(data, key))
    m.note(f"ticket for a {variant} task")
    cmd = ser(seed.header)
    if variant == "map":
        return [exchange_step(cmd, [get] + map_upload(seed), "producer")]
    if variant == "ended":
        return [exchange_step(cmd, [op("half_close")], "producer"), get]
    script = [get] + ([dict(get)] if variant == "twice" else []) + [op("half_close")]
    return [exchange_step(cmd, script, "producer")]


# -- action: DoAction and ListActions

def action_type(m: Mutator) -> str:
    """A mutated action name; never exactly ``drain`` (which disables the worker for good)."""
    base = m.rng.choice(["health", "info", "cancel"])
    how = m.rng.choice(["keep", "keep", "flip", "truncate", "upper", "append", "huge", "empty", "unicode", "random"])
    if how == "flip":
        i = m.rng.randrange(len(base))
        name = base[:i] + chr(ord(base[i]) ^ (1 << m.rng.randrange(7))) + base[i + 1:]
    else:
        name = {"keep": base, "truncate": base[: m.rng.randrange(len(base))], "upper": base.upper(), "append": base + "\x00",
                "huge": base * 20_000, "empty": "", "unicode": base + "\u202e\U0001f4a5",
                "random": "".join(m.rng.choice("abcdefghijklmnopqrstuvwxyz_-") for _ in range(8))}[how]
    m.note(f"action type {short_repr(name)}")
    return name if name != "drain" else "drain!"


def action_body(m: Mutator, kind: str, qid: str) -> bytes:
    request = cancel_request(qid)
    if kind == "cancel" or m.rng.random() < 0.2:
        how = m.rng.choice(["keep", "struct", "struct", "raw"])
        if how == "struct":
            m.message(request, "CancelRequest")
        return m.raw(ser(request), "CancelRequest") if how == "raw" else ser(request)
    return bytes(m.rng.choice([b"", m.rng.randbytes(16), b"\x00" * (1 << 20), ser(request)]))


def action_case(rng: random.Random, m: Mutator, qid: str) -> list[dict[str, Any]]:
    variant = weighted(rng, [("plain", 50), ("cancel-live", 30), ("info-live", 15), ("list", 5)])
    m.note(f"action {variant}")
    if variant == "list":
        return [op("list_actions")]
    if variant == "cancel-live":
        seed = make_seed("parquet", "identity", qid, window=2)
        act = op("action", type="cancel", body=action_body(m, "cancel", qid))
        # Ready carries the two partitions' first windows (protocol 12): the cancel comes once the task is admitted,
        # when its pipeline may not have started yet (before, the credit frames came from the pipeline's thread).
        script = [op("wait_credits", count=2), act, op("half_close")]
        return [exchange_step(ser(seed.header), script)]
    kind = action_type(m)
    act = op("action", type=kind, body=action_body(m, kind, qid))
    if variant == "info-live":
        seed = make_seed("values", "identity", qid)
        return [exchange_step(ser(seed.header), [act, op("half_close")])]
    return [act]
