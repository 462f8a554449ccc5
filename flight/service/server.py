"""The coordinator's Flight SQL service: statements and prepared statements planned here, run on the workers.

Any Flight SQL client (ADBC's driver for Python, R, Go and Java; the Flight SQL JDBC driver) sends
SQL; the service plans it (``flight.sql``), starts it on the workers, and answers with one endpoint
per head partition:

* **direct** (the default): the endpoint names the head task's worker and carries the worker's
  ticket (the query's secret inside). A client that reads endpoints in parallel reads straight from
  the workers, and the service never holds a row.
* **relay** (``endpoints="relay"``): the endpoint names no location, so the client redeems it here,
  and the service reads the partition from its worker with its own credentials and streams it on.
  A client that reaches only the service, or a fleet whose workers want credentials clients do not
  hold (docs/security.md), uses this.

Metadata (catalogs, schemas, tables with their schemas, table types, SQL info) comes from the
service's ``Catalog``. Errors are Flight statuses with the ``PlanError`` text, position included:
``INVALID_ARGUMENT`` for SQL that does not plan or a malformed command. The service is read-only:
updates, transactions and Substrait plans are refused by name.
"""

from __future__ import annotations

import functools
import logging
import secrets
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.flight as fl
from google.protobuf.message import DecodeError

from flight.errors import FlightExecError, PlanError, ProtocolError, QueryTimeoutError, TaskCancelledError, WorkerBusyError, WorkerUnavailableError
from flight.plan.query import Query as PlannedQuery
from flight.service.commands import catalogs, db_schemas, pack, sql_info, table_types, tables, tables_schema, unpack
from flight.service.explain import EXPLAIN_SCHEMA, Explained, Explains, analyzed, plan_rows, split_explain
from flight.service.hints import HINTS_KEY, Hints, dialect_of, retain_of, tag_of
from flight.service.queries import Queries, Query
from flight.service.relay import watched
from flight.service.users import caller_name
from flight.service.watch import CANCEL_ACTION, PROGRESS_ACTION, answer
from flight.sql import sql
from flight.wire._proto import Flight_pb2
from flight.wire._proto import FlightSql_pb2 as sql_pb2
from flight.worker.auth import MIDDLEWARE_KEY, identity

__all__ = ["CoordinatorServer"]

log = logging.getLogger("flight.service")

MAX_PREPARED = 10_000
"""Prepared statements the service keeps at once; past it, creating one is refused until some close."""
MAX_SQL_CHARS = 1 << 20
"""The longest statement text taken (1 Mi characters); a longer one is refused, naming the limit."""
MAX_PARAMETER_BYTES = 1 << 20
"""The most parameter bytes one DoPut may send (one row of values); past it, the upload is refused."""

_H = TypeVar("_H", bound=Callable[..., Any])


def _boundary(handler: _H) -> _H:
    """Whatever a handler raises leaves as a Flight status a client can act on, never a traceback."""

    @functools.wraps(handler)
    def wrapped(self: CoordinatorServer, *args: Any) -> Any:
        try:
            return handler(self, *args)
        except fl.FlightError:
            raise
        except (PlanError, ProtocolError) as exc:
            # Not ArrowInvalid (INVALID_ARGUMENT): pyarrow would add the handler's traceback, with
            # file paths, to that status; a FlightError carries only its text.
            raise fl.FlightServerError(str(exc)) from None
        except (WorkerBusyError, WorkerUnavailableError) as exc:  # retryable: a client may try again
            raise fl.FlightUnavailableError(str(exc)) from None
        except QueryTimeoutError as exc:
            raise fl.FlightTimedOutError(str(exc)) from None
        except TaskCancelledError as exc:
            raise fl.FlightCancelledError(str(exc)) from None
        except FlightExecError as exc:
            raise fl.FlightServerError(str(exc)) from None
        except Exception as exc:  # a bug here: logged, and the client sees only its kind
            log.warning("%s failed unexpectedly", handler.__name__, exc_info=True)
            raise fl.FlightInternalError(f"internal error in {handler.__name__}: {type(exc).__name__} (details in the coordinator's log)") from None

    return wrapped  # type: ignore[return-value]


def _parameters(rows: pa.Table) -> dict[str, object] | None:
    """A parameter batch's one row as values by position ("1", "2", ...); a value Python cannot hold is refused by name."""
    if not rows.num_rows:
        return None
    out: dict[str, object] = {}
    for i in range(1, rows.num_columns + 1):
        try:
            out[str(i)] = rows.column(i - 1)[0].as_py()
        except (OverflowError, ValueError, pa.ArrowException) as exc:
            raise ProtocolError(f"parameter {i} ({rows.schema.field(i - 1).type}) holds a value out of range: {type(exc).__name__}",
                                field="parameters") from None
    return out


