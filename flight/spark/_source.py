"""The ``flight`` PySpark data source (``pyspark.sql.datasource``).

How Spark runs it: ``schema()`` in one short-lived Python process,
``reader(schema)`` and ``partitions()`` in another (the reader is then pickled
to the executors), ``read(partition)`` in a Spark task. So no state lives in
these objects beyond the options: every ``InputPartition`` carries what its
``read()`` needs (a URL and a ticket, or a task's units), and ``read()`` casts
each batch to the Arrow schema Spark checks the first batch against.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.flight as fl
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

try:
    from pyspark.sql.datasource import Filter
except ImportError:  # PySpark 4.0: no filter pushdown (pushFilters is never called)
    Filter = object  # type: ignore[assignment,misc]
from pyspark.sql.types import StructType

from flight.errors import WorkerError, WorkerUnavailableError
from flight.security import SecurityFiles, connect
from flight.spark._options import Assignment, HeadOptions, PlanOptions, decode_options
from flight.spark._schema import Conformer, arrow_schema, spark_schema
from flight.spark._service import (
    ServicePartition,
    ServiceSource,
    filter_sql,
    one_statement,
    pushed_text,
    read_service_partition,
    service_partitions,
    service_schema,
)
from flight.spark._stage_task import run_stage_task
from flight.spark._workers import Workers
from flight.wire._proto import protocol_pb2
from flight.wire.clients import read_stream, translate_flight_error
from flight.wire.protocol import error_info_of
from flight.wire.stall import SAFE_STALL_S

__all__ = ["READ_ONCE_HINT", "FlightDataSource", "HeadPartition", "StageTaskPartition", "find_replacement"]

log = logging.getLogger(__name__)

READ_ONCE_HINT = (
    "A DataFrame from flight.spark.read() streams the result of a query that runs once. Its partitions "
    "stay readable (by any number of actions, retried or speculative tasks) until the query is released: "
    "FlightRead.release() or close(), or `retain` seconds after it started (600 by default); with "
    "retain=0 each partition can be read once. A released, failed or closed query leaves none: cache the "
    "DataFrame or write it out to keep it longer, or call flight.spark.read() again for a new run."
)


@dataclass
class HeadPartition(InputPartition):
    """One head task's output of a query running detached on the driver."""

    index: int
    url: str
    ticket: bytes
    query_id: str
    security_files: SecurityFiles = field(default_factory=SecurityFiles)
    workers: tuple[str, ...] = ()
    """Every worker of the query: if ``url``'s is lost, the driver replaces the task on one of them."""

    def __post_init__(self) -> None:
        self.value = self.index


@dataclass
class StageTaskPartition(InputPartition):
    """One task of a one-stage plan, run by the Spark task that reads it."""

    index: int
    tasks: int
    plan: bytes
    assign: Assignment
    workers: Workers
    connect_timeout: float

    def __post_init__(self) -> None:
        self.value = self.index


@dataclass
class ServiceInputPartition(InputPartition):
    """One endpoint of a statement a ``flight-coordinator`` runs."""

    index: int
    endpoint: ServicePartition

    def __post_init__(self) -> None:
        self.value = self.index


