"""Frames of the coordinator ↔ worker protocol: encode, decode, validate.

The wire format is ``proto/flight/_proto/protocol.proto``; docs/protocol.md says
in which order the frames flow. This module is the only place that parses
bytes from a peer, so every malformed input becomes one ``ProtocolError``
naming the field that was wrong, and both sides share the same checks.
"""

from __future__ import annotations

import pyarrow as pa
from google.protobuf.message import DecodeError, Message

from flight._proto import plan_pb2, protocol_pb2
from flight.errors import ProtocolError, VersionMismatchError

__all__ = [
    "COMPRESSION",
    "PROTOCOL_VERSION",
    "ipc_options",
    "status_message",
    "decode_coordinator_frame",
    "decode_header",
    "decode_schema",
    "decode_ticket",
    "decode_worker_frame",
    "encode_schema",
    "format_stage_key",
    "make_stage_key",
]

PROTOCOL_VERSION = 1
"""Bumped on any change a peer of the previous version would misread."""


COMPRESSION = {
    "none": protocol_pb2.COMPRESSION_NONE,
    "lz4": protocol_pb2.COMPRESSION_LZ4,
    "zstd": protocol_pb2.COMPRESSION_ZSTD,
}
"""``ExecOptions.compression`` names and their wire values."""


def ipc_options(compression: int) -> pa.ipc.IpcWriteOptions:
    """IPC write options for a TaskOptions.ipc_compression value (unknown values: none)."""
    names = {v: k for k, v in COMPRESSION.items()}
    name = names.get(compression, "none")
    return pa.ipc.IpcWriteOptions(compression=None if name == "none" else name)


def status_message(error: BaseException | str) -> str:
    """The readable part of a Flight status: what precedes pyarrow's appended detail and context.

    pyarrow adds ". Detail: ..." (a Python traceback for errors escaping a handler) and
    ". gRPC client debug context: ..." to messages; people should see neither.
    """
    text = str(error)
    for marker in (". Detail:", "\nDetail:", ". gRPC client debug context", ". Client context:"):
        text = text.split(marker)[0]
    return text.strip()


def make_stage_key(query_id: str, stage_id: int, task_number: int) -> protocol_pb2.StageKey:
    return protocol_pb2.StageKey(query_id=query_id, stage_id=stage_id, task_number=task_number)


def format_stage_key(key: protocol_pb2.StageKey) -> str:
    """``query/stage/task``: how errors and logs name a task."""
    return f"{key.query_id}/{key.stage_id}/{key.task_number}"


def encode_schema(schema: pa.Schema) -> bytes:
    return schema.serialize().to_pybytes()


def decode_schema(data: bytes, field: str) -> pa.Schema:
    """An Arrow IPC schema message; ``field`` names where it came from for the error."""
    if not data:
        raise ProtocolError(f"{field} is empty; expected an Arrow IPC schema", field=field)
    try:
        return pa.ipc.read_schema(pa.py_buffer(data))
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as exc:
        raise ProtocolError(f"{field} is not a valid Arrow IPC schema: {exc}", field=field) from exc


def _parse(message: Message, data: bytes | memoryview | pa.Buffer, field: str) -> None:
    try:
        message.ParseFromString(bytes(data) if not isinstance(data, bytes) else data)
    except DecodeError as exc:
        raise ProtocolError(f"{field} is not a valid {message.DESCRIPTOR.full_name}: {exc}", field=field) from exc


def _check_stage_key(key: protocol_pb2.StageKey, field: str) -> None:
    if not key.query_id:
        raise ProtocolError(f"{field}.query_id is empty", field=f"{field}.query_id")


def decode_header(data: bytes) -> tuple[protocol_pb2.TaskHeader, plan_pb2.StagePlan]:
    """Parse and check a DoExchange descriptor: the TaskHeader and the StagePlan inside it."""
    if not data:
        raise ProtocolError("the DoExchange descriptor has no command; expected a TaskHeader", field="descriptor.cmd")
    header = protocol_pb2.TaskHeader()
    _parse(header, data, "descriptor.cmd")
    if header.protocol_version != PROTOCOL_VERSION:
        raise VersionMismatchError(
            f"protocol_version {header.protocol_version} is not supported; this worker speaks {PROTOCOL_VERSION}",
            field="header.protocol_version",
        )
    if not header.HasField("stage_key"):
        raise ProtocolError("header.stage_key is missing", field="header.stage_key")
    _check_stage_key(header.stage_key, "header.stage_key")
    if header.task_count == 0:
        raise ProtocolError("header.task_count is 0; a stage has at least one task", field="header.task_count")
    if header.stage_key.task_number >= header.task_count:
        raise ProtocolError(
            f"header.stage_key.task_number {header.stage_key.task_number} is not below task_count {header.task_count}",
            field="header.stage_key.task_number",
        )
    seen: set[str] = set()
    for i, feed in enumerate(header.feeds):
        if not feed.feed_id:
            raise ProtocolError(f"header.feeds[{i}].feed_id is empty", field=f"header.feeds[{i}].feed_id")
        if feed.feed_id in seen:
            raise ProtocolError(f"header.feeds[{i}] repeats feed {feed.feed_id!r}", field=f"header.feeds[{i}].feed_id")
        seen.add(feed.feed_id)
    plan = plan_pb2.StagePlan()
    if not header.plan:
        raise ProtocolError("header.plan is empty; expected a StagePlan", field="header.plan")
    _parse(plan, header.plan, "header.plan")
    if not plan.HasField("root"):
        raise ProtocolError("header.plan.root is missing", field="header.plan.root")
    return header, plan


def decode_coordinator_frame(data: pa.Buffer | bytes) -> protocol_pb2.CoordinatorFrame:
    frame = protocol_pb2.CoordinatorFrame()
    _parse(frame, data, "app_metadata")
    if frame.WhichOneof("frame") is None:
        raise ProtocolError("a CoordinatorFrame has no frame set", field="app_metadata.frame")
    return frame


def decode_worker_frame(data: pa.Buffer | bytes) -> protocol_pb2.WorkerFrame:
    frame = protocol_pb2.WorkerFrame()
    _parse(frame, data, "app_metadata")
    if frame.WhichOneof("frame") is None:
        raise ProtocolError("a WorkerFrame has no frame set", field="app_metadata.frame")
    return frame


def decode_ticket(data: bytes) -> protocol_pb2.Ticket:
    ticket = protocol_pb2.Ticket()
    _parse(ticket, data, "ticket")
    if not ticket.HasField("stage_key"):
        raise ProtocolError("ticket.stage_key is missing", field="ticket.stage_key")
    _check_stage_key(ticket.stage_key, "ticket.stage_key")
    if ticket.partition_end <= ticket.partition_start:
        raise ProtocolError(
            f"ticket partition range [{ticket.partition_start}, {ticket.partition_end}) is empty",
            field="ticket.partition_end",
        )
    return ticket
