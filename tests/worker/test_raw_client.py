"""A raw ``pyarrow.flight`` client drives a worker with only docs/protocol.md and the .proto files.

Nothing from the project is imported here: the message classes come from the
two ``.proto`` files, compiled with ``grpc_tools.protoc`` into a descriptor set
and loaded into a private descriptor pool (so they never meet the project's own
generated modules, which other tests load into the default pool). The worker
runs as a separate process, started the way a user starts it. If these tests
pass, the protocol document is enough to write a coordinator in any language.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.resources
import math
import os
import random
import re
import selectors
import signal
import struct
import subprocess
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl
import pyarrow.parquet as pq
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "proto"
PROTO_FILES = ["flight/wire/_proto/protocol.proto", "flight/wire/_proto/plan.proto"]
PROTOCOL_VERSION = 13  # docs/protocol.md, section 1
SECRET = b"raw-client-query-secret"  # 16 to 64 bytes: every header, ticket and cancel of a query repeats it
LISTENING = re.compile(rb"^flight-worker listening on (grpc://\S+)$")
START_TIMEOUT = 30.0
STOP_TIMEOUT = 40.0  # above the worker's default drain grace (30 s)
CALL = fl.FlightCallOptions(timeout=30.0)  # no Flight call may hang a test


# ------------------------------------------------------------------ protobufs


class Protos:
    """Message classes of package ``flight_exec.v1`` from a private descriptor pool.

    ``P.TaskHeader``, ``P.StagePlan``, ... are classes; ``P.enum("ErrorCode", "ERROR_CODE_EXECUTION")``
    is an enum value's number.
    """

    def __init__(self, descriptor_set: bytes) -> None:
        self.pool = descriptor_pool.DescriptorPool()
        for file in descriptor_pb2.FileDescriptorSet.FromString(descriptor_set).file:
            self.pool.Add(file)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        cls = message_factory.GetMessageClass(self.pool.FindMessageTypeByName(f"flight_exec.v1.{name}"))
        setattr(self, name, cls)
        return cls

    def enum(self, enum: str, value: str) -> int:
        return int(self.pool.FindEnumTypeByName(f"flight_exec.v1.{enum}").values_by_name[value].number)

    # Expression builders (plan.proto: Expression = flat ExprNode list in post-order, the root
    # last; a Call names its arguments by the indexes of earlier nodes).
    def col(self, name: str) -> Any:
        return self.Expression(nodes=[self.ExprNode(field=self.FieldRef(name=name))])

    def lit(self, **value: Any) -> Any:
        return self.Expression(nodes=[self.ExprNode(literal=self.Literal(**value))])

    def call(self, function: str, *args: Any, options: Any = None) -> Any:
        out = self.Expression()
        refs = []
        for arg in args:  # each argument's nodes, renumbered, then the call
            base = len(out.nodes)
            for node in arg.nodes:
                copy = out.nodes.add()
                copy.CopyFrom(node)
                if copy.WhichOneof("kind") == "call":
                    copy.call.args[:] = [base + i for i in copy.call.args]
            refs.append(len(out.nodes) - 1)
        call = out.nodes.add().call
        call.function = function
        call.args.extend(refs)
        if options is not None:
            call.options.CopyFrom(options)
        return out

    # Plans (plan.proto: StagePlan.operators = flat OperatorNode list in post-order, the root last; a node
    # names its inputs by the indexes of earlier nodes). The tests write a plan as nested Operators, which
    # reads better; ``wire`` lists it the way TaskHeader.plan carries it.
    INPUTS: ClassVar[dict[str, tuple[str, ...]]] = {
        "filter": ("input",), "project": ("input",), "limit": ("input",), "aggregate": ("input",), "sort": ("input",),
        "window": ("input",), "hash_join": ("left", "right"), "union": ("inputs",),
    }

    def wire(self, plan: Any) -> bytes:
        out = self.StagePlan()
        out.CopyFrom(plan)
        out.ClearField("root")

        def add(op: Any) -> int:  # each input's nodes first, then the operator's own
            kind = op.WhichOneof("kind")
            body = getattr(op, kind)
            inputs = [add(child) for name in self.INPUTS.get(kind, ()) for child in
                      (getattr(body, name) if name == "inputs" else [getattr(body, name)] if body.HasField(name) else [])]
            node = out.operators.add()
            getattr(node, kind).CopyFrom(body)
            for name in self.INPUTS.get(kind, ()):
                getattr(node, kind).ClearField(name)
            node.inputs.extend(inputs)
            return len(out.operators) - 1

        if plan.HasField("root"):
            add(plan.root)
        return bytes(out.SerializeToString())


GRPC_CODES = {fl.FlightServerError: 2, fl.FlightCancelledError: 1, fl.FlightUnavailableError: 14, fl.FlightUnauthenticatedError: 16,
              fl.FlightUnauthorizedError: 7}
"""The gRPC code pyarrow sends each Flight error class with (UNKNOWN, CANCELLED, UNAVAILABLE, UNAUTHENTICATED, PERMISSION_DENIED)."""


def error_info(P: Protos, exc: fl.FlightError) -> Any:
    """The ErrorInfo in a worker error's extra_info (the grpc-status-details-bin trailer), read as a gRPC client in another
    language reads it: a google.rpc.Status of the call's own code, the ErrorInfo its one detail (docs/protocol.md section 10)."""
    status = P.RpcStatus.FromString(exc.extra_info)
    assert status.code == GRPC_CODES[type(exc)], f"{type(exc).__name__} carries a status of gRPC code {status.code}"
    assert status.message == str(exc).split(". Detail: ")[0].split(". gRPC client debug context")[0], status.message
    [detail] = status.details
    assert detail.type_url == "type.googleapis.com/flight_exec.v1.ErrorInfo"
    return P.ErrorInfo.FromString(detail.value)


@pytest.fixture(scope="module")
def P(tmp_path_factory: pytest.TempPathFactory) -> Protos:
    out = tmp_path_factory.mktemp("protos") / "flight_exec.binpb"
    include = importlib.resources.files("grpc_tools") / "_proto"  # well-known types, should the protos ever import them
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_DIR}",
        f"-I{include}",
        "--include_imports",
        f"--descriptor_set_out={out}",
        *PROTO_FILES,
    ]
    assert protoc.main(args) == 0, f"protoc failed on {PROTO_FILES}"
    return Protos(out.read_bytes())


# --------------------------------------------------------------------- worker


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


def _first_line(proc: subprocess.Popen[bytes], timeout: float) -> bytes:
    """The worker's first stdout line, waiting at most ``timeout`` seconds."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    buf = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"the worker printed no line within {timeout:g} s (so far: {buf!r})")
            if not sel.select(left):
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                raise AssertionError(f"the worker exited with {proc.wait(5)} before it listened")
            buf += chunk
    return buf.split(b"\n", 1)[0].rstrip(b"\r")


def start_worker(workdir: Path, data_root: Path | None = None, extra: Sequence[str] = ()) -> Worker:
    log = workdir / "worker.log"
    roots = ["--data-root", str(data_root)] if data_root is not None else []
    roots += list(extra)
    with open(log, "wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flight.worker", "--host", "127.0.0.1", "--port", "0", *roots],
            stdout=subprocess.PIPE,
            stderr=stderr,
            cwd=workdir,
        )
    try:
        line = _first_line(proc, START_TIMEOUT)
        match = LISTENING.match(line)
        assert match, f"unexpected first line from the worker: {line!r}"
    except BaseException:
        stop_worker(proc)
        raise
    return Worker(proc, match.group(1).decode(), log)


def stop_worker(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM, then wait; kill if it does not stop. Returns the exit code."""
    try:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
            raise AssertionError(f"the worker did not stop within {STOP_TIMEOUT:g} s of SIGTERM") from None
    finally:
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    w = start_worker(tmp_path_factory.mktemp("worker"), data_root=tmp_path_factory.getbasetemp())  # tests' files: tmp_path
    try:
        yield w
    finally:
        rc = stop_worker(w.proc)
    assert rc == 0, f"the worker exited with {rc} after SIGTERM; its log:\n{w.log_tail()}"


