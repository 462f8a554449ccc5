"""Input calls (docs/protocol.md, section 16): a task whose ``ExchangeInput`` has ``separate_input`` is opened
by its coordinator on its own exchange, and another process sends its rows on a DoExchange of their own
(descriptor path ``flight-exec.input``). Against a real worker: the rows read back with DoGet are the rows
sent, and every hostile or broken input call is refused naming what was wrong, fails the task rather than
leaving it short, and leaves the worker healthy with no task held.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pyarrow as pa
import pyarrow.flight as fl
import pytest
from support import healthy, running_tasks, wait_until

import flight
from flight.coordinator.detached import InputTarget
from flight.security import SecurityFiles
from flight.spark._table import send_partition
from flight.wire._proto import plan_pb2, protocol_pb2
from flight.wire.plan_codec import encode_plan
from flight.wire.protocol import INPUT_CALL_PATH, PROTOCOL_VERSION, error_info_of

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])
SECRET = b"k" * 16
CODE = protocol_pb2.ErrorCode


def _plan(separate: bool = True) -> plan_pb2.StagePlan:
    plan = flight.map_input(SCHEMA).stage_plan()
    plan.root.exchange_input.separate_input = separate
    plan.root.exchange_input.input_id = "test:input"
    return plan


def _header(plan: plan_pb2.StagePlan) -> protocol_pb2.TaskHeader:
    key = protocol_pb2.StageKey(query_id=f"q{uuid.uuid4().hex[:12]}", stage_id=0, task_number=0)
    return protocol_pb2.TaskHeader(protocol_version=PROTOCOL_VERSION, stage_key=key, task_count=1, plan=encode_plan(plan),
                                   query_secret=SECRET)


def _table(n: int) -> pa.Table:
    return pa.table({"id": pa.array(range(n), pa.int64()), "name": pa.array([f"n{i}" if i % 3 else None for i in range(n)])})


@contextmanager
def _opened(url: str, plan: plan_pb2.StagePlan | None = None) -> Iterator[tuple[protocol_pb2.TaskHeader, fl.FlightStreamReader]]:
    """The coordinator's side: the task's exchange, open until the block ends (then released)."""
    header = _header(plan or _plan())
    with fl.connect(url) as client:
        writer, reader = client.do_exchange(fl.FlightDescriptor.for_command(header.SerializeToString()))
        chunk = reader.read_chunk()
        frame = protocol_pb2.WorkerFrame.FromString(chunk.app_metadata.to_pybytes())
        assert frame.WhichOneof("frame") == "ready", frame
        try:
            yield header, reader
        finally:
            release = protocol_pb2.CoordinatorFrame(release=protocol_pb2.Release())
            writer.write_metadata(pa.py_buffer(release.SerializeToString()))
            try:
                while True:
                    reader.read_chunk()
            except (StopIteration, pa.ArrowException):
                pass
            with contextlib.suppress(pa.ArrowException):
                writer.close()


def _target(url: str, header: protocol_pb2.TaskHeader, secret: bytes = SECRET) -> InputTarget:
    attach = protocol_pb2.CoordinatorFrame(attach=protocol_pb2.InputAttach(stage_key=header.stage_key, query_secret=secret))
    return InputTarget("test:input", 0, url, attach.SerializeToString())


def _read(url: str, header: protocol_pb2.TaskHeader) -> pa.Table:
    ticket = protocol_pb2.Ticket(stage_key=header.stage_key, partition_start=0, partition_end=1, query_secret=SECRET)
    with fl.connect(url) as client:
        return client.do_get(fl.Ticket(ticket.SerializeToString())).read_all()  # heartbeats add no rows


def _raw_call(url: str, messages: list[bytes | pa.RecordBatch], done: bool = True) -> BaseException | None:
    """An input call by hand: metadata frames and batches in order; the error that ended it, if any."""
    with fl.connect(url) as client:
        writer, reader = client.do_exchange(fl.FlightDescriptor.for_path(INPUT_CALL_PATH))
        began = False
        try:
            for m in messages:
                if isinstance(m, pa.RecordBatch):
                    if not began:
                        writer.begin(m.schema)
                        began = True
                    writer.write_batch(m)
                else:
                    writer.write_metadata(pa.py_buffer(m))
            if done:
                writer.done_writing()
            while True:
                reader.read_chunk()
        except StopIteration:
            pass
        except pa.ArrowException as exc:
            with contextlib.suppress(pa.ArrowException):
                writer.close()
            return exc
        try:
            writer.close()  # the call's status, when reading did not raise it
        except pa.ArrowException as exc:
            return exc
        return None


def _frame(**kw: object) -> bytes:
    return protocol_pb2.CoordinatorFrame(**kw).SerializeToString()  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def one() -> Iterator[flight.LocalCluster]:
    with flight.LocalCluster(1, worker_args=["--get-wait", "2"]) as c:  # a read of an absent task: NOT_FOUND in 2 s, not 10
        yield c


def test_the_rows_sent_on_an_input_call_are_the_rows_read_back(one: flight.LocalCluster) -> None:
    url = one.urls[0]
    table = _table(10_000)
    with _opened(url) as (header, _):
        sent = send_partition(_target(url, header), SCHEMA, iter(table.to_batches(max_chunksize=700)), SecurityFiles())
        assert sent == table.num_rows
        assert _read(url, header).sort_by("id").equals(table)
    wait_until(lambda: running_tasks([url]) == 0, 10.0, "the released task to be freed")


def test_hostile_input_calls_are_refused_naming_the_field(one: flight.LocalCluster) -> None:
    url = one.urls[0]
    batch = _table(5).to_batches()[0]
    with _opened(url) as (header, _):
        attach = _frame(attach=protocol_pb2.InputAttach(stage_key=header.stage_key, query_secret=SECRET))
        wrong = _frame(attach=protocol_pb2.InputAttach(stage_key=header.stage_key, query_secret=b"x" * 16))
        cases = {
            "a batch before InputAttach": ([batch], CODE.Value("ERROR_CODE_INVALID_ARGUMENT"), "data"),
            "another frame first": ([_frame(heartbeat=protocol_pb2.Heartbeat())], CODE.Value("ERROR_CODE_INVALID_ARGUMENT"), "app_metadata.attach"),
            "no frame at all": ([], CODE.Value("ERROR_CODE_INVALID_ARGUMENT"), "app_metadata.attach"),
            "garbage": ([b"\xff\x00garbage"], CODE.Value("ERROR_CODE_INVALID_ARGUMENT"), "app_metadata"),
            "the wrong secret": ([wrong, batch], CODE.Value("ERROR_CODE_PERMISSION_DENIED"), "app_metadata.attach.query_secret"),
        }
        for what, (messages, code, field) in cases.items():
            info = error_info_of(_raw_call(url, messages))  # type: ignore[arg-type]
            assert info is not None and (info.code, info.field) == (code, field), (what, info)
            assert "Traceback" not in info.message and "/" not in info.field
        # None of them took the task: the real sender still can, and a second attach is refused.
        assert send_partition(_target(url, header), SCHEMA, iter([batch]), SecurityFiles()) == 5
        info = error_info_of(_raw_call(url, [attach]))  # type: ignore[arg-type]
        assert info is not None and "already has its input call" in info.message, info
        assert _read(url, header).num_rows == 5
    assert healthy(url)


def test_a_task_that_takes_no_input_call_refuses_one_and_its_exchange_refuses_input(one: flight.LocalCluster) -> None:
    url = one.urls[0]
    values = flight.from_arrow(_table(3)).stage_plan()
    with _opened(url, values) as (header, _):
        info = error_info_of(_raw_call(url, [_frame(attach=protocol_pb2.InputAttach(stage_key=header.stage_key, query_secret=SECRET))]))  # type: ignore[arg-type]
        assert info is not None and info.code == CODE.Value("ERROR_CODE_INVALID_ARGUMENT") and "does not take an input call" in info.message
    # A separate-input task's own exchange carries no batches, and no task's exchange carries InputAttach.
    for messages in ([_table(2).to_batches()[0]], [_frame(attach=protocol_pb2.InputAttach(stage_key=_header(_plan()).stage_key, query_secret=SECRET))]):
        header = _header(_plan())
        with fl.connect(url) as client:
            writer, reader = client.do_exchange(fl.FlightDescriptor.for_command(header.SerializeToString()))
            for m in messages:
                if isinstance(m, pa.RecordBatch):
                    writer.begin(m.schema)
                    writer.write_batch(m)
                else:
                    writer.write_metadata(pa.py_buffer(m))
            errors = []
            with pytest.raises(pa.ArrowException):
                while True:
                    chunk = reader.read_chunk()
                    if chunk.app_metadata is not None:
                        frame = protocol_pb2.WorkerFrame.FromString(chunk.app_metadata.to_pybytes())
                        if frame.WhichOneof("frame") == "error":
                            errors.append(frame.error)
                            writer.done_writing()
            with contextlib.suppress(pa.ArrowException):
                writer.close()
        assert [e.field for e in errors] in (["data"], ["app_metadata.attach"]), errors
    wait_until(lambda: running_tasks([url]) == 0, 10.0, "the refused tasks to be freed")


def test_an_input_cut_short_or_of_another_schema_fails_the_task_never_a_short_result(one: flight.LocalCluster) -> None:
    url = one.urls[0]
    batch = _table(7).to_batches()[0]
    broken = {
        "no InputEnd": ([batch], "app_metadata.input_end"),
        "counts that differ": ([batch, _frame(input_end=protocol_pb2.InputEnd(rows=70, batches=10))], "app_metadata.input_end"),
        "a frame an input call does not carry": ([batch, _frame(feed_end=protocol_pb2.FeedEnd(feed_id="f"))], "app_metadata"),
    }
    for what, (messages, field) in broken.items():
        with _opened(url) as (header, _):
            attach = _frame(attach=protocol_pb2.InputAttach(stage_key=header.stage_key, query_secret=SECRET))
            info = error_info_of(_raw_call(url, [attach, *messages]))  # type: ignore[arg-type]
            assert info is not None and info.field == field, (what, info)
            with pytest.raises(fl.FlightError):  # its readers see the failure, not fewer rows
                _read(url, header)
    wait_until(lambda: running_tasks([url]) == 0, 10.0, "the failed tasks to be freed")
    assert healthy(url)


def test_an_input_call_for_a_task_that_is_not_there_is_not_found(one: flight.LocalCluster) -> None:
    url = one.urls[0]
    header = _header(_plan())  # never opened: the worker waits its --get-wait (2 s here), then says so
    info = error_info_of(_raw_call(url, [_frame(attach=protocol_pb2.InputAttach(stage_key=header.stage_key, query_secret=SECRET))]))  # type: ignore[arg-type]
    assert info is not None and info.code == CODE.Value("ERROR_CODE_NOT_FOUND") and info.field == "app_metadata.attach.stage_key", info


def test_a_call_refused_before_its_first_batch_leaves_the_task_to_the_next_call(one: flight.LocalCluster) -> None:
    # Nothing reached the task (a batch of another schema first, or the call ended before any batch): it stays
    # free, so Spark's retry of the sending task can still send the partition whole.
    url = one.urls[0]
    other = pa.record_batch([pa.array([1, 2], pa.int32())], names=["id"])
    table = _table(50)
    with _opened(url) as (header, _):
        attach = _frame(attach=protocol_pb2.InputAttach(stage_key=header.stage_key, query_secret=SECRET))
        info = error_info_of(_raw_call(url, [attach, other]))  # type: ignore[arg-type]
        assert info is not None and info.field == "data" and "schema" in info.message, info
        info = error_info_of(_raw_call(url, [attach]))  # type: ignore[arg-type]
        assert info is not None and info.field == "app_metadata.input_end", info
        assert send_partition(_target(url, header), SCHEMA, iter(table.to_batches(max_chunksize=20)), SecurityFiles()) == 50
        assert _read(url, header).sort_by("id").equals(table)
    wait_until(lambda: running_tasks([url]) == 0, 10.0, "the released task to be freed")
