"""``flight_map``: run a flight-exec map stage inside ``DataFrame.mapInArrow``.

Each Spark task opens one ``DoExchange`` to a worker (``map_batches``, the
protocol of ``flight.map_batches`` made safe to abandon half-way): the
partition's batches stream up on a thread of their own while the results
stream back and are handed to Spark, so nothing is collected in memory. The
function Spark pickles is a ``FlightMap``: the serialized stage, the workers as
plain data and the declared output schema as IPC bytes, never a live client.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from flight.coordinator.map import map_batches
from flight.coordinator.resolver import WorkerResolver
from flight.errors import PlanError, RetryableError
from flight.plan.nodes import ExchangeInputNode
from flight.plan.query import Query
from flight.security import SecurityFiles
from flight.spark._schema import Conformer, arrow_schema, check_conformable, ddl, to_struct
from flight.spark._workers import Workers, describe_workers, mark_down
from flight.wire.clients import translate_flight_error
from flight.wire.plan_codec import encode_plan
from flight.wire.protocol import decode_schema, encode_schema

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

__all__ = ["FlightMap", "flight_map", "map_in_arrow"]


def _input_schema(stage: Query) -> pa.Schema:
    inputs = [n for n in stage.node.walk() if isinstance(n, ExchangeInputNode)]
    if len(inputs) != 1:
        raise PlanError("flight_map needs a map stage with one input: build it from flight.map_input(schema)")
    return inputs[0].schema


class _Pulled:
    """An iterator that remembers whether anything was taken from it."""

    def __init__(self, it: Iterator[pa.RecordBatch]) -> None:
        self._it = it
        self.started = False

    def __iter__(self) -> _Pulled:
        return self

    def __next__(self) -> pa.RecordBatch:
        self.started = True
        return next(self._it)


class FlightMap:
    """The function ``mapInArrow`` calls: ``Iterator[RecordBatch] -> Iterator[RecordBatch]``.

    ``schema`` is the Spark DDL of the output this function yields (pass it to
    ``mapInArrow``); ``spark_schema`` the same as a StructType.
    """

    def __init__(
        self,
        plan: bytes,
        input_schema: bytes,
        output_schema: bytes,
        declared: str,
        workers: Workers,
        connect_timeout: float = 10.0,
    ) -> None:
        self.plan = plan
        self.input_schema_ipc = input_schema
        self.output_schema_ipc = output_schema  # the Arrow schema Spark expects for the declared schema
        self.declared = declared  # the declared StructType as JSON
        self.workers = workers
        self.connect_timeout = connect_timeout

    @property
    def output_schema(self) -> pa.Schema:
        return decode_schema(self.output_schema_ipc, "output_schema")

    @property
    def spark_schema(self) -> StructType:
        from pyspark.sql.types import StructType

        return StructType.fromJson(json.loads(self.declared))

    @property
    def schema(self) -> str:
        return ddl(self.spark_schema)

    def __repr__(self) -> str:
        return f"FlightMap(schema={self.schema!r}, workers={self.workers.description})"

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        partition = _spark_partition()
        conform = Conformer(self.output_schema, "flight_map output")
        source = _Pulled(iter(batches))
        failures: list[str] = []
        for url in self.workers.candidates(partition, failures):
            # The executor reads its credentials from files (paths in the closure, or FLIGHT_EXEC_*):
            # the closure Spark pickles carries no secret (docs/security.md).
            output = map_batches(
                self.plan, source, url, task_number=partition, connect_timeout=self.connect_timeout, security=self.workers.security()
            )
            try:
                try:
                    for batch in output:
                        yield conform(batch)
                    return
                except (pa.ArrowException, OSError) as exc:  # defensive: map_batches translates its own
                    raise translate_flight_error(exc, url) from exc
            except RetryableError as exc:
                # A worker that vanished before taking any input: the next one gets the partition.
                if source.started:
                    exc.add_note(f"Spark partition {partition}, map stage on worker {url}")
                    raise
                mark_down(url)
                failures.append(f"{url}: {exc.cause}")
            except Exception as exc:
                exc.add_note(f"Spark partition {partition}, map stage on worker {url}")
                raise
            finally:
                close = getattr(output, "close", None)
                if close is not None:
                    close()


def _spark_partition() -> int:
    try:
        from pyspark import TaskContext
    except ImportError:  # pragma: no cover - called outside Spark without pyspark
        return 0
    ctx = TaskContext.get()
    return ctx.partitionId() if ctx is not None else 0


def flight_map(
    stage: Query,
    workers: str | Sequence[str] | WorkerResolver,
    *,
    schema: StructType | pa.Schema | str | None = None,
    health_timeout: float = 2.0,
    connect_timeout: float = 10.0,
    security_files: SecurityFiles | None = None,
) -> FlightMap:
    """The function for ``df.mapInArrow(f, schema=f.schema)`` that runs ``stage`` on the workers.

    ``stage`` is built from ``flight.map_input(schema)``; ``workers`` is a list
    of URLs, a comma-separated string, or a describable ``WorkerResolver``.
    ``schema`` is the output you will declare to ``mapInArrow`` (DDL, StructType
    or Arrow schema); by default the stage's own output. Every output batch is
    cast and ordered to it; a declared column the stage does not produce, or
    cannot be cast to, is a ``PlanError`` here. ``security_files`` says where executors find
    the token and TLS material (``LocalCluster.security_files``); without it they use the
    ``FLIGHT_EXEC_*`` environment variables. Only paths travel in the closure.
    """
    if not isinstance(stage, Query):
        raise TypeError(f"flight_map needs a flight.Query built from flight.map_input(schema), not {type(stage).__name__}")
    input_schema = _input_schema(stage)
    struct = to_struct(schema if schema is not None else stage.schema)
    target = arrow_schema(struct)
    check_conformable(stage.schema, target, "flight_map")
    return FlightMap(
        encode_plan(stage.stage_plan()),
        encode_schema(input_schema),
        encode_schema(target),
        struct.json(),
        Workers(describe_workers(workers), health_timeout, security_files or SecurityFiles()),
        connect_timeout,
    )


def map_in_arrow(
    df: DataFrame,
    stage: Query,
    workers: str | Sequence[str] | WorkerResolver,
    *,
    schema: StructType | pa.Schema | str | None = None,
    **kwargs: float,
) -> DataFrame:
    """``df.mapInArrow(flight_map(stage, workers), schema)`` with the declared schema given once.

    Also checks at once that ``df`` has every column the stage's input needs.
    """
    fm = flight_map(stage, workers, schema=schema, **kwargs)  # type: ignore[arg-type]  # flight_map checks them
    needed = decode_schema(fm.input_schema_ipc, "input_schema")
    have = {c.lower() for c in df.columns}
    missing = [f.name for f in needed if f.name.lower() not in have]
    if missing:
        raise PlanError(f"map_in_arrow: the DataFrame lacks the stage's input column(s) {missing} (it has {df.columns})")
    return df.mapInArrow(fm, fm.spark_schema)
