"""Frames of the coordinator ↔ worker protocol: encode, decode, validate.

The wire format is ``proto/flight/wire/_proto/protocol.proto``; docs/protocol.md says
in which order the frames flow. This module is the only place that parses
bytes from a peer, so every malformed input becomes one ``ProtocolError``
naming the field that was wrong, and both sides share the same checks.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Sequence
from typing import Literal

import pyarrow as pa
import pyarrow.flight as fl
from google.protobuf.message import DecodeError, Message

from flight.errors import ProtocolError, VersionMismatchError
from flight.wire._proto import plan_pb2, protocol_pb2
from flight.wire.ipc import check_schema
from flight.wire.limits import (
    MAX_ECHO_CHARS,
    MAX_FEED_PARTITIONS,
    MAX_FEEDS,
    MAX_FRAME_BYTES,
    MAX_HEADER_BYTES,
    MAX_ID_CHARS,
    MAX_MESSAGE_CHARS,
    MAX_OUTPUT_PARTITIONS,
    MAX_OUTPUT_READERS,
    MAX_PROJECTED,
    MAX_SECRET_BYTES,
    MAX_TASK_COUNT,
    MAX_UNIT_BYTES,
    MAX_UNITS_PER_FRAME,
    MIN_SECRET_BYTES,
    check_count,
    clip,
)
from flight.wire.operators import taggable
from flight.wire.plan_codec import check_operators, unflatten

__all__ = [
    "COMPRESSION",
    "DIALECT_HEADER",
    "INPUT_CALL_PATH",
    "PROTOCOL_VERSION",
    "RETAIN_HEADER",
    "TAG_HEADER",
    "check_id",
    "check_secret",
    "decode_attach",
    "decode_cancel_request",
    "decode_coordinator_frame",
    "decode_header",
    "decode_schema",
    "decode_ticket",
    "decode_worker_frame",
    "encode_schema",
    "error_info_of",
    "format_stage_key",
    "ipc_options",
    "make_stage_key",
    "new_secret",
    "status_error",
    "status_message",
]

PROTOCOL_VERSION = 13
"""Bumped on any change a peer of the previous version would misread (2: heartbeats, InputEnd, flat expressions;
3: the Release frame, which a version-2 worker would refuse as a frame without a member; 4: heartbeats on
DoGet streams, whose absence a version-4 reader takes for a lost worker when a version-3 producer is slow;
5: input calls, which a version-4 worker would run as a map stage; 6: a plan's operators as a flat list,
``StagePlan.operators``, where a version-5 worker finds no ``root``; 7: RANGE window frames, ``WindowFrame.range``,
which a version-6 worker would compute as ROWS, beside the ``Unnest`` operator and the aggregates DuckDB computes;
8: every partition of a row stream ends with its trailer, ``BatchMetadata.trailer``, whose absence a version-8 reader
takes for a stream ended short; 9: an error's ``extra_info`` is an ``RpcStatus`` around the ``ErrorInfo``, which a
version-8 reader would not find; 10: the trailer's ``checksum`` sums long buffers' words before its CRC-32, which a
version-9 reader would take for a corrupted stream; 11: ``Values.every_task``, literal rows every task of a join emits,
which a version-10 worker would emit from task 0 alone; 12: each feed partition's first credit window in
``Ready.credits``, where a version-11 coordinator waits for a ``FeedCredit`` frame per partition; 13: ``FeedFrames``,
several partitions' units and feed ends in one frame, which a version-12 worker would refuse as a frame it does not know)."""

RETAIN_HEADER = "x-flight-exec-retain"
DIALECT_HEADER = "x-flight-exec-dialect"
"""A call header of a Flight SQL statement to ``flight-coordinator``: the text's SQL dialect (``duckdb``, the
default, or ``spark``; ``flight/service/hints.py``). The Spark data source sends ``spark`` unless told otherwise."""
TAG_HEADER = "x-flight-exec-tag"
"""A call header of a Flight SQL statement to ``flight-coordinator``: a name the client chose for it (at most 64
letters, digits, ``-`` and ``_``), by which the same client asks its progress or cancels it (``flight-sql``'s
progress line and Ctrl-C; ``flight/service/watch.py``)."""
INPUT_CALL_PATH = "flight-exec.input"
"""The DoExchange descriptor path of an input call: batches for a task whose ExchangeInput has
``separate_input`` (docs/protocol.md, section 16), from another process than its coordinator."""
"""A call header of a Flight SQL ``GetFlightInfo`` to ``flight-coordinator``: keep the statement's results
readable again for this many seconds (``flight/service/hints.py``; the Spark data source sends it)."""

_ID = re.compile(rf"[A-Za-z0-9._:-]{{1,{MAX_ID_CHARS}}}")


COMPRESSION = {
    "none": protocol_pb2.COMPRESSION_NONE,
    "lz4": protocol_pb2.COMPRESSION_LZ4,
    "zstd": protocol_pb2.COMPRESSION_ZSTD,
}
"""``ExecOptions.compression`` names and their wire values."""


def ipc_options(compression: int) -> pa.ipc.IpcWriteOptions:
    """IPC write options for a TaskOptions.ipc_compression value (unknown values: none)."""
    codecs: dict[int, Literal["lz4", "zstd"]] = {COMPRESSION["lz4"]: "lz4", COMPRESSION["zstd"]: "zstd"}
    return pa.ipc.IpcWriteOptions(compression=codecs.get(compression))


def status_message(error: BaseException | str) -> str:
    """The readable part of a Flight status: what precedes pyarrow's appended detail and context.

    pyarrow adds ". Detail: ..." (a Python traceback for errors escaping a handler) and
    ". gRPC client debug context: ..." to messages; people should see neither.
    """
    text = str(error)
    for marker in (". Detail:", "\nDetail:", ". gRPC client debug context", ". Client context:"):
        text = text.split(marker)[0]
    return text.strip()


def make_stage_key(query_id: str, stage_id: int, task_number: int, epoch: int = 0) -> protocol_pb2.StageKey:
    return protocol_pb2.StageKey(query_id=query_id, stage_id=stage_id, task_number=task_number, epoch=epoch)


def format_stage_key(key: protocol_pb2.StageKey) -> str:
    """``query/stage/task`` (``@epoch`` for a task run again): how errors, logs and a worker's
    task table name a task."""
    base = f"{key.query_id}/{key.stage_id}/{key.task_number}"
    return f"{base}@{key.epoch}" if key.epoch else base


def encode_schema(schema: pa.Schema) -> bytes:
    return schema.serialize().to_pybytes()


def decode_schema(data: bytes, field: str) -> pa.Schema:
    """An Arrow IPC schema message with unique column names; ``field`` names where it came from for the error."""
    if not data:
        raise ProtocolError(f"{field} is empty; expected an Arrow IPC schema", field=field)
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(data))
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise ProtocolError(f"{field} is not a valid Arrow IPC schema: {clip(exc)}", field=field) from None
    return check_schema(schema, field)


