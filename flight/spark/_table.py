"""A Spark DataFrame as a table of a flight query (``flight.spark.table``).

How it runs: the DataFrame becomes an ``InputCallNode`` leaf, one task per Spark partition.
``flight.spark.read`` (or ``sql``) starts the query detached on the driver, which opens
every task as usual, the input stage's too (so its consumers find it at once, and its
coordinator watches and frees it). Then a Spark job over the DataFrame
(``mapInArrow``, so Spark's partitioning is kept) sends each partition from the Spark task
that computed it to its flight task, on one input call (a DoExchange: docs/protocol.md,
section 16): ``InputAttach``, the batches, ``InputEnd``. The rows never pass through the
driver. The job runs to its end before Spark reads the result (``send_inputs`` says why); if
it fails, the query fails with Spark's error, and if the query fails, its sending tasks fail
with the query's error, and so does the job.

Rows sent once cannot be sent again: such a query does not survive a lost worker
(``replay_mode``), and an input feeds one stage only (``planner/inputs.py``).
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.flight as fl

from flight.coordinator.detached import DetachedQuery, InputTarget
from flight.errors import FlightExecError, PlanError
from flight.plan.nodes import InputCallNode
from flight.plan.query import Query
from flight.security import SecurityFiles, connect
from flight.wire._proto import protocol_pb2
from flight.wire.clients import translate_flight_error
from flight.wire.limits import clip
from flight.wire.protocol import INPUT_CALL_PATH

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["SparkInput", "send_inputs", "spark_inputs", "table"]

log = logging.getLogger(__name__)

CONNECT_PARTITIONS = 4
"""Partitions of a Spark Connect DataFrame given without ``partitions`` (Connect does not say how many it has)."""


@dataclass(eq=False)
class SparkInput:
    """The DataFrame behind an ``InputCallNode``: it stays on the driver."""

    df: DataFrame
    name: str


def table(df: DataFrame, *, name: str = "dataframe", partitions: int | None = None) -> Query:
    """``df`` as a table (a ``Query`` leaf) of a flight query run through ``flight.spark.read`` or ``sql``.

    One flight task reads each Spark partition (``partitions``: repartition to that many first). The
    DataFrame is computed once, by the query's run, its partitions streamed by Spark's tasks straight
    into the flight tasks. Use it once per query.
    """
    from pyspark.sql.pandas.types import to_arrow_schema

    if partitions is not None:
        if partitions < 1:
            raise PlanError(f"flight.spark.table({name!r}): partitions must be at least 1, not {partitions}")
        df = df.repartition(partitions)
    else:
        try:
            partitions = df.rdd.getNumPartitions()
        except Exception:  # noqa: BLE001 - Spark Connect has no RDDs: fix the count ourselves
            partitions = CONNECT_PARTITIONS
            df = df.repartition(partitions)
        if partitions == 0:  # an empty DataFrame Spark optimised to no partition: one empty partition
            partitions, df = 1, df.repartition(1)
    schema = to_arrow_schema(df.schema, timezone="UTC", prefers_large_types=False)
    input_id = f"spark:{name}#{uuid.uuid4().hex[:8]}"
    return Query(InputCallNode(schema, partitions, input_id, SparkInput(df, name)))


def spark_inputs(query: Query) -> list[InputCallNode]:
    return [n for n in query.node.walk() if isinstance(n, InputCallNode) and isinstance(n.source, SparkInput)]


_CAUSE_WAIT_S = 2.0  # how long a failed sender waits for the query's own error (it travels a worker's stream)


def send_inputs(spark: SparkSession, query: Query, detached: DetachedQuery, files: SecurityFiles) -> None:
    """Send each of ``query``'s DataFrame tables to its tasks: one Spark job each, run to its end here.

    Before Spark reads the result, not beside it: a read job's tasks would wait on the head tasks,
    which wait for the input, whose sending tasks would wait for the cores the read job holds. In
    stage order, children first: a stage reading one input may first read a stage fed by another.
    If a job fails, or leaves a partition unsent, the query fails (its tasks freed) and the error,
    naming the DataFrame and carrying Spark's, is raised here. The ``retain`` window starts after."""
    nodes = detached.input_nodes()  # as planned: only the columns the query uses are sent
    connect_session = type(spark).__module__.startswith("pyspark.sql.connect")
    group = f"flight-input-{detached.query_id}"
    if connect_session:
        spark.addTag(group)
    else:
        spark.sparkContext.setJobGroup(group, f"flight-exec: the DataFrame tables of query {detached.query_id}", interruptOnCancel=True)
    try:
        for input_id, targets in detached.inputs().items():  # stage order
            node = nodes[input_id]
            assert isinstance(node.source, SparkInput)
            _send_one(node, node.source, targets, detached, files)
    except BaseException:
        _cancel(spark, group, connect_session)  # a KeyboardInterrupt, or a failure: Spark stops computing
        raise
    finally:
        if connect_session:
            spark.removeTag(group)
        else:
            spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    detached.restart_retain()