@pytest.fixture(scope="module")
def client(worker: Worker) -> Iterator[fl.FlightClient]:
    c = fl.connect(worker.url)
    try:
        yield c
    finally:
        c.close()


# -------------------------------------------------------------------- helpers


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Poll ``predicate`` every 10 ms until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()  # never set: an interruptible pause between polls
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        pause.wait(0.01)


def clean(exc: BaseException) -> str:
    """A Flight error's message as a user should see it (docs/protocol.md, section 10)."""
    return str(exc).split(". Detail:")[0]


def schema_bytes(schema: pa.Schema) -> bytes:
    return schema.serialize().to_pybytes()


def read_schema(data: bytes) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(data))


def new_key(P: Protos, task_number: int = 0) -> Any:
    """A fresh stage key: a key runs once per worker."""
    return P.StageKey(query_id=f"raw-{uuid.uuid4().hex[:12]}", stage_id=0, task_number=task_number)


def header(P: Protos, key: Any, plan: Any, feeds: dict[str, list[int]] | None = None, **options: Any) -> Any:
    return P.TaskHeader(
        protocol_version=PROTOCOL_VERSION,
        stage_key=key,
        task_count=key.task_number + 1,
        plan=P.wire(plan) if plan.HasField("root") else plan.SerializeToString(),  # a plan without root: its operators as given
        feeds=[P.FeedAssignment(feed_id=f, partitions=p) for f, p in (feeds or {}).items()],
        query_start_unix_nanos=time.time_ns(),
        options=P.TaskOptions(**options),
        query_secret=SECRET,
    )


def info(P: Protos, client: fl.FlightClient) -> Any:
    (result,) = list(client.do_action(fl.Action("info", b""), options=CALL))
    return P.WorkerInfo.FromString(result.body.to_pybytes())


def healthy(client: fl.FlightClient) -> bool:
    (result,) = list(client.do_action(fl.Action("health", b""), options=CALL))
    return bool(result.body.to_pybytes() == b"ok")


class Exchange:
    """One task's DoExchange, driven by hand."""

    def __init__(self, P: Protos, client: fl.FlightClient, cmd: bytes, options: fl.FlightCallOptions = CALL) -> None:
        self.P = P
        # The first message carries the CMD descriptor and nothing else; pyarrow sends it on open.
        self.writer, self.reader = client.do_exchange(fl.FlightDescriptor.for_command(cmd), options=options)

    def send(self, **member: Any) -> None:
        """One CoordinatorFrame as a metadata-only message, e.g. ``send(feed_end=...)``."""
        frame = self.P.CoordinatorFrame(**member)
        self.writer.write_metadata(pa.py_buffer(frame.SerializeToString()))

    def read(self) -> tuple[Any | None, pa.RecordBatch | None]:
        """The next message: (WorkerFrame or None, record batch or None). StopIteration at the end."""
        chunk = self.reader.read_chunk()
        frame = None
        if chunk.app_metadata is not None and chunk.app_metadata.size:
            frame = self.P.WorkerFrame.FromString(chunk.app_metadata.to_pybytes())
        return frame, chunk.data

    def frame(self) -> Any:
        """The next message, which must be a frame (a leaf task's exchange carries no batches)."""
        frame, data = self.read()
        assert data is None, "a non-map task sent a record batch on its exchange"
        assert frame is not None, "a message with neither a frame nor a batch"
        return frame

    def drain(self) -> list[Any]:
        """Frames until the end of the stream (raises the call's error status, if any)."""
        frames = []
        while True:
            try:
                frames.append(self.frame())
            except StopIteration:
                return frames

    def close(self) -> None:
        # Once the call ended, closing the writer re-raises its final status: expected.
        with contextlib.suppress(pa.ArrowException):
            self.writer.close()


def read_doget(P: Protos, client: fl.FlightClient, ticket: Any) -> tuple[pa.Schema, list[pa.RecordBatch], list[int]]:
    """A DoGet stream read with read_chunk (read_all turns CANCELLED into KeyboardInterrupt)."""
    reader = client.do_get(fl.Ticket(ticket.SerializeToString()), options=CALL)
    batches, partitions = [], []
    while True:
        try:
            chunk = reader.read_chunk()
        except StopIteration:
            break
        assert chunk.app_metadata is not None, "every DoGet batch carries its BatchMetadata"
        meta = P.BatchMetadata.FromString(chunk.app_metadata.to_pybytes())
        assert meta.HasField("partition")
        partitions.append(meta.partition)
        batches.append(chunk.data)
    return reader.schema, batches, partitions


def sorted_rows(table: pa.Table, key: str) -> list[dict[str, Any]]:
    return list(table.sort_by([(key, "ascending")]).to_pylist())


FILE_SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64())])


def write_files(root: Path, count: int = 3, rows: int = 40) -> list[Path]:
    paths = []
    for f in range(count):
        ids = list(range(f * rows, (f + 1) * rows))
        table = pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "name": pa.array([None if i % 11 == 0 else f"item-{i % 7}" for i in ids], pa.string()),
                "score": pa.array([float(i * 7 % 50) for i in ids], pa.float64()),
            },
            schema=FILE_SCHEMA,
        )
        path = root / f"part-{f}.parquet"
        pq.write_table(table, path, row_group_size=16)
        paths.append(path)
    return paths


def scan(P: Protos, feed_id: str = "files", reader: str = "parquet") -> Any:
    return P.Operator(
        feed_scan=P.FeedScan(feed=P.WorkUnitFeed(feed_id=feed_id), reader=reader, schema=schema_bytes(FILE_SCHEMA))
    )


# ----------------------------------------------- output hash partitioning (the spec)
#
# docs/protocol.md, "Output partitioning", re-implemented in plain Python (ints, struct,
# zlib.crc32) from the document alone; pyarrow only names the key types.
# tests/engine/test_partition.py checks the project's vectorised function against these too.

SPEC_MASK = (1 << 64) - 1
SPEC_GOLDEN = 0x9E3779B97F4A7C15
SPEC_CANONICAL_NAN = 0x7FF8000000000000
_EPOCH = datetime.datetime(1970, 1, 1)
_TICKS_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


def spec_value_type(t: pa.DataType) -> pa.DataType:
    """Dictionaries hash as their values, extension types as their storage."""
    while True:
        if isinstance(t, pa.BaseExtensionType):
            t = t.storage_type
        elif pa.types.is_dictionary(t):
            t = t.value_type
        else:
            return t


def spec_string_like(t: pa.DataType) -> bool:
    t = spec_value_type(t)
    kinds = (
        pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view,
        pa.types.is_binary, pa.types.is_large_binary, pa.types.is_binary_view, pa.types.is_fixed_size_binary,
    )
    return any(kind(t) for kind in kinds)


def _spec_ticks(delta: datetime.timedelta, unit: str) -> int:
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return micros * _TICKS_PER_SECOND[unit] // 1_000_000