def _parse(message: Message, data: bytes | memoryview | pa.Buffer, field: str, limit: int) -> None:
    size = data.size if isinstance(data, pa.Buffer) else len(data)
    if size > limit:
        raise ProtocolError(f"{field} is {size} bytes; at most {limit} are accepted", field=field)
    try:
        message.ParseFromString(bytes(data) if not isinstance(data, bytes) else data)
    except DecodeError as exc:
        # upb refuses messages nested more than 100 deep, among others: say what, not where in C.
        raise ProtocolError(f"{field} is not a valid {message.DESCRIPTOR.full_name}: {clip(exc)}", field=field) from None


def check_id(value: str, field: str) -> None:
    """A query or feed id: 1 to MAX_ID_CHARS of letters, digits and ``._:-`` (it is echoed in errors and logs)."""
    if not _ID.fullmatch(value):
        raise ProtocolError(
            f"{field} must be 1 to {MAX_ID_CHARS} characters of letters, digits and '._:-', not {clip(value, 40)!r}",
            field=field,
        )


def check_secret(secret: bytes, field: str) -> None:
    """A query secret: 16 to 64 bytes (the coordinator draws 16 random ones)."""
    if not MIN_SECRET_BYTES <= len(secret) <= MAX_SECRET_BYTES:
        raise ProtocolError(
            f"{field} must be {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} bytes, not {len(secret)}: "
            "every query carries a random secret that its tickets and cancels repeat",
            field=field,
        )


def _check_stage_key(key: protocol_pb2.StageKey, field: str) -> None:
    check_id(key.query_id, f"{field}.query_id")