def _send_one(node: InputCallNode, source: SparkInput, targets: list[InputTarget], detached: DetachedQuery, files: SecurityFiles) -> None:
    where = f"query {detached.query_id}: the Spark job sending DataFrame {source.name!r} ({node.input_id})"
    if len(targets) != node.partitions:
        error = FlightExecError(f"{where}: {len(targets)} tasks for {node.partitions} partitions")
        detached.fail(error)
        raise error
    started = time.monotonic()
    df = _select(source.df, node.columns if node.columns is not None else list(source.df.columns))
    try:
        pushed = df.mapInArrow(sender(targets, node.schema, files), "partition int, rows long").collect()
    except Exception as exc:  # noqa: BLE001 - Spark's error, with its context, fails the query
        # The query may have failed first (a task's cast), and the sender met its ended task: the query's own
        # error is then the root, and the worker's account of it comes clipped inside Spark's.
        cause = detached.failure(wait=_CAUSE_WAIT_S)
        if cause is not None:
            error = FlightExecError(f"{where} failed because the query failed: {cause} (Spark: {clip(spark_reason(exc), 400)})")
        else:
            error = FlightExecError(f"{where} failed: {spark_reason(exc)}")
        detached.fail(error)
        raise error from None
    sent = sorted(r["partition"] for r in pushed)
    if sent != list(range(node.partitions)):  # Spark ran another number of partitions than it said
        missing = sorted(set(range(node.partitions)) - set(sent))
        error = FlightExecError(f"{where} sent partitions {sent[:20]} of {node.partitions}: {missing[:20]} never came "
                                "(the DataFrame's partitioning changed between planning and running: give partitions=)")
        detached.fail(error)
        raise error
    log.info("query %s: DataFrame %r sent, %d rows in %d partitions, %.2f s", detached.query_id, source.name,
             sum(r["rows"] for r in pushed), len(pushed), time.monotonic() - started)


def _select(df: DataFrame, columns: list[str]) -> DataFrame:
    """``df``'s ``columns`` (a narrow step: its partitions stay), chosen by position under plain names: Spark
    reads a name with a dot as a path (``mapInArrow`` over a column ``a.b`` fails to resolve it). The sender
    names them back (``send_partition``)."""
    names = list(df.columns)
    plain = [f"_flight_c{i}" for i in range(len(names))]
    return df.toDF(*plain).select(*[plain[names.index(c)] for c in columns])


def _cancel(spark: SparkSession, group: str, connect_session: bool) -> None:
    try:
        if connect_session:
            spark.interruptTag(group)
        else:
            spark.sparkContext.cancelJobGroup(group)
    except Exception as exc:  # noqa: BLE001 - the session may be gone already, and the job with it
        log.debug("cancelling %s: %s", group, exc)


def spark_reason(exc: BaseException) -> str:
    """Spark's error without the Python traceback it wraps (its last line is the exception raised in the task)."""
    text = str(exc)
    if "Traceback (most recent call last)" in text:
        lines = [x.strip() for x in text.splitlines() if x.strip() and not x.strip().startswith(("SQLSTATE", "at ", "File ", "^"))]
        raised = [x for x in lines if ": " in x and not x.startswith(("Traceback", "org.apache", "An exception"))]
        if raised:
            return clip(raised[-1], 1500)
    return clip(text, 1500)


def sender(targets: list[InputTarget], schema: pa.Schema, files: SecurityFiles) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function: partition ``i`` of the DataFrame goes to ``targets[i]`` (pickled to the executors)."""

    def send(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        index = context.partitionId() if context is not None else 0
        if not 0 <= index < len(targets):
            raise FlightExecError(f"DataFrame partition {index} has no flight task: the query planned {len(targets)} partitions "
                                  "(the DataFrame's partitioning changed between planning and running: give partitions=)")
        rows = send_partition(targets[index], schema, batches, files)
        yield pa.record_batch([pa.array([index], pa.int32()), pa.array([rows], pa.int64())], names=["partition", "rows"])

    return send


def send_partition(target: InputTarget, schema: pa.Schema, batches: Iterator[Any], files: SecurityFiles) -> int:
    """Stream ``batches`` (cast to ``schema``) to ``target``'s task on one input call; the rows sent.

    Raises a WorkerError naming the worker and the task when the call is refused or breaks."""
    where = f"input {target.input_id} partition {target.task} to {target.url}"
    first = next(batches, None)  # computed before the call opens: a failure here leaves the task free for Spark's retry
    batches = itertools.chain([first] if first is not None else [], batches)
    client = connect(target.url, files.load())
    rows = count = 0
    try:
        writer, reader = client.do_exchange(fl.FlightDescriptor.for_path(INPUT_CALL_PATH))
        writer.write_metadata(pa.py_buffer(target.attach))
        writer.begin(schema)
        for batch in batches:
            if batch.num_rows == 0:
                continue
            batch = pa.Table.from_batches([batch.rename_columns(schema.names)]).cast(schema).combine_chunks().to_batches()[0]
            writer.write_batch(batch)
            rows += batch.num_rows
            count += 1
        end = protocol_pb2.CoordinatorFrame(input_end=protocol_pb2.InputEnd(rows=rows, batches=count))
        writer.write_metadata(pa.py_buffer(end.SerializeToString()))
        writer.done_writing()
        for _ in iter(reader.read_chunk, None):  # the worker sends nothing: this waits for the call's status
            pass
    except StopIteration:
        return rows
    except (pa.ArrowException, OSError) as exc:
        error = translate_flight_error(exc, target.url)
        raise type(error)(f"sending {where} failed: {error.cause}", worker_url=target.url, cause=error.cause) from None
    finally:
        client.close()
    return rows
