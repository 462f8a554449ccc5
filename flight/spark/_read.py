"""Driver-side helpers of the ``flight`` data source.

``read(spark, query, resolver)`` is the usual way: the driver starts the query
detached (``DistributedExec.start_detached()``, so the coordinator lives in the
driver for as long as Spark reads) and hands Spark the head partitions (URL and
ticket each) and the Arrow schema as options. Spark then reads every head
partition in parallel with ``DoGet``; the driver never holds the result.

``plan_options(query)`` builds the options of the coordinator-less form: a
query that is one stage (scan, filter, project) with its work units listed on
the driver, which every Spark task runs as its own task.
"""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Self

from flight.config import ExecOptions
from flight.coordinator.exec import DetachedQuery, DistributedExec
from flight.coordinator.resolver import WorkerResolver
from flight.errors import PlanError
from flight.plan.query import Query
from flight.planner.cut import plan_query
from flight.planner.inputs import refuse_unsent_inputs
from flight.security import SecurityFiles
from flight.sources.feed import FeedContext, WorkUnit, unit_bytes
from flight.spark._kept import keep
from flight.spark._options import Assignment, b64, encode_head, encode_units
from flight.wire._proto import plan_pb2
from flight.wire.plan_codec import encode_plan
from flight.wire.protocol import encode_schema

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from flight.sql.catalog import Catalog, Source

__all__ = ["FlightRead", "plan_options", "read", "register", "sql", "start_read"]

FORMAT = "flight"
DEFAULT_RETAIN_S = 600.0
"""How long a read()'s head outputs stay readable when nobody releases them (the backstop)."""


PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark: SparkSession) -> None:
    """Register the ``flight`` data source with ``spark`` (idempotent).

    On PySpark 4.1+, also turns Python data sources' filter pushdown on (``PUSHDOWN_CONF``): a statement
    for a ``flight-coordinator`` takes Spark's filters, and Spark refuses such a reader while the setting
    is off. Only Python sources that offer to take filters are affected; a read can decline with the
    option ``pushdown 'false'``. (Whether a session set it itself cannot be told: reading it gives its
    default, ``false``, either way.)
    """
    import pyspark

    from flight.spark._source import FlightDataSource

    spark.dataSource.register(FlightDataSource)
    if tuple(int(x) for x in pyspark.__version__.split(".")[:2]) >= (4, 1):
        spark.conf.set(PUSHDOWN_CONF, "true")


class FlightRead:
    """A query running detached on the driver, and the Spark DataFrame that reads it.

    The head outputs stay on the workers, readable by any number of Spark actions
    (and retried or speculative tasks), until ``release()`` (or leaving the ``with``
    block), ``close()``, ``retain`` seconds after the start, or once nothing can read
    them (the DataFrame and those made from it collected, or the session stopped:
    ``flight/spark/_kept.py``); the workers spill
    them to local disk past their output bound. With ``retain=0`` each head
    partition can be read once, and the tasks free themselves once it was.
    """

    def __init__(self, detached: DetachedQuery, df: DataFrame) -> None:
        self.query = detached
        self.df = df

    @property
    def query_id(self) -> str:
        return self.query.query_id

    @property
    def partitions(self) -> int:
        return len(self.query.partitions)

    def wait(self, timeout: float | None = None) -> bool:
        """True once the query ended (released; read once: every head partition read); raises its error if it failed."""
        return self.query.wait(timeout)

    def release(self) -> None:
        """The DataFrame will be read no more: free the query's tasks and their retained outputs."""
        self.query.release()

    def close(self) -> None:
        """Cancel the query if Spark has not read it all, and free its tasks."""
        self.query.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
        self.close()


def start_read(
    spark: SparkSession,
    query: Query,
    resolver: WorkerResolver | Sequence[str],
    options: ExecOptions | None = None,
    *,
    security_files: SecurityFiles | None = None,
    retain: float = DEFAULT_RETAIN_S,
    **overrides: object,
) -> FlightRead:
    """Start ``query`` on the workers; return the handle whose ``df`` reads its head partitions.

    The driver uses ``ExecOptions.security``; the Spark tasks read the credentials from
    ``security_files`` (paths only travel in the data source's options), else from ``FLIGHT_EXEC_*``.
    """
    from flight.spark._table import send_inputs, spark_inputs

    register(spark)
    if spark_inputs(query) and retain <= 0:
        raise PlanError("a query reading a Spark DataFrame (flight.spark.table) keeps its result readable: "
                        "retain must be above 0 (Spark may read it only once the DataFrame was sent)")
    # Spark reads one partition per head task: its parallelism is what the stages give, however small the query.
    overrides = {"small_query_bytes": 0, **overrides}
    detached = DistributedExec(query, resolver, options, **overrides).start_detached(retain, sends_inputs=True)  # type: ignore[arg-type]
    try:
        partitions = [(p.url, p.ticket) for p in detached.partitions]
        opts = encode_head(partitions, detached.schema, detached.query_id, security_files, detached.workers)
        df = spark.read.format(FORMAT).options(**opts).load()
        send_inputs(spark, query, detached, security_files or SecurityFiles())  # a DataFrame table's rows, before Spark reads
    except BaseException:
        detached.close()
        raise
    if retain > 0:
        keep(detached, df)  # let go once nothing can read it: the DataFrames collected, or the session stopped
    return FlightRead(detached, df)