def decode_header(data: bytes) -> tuple[protocol_pb2.TaskHeader, plan_pb2.StagePlan]:
    """Parse and check a DoExchange descriptor: the TaskHeader and the StagePlan inside it, whose flat
    operators (``plan_codec``) come back as the tree ``plan.root``."""
    if not data:
        raise ProtocolError("the DoExchange descriptor has no command; expected a TaskHeader", field="descriptor.cmd")
    header = protocol_pb2.TaskHeader()
    _parse(header, data, "descriptor.cmd", MAX_HEADER_BYTES)
    if header.protocol_version != PROTOCOL_VERSION:
        raise VersionMismatchError(
            f"protocol_version {header.protocol_version} is not supported; this worker speaks {PROTOCOL_VERSION}",
            field="header.protocol_version",
        )
    if not header.HasField("stage_key"):
        raise ProtocolError("header.stage_key is missing", field="header.stage_key")
    _check_stage_key(header.stage_key, "header.stage_key")
    check_secret(header.query_secret, "header.query_secret")
    if header.task_count == 0:
        raise ProtocolError("header.task_count is 0; a stage has at least one task", field="header.task_count")
    if header.stage_key.task_number >= header.task_count:
        raise ProtocolError(
            f"header.stage_key.task_number {header.stage_key.task_number} is not below task_count {header.task_count}",
            field="header.stage_key.task_number",
        )
    check_count(header.task_count, MAX_TASK_COUNT, "header.task_count", "tasks")
    check_count(len(header.feeds), MAX_FEEDS, "header.feeds", "feeds")
    check_count(sum(len(f.partitions) for f in header.feeds), MAX_FEED_PARTITIONS, "header.feeds", "feed partitions")
    seen: set[str] = set()
    for i, feed in enumerate(header.feeds):
        check_id(feed.feed_id, f"header.feeds[{i}].feed_id")
        if feed.feed_id in seen:
            raise ProtocolError(f"header.feeds[{i}] repeats feed {feed.feed_id!r}", field=f"header.feeds[{i}].feed_id")
        seen.add(feed.feed_id)
        if len(set(feed.partitions)) != len(feed.partitions):
            raise ProtocolError(f"header.feeds[{i}].partitions repeats a partition", field=f"header.feeds[{i}].partitions")
    plan = plan_pb2.StagePlan()
    if not header.plan:
        raise ProtocolError("header.plan is empty; expected a StagePlan", field="header.plan")
    _parse(plan, header.plan, "header.plan", MAX_HEADER_BYTES)
    check_operators(plan, "header.plan")  # a flat list that is a tree (plan_codec)
    check_count(plan.output.partitions, MAX_OUTPUT_PARTITIONS, "header.plan.output.partitions", "output partitions")
    check_count(plan.output.readers, MAX_OUTPUT_READERS, "header.plan.output.readers", "readers per partition")
    _check_lists(plan)
    unflatten(plan)  # the tree every later step walks: plan.root
    if header.options.tag_units and (plan.output.partitions > 1 or not taggable(plan.root)):
        raise ProtocolError(
            "header.options.tag_units needs one output partition and a plan of filters and projections over one feed scan",
            field="header.options.tag_units",
        )
    return header, plan


_LISTS: dict[str, tuple[tuple[str, str], ...]] = {
    "project": (("exprs", "projected expressions"),),
    "sort": (("keys", "sort keys"),),
    "aggregate": (("keys", "grouping keys"), ("aggregates", "aggregates")),
    "hash_join": (("left_keys", "join keys"), ("right_keys", "join keys")),
    "window": (("partition_by", "partition keys"), ("order_by", "order keys"), ("calls", "window calls")),
}
"""The operators' lists whose length sets the cost of compiling them, each bounded by ``MAX_PROJECTED``."""


def _check_lists(plan: plan_pb2.StagePlan) -> None:
    """Counts no operator check makes before compiling, on the received (flat) operators: each one's
    lists (``_LISTS``), one exchange input per plan."""
    inputs = []
    for i, op in enumerate(plan.operators):
        kind = op.WhichOneof("kind") or ""
        for name, what in _LISTS.get(kind, ()):
            check_count(len(getattr(getattr(op, kind), name)), MAX_PROJECTED, f"header.plan.operators[{i}].{kind}.{name}", what)
        if kind == "exchange_input":
            inputs.append(op.exchange_input.separate_input)
    if len(inputs) > 1:
        raise ProtocolError(f"header.plan has {len(inputs)} exchange inputs; a task takes at most one", field="header.plan")


