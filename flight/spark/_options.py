"""The ``flight`` data source's options: plain strings, encoded and decoded here.

Spark passes data source options as strings, through the JVM, to a Python
planner process and then (inside the reader) to every Spark task. Two forms:

* **head partitions** (what ``flight.spark.read`` sets): ``partitions`` = base64
  of a JSON list ``[{"url": ..., "ticket": base64}]``, one per head task of a
  query running detached on the driver; ``schema`` = base64 of its Arrow IPC
  schema; ``query_id`` for messages.
* **one-stage plan** (coordinator-less): ``plan`` = base64 of a serialized
  ``StagePlan`` as ``TaskHeader.plan`` carries it (its operators flat: docs/protocol.md, section 5),
  without shuffle reads; ``workers`` = comma-separated URLs (or
  ``resolver`` = a resolver's ``describe()`` JSON); ``units`` = base64 of JSON
  ``{"tasks": n, "assign": [{feed_id: {partition: [base64 unit, ...]}}, ...]}``
  (one dict per task); ``tasks`` overrides the task count.
* **a statement for a service**: ``coordinator`` = a ``flight-coordinator``'s URL, ``sql`` = the
  text; ``token_file``, ``tls_ca``, ``tls_cert``, ``tls_key`` name credential files (paths only:
  options show in Spark's plans); ``timeout`` bounds each call to the service; ``pushdown``
  offers to take Spark's filters (``true`` from PySpark 5.0, else asked for: ``_pushdown_by_default``);
  ``retain`` (600) keeps results readable again that many seconds (``_service.py``).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from flight.coordinator.resolver import resolver_from_description
from flight.errors import PlanError
from flight.security import SecurityFiles
from flight.spark._service import ServiceSource
from flight.spark._workers import Workers, describe_workers
from flight.wire._proto import plan_pb2
from flight.wire.plan_codec import decode_plan
from flight.wire.protocol import decode_schema

__all__ = ["HeadOptions", "PlanOptions", "b64", "decode_options", "encode_head", "encode_units"]

Assignment = dict[str, dict[int, list[bytes]]]  # feed id -> partition -> unit bodies


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str, option: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError) as exc:
        raise PlanError(f"flight data source: option {option!r} is not valid base64: {exc}") from exc


def _json(text: str, option: str) -> object:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise PlanError(f"flight data source: option {option!r} is not valid JSON: {exc}") from exc


def encode_head(
    partitions: list[tuple[str, bytes]],
    schema: pa.Schema,
    query_id: str,
    security_files: SecurityFiles | None = None,
    workers: Sequence[str] = (),
) -> dict[str, str]:
    """``workers``: every worker of the query, where a lost head task's replacement may be found."""
    items = [{"url": url, "ticket": b64(ticket)} for url, ticket in partitions]
    opts = {
        "partitions": b64(json.dumps(items).encode()),
        "schema": b64(schema.serialize().to_pybytes()),
        "query_id": query_id,
    }
    if workers:
        opts["head_workers"] = json.dumps(list(workers))
    if security_files is not None and security_files.to_dict():
        opts["security_files"] = json.dumps(security_files.to_dict())
    return opts


def _security_files(options: Mapping[str, str]) -> SecurityFiles:
    """Option ``security_files``: JSON of credential file paths (never the credentials themselves)."""
    raw = options.get("security_files")
    if raw is None:
        return SecurityFiles()
    values = _json(raw, "security_files")
    if not isinstance(values, dict):
        raise PlanError("flight data source: option 'security_files' must be a JSON object of file paths")
    return SecurityFiles.from_dict(values)


def encode_units(assign: list[Assignment]) -> str:
    body = {
        "tasks": len(assign),
        "assign": [{f: {str(p): [b64(u) for u in units] for p, units in parts.items()} for f, parts in a.items()} for a in assign],
    }
    return b64(json.dumps(body).encode())


def _decode_units(text: str) -> list[Assignment]:
    body = _json(_unb64(text, "units").decode(), "units")
    try:
        assign = body["assign"]  # type: ignore[index]
        return [
            {str(f): {int(p): [_unb64(u, "units") for u in units] for p, units in parts.items()} for f, parts in a.items()}
            for a in assign
        ]
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise PlanError(f"flight data source: option 'units' is not {{'tasks': n, 'assign': [...]}}: {exc!r}") from exc


@dataclass(frozen=True)
class HeadOptions:
    """Read the head partitions of a query running detached on the driver."""

    partitions: list[tuple[str, bytes]]
    schema: pa.Schema
    query_id: str
    security_files: SecurityFiles = field(default_factory=SecurityFiles)
    workers: tuple[str, ...] = ()
    """Every worker of the query: where a lost head task's replacement is looked for."""


@dataclass(frozen=True)
class PlanOptions:
    """Run a one-stage plan: each Spark partition is one task, which the Spark task drives itself."""

    plan: bytes
    schema: pa.Schema
    workers: Workers
    assign: list[Assignment]
    connect_timeout: float


def _float(options: Mapping[str, str], name: str, default: float) -> float:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        return float(raw)
    except ValueError:
        raise PlanError(f"flight data source: option {name!r} must be a number of seconds, not {raw!r}") from None


def _pushdown_by_default() -> bool:
    """Whether a statement for a service offers to take Spark's filters unless told: from PySpark 5.0.

    PySpark 4.1 to 4.x keep the partitions planned with a DataFrame's pushed filters on the data source
    that DataFrame shares with the one it was filtered from: the unfiltered one, used after, reads the
    filtered rows (measured here on 4.3: ``df.filter(…).count()`` then ``df.count()`` gave 169 and 169
    for 169 and 299,814). Spark's fix keeps pushed partitions per scan; until then, pushing is asked for
    (``pushdown 'true'``), and docs/spark.md says to load the DataFrame again for each filter.
    """
    try:
        import pyspark
    except ImportError:
        return False
    return tuple(int(x) for x in pyspark.__version__.split(".")[:2] if x.isdigit()) >= (5, 0)


