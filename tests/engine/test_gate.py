"""The gate between a task's reader and its streaming plan's sources (``flight.engine.gate``), with real Acero plans.

A plan whose reader is away may compute at most the gate's bound ahead; a reader that waits on the
plan (a filter dropping every row) never holds it back; a reader that stops lets every source go,
so the plan closes. The rows are pyarrow's own: what comes out is what went in, filtered.
"""

from __future__ import annotations

import threading

import pyarrow as pa
import pyarrow.acero as ac
import pyarrow.compute as pc
import pytest
from support import wait_until

from flight.engine.gate import Gate, streaming
from flight.wire._proto import plan_pb2

BATCH = pa.record_batch({"x": pa.array(range(1024), pa.int64())})  # 8 KiB


def _plan(gate: Gate, batches: int, counter: list[int], predicate: pc.Expression | None = None) -> pa.RecordBatchReader:
    def source() -> object:
        for _ in range(batches):
            counter[0] += 1
            yield BATCH

    reader = pa.RecordBatchReader.from_batches(BATCH.schema, gate.source(source()))  # type: ignore[arg-type]
    decl = ac.Declaration("record_batch_reader_source", ac.RecordBatchReaderSourceNodeOptions(reader))  # type: ignore[attr-defined]
    if predicate is not None:
        decl = ac.Declaration.from_sequence([decl, ac.Declaration("filter", ac.FilterNodeOptions(predicate))])
    return gate.output(decl.to_reader(use_threads=True))


def test_a_reader_that_is_away_holds_the_plan_within_the_bound() -> None:
    gate, taken = Gate(bound=10 * BATCH.nbytes), [0]
    out = _plan(gate, 10_000, taken)
    first = out.read_next_batch()
    wait_until(lambda: gate.held == 1, 10.0, "the source to wait at the gate")  # the reader is away: at most the bound more
    held = taken[0]
    assert gate.held == 1 and taken[0] == held and held < 200, (held, taken[0])  # what ran while the reader waited, plus the bound
    rows = first.num_rows + sum(b.num_rows for b in out)  # back again: everything comes through
    assert rows == 10_000 * 1024 and taken[0] == 10_000


def test_a_reader_waiting_on_a_filter_that_drops_everything_never_stalls_the_plan() -> None:
    gate, taken = Gate(bound=BATCH.nbytes), [0]
    out = _plan(gate, 5_000, taken, pc.field("x") < -1)
    assert out.read_all().num_rows == 0 and taken[0] == 5_000


def test_a_reader_that_stops_lets_its_waiting_sources_go() -> None:
    gate, taken = Gate(bound=2 * BATCH.nbytes), [0]
    out = _plan(gate, 1_000_000, taken)
    out.read_next_batch()
    wait_until(lambda: gate.held == 1, 10.0, "the source to wait at the gate")
    closed = threading.Thread(target=out.close, daemon=True)
    closed.start()
    closed.join(10)
    assert not closed.is_alive(), "closing the reader waited for a source held at the gate"
    assert taken[0] < 1_000_000


@pytest.mark.parametrize(
    "kind, gated",
    [("filter", True), ("project", True), ("union", True), ("aggregate", False), ("hash_join", False), ("sort", False), ("window", False)],
)
def test_only_plans_that_pass_batches_on_are_gated(kind: str, gated: bool) -> None:
    leaf = plan_pb2.Operator(exchange_input=plan_pb2.ExchangeInput())
    body = {"union": lambda: plan_pb2.Union(inputs=[leaf, leaf]), "hash_join": lambda: plan_pb2.HashJoin(left=leaf, right=leaf)}
    op = plan_pb2.Operator(**{kind: body[kind]() if kind in body else getattr(plan_pb2, kind.title().replace("_", ""))(input=leaf)})
    assert streaming(op) is gated