def _without_traceback(handler: _H) -> _H:
    """``handler`` whose errors reach the client without a traceback, for pyarrow's GetSchema.

    pyarrow turns a FlightError raised by the other handlers into its status, but not one raised by
    ``get_schema``: that one leaves as "Unknown error" whose detail is ``traceback.format_exception``
    of it, the file paths of this code and of pyarrow included (found by the service fuzzer). So its
    errors are marked, and ``traceback.format_exception`` (which pyarrow looks up at each use)
    formats a marked error without its frames: every other exception keeps its traceback."""
    _install_untraced()

    @functools.wraps(handler)
    def wrapped(*args: Any) -> Any:
        try:
            return handler(*args)
        except BaseException as exc:
            exc._flight_untraced = True  # type: ignore[attr-defined]
            raise

    return wrapped  # type: ignore[return-value]


def _install_untraced() -> None:
    original = traceback.format_exception
    if getattr(original, "_flight_untraced", False):
        return

    @functools.wraps(original)
    def format_exception(exc: Any, /, value: Any = _NOTHING, tb: Any = _NOTHING, *args: Any, **kwargs: Any) -> list[str]:
        error = exc if value is _NOTHING else value
        if getattr(error, "_flight_untraced", False):
            return original(type(error), error, None, *args, **kwargs)
        if value is _NOTHING:
            return original(exc, *args, **kwargs)
        return original(exc, value, tb, *args, **kwargs)

    format_exception._flight_untraced = True  # type: ignore[attr-defined]
    traceback.format_exception = format_exception


_NOTHING: Any = object()


@dataclass
class _Prepared:
    sql: str
    dialect: str = "duckdb"  # the dialect header of the call that prepared it
    params: dict[str, object] | None = None
    planned: PlannedQuery | None = None  # the text's plan, made once, while it has no parameters to bind