def spec_key_value(value: Any, t: pa.DataType) -> int:
    """Step 2: a key's 64-bit value. Temporal values may also be given as their stored integer."""
    t = spec_value_type(t)
    if value is None:
        return 0
    if spec_string_like(t):
        return zlib.crc32(value.encode("utf-8") if isinstance(value, str) else bytes(value))
    if pa.types.is_boolean(t):
        return 1 if value else 0
    if pa.types.is_floating(t):
        x = float(value)
        if math.isnan(x):
            bits = SPEC_CANONICAL_NAN  # whatever its sign and payload
        else:
            bits = struct.unpack("<Q", struct.pack("<d", x + 0.0))[0]  # -0.0 + 0.0 is +0.0
        return ((bits << 32) | (bits >> 32)) & SPEC_MASK  # the two 32-bit halves swapped
    if pa.types.is_decimal(t):
        sign, digits, exponent = Decimal(value).as_tuple()
        assert isinstance(exponent, int) and exponent + t.scale >= 0
        unscaled = int("".join(map(str, digits)) or "0") * 10 ** (exponent + t.scale)
        return (-unscaled if sign else unscaled) & SPEC_MASK
    if isinstance(value, int):  # integers; temporal values as their stored integer
        return value & SPEC_MASK
    if pa.types.is_date32(t):
        return (value - _EPOCH.date()).days & SPEC_MASK
    if pa.types.is_date64(t):
        return (value - _EPOCH.date()).days * 86_400_000 & SPEC_MASK
    if pa.types.is_timestamp(t):
        if value.tzinfo is not None:
            value = value.astimezone(datetime.UTC).replace(tzinfo=None)
        return _spec_ticks(value - _EPOCH, t.unit) & SPEC_MASK
    if pa.types.is_time(t):
        since_midnight = datetime.timedelta(
            hours=value.hour, minutes=value.minute, seconds=value.second, microseconds=value.microsecond
        )
        return _spec_ticks(since_midnight, t.unit) & SPEC_MASK
    if pa.types.is_duration(t):
        return _spec_ticks(value, t.unit) & SPEC_MASK
    raise TypeError(f"the spec does not hash keys of type {t}")


def spec_hashed_positions(types: Sequence[pa.DataType]) -> list[int]:
    """Step 1: the non-string-like keys if there are any, else all of them."""
    cheap = [i for i, t in enumerate(types) if not spec_string_like(t)]
    return cheap or list(range(len(types)))


def spec_partition(values: Sequence[Any], types: Sequence[pa.DataType], partitions: int) -> int:
    """Steps 1-4: the partition of a row whose hash keys have these values and types."""
    if partitions <= 1:
        return 0
    h = 0
    for n, i in enumerate(spec_hashed_positions(types)):
        v = spec_key_value(values[i], types[i])
        h = v if n == 0 else ((h * 31) & SPEC_MASK) ^ v
    return (((h * SPEC_GOLDEN) & SPEC_MASK) >> 29) % partitions


# ---------------------------------------------------------------------- tests


def test_leaf_task_fed_under_credit_and_read_with_doget(P: Protos, client: fl.FlightClient, worker: Worker, tmp_path: Path) -> None:
    paths = write_files(tmp_path)
    # What the stage must return, computed by pyarrow straight from the files.
    source = pa.concat_tables([pq.read_table(p) for p in paths])
    kept = source.filter(pc.greater_equal(source["score"], 20.0))
    expected = pa.table(
        {
            "id": pc.add(kept["id"], 1000),
            "label": pc.utf8_upper(kept["name"]),
            "score2": pc.multiply(kept["score"], 2.0),
        }
    )
    assert 0 < expected.num_rows < source.num_rows

    plan = P.StagePlan(
        root=P.Operator(
            project=P.Project(
                input=P.Operator(
                    filter=P.Filter(
                        input=scan(P),
                        predicate=P.call("greater_equal", P.col("score"), P.lit(float_value=20.0)),
                    )
                ),
                exprs=[
                    P.NamedExpression(name="id", expr=P.call("add", P.col("id"), P.lit(int_value=1000))),
                    P.NamedExpression(name="label", expr=P.call("utf8_upper", P.col("name"))),
                    P.NamedExpression(name="score2", expr=P.call("multiply", P.col("score"), P.lit(float_value=2.0))),
                ],
            )
        ),
        output=P.OutputSpec(partitions=1),
        output_schema=schema_bytes(expected.schema),
    )
    key = new_key(P)
    window = 2  # fewer credits than files: the client must wait for more credit
    task = header(P, key, plan, {"files": [0]}, feed_window=window)
    task.target_worker_url = worker.url
    ex = Exchange(P, client, task.SerializeToString())
    try:
        ready = ex.frame()
        assert ready.WhichOneof("frame") == "ready", ready
        output_schema = read_schema(ready.ready.output_schema)
        assert output_schema.equals(expected.schema), output_schema

        # Credits: the first window comes in Ready (protocol version 12), the rest as FeedCredit frames; answer each
        # with at most that many units, then FeedEnd.
        assert [(c.feed_id, c.partition, c.credits) for c in ready.ready.credits] == [("files", 0, window)]
        pending = [P.FileUnit(path=str(p)).SerializeToString() for p in paths]
        balance = granted = sent = credit_frames = 0
        credits = list(ready.ready.credits)
        while pending:
            if not credits:
                frame = ex.frame()
                assert frame.WhichOneof("frame") == "credit", frame
                credits.append(frame.credit)
            credit = credits.pop(0)
            assert (credit.feed_id, credit.partition) == ("files", 0)
            credit_frames += 1
            balance += credit.credits
            granted += credit.credits
            n = min(balance, len(pending))
            if n:
                now = time.time_ns()
                units = [P.WorkUnit(body=b, created_unix_nanos=now, sent_unix_nanos=now) for b in pending[:n]]
                ex.send(units=P.WorkUnitBatch(feed_id="files", partition=0, units=units))
                del pending[:n]
                balance -= n
                sent += n
            assert sent <= granted
        ex.send(feed_end=P.FeedEnd(feed_id="files", partition=0))
        assert credit_frames >= 2, "the initial window was smaller than the work: more credit had to come"

        # The output, read with DoGet (small here; a real client reads it while feeding).
        ticket = P.Ticket(stage_key=key, partition_start=0, partition_end=1, query_secret=SECRET)
        schema, batches, partitions = read_doget(P, client, ticket)
        assert schema.equals(output_schema)
        assert set(partitions) <= {0}
        result = pa.Table.from_batches(batches, schema=schema)
        assert sorted_rows(result, "id") == sorted_rows(expected, "id")

        # The finished frame (late credit frames may come first), then the half-close releases the task.
        frame = ex.frame()
        while frame.WhichOneof("frame") == "credit":
            frame = ex.frame()
        assert frame.WhichOneof("frame") == "finished", frame
        metrics = frame.finished
        assert metrics.stage_key == key
        assert metrics.rows_out == expected.num_rows
        assert [(f.feed_id, f.partition, f.units) for f in metrics.feeds] == [("files", 0, len(paths))]
        ex.writer.done_writing()
        rest = ex.drain()  # ends with status OK
        kinds = [f.WhichOneof("frame") for f in rest]
        assert set(kinds) <= {"credit", "drained"} and kinds.count("drained") == 1, rest
    finally:
        ex.close()

    wait_until(lambda: info(P, client).running_tasks == 0, "the worker to free the task")
    worker_info = info(P, client)
    assert worker_info.protocol_version == PROTOCOL_VERSION
    assert worker_info.url == worker.url
    assert not worker_info.draining