def read(
    spark: SparkSession,
    query: Query,
    resolver: WorkerResolver | Sequence[str],
    options: ExecOptions | None = None,
    *,
    security_files: SecurityFiles | None = None,
    retain: float = DEFAULT_RETAIN_S,
    **overrides: object,
) -> DataFrame:
    """``query``'s result as a Spark DataFrame: one partition per head task, each read with DoGet.

    The DataFrame can be read by any number of actions for ``retain`` seconds (then its query
    is released); ``start_read`` gives the handle to release it sooner, wait for or cancel it.
    """
    return start_read(spark, query, resolver, options, security_files=security_files, retain=retain, **overrides).df


def sql(
    spark: SparkSession,
    text: str,
    tables: Mapping[str, Source] | Catalog,
    workers: WorkerResolver | Sequence[str],
    options: ExecOptions | None = None,
    *,
    dialect: str = "spark",
    params: Sequence[object] | Mapping[str, object] | None = None,
    security_files: SecurityFiles | None = None,
    retain: float = DEFAULT_RETAIN_S,
    **overrides: object,
) -> DataFrame:
    """SQL planned here and run on ``workers``, its result as a DataFrame (``read``): no service needed.

    ``dialect`` is Spark's by default (backtick identifiers, ``date_add``, ``nvl``: docs/sql.md), as a
    Spark user writes it. The statement runs once, now; Spark reads its head partitions.
    """
    from flight.sql import sql as flight_sql  # the sql extra (DataFusion): imported when used

    query = flight_sql(text, tables, dialect=dialect, params=params)
    return read(spark, query, workers, options, security_files=security_files, retain=retain, **overrides)


def _drain(stream: Iterator[WorkUnit] | AsyncIterator[WorkUnit]) -> list[bytes]:
    if inspect.isasyncgen(stream) or hasattr(stream, "__anext__"):

        async def collect() -> list[bytes]:
            return [unit_bytes(u) async for u in stream]  # type: ignore[union-attr]

        return asyncio.run(collect())
    return [unit_bytes(u) for u in stream]


def plan_options(query: Query, tasks: int = 2) -> dict[str, str]:
    """Options ``plan`` / ``units`` / ``tasks`` for ``spark.read.format("flight")`` (add ``workers``).

    Only for a query that is **one stage** with at most ``tasks`` tasks (scans,
    filters, projections: no aggregate, join, sort or limit across tasks). Its
    feeds' providers run here, now, to the end: their units travel inside the
    options, so keep them few (files, not rows). Each Spark partition then runs
    one task of the stage; the DataFrame can be read any number of times.
    """
    if tasks < 1:
        raise PlanError(f"plan_options: tasks must be at least 1, not {tasks}")
    qplan = plan_query(query.node, tasks, colocate=False)
    refuse_unsent_inputs(qplan.stages, "plan_options")
    if len(qplan.stages) != 1:
        raise PlanError(
            f"plan_options: this query needs {len(qplan.stages)} stages (it aggregates, joins, sorts or limits across "
            "tasks); the 'plan' option carries one stage only. Use flight.spark.read(spark, query, resolver)."
        )
    stage = qplan.head
    count = tasks if stage.sized_at_execution else max(1, min(stage.task_count or tasks, tasks))
    query_id = f"spark-plan-{uuid.uuid4().hex[:8]}"
    assign: list[Assignment] = [{f.feed.feed_id: {} for f in stage.feeds} for _ in range(count)]
    for f in stage.feeds:
        provider = f.feed.inner()
        streams = [
            _drain(provider.feed(p, FeedContext(query_id, f.feed.feed_id, p, f.partitions))) for p in range(f.partitions)
        ]
        if f.shared:
            for i, unit in enumerate(streams[0]):  # one discovery stream, dealt round-robin: task t owns partition t
                assign[i % count][f.feed.feed_id].setdefault(i % count, []).append(unit)
            for t in range(count):
                assign[t][f.feed.feed_id].setdefault(t, [])
        else:
            for p, units in enumerate(streams):
                assign[p % count][f.feed.feed_id][p] = units
    plan = plan_pb2.StagePlan(output=plan_pb2.OutputSpec(partitions=1), output_schema=encode_schema(stage.output_schema))
    plan.root.CopyFrom(stage.root.to_proto())
    return {"plan": b64(encode_plan(plan)), "units": encode_units(assign), "tasks": str(count)}
