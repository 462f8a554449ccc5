"""The worker's bookkeeping driven without sockets: credits, buffers, registry, header checks."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest
from support import wait_until

from flight.errors import ProtocolError, TaskCancelledError, TaskFailedError, VersionMismatchError
from flight.wire._proto import plan_pb2, protocol_pb2
from flight.wire.limits import MAX_PROJECTED
from flight.wire.plan_codec import encode_plan
from flight.wire.protocol import PROTOCOL_VERSION, decode_header, decode_ticket
from flight.worker.admission import Admission, Refusal
from flight.worker.buffers import OutputBuffer
from flight.worker.capacity import Capacity, Need
from flight.worker.inputs import FeedInbox


def units(n: int) -> list[protocol_pb2.WorkUnit]:
    return [protocol_pb2.WorkUnit(body=bytes([i % 256]), created_unix_nanos=1, sent_unix_nanos=2) for i in range(n)]


def test_inbox_grants_its_window_then_tops_up_in_chunks() -> None:
    grants: list[int] = []
    inbox = FeedInbox("f", 0, window=8, send_credit=grants.append)
    assert inbox.open() == 8 and grants == []  # the first window goes in the task's Ready frame (protocol 12)
    inbox.deliver(units(8))
    taken = [inbox.take(1) for _ in range(3)]
    assert all(len(t) == 1 for t in taken) and grants == []  # 5 outstanding > 8 // 2
    inbox.take(1)
    assert grants == [4]  # 4 outstanding: topped up back to the window
    with pytest.raises(ProtocolError, match="credits") as info:
        inbox.deliver(units(9))
    assert info.value.field == "app_metadata.units"


def test_inbox_end_and_units_after_end() -> None:
    inbox = FeedInbox("f", 3, window=4, send_credit=lambda n: None)
    inbox.open()
    inbox.deliver(units(2))
    inbox.end()
    assert len(list(inbox)) == 2
    assert inbox.take(1) == []
    with pytest.raises(ProtocolError, match="after its FeedEnd"):
        inbox.deliver(units(1))


def test_inbox_failure_wakes_a_waiting_reader() -> None:
    inbox = FeedInbox("f", 0, window=4, send_credit=lambda n: None)
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            inbox.take(1)
        except TaskCancelledError as exc:
            errors.append(exc)

    t = threading.Thread(target=reader)
    t.start()
    inbox.fail(TaskCancelledError("stop"))
    t.join(5)
    assert not t.is_alive() and len(errors) == 1


def batch(n: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array(range(n), pa.int64())], names=["x"])


def test_output_buffer_blocks_the_producer_until_read() -> None:
    buf = OutputBuffer(1, max_bytes=batch(100).nbytes)
    buf.put(0, batch(100))
    produced = threading.Event()

    def producer() -> None:
        buf.put(0, batch(100))
        produced.set()
        buf.finish()

    t = threading.Thread(target=producer)
    t.start()
    assert not produced.wait(0.2), "the producer should wait while the buffer is full"
    got = list(buf.read(0))
    t.join(5)
    assert [b.num_rows for b in got] == [100, 100] and buf.buffered_bytes == 0
    assert buf.all_drained()
    with pytest.raises(TaskCancelledError, match="already"):
        list(buf.read(0))


def test_output_buffer_failure_reaches_the_reader() -> None:
    buf = OutputBuffer(2, max_bytes=1 << 20)
    buf.put(1, batch(3))
    buf.fail(TaskCancelledError("gone"))
    with pytest.raises(TaskCancelledError, match="gone"):
        list(buf.read(1))


def test_a_retained_output_is_read_any_number_of_times_from_the_start(tmp_path) -> None:  # type: ignore[no-untyped-def]
    buf = OutputBuffer(1, max_bytes=1 << 20, retain=True, spill_dir=str(tmp_path))
    early = buf.read(0)
    buf.put(0, batch(3))
    assert next(early).num_rows == 3  # a reader while the task still produces
    buf.put(0, batch(4))
    buf.finish()
    assert [b.num_rows for b in early] == [4]
    for _ in range(3):  # a second action, a retried task, a speculative one
        assert [b.num_rows for b in buf.read(0)] == [3, 4]
    assert not buf.all_drained() and not buf.wait_drained(0)
    assert list(tmp_path.iterdir()) == []  # within the bound: nothing spilled


def test_a_retained_output_past_its_bound_spills_to_disk_and_reads_back_the_same() -> None:
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        buf = OutputBuffer(2, max_bytes=2000, retain=True, spill_dir=d)
        sent = {p: [pa.record_batch({"x": pa.array(range(p * 1000 + i * 100, p * 1000 + i * 100 + 100))}) for i in range(5)] for p in (0, 1)}
        for i in range(5):
            for p in (0, 1):
                buf.put(p, sent[p][i])  # never blocks: past the bound the rest goes to disk
        buf.finish()
        assert buf.buffered_bytes <= 2000 and buf.spilled_bytes > 0
        assert len(list(Path(d).iterdir())) == 2
        for p in (0, 1):
            for _ in range(2):
                got = pa.Table.from_batches(list(buf.read(p)))
                assert got.equals(pa.Table.from_batches(sent[p]))  # same rows, same order
        buf.fail(TaskCancelledError("the task ended"))
        assert list(Path(d).iterdir()) == []  # freed with the task


def test_a_retained_output_past_its_disk_bound_fails_the_task_naming_the_option(tmp_path) -> None:  # type: ignore[no-untyped-def]
    buf = OutputBuffer(1, max_bytes=100, retain=True, spill_dir=str(tmp_path), max_retained=1000)
    big = pa.record_batch({"x": pa.array(range(100), pa.int64())})  # 800 bytes
    buf.put(0, big)  # spilled: past the memory bound
    with pytest.raises(TaskFailedError, match="retain_output") as info:
        buf.put(0, big)
    buf.fail(info.value)  # what the failing task does: its spill goes with it
    assert list(tmp_path.iterdir()) == []


def header(**kw: object) -> protocol_pb2.TaskHeader:
    plan = plan_pb2.StagePlan(root=plan_pb2.Operator(values=plan_pb2.Values()))
    h = protocol_pb2.TaskHeader(
        protocol_version=PROTOCOL_VERSION,
        stage_key=protocol_pb2.StageKey(query_id="q", stage_id=1, task_number=0),
        task_count=1,
        plan=encode_plan(plan),
        query_secret=b"0123456789abcdef",
    )
    for k, v in kw.items():
        if k == "stage_key":
            h.stage_key.CopyFrom(v)  # type: ignore[arg-type]
        else:
            setattr(h, k, v)
    return h


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"task_count": 0}, "header.task_count"),
        ({"stage_key": protocol_pb2.StageKey(query_id="", task_number=0)}, "header.stage_key.query_id"),
        ({"stage_key": protocol_pb2.StageKey(query_id="q", task_number=5)}, "header.stage_key.task_number"),
        ({"plan": b""}, "header.plan"),
        ({"plan": plan_pb2.StagePlan().SerializeToString() + b"\x00"}, "header.plan"),
    ],
)
def test_header_checks_name_the_field(change: dict[str, object], field: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_header(header(**change).SerializeToString())
    assert info.value.field == field


def test_header_version_and_duplicate_feeds() -> None:
    with pytest.raises(VersionMismatchError):
        decode_header(header(protocol_version=99).SerializeToString())
    h = header()
    h.feeds.add(feed_id="a", partitions=[0])
    h.feeds.add(feed_id="a", partitions=[1])
    with pytest.raises(ProtocolError, match="repeats") as info:
        decode_header(h.SerializeToString())
    assert info.value.field == "header.feeds[1].feed_id"
    good, plan = decode_header(header().SerializeToString())
    assert good.stage_key.stage_id == 1 and plan.root.WhichOneof("kind") == "values"


def test_ticket_checks() -> None:
    key = protocol_pb2.StageKey(query_id="q")
    with pytest.raises(ProtocolError, match="empty"):
        decode_ticket(protocol_pb2.Ticket(stage_key=key, partition_start=2, partition_end=2, query_secret=b"0123456789abcdef").SerializeToString())
    with pytest.raises(ProtocolError, match="stage_key"):
        decode_ticket(protocol_pb2.Ticket(partition_end=1).SerializeToString())


# -------------------------------------------------------------- admission


def _capacity(tasks: int = 2, threads: int = 4, queue: int = 2, wait: float = 5.0) -> Capacity:
    return Capacity(tasks=tasks, threads=threads, memory=1 << 30, queue=queue, wait=wait)


def test_admission_reserves_until_released_and_refuses_what_never_fits() -> None:
    adm = Admission(_capacity(queue=0))
    assert adm.admit("a", Need(3, 10)) is None
    busy = adm.admit("b", Need(2, 10))
    assert busy is not None and busy.fits_ever and "1/2 tasks, 3/4 source threads" in busy.reason
    adm.release("a")
    adm.release("a")  # idempotent
    assert adm.admit("b", Need(2, 10)) is None
    never = adm.admit("c", Need(5, 10))
    assert never is not None and not never.fits_ever and "needs 5 source threads" in never.reason


def test_admission_queue_is_first_come_first_served() -> None:
    adm = Admission(_capacity(tasks=1, queue=4))
    assert adm.admit("holder", Need(1, 1)) is None
    order: list[str] = []

    def wait_for(key: str) -> None:
        assert adm.admit(key, Need(1, 1)) is None
        order.append(key)
        adm.release(key)

    first = threading.Thread(target=wait_for, args=("first",))
    first.start()
    wait_until(lambda: adm.waiting == 1, 5.0, "the first task to queue")
    second = threading.Thread(target=wait_for, args=("second",))
    second.start()
    wait_until(lambda: adm.waiting == 2, 5.0, "the second task to queue")
    adm.release("holder")
    first.join(5)
    second.join(5)
    assert order == ["first", "second"]


def test_admission_refuses_when_the_queue_is_full_or_the_wait_ends() -> None:
    adm = Admission(_capacity(tasks=1, queue=1, wait=0.3))
    assert adm.admit("holder", Need(1, 1)) is None
    ticks: list[int] = []
    results: list[object] = []
    waiter = threading.Thread(target=lambda: results.append(adm.admit("w", Need(1, 1), tick=lambda: ticks.append(1), tick_every=0.05)))
    waiter.start()
    wait_until(lambda: adm.waiting == 1, 5.0, "a queued task")
    full = adm.admit("x", Need(1, 1))
    assert full is not None and full.fits_ever and "1 tasks wait already" in full.reason
    waiter.join(5)
    refusal = results[0]
    assert isinstance(refusal, Refusal) and refusal.fits_ever and "at capacity for 0.3s" in refusal.reason
    assert len(ticks) >= 2  # the queued task told its coordinator it waits, repeatedly
    gave_up = adm.admit("y", Need(1, 1), give_up=lambda: True)
    assert gave_up is not None and adm.waiting == 0


def test_a_reader_waits_for_a_task_that_waits_for_capacity_past_its_own_wait() -> None:
    from flight.worker.tasks import TaskRegistry

    queued = threading.Event()
    queued.set()
    registry = TaskRegistry(queued=lambda key: key == "q/1/0" and queued.is_set())
    got: list[tuple[object, str]] = []
    reader = threading.Thread(target=lambda: got.append(registry.get("q/1/0", wait=0.05)))
    reader.start()
    reader.join(0.5)
    assert reader.is_alive(), "the reader should wait while the task is queued, past its 0.05 s"
    queued.clear()  # refused: never registered
    reader.join(5.0)
    assert got == [(None, "it is not running here")]
    assert registry.get("other/0/0", wait=0.01) == (None, "it is not running here")  # not queued: wait only as asked


def test_an_operator_list_too_long_and_a_second_input_are_refused_before_compiling() -> None:
    # 70,000 projected expressions took a worker over 10 s to compile (the fuzzer's case 9986 of seed 1).
    values = plan_pb2.Operator(values=plan_pb2.Values())
    wide = plan_pb2.Operator(project=plan_pb2.Project(input=values, exprs=[plan_pb2.NamedExpression(name=f"c{i}") for i in range(MAX_PROJECTED + 1)]))
    with pytest.raises(ProtocolError, match="projected expressions") as info:
        decode_header(header(plan=encode_plan(plan_pb2.StagePlan(root=wide))).SerializeToString())
    assert info.value.field == "header.plan.operators[1].project.exprs"
    # 70,000 sort keys took 4 s and left the worker's heaps 78 MiB larger for good (seed 2's case 6674).
    keys = [plan_pb2.SortKey(column="c")] * (MAX_PROJECTED + 1)
    many = ["c"] * (MAX_PROJECTED + 1)
    for op, field in ((plan_pb2.Operator(sort=plan_pb2.Sort(input=values, keys=keys)), "header.plan.operators[1].sort.keys"),
                      (plan_pb2.Operator(aggregate=plan_pb2.Aggregate(input=values, keys=many)), "header.plan.operators[1].aggregate.keys"),
                      (plan_pb2.Operator(window=plan_pb2.Window(input=values, order_by=keys)), "header.plan.operators[1].window.order_by")):
        with pytest.raises(ProtocolError, match="at most 8192") as info:
            decode_header(header(plan=encode_plan(plan_pb2.StagePlan(root=op))).SerializeToString())
        assert info.value.field == field
    one = plan_pb2.Operator(exchange_input=plan_pb2.ExchangeInput(separate_input=True))
    two = plan_pb2.Operator(union=plan_pb2.Union(inputs=[one, one]))
    with pytest.raises(ProtocolError, match="at most one") as info:
        decode_header(header(plan=encode_plan(plan_pb2.StagePlan(root=two))).SerializeToString())
    assert info.value.field == "header.plan"


def test_a_wait_for_a_producer_ends_when_its_consumer_stops() -> None:
    # A consumer cancelled while it waits for a local producer that never appears lets go of the wait (it
    # held a thread and its call for the whole --get-wait before); without ``stop`` this would wait an hour.
    from flight.worker.tasks import TaskRegistry

    registry, stop = TaskRegistry(), threading.Event()
    threading.Timer(0.2, stop.set).start()
    assert registry.get("q/0/0", wait=3600.0, stop=stop.is_set) == (None, "it is not running here")