def test_map_stage_streams_batches_both_ways(P: Protos, client: fl.FlightClient) -> None:
    schema = pa.schema([("k", pa.int64()), ("v", pa.string())])
    inputs = [
        pa.record_batch(
            [
                pa.array(range(b * 10, b * 10 + 10), pa.int64()),
                pa.array([None if i % 4 == 0 else f"{'ab'[i % 2]}{i}" for i in range(b * 10, b * 10 + 10)], pa.string()),
            ],
            schema=schema,
        )
        for b in range(3)
    ]
    source = pa.Table.from_batches(inputs)
    mask = pc.and_(pc.greater_equal(source["k"], 5), pc.starts_with(source["v"], pattern="a"))
    expected = source.filter(mask)
    assert 0 < expected.num_rows < source.num_rows

    starts_with_a = P.FunctionOptions(match_substring=P.MatchSubstringOptions(pattern="a"))
    plan = P.StagePlan(
        root=P.Operator(
            filter=P.Filter(
                input=P.Operator(exchange_input=P.ExchangeInput(schema=schema_bytes(schema))),
                predicate=P.call(
                    "and",
                    P.call("greater_equal", P.col("k"), P.lit(int_value=5)),
                    P.call("starts_with", P.col("v"), options=starts_with_a),
                ),
            )
        ),
        output=P.OutputSpec(partitions=1),
        output_schema=schema_bytes(schema),
    )
    ex = Exchange(P, client, header(P, new_key(P), plan).SerializeToString())
    try:
        ready, data = ex.read()
        assert data is None and ready is not None and ready.WhichOneof("frame") == "ready", ready
        output_schema = read_schema(ready.ready.output_schema)
        assert output_schema.equals(schema)

        # Input up the exchange. Small enough for gRPC's buffers, so writing it all before
        # reading is safe; a real client reads the output concurrently.
        ex.writer.begin(schema)
        for batch in inputs:
            ex.writer.write_batch(batch)
        # The explicit end of the input, with what was sent: a cut upload cannot pass for a short one.
        ex.send(input_end=P.InputEnd(rows=sum(b.num_rows for b in inputs), batches=len(inputs)))

        events: list[str] = []
        out: list[pa.RecordBatch] = []
        finished = None
        while True:
            try:
                frame, data = ex.read()
            except StopIteration:
                break
            if data is not None:
                events.append("batch")
                out.append(data)
            if frame is not None:
                events.append(frame.WhichOneof("frame"))
                if frame.WhichOneof("frame") == "finished":
                    finished = frame.finished
                    ex.writer.done_writing()  # the release: the worker ends the call
        assert ex.reader.schema.equals(output_schema)
        events = [e for e in events if e != "heartbeat"]
        assert events and events[-1] == "finished", events
        assert set(events) <= {"batch", "finished"}, events
        assert finished is not None
        assert finished.rows_in == source.num_rows
        assert finished.rows_out == expected.num_rows
        result = pa.Table.from_batches(out, schema=output_schema)
        assert sorted_rows(result, "k") == sorted_rows(expected, "k")
    finally:
        ex.close()
    wait_until(lambda: info(P, client).running_tasks == 0, "the worker to free the map task")


def _garbage(P: Protos) -> bytes:
    return b"\xff\xff\xffthis is not a TaskHeader"


def _version_99(P: Protos) -> bytes:
    task = header(P, new_key(P), P.StagePlan(root=scan(P)), {"files": [0]})
    task.protocol_version = 99
    return bytes(task.SerializeToString())


def _task_number_too_big(P: Protos) -> bytes:
    task = header(P, new_key(P), P.StagePlan(root=scan(P)), {"files": [0]})
    task.task_count = 2
    task.stage_key.task_number = 2
    return bytes(task.SerializeToString())


def _unlisted_function(P: Protos) -> bytes:
    plan = P.StagePlan(root=P.Operator(filter=P.Filter(input=scan(P), predicate=P.call("system", P.col("name")))))
    return bytes(header(P, new_key(P), plan, {"files": [0]}).SerializeToString())


def _shared_operator(P: Protos) -> bytes:
    # The scan (node 0) is the input of two limits: a plan's operators form a tree.
    limit = P.Limit(count=1)
    nodes = [P.OperatorNode(feed_scan=scan(P).feed_scan), P.OperatorNode(limit=limit, inputs=[0]), P.OperatorNode(limit=limit, inputs=[0]),
             P.OperatorNode(union=P.Union(), inputs=[1, 2])]
    return bytes(header(P, new_key(P), P.StagePlan(operators=nodes), {"files": [0]}).SerializeToString())


def _forward_input(P: Protos) -> bytes:
    nodes = [P.OperatorNode(limit=P.Limit(count=1), inputs=[1]), P.OperatorNode(feed_scan=scan(P).feed_scan)]
    return bytes(header(P, new_key(P), P.StagePlan(operators=nodes), {"files": [0]}).SerializeToString())


def _nested_root(P: Protos) -> bytes:
    # Protocol 5's encoding: the operators nested in root, not listed.
    return _with_plan(P, P.StagePlan(root=scan(P)).SerializeToString())


def _with_plan(P: Protos, plan: bytes) -> bytes:
    task = header(P, new_key(P), P.StagePlan(root=scan(P)), {"files": [0]})
    task.plan = plan
    return bytes(task.SerializeToString())


@pytest.mark.parametrize(
    ("make_cmd", "code", "field"),
    [
        (_garbage, "ERROR_CODE_INVALID_ARGUMENT", "descriptor.cmd"),
        (_version_99, "ERROR_CODE_VERSION_MISMATCH", "header.protocol_version"),
        (_task_number_too_big, "ERROR_CODE_INVALID_ARGUMENT", "header.stage_key.task_number"),
        (_unlisted_function, "ERROR_CODE_INVALID_ARGUMENT", "plan.root.filter.predicate.nodes[1].call.function"),
        (_shared_operator, "ERROR_CODE_INVALID_ARGUMENT", "header.plan.operators[2].inputs[0]"),
        (_forward_input, "ERROR_CODE_INVALID_ARGUMENT", "header.plan.operators[0].inputs[0]"),
        (_nested_root, "ERROR_CODE_INVALID_ARGUMENT", "header.plan.root"),
    ],
    ids=["garbage", "version-99", "task-number", "unlisted-function", "shared-operator", "forward-input", "nested-root"],
)
def test_malformed_header_is_rejected_with_its_field(
    P: Protos, client: fl.FlightClient, make_cmd: Callable[[Protos], bytes], code: str, field: str
) -> None:
    ex = Exchange(P, client, make_cmd(P))
    try:
        frames: list[Any] = []
        with pytest.raises(fl.FlightServerError) as raised:  # at once; the ErrorInfo rides in extra_info
            while True:
                frames.append(ex.frame())
    finally:
        ex.close()
    assert [f.WhichOneof("frame") for f in frames] == ["error"], frames
    error = frames[0].error
    assert error.code == P.enum("ErrorCode", code)
    assert error.field == field
    assert error.message and "Traceback" not in error.message
    message = clean(raised.value)
    assert message.endswith(f"[field: {field}]"), message
    status = error_info(P, raised.value)
    assert (status.code, status.field) == (error.code, field)
    assert "Traceback" not in message
    assert healthy(client)
    assert info(P, client).running_tasks == 0