def decode_coordinator_frame(data: pa.Buffer | bytes) -> protocol_pb2.CoordinatorFrame:
    frame = protocol_pb2.CoordinatorFrame()
    _parse(frame, data, "app_metadata", MAX_FRAME_BYTES)
    kind = frame.WhichOneof("frame")
    if kind is None:
        raise ProtocolError("a CoordinatorFrame has no frame set", field="app_metadata.frame")
    if kind == "units":
        _check_units(frame.units.units, len(frame.units.units), "app_metadata.units")
    elif kind == "feeds":
        _check_feeds(frame.feeds)
    return frame


def _check_feeds(feeds: protocol_pb2.FeedFrames) -> None:
    """A ``FeedFrames``: at least one entry, at most ``2 * MAX_FEED_PARTITIONS``; each ``units`` entry with units, all of
    them together at most ``MAX_UNITS_PER_FRAME``. No coordinator sends an empty bundle or entry: refused, they would
    only be work a peer makes the worker do for nothing."""
    entries = len(feeds.units) + len(feeds.ends)
    if not entries:
        raise ProtocolError("a FeedFrames holds no units and no ends", field="app_metadata.feeds")
    check_count(entries, 2 * MAX_FEED_PARTITIONS, "app_metadata.feeds", "partitions' units and ends in one frame")
    check_count(sum(len(batch.units) for batch in feeds.units), MAX_UNITS_PER_FRAME, "app_metadata.feeds.units", "units in one frame")
    for i, batch in enumerate(feeds.units):
        if not batch.units:
            raise ProtocolError(f"entry {i} of a FeedFrames' units holds no unit", field=f"app_metadata.feeds.units[{i}].units")
        _check_units(batch.units, len(batch.units), f"app_metadata.feeds.units[{i}]")


def _check_units(units: Sequence[protocol_pb2.WorkUnit], total: int, where: str) -> None:
    """A frame's units: ``total`` of them in the frame at most ``MAX_UNITS_PER_FRAME``, each body at most ``MAX_UNIT_BYTES``."""
    check_count(total, MAX_UNITS_PER_FRAME, f"{where}.units", "units in one frame")
    for i, unit in enumerate(units):
        if len(unit.body) > MAX_UNIT_BYTES:
            raise ProtocolError(
                f"work unit {i} is {len(unit.body)} bytes; a unit may be at most {MAX_UNIT_BYTES}",
                field=f"{where}.units[{i}].body",
            )


def decode_attach(data: pa.Buffer | bytes | None) -> protocol_pb2.InputAttach:
    """The first frame of an input call (docs/protocol.md, section 16): which task, and its query's secret."""
    if data is None or not len(data):
        raise ProtocolError("an input call starts with an InputAttach frame in app_metadata", field="app_metadata.attach")
    frame = decode_coordinator_frame(data)
    if frame.WhichOneof("frame") != "attach":
        raise ProtocolError(f"an input call starts with an InputAttach frame, not {frame.WhichOneof('frame')}", field="app_metadata.attach")
    attach = frame.attach
    if not attach.HasField("stage_key"):
        raise ProtocolError("attach.stage_key is missing", field="app_metadata.attach.stage_key")
    _check_stage_key(attach.stage_key, "app_metadata.attach.stage_key")
    check_secret(attach.query_secret, "app_metadata.attach.query_secret")
    return attach


def decode_worker_frame(data: pa.Buffer | bytes) -> protocol_pb2.WorkerFrame:
    frame = protocol_pb2.WorkerFrame()
    _parse(frame, data, "app_metadata", MAX_FRAME_BYTES)
    if frame.WhichOneof("frame") is None:
        raise ProtocolError("a WorkerFrame has no frame set", field="app_metadata.frame")
    return frame


def decode_cancel_request(data: bytes) -> protocol_pb2.CancelRequest:
    """The body of the ``cancel`` action."""
    req = protocol_pb2.CancelRequest()
    _parse(req, data, "body", MAX_HEADER_BYTES)
    check_id(req.query_id, "body.query_id")
    check_secret(req.query_secret, "body.query_secret")
    return req


