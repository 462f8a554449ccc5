"""``ServiceRunner``: plays a service or registry case against its server, every call within the case's deadline.

What it records is the worker fuzzer's ``Outcome`` (statuses, calls past their deadline), so that
``benchmarks.fuzz.verdicts`` judges both alike. The placeholders of ``sqlproto`` become the handles
this case was given; the results of every statement are read to the end (or cancelled), so that
no case leaves a query holding a slot of the service.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl
from google.protobuf.message import DecodeError

from benchmarks.fuzz.cases import Case
from benchmarks.fuzz.exchange import Outcome, Status, ipc_batch, timed_out
from benchmarks.fuzz.mutator import short_repr
from benchmarks.fuzz.service.sqlproto import FLIPPED, HANDLE, RELAY, TOKEN, F, S, pack, unpack_any
from benchmarks.fuzz.settings import LOOPBACK_URL
from benchmarks.fuzz.verdicts import clean_message

__all__ = ["NoHandshake", "ServiceRunner", "record"]


class NoHandshake(fl.ClientAuthHandler):
    """A ``Handshake`` that sends and reads nothing: the call's headers are what the service checks."""

    def authenticate(self, outgoing: Any, incoming: Any) -> None:
        return None

    def get_token(self) -> str:
        return ""


def record(out: Outcome, label: str, exc: BaseException) -> None:
    if timed_out(exc):
        out.timeouts.append(f"{label}: {clean_message(str(exc))[:300]}")
    else:
        out.statuses.append(Status(label, type(exc).__name__, str(exc)))