def test_a_plan_deeper_than_protobuf_nests_travels_as_a_flat_list(P: Protos, client: fl.FlightClient) -> None:
    # 150 filters over a Values: nested, 300 levels of messages, which protobuf decoders refuse past 100;
    # listed, each filter names the node below it (docs/protocol.md, section 5).
    table = pa.table({"id": pa.array(range(200), pa.int64())})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    nodes = [P.OperatorNode(values=P.Values(ipc_stream=sink.getvalue().to_pybytes()))]
    for i in range(150):
        predicate = P.call("greater_equal", P.col("id"), P.lit(int_value=i))
        nodes.append(P.OperatorNode(filter=P.Filter(predicate=predicate), inputs=[len(nodes) - 1]))
    plan = P.StagePlan(operators=nodes, output=P.OutputSpec(partitions=1), output_schema=schema_bytes(table.schema))
    key = new_key(P)
    ex = Exchange(P, client, header(P, key, plan).SerializeToString())
    try:
        ready = ex.frame()
        assert ready.WhichOneof("frame") == "ready", ready
        _, batches, _ = read_doget(P, client, P.Ticket(stage_key=key, partition_start=0, partition_end=1, query_secret=SECRET))
        frame = ex.frame()
        while frame.WhichOneof("frame") != "finished":
            assert frame.WhichOneof("frame") in {"credit", "heartbeat"}, frame
            frame = ex.frame()
        ex.writer.done_writing()
        ex.drain()
    finally:
        ex.close()
    assert sorted(i for b in batches for i in b.column("id").to_pylist()) == list(range(149, 200))
    wait_until(lambda: info(P, client).running_tasks == 0, "the worker to free the task")


def _refused(P: Protos, client: fl.FlightClient, tmp_path: Path, frame: Callable[[Any], dict[str, Any]]) -> tuple[list[Any], fl.FlightError]:
    """A leaf task over one file (window 2) sent ``frame(unit)`` once it is ready: the error frames it answered with
    and the error that ended the call (the worker ends it without waiting for the client)."""
    (path,) = write_files(tmp_path, count=1)
    ex = Exchange(P, client, header(P, new_key(P), P.StagePlan(root=scan(P)), {"files": [0]}, feed_window=2).SerializeToString())
    try:
        ready = ex.frame()
        assert ready.WhichOneof("frame") == "ready" and [c.credits for c in ready.ready.credits] == [2], ready
        ex.send(**frame(P.WorkUnit(body=P.FileUnit(path=str(path)).SerializeToString())))
        frames: list[Any] = []
        with pytest.raises(fl.FlightServerError) as raised:
            while True:
                frames.append(ex.frame())
    finally:
        ex.close()
    return [f.error for f in frames if f.WhichOneof("frame") == "error"], raised.value


def test_more_units_than_credit_is_a_protocol_error(P: Protos, client: fl.FlightClient, tmp_path: Path) -> None:
    errors, raised = _refused(P, client, tmp_path, lambda unit: {"units": P.WorkUnitBatch(feed_id="files", partition=0, units=[unit] * 3)})
    assert len(errors) == 1, errors
    assert errors[0].code == P.enum("ErrorCode", "ERROR_CODE_INVALID_ARGUMENT")
    assert errors[0].field == "app_metadata.units"
    assert clean(raised).endswith("[field: app_metadata.units]")
    wait_until(lambda: info(P, client).running_tasks == 0, "the worker to free the rejected task")


def test_several_partitions_units_and_ends_in_one_feed_frames(P: Protos, client: fl.FlightClient, tmp_path: Path) -> None:
    """Protocol 13: a ``FeedFrames`` carries each partition's units, then their ends; the worker acts on them as on
    frames of their own, so the task reads both partitions' files whole."""
    paths = write_files(tmp_path, count=3)
    key = new_key(P)
    plan = P.StagePlan(root=scan(P), output=P.OutputSpec(partitions=1), output_schema=schema_bytes(FILE_SCHEMA))
    ex = Exchange(P, client, header(P, key, plan, {"files": [0, 1]}, feed_window=4).SerializeToString())
    try:
        ready = ex.frame()
        assert sorted((c.partition, c.credits) for c in ready.ready.credits) == [(0, 4), (1, 4)], ready
        unit = [P.WorkUnit(body=P.FileUnit(path=str(p)).SerializeToString()) for p in paths]
        ex.send(feeds=P.FeedFrames(
            units=[P.WorkUnitBatch(feed_id="files", partition=0, units=unit[:2]), P.WorkUnitBatch(feed_id="files", partition=1, units=unit[2:])],
            ends=[P.FeedEnd(feed_id="files", partition=0), P.FeedEnd(feed_id="files", partition=1)],
        ))
        ticket = P.Ticket(stage_key=key, partition_start=0, partition_end=1, query_secret=SECRET)
        _, batches, _ = read_doget(P, client, ticket)
        want = pa.concat_tables([pq.read_table(p) for p in paths])
        assert sorted_rows(pa.Table.from_batches(batches, schema=FILE_SCHEMA), "id") == sorted_rows(want, "id")
        frame = ex.frame()
        while frame.WhichOneof("frame") == "credit":
            frame = ex.frame()
        assert frame.WhichOneof("frame") == "finished", frame
        assert sorted((f.partition, f.units) for f in frame.finished.feeds) == [(0, 2), (1, 1)]
        ex.writer.done_writing()
        ex.drain()
    finally:
        ex.close()
    wait_until(lambda: info(P, client).running_tasks == 0, "the worker to free the task")


def test_a_feed_frames_entry_for_a_partition_the_task_lacks_is_refused(P: Protos, client: fl.FlightClient, tmp_path: Path) -> None:
    errors, raised = _refused(P, client, tmp_path, lambda unit: {"feeds": P.FeedFrames(units=[
        P.WorkUnitBatch(feed_id="files", partition=0, units=[unit]), P.WorkUnitBatch(feed_id="files", partition=7, units=[unit])])})
    assert len(errors) == 1 and errors[0].code == P.enum("ErrorCode", "ERROR_CODE_INVALID_ARGUMENT"), errors
    assert "entry 1 of a FeedFrames' units" in errors[0].message and "partition 7" in errors[0].message, errors[0]
    assert errors[0].field == "app_metadata.feeds.units[1]", errors[0]
    assert "partition 7" in clean(raised)
    wait_until(lambda: info(P, client).running_tasks == 0, "the worker to free the rejected task")


