"""The ``flight`` data source over a ``flight-coordinator``: SQL text in, the service's endpoints as partitions.

``spark.read.format("flight").option("coordinator", URL).option("sql", TEXT)``: Spark's planner
process asks the service for the result's schema (Flight SQL ``GetSchema``: nothing runs), takes
the filters Spark offers that SQL can state (``pushFilters``, PySpark 4.1 and later), and when Spark
plans the partitions, starts the statement (``GetFlightInfo``) with those filters around it:
``SELECT * FROM (TEXT) AS flight_pushed WHERE …``, which the service's planner pushes into its scans
(row-group pruning). Each endpoint of the answer is one Spark partition, read by a Spark task with
``DoGet`` from the endpoint's location (a worker, with ``--endpoints direct``) or from the service
(a relay endpoint has none).

A statement runs once per Spark action that reads the DataFrame (each plans its partitions again).
Its results stay readable again for ``retain`` seconds (a call header the service honours up to its
``--result-ttl``: ``flight/service/hints.py``), as Spark re-reads partitions: a retried or
speculative task, or the sample a sort takes before it reads.
"""

from __future__ import annotations

import datetime
import decimal
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.flight as fl

from flight.errors import PlanError
from flight.security import SecurityFiles, connect
from flight.wire._proto import FlightSql_pb2 as sql_pb2
from flight.wire.clients import read_stream, translate_flight_error
from flight.wire.protocol import DIALECT_HEADER, RETAIN_HEADER

__all__ = ["ServicePartition", "filter_sql", "pushed_text", "service_partitions", "service_schema"]

PUSHED_ALIAS = "flight_pushed"


@dataclass(frozen=True)
class ServiceSource:
    """Where the statement is served, what it is, and the credentials' files (never the credentials)."""

    coordinator: str
    sql: str
    security_files: SecurityFiles = field(default_factory=SecurityFiles)
    timeout: float = 60.0
    pushdown: bool = False
    """Offer to take Spark's filters (option ``pushdown``; needs PySpark 4.1+; ``_options._pushdown_by_default``)."""
    retain: float = 600.0
    """Seconds the service keeps the results readable again (option ``retain``; at most its ``--result-ttl``)."""
    dialect: str = "spark"
    """The statement's SQL dialect (option ``dialect``): Spark's unless told, so a Spark user's text gives Spark's answers."""

    def headers(self, retained: bool = False) -> list[tuple[bytes, bytes]]:
        """The call headers the service reads beside the statement (``flight/service/hints.py``)."""
        out = [(DIALECT_HEADER.encode(), self.dialect.encode())]
        if retained and self.retain > 0:
            out.append((RETAIN_HEADER.encode(), f"{self.retain:g}".encode()))
        return out


def _pack(message: object) -> bytes:
    from google.protobuf import any_pb2

    wrapped = any_pb2.Any()
    wrapped.Pack(message)  # type: ignore[arg-type]
    return wrapped.SerializeToString()


def _client(url: str, source: ServiceSource) -> fl.FlightClient:
    try:
        return connect(url, source.security_files.load())
    except (pa.ArrowException, OSError) as exc:
        raise translate_flight_error(exc, url) from exc


def service_schema(source: ServiceSource) -> pa.Schema:
    """The statement's result schema, planned by the service without running it."""
    descriptor = fl.FlightDescriptor.for_command(_pack(sql_pb2.CommandStatementQuery(query=source.sql)))
    with _client(source.coordinator, source) as client:
        try:
            call = fl.FlightCallOptions(timeout=source.timeout, headers=source.headers())  # type: ignore[arg-type]  # bytes: its stubs say str
            result = client.get_schema(descriptor, options=call)
            return getattr(result, "schema", result)  # a SchemaResult (its stubs say Schema)
        except (pa.ArrowException, OSError) as exc:
            raise _service_error(exc, source.coordinator, "plan the statement") from exc


@dataclass
class ServicePartition:
    """One endpoint of the running statement: read ``ticket`` at ``url`` (a worker, or the service)."""

    index: int
    url: str
    ticket: bytes
    source: ServiceSource

    @property
    def value(self) -> int:
        return self.index


def service_partitions(source: ServiceSource, text: str) -> list[ServicePartition]:
    """Start ``text`` on the service: one partition per endpoint of its answer."""
    descriptor = fl.FlightDescriptor.for_command(_pack(sql_pb2.CommandStatementQuery(query=text)))
    # Kept readable again (the service's hints.py): Spark re-reads a partition for a retried or speculative
    # task, and for the sample a sort takes before it reads.
    with _client(source.coordinator, source) as client:
        try:
            call = fl.FlightCallOptions(timeout=source.timeout, headers=source.headers(retained=True))  # type: ignore[arg-type]  # bytes: its stubs say str
            info = client.get_flight_info(descriptor, options=call)
        except (pa.ArrowException, OSError) as exc:
            raise _service_error(exc, source.coordinator, "start the statement") from exc
    out = []
    for i, endpoint in enumerate(info.endpoints):
        url = endpoint.locations[0].uri.decode() if endpoint.locations else source.coordinator
        out.append(ServicePartition(i, url, endpoint.ticket.ticket, source))
    return out