class ServiceRunner:
    """One case's steps on one connection (``client: fresh`` steps on another), within ``timeout`` seconds."""

    def __init__(self, url: str, timeout: float, token: str = TOKEN) -> None:
        self.url = url
        self.timeout = timeout
        self.token = token
        self.deadline = 0.0
        self.client = fl.connect(url)
        self.handles: list[bytes] = []
        self.relay = b"\x00" * 16
        self.unread: list[fl.FlightInfo] = []
        self.last: fl.FlightInfo | None = None

    def close(self) -> None:
        with contextlib.suppress(pa.ArrowException, OSError):
            self.client.close()

    def run(self, case: Case) -> Outcome:
        out = Outcome()
        self.deadline = time.monotonic() + self.timeout
        for step in case.steps:
            self._step(step, out)
        return out

    def options(self, step: dict[str, Any] | None = None, **extra: Any) -> fl.FlightCallOptions:
        headers = [(k.encode(), v.encode()) for k, v in (step or {}).get("headers", [])]
        if (step or {}).get("auth", "default") == "default":
            headers.insert(0, (b"authorization", f"Bearer {self.token}".encode()))
        return fl.FlightCallOptions(timeout=max(0.05, self.deadline - time.monotonic()), headers=headers, **extra)

    def _localize(self, data: bytes, step: dict[str, Any]) -> bytes:
        handle = self.handles[-1] if self.handles else b"\x00" * 16
        flipped = bytearray(handle)
        bit = int(step.get("flip", 5)) % (8 * len(flipped))
        flipped[bit // 8] ^= 1 << (bit % 8)
        return data.replace(HANDLE, handle).replace(FLIPPED, bytes(flipped)).replace(RELAY, self.relay)

    def _call(self, out: Outcome, label: str, call: Callable[[], object]) -> object:
        try:
            return call()
        except (pa.ArrowException, OSError) as exc:
            record(out, label, exc)
            return None

    def _step(self, step: dict[str, Any], out: Outcome) -> None:
        kind = step["op"]
        client = fl.connect(self.url) if step.get("client") == "fresh" else self.client
        try:
            if kind == "info":
                self._info(client, step, out)
            elif kind == "schema":
                descriptor = fl.FlightDescriptor.for_command(self._localize(step["cmd"], step))
                self._call(out, "GetSchema", lambda: client.get_schema(descriptor, self.options(step)))
            elif kind == "doget":
                ticket = fl.Ticket(self._localize(step["ticket"], step))
                self._call(out, "DoGet", functools.partial(self._drain, client, ticket, step))
            elif kind in ("action", "register"):
                self._action(client, step, out)
            elif kind == "put":
                self._put(client, step, out)
            elif kind == "handshake":
                self._handshake(step, out)
            elif kind == "list_actions":
                self._call(out, "ListActions", lambda: client.list_actions(self.options(step)))
            elif kind in ("read_last", "cancel_last"):
                self._last(step, out)
            elif kind == "close_all":
                self._close_all(out)
        finally:
            if client is not self.client:
                client.close()

    def _info(self, client: fl.FlightClient, step: dict[str, Any], out: Outcome) -> None:
        descriptor = fl.FlightDescriptor.for_command(self._localize(step["cmd"], step))
        info = self._call(out, "GetFlightInfo", lambda: client.get_flight_info(descriptor, self.options(step)))
        if not isinstance(info, fl.FlightInfo):
            return
        self.last = info
        if step.get("keep_relay") and info.endpoints:
            with contextlib.suppress(DecodeError, ValueError):
                url, value = unpack_any(info.endpoints[0].ticket.ticket)
                if url.endswith("TicketStatementQuery"):
                    self.relay = S.TicketStatementQuery.FromString(value).statement_handle
        if step.get("read", True):
            self._read(info, out)
        else:
            self.unread.append(info)

    def _read(self, info: fl.FlightInfo, out: Outcome) -> None:
        """Every endpoint read to its end: from the service (relay), or from the loopback location it names."""
        for endpoint in info.endpoints:
            where = [loc.uri.decode() for loc in endpoint.locations]
            if where and not LOOPBACK_URL.fullmatch(where[0]):
                out.statuses.append(Status("FlightInfo", "NotLoopback", f"an endpoint names {where[0][:80]!r}"))
                continue
            reader = fl.connect(where[0]) if where else self.client
            try:
                self._call(out, "DoGet(endpoint)", functools.partial(self._read_one, reader, endpoint.ticket))
            finally:
                if reader is not self.client:
                    reader.close()

    def _read_one(self, client: fl.FlightClient, ticket: fl.Ticket) -> None:
        self._drain(client, ticket, None)

    def _drain(self, client: fl.FlightClient, ticket: fl.Ticket, step: dict[str, Any] | None) -> None:
        """A DoGet read chunk by chunk, not with ``read_all``: pyarrow's ``read_all`` re-sends the signal number a
        cancelled status carries to the main thread (``SignalStopHandler``), which interrupted the fuzzer itself."""
        reader = client.do_get(ticket, self.options(step))
        with contextlib.suppress(StopIteration):
            while True:
                reader.read_chunk()

    def _action(self, client: fl.FlightClient, step: dict[str, Any], out: Outcome) -> None:
        action = fl.Action(step["type"], pa.py_buffer(self._localize(step["body"], step)))
        label = f"DoAction {short_repr(step['type'])}"
        results = self._call(out, label, lambda: [r.body.to_pybytes() for r in client.do_action(action, self.options(step))])
        if step["type"] == "CreatePreparedStatement" and isinstance(results, list) and results:
            with contextlib.suppress(DecodeError, ValueError):
                _, value = unpack_any(results[0])
                handle = S.ActionCreatePreparedStatementResult.FromString(value).prepared_statement_handle
                if handle:
                    self.handles.append(handle)

    def _put(self, client: fl.FlightClient, step: dict[str, Any], out: Outcome) -> None:
        descriptor = fl.FlightDescriptor.for_command(self._localize(step["cmd"], step))
        try:
            schema = pa.ipc.read_schema(pa.py_buffer(step["schema"])) if step["schema"] else pa.schema([])
        except (pa.ArrowException, OSError, ValueError):
            schema = pa.schema([])  # a schema the client cannot read cannot be sent either
        write = pa.ipc.IpcWriteOptions(compression=step.get("compression"))

        def upload() -> None:
            writer, reader = client.do_put(descriptor, schema, self.options(step, write_options=write))
            try:
                for data in step["batches"]:
                    writer.write_batch(ipc_batch(data))
                writer.done_writing()
                with contextlib.suppress(StopIteration):
                    reader.read()  # type: ignore[attr-defined]  # a FlightMetadataReader; the stubs name another class
            finally:
                writer.close()

        self._call(out, "DoPut", upload)

    def _handshake(self, step: dict[str, Any], out: Outcome) -> None:
        client = fl.connect(self.url)
        try:
            self._call(out, "Handshake", lambda: client.authenticate(NoHandshake(), self.options(step)))
        finally:
            client.close()

    def _last(self, step: dict[str, Any], out: Outcome) -> None:
        info = self.last
        if info is None:
            return
        if step["op"] == "read_last":
            if info in self.unread:
                self.unread.remove(info)
            self._read(info, out)
            return
        if step["how"] == "CancelFlightInfo":
            body = F.CancelFlightInfoRequest(info=F.FlightInfo.FromString(info.serialize())).SerializeToString()
        else:
            body = pack(S.ActionCancelQueryRequest(info=info.serialize()))
        action = fl.Action(step["how"], pa.py_buffer(body))
        self._call(out, f"DoAction {step['how']}", lambda: list(self.client.do_action(action, self.options(None))))

    def _close_all(self, out: Outcome) -> None:
        """Close the case's prepared statements and cancel its unread statements; only a call past its deadline counts."""
        quiet = Outcome()
        for info in self.unread:
            body = F.CancelFlightInfoRequest(info=F.FlightInfo.FromString(info.serialize())).SerializeToString()
            self._call(quiet, "DoAction CancelFlightInfo", functools.partial(self._quiet_action, "CancelFlightInfo", body))
        for handle in self.handles:
            body = pack(S.ActionClosePreparedStatementRequest(prepared_statement_handle=handle))
            self._call(quiet, "DoAction ClosePreparedStatement", functools.partial(self._quiet_action, "ClosePreparedStatement", body))
        self.unread.clear()
        out.timeouts += quiet.timeouts

    def _quiet_action(self, kind: str, body: bytes) -> None:
        list(self.client.do_action(fl.Action(kind, pa.py_buffer(body)), self.options()))