def test_execution_error_is_reported_then_released_by_the_half_close(P: Protos, client: fl.FlightClient, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-file.parquet"
    key = new_key(P)
    ex = Exchange(P, client, header(P, key, P.StagePlan(root=scan(P)), {"files": [0]}).SerializeToString())
    try:
        ready = ex.frame()
        assert ready.WhichOneof("frame") == "ready" and len(ready.ready.credits) == 1, ready  # the first window
        unit = P.WorkUnit(body=P.FileUnit(path=str(missing)).SerializeToString())
        ex.send(units=P.WorkUnitBatch(feed_id="files", partition=0, units=[unit]))
        ex.send(feed_end=P.FeedEnd(feed_id="files", partition=0))
        frame = ex.frame()
        while frame.WhichOneof("frame") == "credit":
            frame = ex.frame()
        assert frame.WhichOneof("frame") == "error", frame
        assert frame.error.code == P.enum("ErrorCode", "ERROR_CODE_EXECUTION")
        assert str(missing) in frame.error.message
        assert frame.error.stage_key == key

        # The task's output cannot be read (its ErrorInfo above has the real cause).
        ticket = P.Ticket(stage_key=key, partition_start=0, partition_end=1, query_secret=SECRET)
        with pytest.raises((fl.FlightCancelledError, fl.FlightServerError)):
            read_doget(P, client, ticket)

        # The worker keeps the task until the half-close, then ends the call as "failed".
        ex.writer.done_writing()
        with pytest.raises(fl.FlightServerError) as raised:
            ex.drain()
        assert str(missing) in clean(raised.value)
    finally:
        ex.close()
    wait_until(lambda: info(P, client).running_tasks == 0, "the worker to free the failed task")


def test_cancel_frame_cancels_and_the_half_close_ends_the_call(P: Protos, client: fl.FlightClient) -> None:
    key = new_key(P)
    ex = Exchange(P, client, header(P, key, P.StagePlan(root=scan(P)), {"files": [0]}).SerializeToString())
    try:
        assert ex.frame().WhichOneof("frame") == "ready"
        assert info(P, client).running_tasks == 1
        ex.send(cancel=P.Cancel(reason="the raw client changed its mind"))
        frame = ex.frame()
        while frame.WhichOneof("frame") == "credit":
            frame = ex.frame()
        assert frame.WhichOneof("frame") == "error", frame
        assert frame.error.code == P.enum("ErrorCode", "ERROR_CODE_CANCELLED")
        assert "the raw client changed its mind" in frame.error.message
        ex.writer.done_writing()
        with pytest.raises(fl.FlightCancelledError):
            ex.drain()
    finally:
        ex.close()
    wait_until(lambda: info(P, client).running_tasks == 0, "the worker to free the cancelled task")


def _finished_leaf(P: Protos, client: fl.FlightClient, tmp_path: Path) -> tuple[Exchange, Any, Path]:
    """A leaf task over one 40-row file, fed, ended and finished; its output still unread."""
    (path,) = write_files(tmp_path, count=1)
    key = new_key(P)
    ex = Exchange(P, client, header(P, key, P.StagePlan(root=scan(P)), {"files": [0]}).SerializeToString())
    ready = ex.frame()
    assert ready.WhichOneof("frame") == "ready" and len(ready.ready.credits) == 1, ready  # the first window
    ex.send(units=P.WorkUnitBatch(feed_id="files", partition=0, units=[P.WorkUnit(body=P.FileUnit(path=str(path)).SerializeToString())]))
    ex.send(feed_end=P.FeedEnd(feed_id="files", partition=0))
    frame = ex.frame()
    while frame.WhichOneof("frame") in ("credit", "heartbeat"):
        frame = ex.frame()
    assert frame.WhichOneof("frame") == "finished", frame
    return ex, key, path


def test_a_unit_after_finished_is_a_protocol_error_not_a_silent_end(P: Protos, client: fl.FlightClient, tmp_path: Path) -> None:
    # docs/protocol.md §7 and §9: units after their partition's FeedEnd are a protocol error, after
    # `finished` too: an ErrorInfo names the field and the call ends INVALID_ARGUMENT (never OK).
    ex, key, path = _finished_leaf(P, client, tmp_path)
    try:
        ex.send(units=P.WorkUnitBatch(feed_id="files", partition=0, units=[P.WorkUnit(body=P.FileUnit(path=str(path)).SerializeToString())]))
        frames: list[Any] = []
        with pytest.raises(fl.FlightServerError) as raised:  # a bad frame: the worker ends the call without waiting
            while True:
                frames.append(ex.frame())
    finally:
        ex.close()
    errors = [f.error for f in frames if f.WhichOneof("frame") == "error"]
    assert len(errors) == 1, frames
    assert errors[0].code == P.enum("ErrorCode", "ERROR_CODE_INVALID_ARGUMENT")
    assert errors[0].field == "app_metadata.units"
    assert errors[0].stage_key == key
    assert clean(raised.value).endswith("[field: app_metadata.units]")
    wait_until(lambda: info(P, client).running_tasks == 0, "the worker to free the task")


def test_a_cancel_after_finished_ends_the_call_cancelled(P: Protos, client: fl.FlightClient, tmp_path: Path) -> None:
    # docs/protocol.md §6 and §9: a Cancel at any time answers ErrorInfo{CANCELLED}, drops the unread
    # output, and the call ends CANCELLED once the client lets go.
    ex, key, _ = _finished_leaf(P, client, tmp_path)
    try:
        ex.send(cancel=P.Cancel(reason="no longer wanted"))
        frame = ex.frame()
        while frame.WhichOneof("frame") in ("heartbeat", "drained"):
            frame = ex.frame()
        assert frame.WhichOneof("frame") == "error", frame
        assert frame.error.code == P.enum("ErrorCode", "ERROR_CODE_CANCELLED")
        assert "no longer wanted" in frame.error.message and frame.error.stage_key == key
        ticket = P.Ticket(stage_key=key, partition_start=0, partition_end=1, query_secret=SECRET)
        with pytest.raises((fl.FlightCancelledError, fl.FlightServerError)):
            read_doget(P, client, ticket)  # the output was dropped
        ex.writer.done_writing()
        with pytest.raises(fl.FlightCancelledError):
            ex.drain()
    finally:
        ex.close()
    wait_until(lambda: info(P, client).running_tasks == 0, "the worker to free the cancelled task")


def test_a_task_moved_by_its_coordinator_sends_a_doget_looking_elsewhere(P: Protos, client: fl.FlightClient, tmp_path: Path) -> None:
    # docs/protocol.md §6 and §11: a Cancel naming a lost worker (the coordinator runs the task again
    # elsewhere) makes a DoGet of its ticket here UNAVAILABLE naming that worker, not NOT_FOUND: while
    # the task is still held, and after the worker let it go.
    lost = "grpc://10.99.0.7:8815"
    ex, key, _ = _finished_leaf(P, client, tmp_path)
    ticket = P.Ticket(stage_key=key, partition_start=0, partition_end=1, query_secret=SECRET)
    unavailable = P.enum("ErrorCode", "ERROR_CODE_UNAVAILABLE")
    try:
        ex.send(cancel=P.Cancel(reason="runs again elsewhere", lost_worker=lost))
        frame = ex.frame()
        while frame.WhichOneof("frame") in ("heartbeat", "drained"):
            frame = ex.frame()
        assert frame.error.code == P.enum("ErrorCode", "ERROR_CODE_CANCELLED")
        with pytest.raises(fl.FlightError) as raised:
            read_doget(P, client, ticket)
        held = error_info(P, raised.value)
        assert (held.code, held.worker_url) == (unavailable, lost), held
        ex.writer.done_writing()
        with pytest.raises(fl.FlightCancelledError):
            ex.drain()
    finally:
        ex.close()
    wait_until(lambda: info(P, client).running_tasks == 0, "the worker to free the moved task")
    with pytest.raises(fl.FlightError) as raised:
        read_doget(P, client, ticket)
    ended = error_info(P, raised.value)
    assert (ended.code, ended.worker_url, ended.stage_key) == (unavailable, lost, key), ended
    assert "runs again elsewhere" in ended.message


def test_a_release_frame_frees_a_finished_task_and_ends_the_call_ok(P: Protos, client: fl.FlightClient, tmp_path: Path) -> None:
    # docs/protocol.md §6: Release is the half-close as a frame; the worker ends the call itself.
    ex, key, _ = _finished_leaf(P, client, tmp_path)
    try:
        ticket = P.Ticket(stage_key=key, partition_start=0, partition_end=1, query_secret=SECRET)
        _, batches, _ = read_doget(P, client, ticket)
        assert sum(b.num_rows for b in batches) == 40
        ex.send(release=P.Release())
        frames = ex.drain()  # ends OK, without our half-close
        assert all(f.WhichOneof("frame") in ("heartbeat", "drained") for f in frames), frames
    finally:
        ex.close()
    wait_until(lambda: info(P, client).running_tasks == 0, "the worker to free the released task")


def test_a_doget_of_a_task_the_worker_never_had_says_so(P: Protos, client: fl.FlightClient, tmp_path: Path) -> None:
    # docs/protocol.md §10: NOT_FOUND either way; ErrorInfo.never_here tells a task this worker never had (it
    # restarted, or the task never reached it: a reader takes the worker for lost) from one that ended here.
    ex, key, _ = _finished_leaf(P, client, tmp_path)
    try:
        ticket = P.Ticket(stage_key=key, partition_start=0, partition_end=1, query_secret=SECRET)
        read_doget(P, client, ticket)
        ex.send(release=P.Release())
        ex.drain()
    finally:
        ex.close()
    with pytest.raises(fl.FlightServerError) as raised:
        read_doget(P, client, ticket)
    ended = error_info(P, raised.value)
    assert (ended.code, ended.never_here) == (P.enum("ErrorCode", "ERROR_CODE_NOT_FOUND"), False), ended
    assert "it finished" in ended.message
    other = P.StageKey(query_id=uuid.uuid4().hex[:16], stage_id=0, task_number=0)
    quick = start_worker(tmp_path, extra=["--get-wait", "1"])  # the shared worker's 10 s would be this test's whole time
    try:
        with fl.connect(quick.url) as short, pytest.raises(fl.FlightServerError) as raised:  # after --get-wait (it might still arrive)
            read_doget(P, short, P.Ticket(stage_key=other, partition_start=0, partition_end=1, query_secret=SECRET))
    finally:
        stop_worker(quick.proc)
    never = error_info(P, raised.value)
    assert (never.code, never.never_here, never.field) == (P.enum("ErrorCode", "ERROR_CODE_NOT_FOUND"), True, "ticket.stage_key"), never
    assert "it is not running here" in never.message


def test_a_doget_stream_with_nothing_to_send_sends_heartbeats_of_no_rows(P: Protos, client: fl.FlightClient, tmp_path: Path) -> None:
    # docs/protocol.md §11: while a stream has nothing to send, a batch of 0 rows of its schema every
    # heartbeat_ms, its BatchMetadata saying heartbeat (and the partition being read); rows follow as they come.
    (path,) = write_files(tmp_path, count=1)
    key = new_key(P)
    ex = Exchange(P, client, header(P, key, P.StagePlan(root=scan(P)), {"files": [0]}, heartbeat_ms=200).SerializeToString())
    try:
        ready = ex.frame()
        assert ready.WhichOneof("frame") == "ready", ready
        schema = read_schema(ready.ready.output_schema)
        ticket = P.Ticket(stage_key=key, partition_start=0, partition_end=1, query_secret=SECRET)
        reader = client.do_get(fl.Ticket(ticket.SerializeToString()), options=CALL)
        chunk = reader.read_chunk()  # no unit was sent: the task has nothing to send yet
        meta = P.BatchMetadata.FromString(chunk.app_metadata.to_pybytes())
        assert meta.heartbeat and meta.HasField("partition") and meta.partition == 0
        assert chunk.data.num_rows == 0 and chunk.data.schema.equals(schema)
        ex.send(units=P.WorkUnitBatch(feed_id="files", partition=0, units=[P.WorkUnit(body=P.FileUnit(path=str(path)).SerializeToString())]))
        ex.send(feed_end=P.FeedEnd(feed_id="files", partition=0))
        rows = 0
        with contextlib.suppress(StopIteration):
            while True:
                chunk = reader.read_chunk()
                meta = P.BatchMetadata.FromString(chunk.app_metadata.to_pybytes())
                assert meta.partition == 0 and (chunk.data.num_rows == 0 or not meta.heartbeat), meta
                rows += chunk.data.num_rows
        assert rows == 40
        ex.send(release=P.Release())
        ex.drain()  # ends OK
    finally:
        ex.close()
    wait_until(lambda: info(P, client).running_tasks == 0, "the worker to free the task")


def test_a_release_before_finished_cancels_the_task(P: Protos, client: fl.FlightClient) -> None:
    key = new_key(P)
    ex = Exchange(P, client, header(P, key, P.StagePlan(root=scan(P)), {"files": [0]}).SerializeToString())
    try:
        assert ex.frame().WhichOneof("frame") == "ready"
        ex.send(release=P.Release())
        with pytest.raises(fl.FlightCancelledError):
            ex.drain()
    finally:
        ex.close()
    wait_until(lambda: info(P, client).running_tasks == 0, "the worker to free the released task")


def test_expressions_that_do_not_fit_their_input_are_rejected_not_fatal(P: Protos, tmp_path: Path) -> None:
    # Its own worker: pyarrow can crash a process on an expression that does not bind, and a
    # regression here must not take the shared worker (and every later test) down with it.
    own = start_worker(tmp_path)
    try:
        with fl.connect(own.url) as c:
            cases = [  # (the field the error must name, the plan's root)
                ("plan.root.filter.predicate", P.Operator(  # a column the scan does not have
                    filter=P.Filter(input=scan(P), predicate=P.call("greater", P.col("no_such_column"), P.lit(int_value=1)))
                )),
                ("plan.root.filter.predicate", P.Operator(  # not boolean
                    filter=P.Filter(input=scan(P), predicate=P.call("add", P.col("id"), P.lit(int_value=1)))
                )),
                ("plan.root.project.exprs[0].expr", P.Operator(  # no utf8_upper kernel for float64
                    project=P.Project(
                        input=scan(P),
                        exprs=[P.NamedExpression(name="x", expr=P.call("utf8_upper", P.col("score")))],
                    )
                )),
            ]
            for field, root in cases:
                ex = Exchange(P, c, header(P, new_key(P), P.StagePlan(root=root), {"files": [0]}).SerializeToString())
                try:
                    frames: list[Any] = []
                    with pytest.raises(fl.FlightServerError) as raised:
                        while True:
                            frames.append(ex.frame())
                finally:
                    ex.close()
                assert own.proc.poll() is None, f"the worker died with exit code {own.proc.returncode}"
                assert [f.WhichOneof("frame") for f in frames] == ["error"], frames
                assert frames[0].error.code == P.enum("ErrorCode", "ERROR_CODE_INVALID_ARGUMENT")
                assert frames[0].error.field == field
                assert clean(raised.value).endswith(f"[field: {field}]")
            assert healthy(c)
            assert info(P, c).running_tasks == 0
    finally:
        rc = stop_worker(own.proc)
    assert rc == 0, f"the worker exited with {rc}; its log:\n{own.log_tail()}"


def test_map_stage_limit_ends_the_call_although_more_input_was_sent(P: Protos, tmp_path: Path) -> None:
    # Once its Limit is satisfied, a map stage discards further input but still sees the half-close.
    # Its own worker: should that regress, a stuck task must not hold up the shared worker's shutdown.
    own = start_worker(tmp_path)
    key = new_key(P)
    schema = pa.schema([("k", pa.int64())])
    plan = P.StagePlan(
        root=P.Operator(
            limit=P.Limit(input=P.Operator(exchange_input=P.ExchangeInput(schema=schema_bytes(schema))), count=5)
        )
    )
    try:
        with fl.connect(own.url) as c:
            try:
                ex = Exchange(P, c, header(P, key, plan).SerializeToString(), fl.FlightCallOptions(timeout=10.0))
                try:
                    assert ex.frame().WhichOneof("frame") == "ready"
                    ex.writer.begin(schema)
                    for i in range(300):  # far more than the worker's 8-batch input queue
                        ex.writer.write_batch(pa.record_batch([pa.array(range(i * 10, i * 10 + 10), pa.int64())], schema=schema))
                    ex.writer.done_writing()
                    rows, kinds = 0, []
                    while True:
                        try:
                            frame, data = ex.read()
                        except StopIteration:
                            break
                        if data is not None:
                            rows += data.num_rows
                        if frame is not None:
                            kinds.append(frame.WhichOneof("frame"))
                    assert kinds == ["finished"]
                    assert rows == 5
                finally:
                    ex.close()
                wait_until(lambda: info(P, c).running_tasks == 0, "the worker to free the map task", timeout=5.0)
            finally:
                # Free a stuck task (should the test fail) so the worker stops without its grace period.
                with contextlib.suppress(pa.ArrowException):
                    body = P.CancelRequest(query_id=key.query_id, query_secret=SECRET).SerializeToString()
                    list(c.do_action(fl.Action("cancel", body), options=CALL))
    finally:
        rc = stop_worker(own.proc)
    assert rc == 0, f"the worker exited with {rc}; its log:\n{own.log_tail()}"


def _hash_test_table(rows: int = 240) -> pa.Table:
    """Key columns of several types, special values first, then random ones; ``id`` names a row."""
    rng = random.Random(20240607)
    nan_payload = struct.unpack("<d", struct.pack("<Q", 0xFFF4000000000123))[0]  # negative, non-canonical
    specials: dict[str, tuple[pa.DataType, list[Any], Callable[[], Any]]] = {
        "i": (pa.int64(), [0, 1, -1, 42, -42, 2**63 - 1, -(2**63), None], lambda: rng.randrange(-(2**63), 2**63)),
        "i32": (pa.int32(), [0, -1, 2**31 - 1, -(2**31), None], lambda: rng.randrange(-1000, 1000)),
        "f": (
            pa.float64(),
            [0.0, -0.0, math.nan, -math.nan, nan_payload, math.inf, -math.inf, 1.5, -1.5, 0.1, 1e300, -1e300,
             5e-324, 2.0**63, None, 0.0, -0.0, math.nan],
            lambda: rng.choice([rng.uniform(-1e6, 1e6), float(rng.randrange(-100, 100))]),
        ),
        "s": (
            pa.string(),
            ["", None, "a", "abc", "é", "e\u0301", "日本語", "🙂", "Straße", "ß"],
            lambda: "".join(rng.choice("abcxyz-é日🙂") for _ in range(rng.randrange(0, 8))),
        ),
        "b": (pa.binary(), [b"", None, b"\x00", b"\xff\xfe", b"abc"], lambda: rng.randbytes(rng.randrange(0, 6))),
        "d": (
            pa.decimal128(12, 2),
            [Decimal("0.00"), Decimal("-0.01"), Decimal("12.34"), Decimal("-12.34"), Decimal("9999999999.99"), None],
            lambda: Decimal(rng.randrange(-10**11, 10**11)).scaleb(-2),
        ),
        "day": (
            pa.date32(),
            [datetime.date(1970, 1, 1), datetime.date(1969, 12, 31), datetime.date(1900, 1, 1), None],
            lambda: datetime.date(1970, 1, 1) + datetime.timedelta(days=rng.randrange(-30000, 30000)),
        ),
        "flag": (pa.bool_(), [True, False, None], lambda: rng.random() < 0.5),
    }
    columns: dict[str, pa.Array] = {"id": pa.array(range(rows), pa.int64())}
    for name, (type_, fixed, draw) in specials.items():
        values = [*fixed, *(draw() if rng.random() > 0.05 else None for _ in range(rows - len(fixed)))]
        columns[name] = pa.array(values, type_)
    return pa.table(columns)


@pytest.mark.parametrize(
    ("keys", "partitions"),
    [
        (["i"], 5),
        (["f"], 5),
        (["s"], 6),
        (["i", "f"], 4),  # two keys; a power of two
        (["s", "i32"], 5),  # strings and numbers: only i32 is hashed
        (["s", "b"], 3),  # only string-like keys: both are hashed
        (["d", "day", "flag"], 7),
    ],
    ids=["int", "float", "string", "int-float", "string-int32", "string-binary", "decimal-date-bool"],
)
def test_hash_partitions_follow_the_documented_function(
    P: Protos, client: fl.FlightClient, keys: list[str], partitions: int
) -> None:
    table = _hash_test_table()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=64)
    plan = P.StagePlan(
        root=P.Operator(values=P.Values(ipc_stream=sink.getvalue().to_pybytes())),
        output=P.OutputSpec(partitions=partitions, hash_keys=keys),
        output_schema=schema_bytes(table.schema),
    )
    key = new_key(P)
    ex = Exchange(P, client, header(P, key, plan).SerializeToString())
    landed: dict[int, int] = {}  # row id -> the partition whose stream carried it
    try:
        ready = ex.frame()
        assert ready.WhichOneof("frame") == "ready", ready
        assert read_schema(ready.ready.output_schema).equals(table.schema)
        # Partition 0 on its own ticket, the others on one ticket spanning [1, n).
        for start, end in [(0, 1), (1, partitions)]:
            schema, batches, labels = read_doget(P, client, P.Ticket(stage_key=key, partition_start=start, partition_end=end, query_secret=SECRET))
            assert schema.equals(table.schema)
            assert labels == sorted(labels) and set(labels) <= set(range(start, end)), labels
            for batch, partition in zip(batches, labels):
                for row_id in batch.column("id").to_pylist():
                    assert row_id not in landed, f"row {row_id} came twice"
                    landed[row_id] = partition
        frame = ex.frame()
        while frame.WhichOneof("frame") != "finished":
            assert frame.WhichOneof("frame") in {"credit", "heartbeat"}, frame
            frame = ex.frame()
        ex.writer.done_writing()
        ex.drain()
    finally:
        ex.close()
    wait_until(lambda: info(P, client).running_tasks == 0, "the worker to free the task")

    types = [table.schema.field(k).type for k in keys]
    expected = {row["id"]: spec_partition([row[k] for k in keys], types, partitions) for row in table.to_pylist()}
    wrong = {i: (landed.get(i), p) for i, p in expected.items() if landed.get(i) != p}
    assert not wrong, f"{len(wrong)} rows (id: (landed, spec)) not where the spec puts them: {dict(list(wrong.items())[:5])}"
    assert len(set(landed.values())) > 1
    if keys == ["f"]:  # equal keys together: -0.0 with 0.0, every NaN with every other
        floats = table.column("f").to_pylist()
        zeros = {landed[i] for i, x in enumerate(floats) if x == 0.0}
        nans = {landed[i] for i, x in enumerate(floats) if x is not None and math.isnan(x)}
        assert len(zeros) == 1 and len(nans) == 1, (zeros, nans)