def decode_ticket(data: bytes) -> protocol_pb2.Ticket:
    ticket = protocol_pb2.Ticket()
    _parse(ticket, data, "ticket", MAX_HEADER_BYTES)
    if not ticket.HasField("stage_key"):
        raise ProtocolError("ticket.stage_key is missing", field="ticket.stage_key")
    _check_stage_key(ticket.stage_key, "ticket.stage_key")
    if ticket.partition_end <= ticket.partition_start:
        raise ProtocolError(
            f"ticket partition range [{ticket.partition_start}, {ticket.partition_end}) is empty",
            field="ticket.partition_end",
        )
    check_count(ticket.partition_end, MAX_OUTPUT_PARTITIONS, "ticket.partition_end", "partitions")
    check_secret(ticket.query_secret, "ticket.query_secret")
    return ticket


_STATUS: dict[int, tuple[Callable[..., fl.FlightError], int]] = {
    protocol_pb2.ERROR_CODE_CANCELLED: (fl.FlightCancelledError, 1),  # gRPC CANCELLED
    protocol_pb2.ERROR_CODE_UNAVAILABLE: (fl.FlightUnavailableError, 14),  # UNAVAILABLE
    protocol_pb2.ERROR_CODE_BUSY: (fl.FlightUnavailableError, 14),
    protocol_pb2.ERROR_CODE_UNAUTHENTICATED: (fl.FlightUnauthenticatedError, 16),  # UNAUTHENTICATED
    protocol_pb2.ERROR_CODE_PERMISSION_DENIED: (fl.FlightUnauthorizedError, 7),  # PERMISSION_DENIED
}
"""Flight status classes by ErrorInfo code, with the gRPC code pyarrow sends each with; every other
code is a FlightServerError (gRPC UNKNOWN, 2).

pyarrow adds a Python traceback to the status of any exception that is not a FlightError
(an ``ArrowInvalid`` becomes INVALID_ARGUMENT *with* the handler's traceback and file paths),
so a worker raises only FlightErrors; what kind of failure it was travels in the ErrorInfo."""
_UNKNOWN = (fl.FlightServerError, 2)
_ERROR_INFO_TYPE = "type.googleapis.com/" + protocol_pb2.ErrorInfo.DESCRIPTOR.full_name


def status_error(info: protocol_pb2.ErrorInfo) -> fl.FlightError:
    """The Flight error a handler raises for ``info``: its message (clipped) as the status text, and as
    ``extra_info`` (gRPC's grpc-status-details-bin trailer) an ``RpcStatus`` with the call's gRPC code, that
    text and ``info``: clients never parse text, and gRPC clients that read the trailer as a google.rpc.Status
    (grpc-go's, under ADBC) find the code they expect."""
    info.message = clip(" ".join(info.message.split()), MAX_MESSAGE_CHARS - 2 * MAX_ECHO_CHARS)
    info.field = clip(info.field)
    kind, grpc_code = _STATUS.get(info.code, _UNKNOWN)
    text = info.message + (f" [field: {info.field}]" if info.field else "")
    status = protocol_pb2.RpcStatus(code=grpc_code, message=text)
    status.details.add(type_url=_ERROR_INFO_TYPE, value=info.SerializeToString())
    return kind(text, extra_info=status.SerializeToString())


def error_info_of(exc: BaseException) -> protocol_pb2.ErrorInfo | None:
    """The ErrorInfo a worker put in a Flight error's ``extra_info`` (``status_error``), if there is a valid one."""
    extra = getattr(exc, "extra_info", None)
    if not extra:
        return None
    status, info = protocol_pb2.RpcStatus(), protocol_pb2.ErrorInfo()
    try:
        status.ParseFromString(extra[:MAX_FRAME_BYTES] if isinstance(extra, bytes) else bytes(extra)[:MAX_FRAME_BYTES])
        detail = next((d for d in status.details if d.type_url == _ERROR_INFO_TYPE), None)
        if detail is None:
            return None
        info.ParseFromString(detail.value)
    except DecodeError:
        return None
    return info if info.code != protocol_pb2.ERROR_CODE_UNSPECIFIED else None


def new_secret() -> bytes:
    """A fresh query secret: 128 random bits from the OS."""
    return secrets.token_bytes(MIN_SECRET_BYTES)