class CoordinatorServer(fl.FlightServerBase):
    """A Flight SQL server over ``queries`` (the service's catalog, workers and running queries)."""

    def __init__(self, location: str, queries: Queries, *, endpoints: str = "direct", **server_options: Any) -> None:
        if endpoints not in ("direct", "relay"):
            raise ValueError(f"endpoints must be 'direct' or 'relay', not {endpoints!r}")
        middleware = dict(server_options.pop("middleware", None) or {})
        middleware[HINTS_KEY] = Hints()
        super().__init__(location, middleware=middleware, **server_options)
        scheme = "grpc+tls" if server_options.get("tls_certificates") else "grpc"
        self.url = f"{scheme}://{location.split('://', 1)[1].rsplit(':', 1)[0]}:{self.port}"
        self.queries = queries
        self.endpoints = endpoints
        self._prepared: dict[bytes, _Prepared] = {}
        self.explains = Explains(queries.result_ttl)
        self._lock = threading.Lock()
        self.draining = threading.Event()  # set on SIGTERM: no new queries

    # ------------------------------------------------------------ statements

    @_boundary
    def get_flight_info(self, context: fl.ServerCallContext, descriptor: fl.FlightDescriptor) -> fl.FlightInfo:
        command = unpack(descriptor.command or b"", "descriptor.cmd")
        if self.draining.is_set() and isinstance(command, (sql_pb2.CommandStatementQuery, sql_pb2.CommandPreparedStatementQuery)):
            raise fl.FlightUnavailableError(f"{self.url} is shutting down and takes no new queries")
        retain = retain_of(context)
        if isinstance(command, sql_pb2.CommandStatementQuery):
            if (explain := split_explain(_text(command.query))) is not None:
                return self._explain(context, *explain, None, dialect_of(context), descriptor)
            query = self.queries.start(_text(command.query), _user(context), retain=retain, dialect=dialect_of(context), tag=tag_of(context))
            return self._info(self._unless_gone(context, query), descriptor)
        if isinstance(command, sql_pb2.CommandPreparedStatementQuery):
            prepared = self._statement(command.prepared_statement_handle)
            if (explain := split_explain(prepared.sql)) is not None:
                return self._explain(context, *explain, prepared.params, prepared.dialect, descriptor)
            planned = prepared.planned if prepared.params is None else None
            query = self.queries.start(prepared.sql, _user(context), prepared.params, planned, retain=retain, dialect=prepared.dialect,
                                       tag=tag_of(context))
            return self._info(self._unless_gone(context, query), descriptor)
        table = self._metadata(command)
        return fl.FlightInfo(table.schema, descriptor, [fl.FlightEndpoint(pack(command), [])], table.num_rows, table.nbytes)

    def _unless_gone(self, context: fl.ServerCallContext, query: Query) -> Query:
        """``query``, or, when its client cancelled the call (or its deadline passed) while it waited for a slot and
        was planned, the query cancelled at once: no one will read its results (it would hold its tasks until the
        result TTL), and ADBC's ``adbc_cancel`` sends the service nothing else (issue 41)."""
        if context.is_cancelled():
            self.queries.cancel(query.query_id, "the client cancelled its call before the statement's results were sent")
            raise fl.FlightCancelledError(f"query {query.query_id} cancelled: the client cancelled its call")
        return query

    def _explain(
        self, context: fl.ServerCallContext, analyze: bool, text: str, params: dict[str, object] | None, dialect: str,
        descriptor: fl.FlightDescriptor,
    ) -> fl.FlightInfo:
        """``EXPLAIN [ANALYZE] text`` (``explain.py``): planned now, its rows served here when the client reads them."""
        explained = Explained(_user(context), text, sql(text, self.queries.catalog, params=params, dialect=dialect), dialect, tag_of(context))
        if not analyze:
            explained.rows = plan_rows(self.queries.explain(explained.planned))
        endpoint = fl.FlightEndpoint(pack(sql_pb2.TicketStatementQuery(statement_handle=self.explains.put(explained))), [])
        return fl.FlightInfo(EXPLAIN_SCHEMA, descriptor, [endpoint], -1, -1)

    def _explained(self, context: fl.ServerCallContext, explained: Explained) -> fl.FlightDataStream:
        if explained.rows is not None:
            return fl.RecordBatchStream(explained.rows)
        started: list[Query] = []

        def run() -> tuple[int, str]:
            query = self.queries.start(explained.text, explained.user, planned=explained.planned, dialect=explained.dialect, tag=explained.tag)
            started.append(query)
            count = self.queries.read_all(query)
            query.detached.wait(self.queries.result_ttl)
            assert query.ex is not None
            return count, query.ex.explain(analyze=True)

        def gone() -> None:
            for query in started:
                self.queries.cancel(query.query_id, "its client cancelled the EXPLAIN ANALYZE, or went away")

        return fl.GeneratorStream(EXPLAIN_SCHEMA, watched(analyzed(run), context.is_cancelled, gone))

    def _info(self, query: Query, descriptor: fl.FlightDescriptor) -> fl.FlightInfo:
        endpoints = []
        for handle, i in sorted(query.handles.items(), key=lambda item: item[1]):
            head = query.detached.partitions[i]
            if self.endpoints == "direct":
                endpoints.append(fl.FlightEndpoint(head.ticket, [head.url]))
            else:
                endpoints.append(fl.FlightEndpoint(pack(sql_pb2.TicketStatementQuery(statement_handle=handle)), []))
        return fl.FlightInfo(query.schema, descriptor, endpoints, -1, -1)

    @_without_traceback
    @_boundary
    def get_schema(self, context: fl.ServerCallContext, descriptor: fl.FlightDescriptor) -> fl.SchemaResult:  # type: ignore[override]  # pyarrow wants a SchemaResult; its stubs say Schema
        """A statement's result schema, planned without running it (the Spark data source asks this first)."""
        command = unpack(descriptor.command or b"", "descriptor.cmd")
        if isinstance(command, sql_pb2.CommandStatementQuery):
            explained = split_explain(command.query)
            schema = EXPLAIN_SCHEMA if explained else sql(command.query, self.queries.catalog, dialect=dialect_of(context)).schema
        elif isinstance(command, sql_pb2.CommandPreparedStatementQuery):
            prepared = self._statement(command.prepared_statement_handle)
            explained = split_explain(prepared.sql)
            schema = EXPLAIN_SCHEMA if explained else sql(prepared.sql, self.queries.catalog, params=prepared.params, dialect=prepared.dialect).schema
        elif isinstance(command, sql_pb2.CommandGetTables):
            schema = tables_schema(command.include_schema)
        else:
            schema = self._metadata(command).schema
        return fl.SchemaResult(schema)

    @_boundary
    def do_get(self, context: fl.ServerCallContext, ticket: fl.Ticket) -> fl.FlightDataStream:
        command = unpack(ticket.ticket, "ticket")
        if isinstance(command, sql_pb2.TicketStatementQuery):
            found = self.queries.by_handle(command.statement_handle)
            if found is None:
                explained = self.explains.take(command.statement_handle)
                if explained is not None:
                    return self._explained(context, explained)
                raise fl.FlightServerError("ticket: no such result (the query ended, was cancelled, or its results were read)")
            query, partition = found
            rows = self.queries.relay(query, partition)
            if not query.retained:  # read once: a client that leaves takes its query with it (issue 41)
                why = "its client cancelled the DoGet of its results, or went away"
                rows = watched(rows, context.is_cancelled, lambda: self.queries.cancel(query.query_id, why))
            return fl.GeneratorStream(query.schema, rows)
        return fl.RecordBatchStream(self._metadata(command))

    def _metadata(self, command: Any) -> pa.Table:
        schemas = {name: self.queries.catalog[name].schema for name in self.queries.catalog}
        if isinstance(command, sql_pb2.CommandGetCatalogs):
            return catalogs()
        if isinstance(command, sql_pb2.CommandGetDbSchemas):
            return db_schemas(command)
        if isinstance(command, sql_pb2.CommandGetTables):
            return tables(command, schemas)
        if isinstance(command, sql_pb2.CommandGetTableTypes):
            return table_types()
        if isinstance(command, sql_pb2.CommandGetSqlInfo):
            return sql_info(command)
        raise ProtocolError(f"{type(command).__name__} is not a query or a metadata command", field="descriptor.cmd")

    # ------------------------------------------------------------ prepared statements

    def _statement(self, handle: bytes) -> _Prepared:
        with self._lock:
            prepared = self._prepared.get(handle)
        if prepared is None:
            raise ProtocolError("no such prepared statement (closed, or made by another service)", field="prepared_statement_handle")
        return prepared

    def _create(self, request: sql_pb2.ActionCreatePreparedStatementRequest, dialect: str) -> bytes:
        if request.HasField("transaction_id"):
            raise ProtocolError("transactions are not supported (a read-only service)", field="transaction_id")
        _text(request.query)
        planned = None
        explained = split_explain(request.query)
        try:  # the plan (and the result's schema) when the text plans without its parameters' values
            if explained is not None:  # EXPLAIN: planned again when it runs, with its parameters' values
                sql(explained[1], self.queries.catalog, dialect=dialect)
                schema = EXPLAIN_SCHEMA.serialize().to_pybytes()
            else:
                planned = sql(request.query, self.queries.catalog, dialect=dialect)
                schema = planned.schema.serialize().to_pybytes()
        except PlanError as exc:
            if "has no value" not in str(exc):
                raise
            schema = b""
        handle = secrets.token_bytes(16)
        with self._lock:
            if len(self._prepared) >= MAX_PREPARED:
                raise fl.FlightUnavailableError(f"{MAX_PREPARED} prepared statements are open; close some first")
            self._prepared[handle] = _Prepared(request.query, dialect, planned=planned)
        return pack(sql_pb2.ActionCreatePreparedStatementResult(prepared_statement_handle=handle, dataset_schema=schema))

    @_boundary
    def do_put(
        self, context: fl.ServerCallContext, descriptor: fl.FlightDescriptor, reader: fl.MetadataRecordBatchReader, writer: fl.FlightMetadataWriter
    ) -> None:
        command = unpack(descriptor.command or b"", "descriptor.cmd")
        if not isinstance(command, sql_pb2.CommandPreparedStatementQuery):
            raise ProtocolError(f"DoPut of {type(command).__name__}: only a prepared statement's parameters may be sent", field="descriptor.cmd")
        prepared = self._statement(command.prepared_statement_handle)
        batches, size = [], 0
        while True:  # read as it comes, so that a hostile upload is refused before it is held
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                break
            if chunk.data is None:
                continue
            size += chunk.data.nbytes
            batches.append(chunk.data)
            if size > MAX_PARAMETER_BYTES or sum(b.num_rows for b in batches) > 1:
                raise ProtocolError(f"parameters: a query takes one row of at most {MAX_PARAMETER_BYTES} bytes", field="parameters")
        rows = pa.Table.from_batches(batches, schema=reader.schema)
        prepared.params = _parameters(rows)
        result = sql_pb2.DoPutPreparedStatementResult(prepared_statement_handle=command.prepared_statement_handle)
        writer.write(pa.py_buffer(result.SerializeToString()))  # the bare message, as the specification's servers send it

    # ------------------------------------------------------------ actions

    def list_actions(self, context: fl.ServerCallContext) -> list[tuple[str, str]]:  # type: ignore[override]  # pyarrow takes pairs
        return [
            ("CreatePreparedStatement", "plan a statement to run later, with parameters bound by DoPut"),
            ("ClosePreparedStatement", "forget a prepared statement"),
            ("CancelFlightInfo", "cancel the query a FlightInfo belongs to, freeing its tasks"),
            ("CancelQuery", "the same, as Flight SQL's older action"),
            (PROGRESS_ACTION, "the caller's statement of this tag (x-flight-exec-tag): its state, stages and tasks done, rows, as JSON"),
            (CANCEL_ACTION, "cancel the caller's statement of this tag, freeing its tasks"),
        ]

    @_boundary
    def do_action(self, context: fl.ServerCallContext, action: fl.Action) -> Iterator[bytes]:
        body = action.body.to_pybytes() if action.body is not None else b""
        if action.type == "CreatePreparedStatement":
            request = unpack(body, "action.body")
            if not isinstance(request, sql_pb2.ActionCreatePreparedStatementRequest):
                raise ProtocolError("CreatePreparedStatement takes an ActionCreatePreparedStatementRequest", field="action.body")
            return iter([self._create(request, dialect_of(context))])
        if action.type == "ClosePreparedStatement":
            request = unpack(body, "action.body")
            if isinstance(request, sql_pb2.ActionClosePreparedStatementRequest):
                with self._lock:
                    self._prepared.pop(request.prepared_statement_handle, None)
            return iter([])
        if action.type == "CancelFlightInfo":
            cancel = Flight_pb2.CancelFlightInfoRequest()
            try:
                cancel.ParseFromString(body)
            except DecodeError:
                raise ProtocolError("CancelFlightInfo takes a CancelFlightInfoRequest", field="action.body") from None
            status = self._cancel(cancel.info.SerializeToString(), _user(context))
            return iter([Flight_pb2.CancelFlightInfoResult(status=status).SerializeToString()])
        if action.type == "CancelQuery":
            request = unpack(body, "action.body")
            if not isinstance(request, sql_pb2.ActionCancelQueryRequest):
                raise ProtocolError("CancelQuery takes an ActionCancelQueryRequest", field="action.body")
            cancelled = self._cancel(request.info, _user(context)) == Flight_pb2.CANCEL_STATUS_CANCELLED
            results = sql_pb2.ActionCancelQueryResult
            result = results.CANCEL_RESULT_CANCELLED if cancelled else results.CANCEL_RESULT_NOT_CANCELLABLE
            return iter([pack(results(result=result))])
        if action.type in (PROGRESS_ACTION, CANCEL_ACTION):
            return iter([answer(self.queries, action.type, _user(context), body)])
        known = [a for a, _ in self.list_actions(context)]
        raise ProtocolError(f"unknown action {action.type[:100]!r}; flight-coordinator answers {known}", field="action.type")

    def _cancel(self, serialized_info: bytes, caller: str) -> Flight_pb2.CancelStatus.ValueType:
        """Cancel the query whose endpoints ``serialized_info`` lists, when ``caller`` may (``Queries.may_cancel``);
        Flight's CancelStatus (another user's query is NOT_CANCELLABLE, as one that ended)."""
        try:
            info = fl.FlightInfo.deserialize(serialized_info)
        except (pa.ArrowException, ValueError):
            raise ProtocolError("not a serialized FlightInfo", field="info") from None
        tickets = {e.ticket.ticket for e in info.endpoints}
        for query in self.queries.live():
            mine = {query.detached.partitions[i].ticket for i in query.handles.values()}
            mine |= {pack(sql_pb2.TicketStatementQuery(statement_handle=h)) for h in query.handles}
            if tickets & mine and self.queries.may_cancel(query, caller):
                self.queries.cancel(query.query_id)
                return Flight_pb2.CANCEL_STATUS_CANCELLED
        return Flight_pb2.CANCEL_STATUS_NOT_CANCELLABLE


def _text(query: str) -> str:
    if len(query) > MAX_SQL_CHARS:
        raise ProtocolError(f"the statement is {len(query)} characters long; at most {MAX_SQL_CHARS} are taken", field="query")
    return query


def _user(context: fl.ServerCallContext) -> str:
    """Who asks: the token's or the user's name, else a client certificate's identity, else "anonymous"."""
    return caller_name(context, MIDDLEWARE_KEY) or identity(context)
