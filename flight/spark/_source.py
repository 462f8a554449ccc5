"""The ``flight`` PySpark data source (``pyspark.sql.datasource``).

How Spark runs it: ``schema()`` in one short-lived Python process,
``reader(schema)`` and ``partitions()`` in another (the reader is then pickled
to the executors), ``read(partition)`` in a Spark task. So no state lives in
these objects beyond the options: every ``InputPartition`` carries what its
``read()`` needs (a URL and a ticket, or a task's units), and ``read()`` casts
each batch to the Arrow schema Spark checks the first batch against.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from flight.clients import read_stream, translate_flight_error
from flight.security import SecurityFiles, connect
from flight.spark._options import Assignment, HeadOptions, PlanOptions, decode_options
from flight.spark._schema import Conformer, arrow_schema, spark_schema
from flight.spark._stage_task import run_stage_task
from flight.spark._workers import Workers

__all__ = ["READ_ONCE_HINT", "FlightDataSource", "HeadPartition", "StageTaskPartition"]

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


class FlightDataSource(DataSource):
    """``spark.read.format("flight")``: see docs/spark.md for its options."""

    @classmethod
    def name(cls) -> str:
        return "flight"

    def schema(self) -> StructType:
        return spark_schema(decode_options(self.options).schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        return FlightReader(decode_options(self.options), schema)


class FlightReader(DataSourceReader):
    def __init__(self, spec: HeadOptions | PlanOptions, schema: StructType) -> None:
        self.spec = spec
        self.schema = schema

    def partitions(self) -> list[InputPartition]:
        spec = self.spec
        if isinstance(spec, HeadOptions):
            return [HeadPartition(i, url, ticket, spec.query_id, spec.security_files) for i, (url, ticket) in enumerate(spec.partitions)]
        tasks = len(spec.assign)
        return [
            StageTaskPartition(i, tasks, spec.plan, spec.assign[i], spec.workers, spec.connect_timeout) for i in range(tasks)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        conform = Conformer(arrow_schema(self.schema), "flight data source")
        if isinstance(partition, HeadPartition):
            batches = _read_head(partition)
        elif isinstance(partition, StageTaskPartition):
            batches = run_stage_task(
                partition.plan, partition.assign, partition.index, partition.tasks, partition.workers, partition.connect_timeout
            )
        else:
            raise TypeError(f"the flight data source cannot read a {type(partition).__name__}")
        for batch in batches:
            yield conform(batch)


def _read_head(p: HeadPartition) -> Iterator[pa.RecordBatch]:
    where = f"head partition {p.index} of flight query {p.query_id}"
    try:
        client = connect(p.url, p.security_files.load())
    except (pa.ArrowException, OSError) as exc:
        raise translate_flight_error(exc, p.url) from exc
    try:
        yield from read_stream(client, p.ticket)
    except (pa.ArrowException, OSError) as exc:
        error = translate_flight_error(exc, p.url)
        cause = error.cause
        raise type(error)(f"cannot read {where}: {cause}. {READ_ONCE_HINT}", worker_url=p.url, cause=cause) from exc
    finally:
        client.close()