def test_resume_restarts_the_watchdog(P: Protos, tmp_path: Path) -> None:
    """After drain and resume, a task whose coordinator goes silent is still freed after --peer-timeout."""
    log = tmp_path / "worker.log"
    with open(log, "wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flight.worker", "--host", "127.0.0.1", "--port", "0", "--peer-timeout", "1"],
            stdout=subprocess.PIPE,
            stderr=stderr,
            cwd=tmp_path,
        )
    try:
        match = LISTENING.match(_first_line(proc, START_TIMEOUT))
        assert match, "the worker did not print its listening line"
        with fl.connect(match.group(1).decode()) as c:
            list(c.do_action(fl.Action("drain", b""), options=CALL))
            wait_until(lambda: info(P, c).draining, "the worker to drain")
            list(c.do_action(fl.Action("resume", b""), options=CALL))
            assert not info(P, c).draining and healthy(c)
            ex = Exchange(P, c, header(P, new_key(P), P.StagePlan(root=scan(P)), {"files": [0]}).SerializeToString())
            try:
                assert ex.frame().WhichOneof("frame") == "ready"
                assert info(P, c).running_tasks == 1
                # Silent from here on: no unit, no heartbeat, no half-close.
                wait_until(lambda: info(P, c).running_tasks == 0, "the watchdog to free the silent client's task", timeout=20.0)
            finally:
                with contextlib.suppress(pa.ArrowException):
                    ex.reader.cancel()
                ex.close()
    finally:
        rc = stop_worker(proc)
    assert rc == 0, f"the worker exited with {rc}; its log:\n{log.read_text(errors='replace')[-3000:]}"