class FlightDataSource(DataSource):
    """``spark.read.format("flight")``: see docs/spark.md for its options."""

    @classmethod
    def name(cls) -> str:
        return "flight"

    def schema(self) -> StructType:
        spec = decode_options(self.options)
        return spark_schema(service_schema(spec) if isinstance(spec, ServiceSource) else spec.schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        spec = decode_options(self.options)
        if isinstance(spec, ServiceSource) and spec.pushdown:
            return PushingReader(spec, schema)
        return FlightReader(spec, schema)


class FlightReader(DataSourceReader):
    def __init__(self, spec: HeadOptions | PlanOptions | ServiceSource, schema: StructType) -> None:
        self.spec = spec
        self.schema = schema
        self.pushed: list[str] = []  # SQL conditions of the filters taken from Spark (a service's statement only)

    def partitions(self) -> list[InputPartition]:
        spec = self.spec
        if isinstance(spec, ServiceSource):
            text = pushed_text(spec.sql, self.pushed)
            if self.pushed:
                log.info("flight data source: %d filter(s) pushed to %s: %s", len(self.pushed), spec.coordinator, " AND ".join(self.pushed))
            return [ServiceInputPartition(p.index, p) for p in service_partitions(spec, text)]
        if isinstance(spec, HeadOptions):
            return [
                HeadPartition(i, url, ticket, spec.query_id, spec.security_files, spec.workers)
                for i, (url, ticket) in enumerate(spec.partitions)
            ]
        tasks = len(spec.assign)
        return [
            StageTaskPartition(i, tasks, spec.plan, spec.assign[i], spec.workers, spec.connect_timeout) for i in range(tasks)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        conform = Conformer(arrow_schema(self.schema), "flight data source")
        if isinstance(partition, HeadPartition):
            batches = _read_head(partition)
        elif isinstance(partition, ServiceInputPartition):
            batches = read_service_partition(partition.endpoint)
        elif isinstance(partition, StageTaskPartition):
            batches = run_stage_task(
                partition.plan, partition.assign, partition.index, partition.tasks, partition.workers, partition.connect_timeout
            )
        else:
            raise TypeError(f"the flight data source cannot read a {type(partition).__name__}")
        for batch in batches:
            yield conform(batch)


class PushingReader(FlightReader):
    """A statement for a service, which takes Spark's filters (PySpark 4.1+, where ``flight.spark.register``
    turns ``spark.sql.python.filterPushdown.enabled`` on: Spark refuses a reader with ``pushFilters``
    while it is off). Apart from ``FlightReader`` because of that refusal: the forms that cannot take
    filters (a query already running) must not offer to."""

    def pushFilters(self, filters: list[Filter]) -> list[Filter]:
        """Every filter SQL can state exactly goes into the statement; Spark keeps the rest (all of them
        when the text holds several statements, which no condition can wrap)."""
        assert isinstance(self.spec, ServiceSource)
        if not one_statement(self.spec.sql):
            return list(filters)
        kept = []
        for f in filters:
            condition = filter_sql(f, self.spec.dialect)
            if condition is None:
                kept.append(f)
            else:
                self.pushed.append(condition)
        return kept


def _read_head(p: HeadPartition) -> Iterator[pa.RecordBatch]:
    """The partition's rows; if its worker is gone before the first row, from the task that replaced it.

    The driver replaces a retained head task whose worker is lost with one of the same stage key
    on another worker of the query (``coordinator/replay.py``, mode "task"), which makes the
    lost output again whole. A Spark task (a retry, usually) that cannot reach the first worker
    looks for it there. Once rows were yielded, the error goes up: Spark retries the task, and the
    retry reads the partition from its start.
    """
    where = f"head partition {p.index} of flight query {p.query_id}"
    yielded = False
    try:
        for batch in _read_at(p, p.url):
            yielded = True
            yield batch
        return
    except WorkerError as exc:
        # Only a lost worker sends the read elsewhere: a task that ended there (read once, released,
        # failed) must fail at once, not after a minute of looking. A head task its coordinator moved
        # because a worker was lost (Cancel.lost_worker) answers UNAVAILABLE too (docs/protocol.md, section 11).
        if yielded or not isinstance(exc, WorkerUnavailableError) or len(p.workers) < 2:
            raise _explained(exc, where) from exc
        lost = exc
    url = find_replacement(p.ticket, [u for u in p.workers if u != p.url], p.security_files, RELOCATE_S)
    if url is None:
        raise _explained(lost, where)
    log.info("%s: worker %s is lost; reading its replacement on %s", where, p.url, url)
    try:
        yield from _read_at(p, url)
    except WorkerError as exc:
        raise _explained(exc, where) from exc


RELOCATE_S = 60.0
"""How long a Spark task looks for a lost head task's replacement among the query's workers."""


def _read_at(p: HeadPartition, url: str) -> Iterator[pa.RecordBatch]:
    try:
        client = connect(url, p.security_files.load())
    except (pa.ArrowException, OSError) as exc:
        raise translate_flight_error(exc, url) from exc
    try:
        yield from read_stream(client, p.ticket, stall=SAFE_STALL_S, url=url)  # a silent worker: WorkerUnavailableError
    except (pa.ArrowException, OSError) as exc:
        raise translate_flight_error(exc, url) from exc
    finally:
        client.close()


def _explained(error: WorkerError, where: str) -> WorkerError:
    cause = error.cause
    return type(error)(f"cannot read {where}: {cause}. {READ_ONCE_HINT}", worker_url=error.worker_url, cause=cause)


def find_replacement(ticket: bytes, urls: list[str], files: SecurityFiles, within: float) -> str | None:
    """The first of ``urls`` whose worker serves ``ticket``, asked all at once, for up to ``within`` seconds.

    A worker without the task answers NOT_FOUND after its ``--get-wait`` (it waits for the task
    to appear), so one round also waits for a replacement still being made.
    """
    if not urls:
        return None
    deadline = time.monotonic() + within
    pool = ThreadPoolExecutor(len(urls), thread_name_prefix="flight-relocate")
    try:
        while time.monotonic() < deadline:
            futures = {pool.submit(_serves, url, ticket, files): url for url in urls}
            try:
                for done in as_completed(futures, timeout=max(0.0, deadline - time.monotonic())):
                    if done.result():
                        return futures[done]
            except TimeoutError:
                return None
            time.sleep(0.2)
        return None
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _serves(url: str, ticket: bytes, files: SecurityFiles) -> bool:
    """Whether the worker at ``url`` has the task ``ticket`` names (it starts streaming it)."""
    try:
        with connect(url, files.load()) as client:
            reader = client.do_get(fl.Ticket(ticket))
            try:
                reader.read_chunk()
            except StopIteration:
                pass
            reader.cancel()
            return True
    except (pa.ArrowException, OSError) as exc:
        info = error_info_of(exc)
        if info is None or info.code != protocol_pb2.ERROR_CODE_NOT_FOUND:
            log.debug("looking for a replacement on %s: %s", url, exc)
        return False