def read_service_partition(p: ServicePartition) -> Iterator[pa.RecordBatch]:
    client = _client(p.url, p.source)
    try:
        yield from read_stream(client, p.ticket, check=False)  # the service's stream: it checked the heads' trailers
    except (pa.ArrowException, OSError) as exc:
        raise _service_error(exc, p.url, f"read partition {p.index} (results stay readable for the 'retain' option's "
                                          "seconds, at most the service's --result-ttl; run the action again)") from exc
    finally:
        client.close()


def _service_error(exc: BaseException, url: str, what: str) -> Exception:
    if isinstance(exc, fl.FlightError):
        detail = " ".join(str(exc).split("Detail:")[0].split())
        return PlanError(f"flight data source: could not {what} on {url}: {detail}")
    return translate_flight_error(exc, url)


# ------------------------------------------------------------------ filters


def _column(path: Sequence[str], dialect: str) -> str | None:
    """A top-level column as a quoted identifier (Spark's with backticks); a nested field is not pushed."""
    if len(path) != 1:
        return None
    if dialect == "spark":
        return "`" + path[0].replace("`", "``") + "`"
    return '"' + path[0].replace('"', '""') + '"'


def _literal(value: object, dialect: str) -> str | None:
    """``value`` as a SQL literal of its own type, or None when it has none here."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else None
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            return None
        digits = len(value.as_tuple().digits)
        exponent = int(value.as_tuple().exponent)
        scale = max(0, -exponent)
        precision = max(digits, scale, 1) + max(0, exponent)
        return f"CAST('{value}' AS DECIMAL({min(precision, 38)}, {scale}))" if precision <= 38 else None
    if isinstance(value, str):
        return _quoted(value, dialect)
    if isinstance(value, datetime.datetime):
        return None  # Spark's timestamps carry a session time zone: compared by Spark
    if isinstance(value, datetime.date):
        return f"DATE '{value.isoformat()}'"
    return None


def _quoted(text: str, dialect: str) -> str:
    """A string literal: Spark's escapes with a backslash (where ``''`` would be two literals, joined)."""
    if dialect == "spark":
        return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return "'" + text.replace("'", "''") + "'"


def _contains(column: str, text: str, dialect: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"{column} LIKE {_quoted('%' + escaped + '%', dialect)} ESCAPE {_quoted(chr(92), dialect)}"


_COMPARE = {"EqualTo": "=", "GreaterThan": ">", "GreaterThanOrEqual": ">=", "LessThan": "<", "LessThanOrEqual": "<="}


def filter_sql(f: object, dialect: str = "spark") -> str | None:
    """A Spark data source ``Filter`` as a SQL condition in ``dialect``, or None when it cannot be stated exactly."""
    kind = type(f).__name__
    column = _column(getattr(f, "attribute", ()), dialect)
    if column is None:
        if kind == "Not":
            inner = filter_sql(f.child, dialect)  # type: ignore[attr-defined]
            return None if inner is None else f"NOT ({inner})"
        return None
    if kind in _COMPARE:
        value = _literal(f.value, dialect)  # type: ignore[attr-defined]
        return None if value is None else f"{column} {_COMPARE[kind]} {value}"
    if kind == "EqualNullSafe":
        if f.value is None:  # type: ignore[attr-defined]
            return f"{column} IS NULL"
        value = _literal(f.value, dialect)  # type: ignore[attr-defined]
        return None if value is None else f"{column} IS NOT DISTINCT FROM {value}"
    if kind == "IsNull":
        return f"{column} IS NULL"
    if kind == "IsNotNull":
        return f"{column} IS NOT NULL"
    if kind == "In":
        values = [_literal(v, dialect) for v in f.value]  # type: ignore[attr-defined]
        if not values or any(v is None for v in values):
            return None  # a null in the list: exact under NOT only with three-valued care, so Spark keeps it
        return f"{column} IN ({', '.join(values)})"  # type: ignore[arg-type]
    text = getattr(f, "value", None)
    if not isinstance(text, str):
        return None
    name = "{}with" if dialect == "spark" else "{}_with"  # Spark's startswith, DuckDB's starts_with
    if kind == "StringStartsWith":
        return f"{name.format('starts')}({column}, {_quoted(text, dialect)})"
    if kind == "StringEndsWith":
        return f"{name.format('ends')}({column}, {_quoted(text, dialect)})"
    if kind == "StringContains":
        return _contains(column, text, dialect)
    return None


def pushed_text(text: str, conditions: Sequence[str]) -> str:
    """``text`` with ``conditions`` around it (the service pushes them into its scans)."""
    if not conditions:
        return text
    body = text.strip().rstrip(";").strip()
    return f"SELECT * FROM ({body}) AS {PUSHED_ALIAS} WHERE " + " AND ".join(f"({c})" for c in conditions)


def one_statement(text: str) -> bool:
    """Whether ``text`` is one statement (a ``;`` inside would make it several: filters are not pushed then)."""
    return ";" not in text.strip().rstrip(";")