SECURITY_OPTIONS = {"token_file": "token_file", "tls_ca": "ca_file", "tls_cert": "cert_file", "tls_key": "key_file"}
"""Options naming credential files, one each (``OPTIONS (token_file '…')`` in Spark SQL), as ``SecurityFiles`` fields."""


def _service(options: Mapping[str, str]) -> ServiceSource:
    coordinator, text = options.get("coordinator"), options.get("sql")
    if not coordinator:
        raise PlanError("flight data source: option 'sql' needs option 'coordinator' (a flight-coordinator's grpc:// URL); "
                        "to plan SQL in this process, use flight.spark.sql(spark, text, tables, workers)")
    if not text or not text.strip():
        raise PlanError("flight data source: option 'coordinator' needs option 'sql' (the statement to run)")
    if not coordinator.startswith(("grpc://", "grpc+tcp://", "grpc+tls://")):
        raise PlanError(f"flight data source: option 'coordinator' must be a grpc:// or grpc+tls:// URL, not {coordinator[:80]!r}")
    files: dict[str, object] = dict(_security_files(options).to_dict())
    files.update({field: options[name] for name, field in SECURITY_OPTIONS.items() if options.get(name)})
    pushdown = (options.get("pushdown") or ("true" if _pushdown_by_default() else "false")).strip().lower()
    if pushdown not in ("true", "false"):
        raise PlanError(f"flight data source: option 'pushdown' must be true or false, not {pushdown[:20]!r}")
    dialect = (options.get("dialect") or "spark").strip().lower()
    if dialect not in ("spark", "duckdb"):
        raise PlanError(f"flight data source: option 'dialect' must be spark (the default) or duckdb, not {dialect[:20]!r}")
    return ServiceSource(coordinator, text, SecurityFiles.from_dict(files), _float(options, "timeout", 60.0), pushdown == "true",
                         _float(options, "retain", 600.0), dialect)


def decode_options(options: Mapping[str, str]) -> HeadOptions | PlanOptions | ServiceSource:
    """The options of a ``spark.read.format("flight")``; a PlanError says what is missing or wrong."""
    if options.get("coordinator") is not None or options.get("sql") is not None:
        return _service(options)
    if options.get("partitions") is not None:
        items = _json(_unb64(options["partitions"], "partitions").decode(), "partitions")
        if not isinstance(items, list) or not all(isinstance(i, dict) and "url" in i and "ticket" in i for i in items):
            raise PlanError("flight data source: option 'partitions' must be a list of {'url', 'ticket'}")
        if options.get("schema") is None:
            raise PlanError("flight data source: option 'partitions' needs option 'schema' (base64 Arrow IPC schema)")
        schema = decode_schema(_unb64(options["schema"], "schema"), "schema")
        parts = [(str(i["url"]), _unb64(i["ticket"], "partitions")) for i in items]
        workers = _json(options.get("head_workers") or "[]", "head_workers")
        if not isinstance(workers, list) or not all(isinstance(w, str) for w in workers):
            raise PlanError("flight data source: option 'head_workers' must be a JSON list of worker URLs")
        return HeadOptions(parts, schema, str(options.get("query_id") or "?"), _security_files(options), tuple(workers))
    if options.get("plan") is not None:
        plan = plan_pb2.StagePlan()
        raw = _unb64(options["plan"], "plan")
        try:
            plan.ParseFromString(raw)
            decode_plan(plan, "plan")  # flat operators, as TaskHeader.plan carries them (plan_codec)
        except Exception as exc:
            raise PlanError(f"flight data source: option 'plan' is not a serialized StagePlan: {exc}") from exc
        if not plan.output_schema:
            raise PlanError("flight data source: option 'plan' needs a StagePlan with an output_schema")
        schema = decode_schema(plan.output_schema, "plan.output_schema")
        if options.get("resolver") is not None:
            described = _json(options["resolver"], "resolver")
            resolver_from_description(described).close()  # type: ignore[arg-type]  # validates it here
            workers = Workers(described, _float(options, "health_timeout", 2.0), _security_files(options))  # type: ignore[arg-type]
        elif options.get("workers") is not None:
            workers = Workers(describe_workers(options["workers"]), _float(options, "health_timeout", 2.0), _security_files(options))
        else:
            raise PlanError("flight data source: option 'plan' needs option 'workers' (comma-separated grpc:// URLs)")
        assign = _decode_units(options["units"]) if options.get("units") is not None else []
        try:
            tasks = int(options.get("tasks") or len(assign) or 1)
        except ValueError:
            raise PlanError(f"flight data source: option 'tasks' must be an integer, not {options.get('tasks')!r}") from None
        if tasks < 1:
            raise PlanError(f"flight data source: option 'tasks' must be at least 1, not {tasks}")
        if assign and tasks != len(assign):
            raise PlanError(f"flight data source: option 'tasks' is {tasks} but 'units' was made for {len(assign)} tasks")
        assign = assign or [{} for _ in range(tasks)]
        return PlanOptions(raw, schema, workers, assign, _float(options, "connect_timeout", 10.0))
    raise PlanError(
        "flight data source: give options 'coordinator' and 'sql' (a statement for a flight-coordinator), or 'plan' "
        "(a one-stage StagePlan, base64) with 'workers', or use flight.spark.read(spark, query, resolver), which sets "
        "the options of a running query"
    )
