"""One task of a one-stage plan, driven by the Spark task that reads its output.

The coordinator-less form of the ``flight`` data source: the Spark task is the
task's coordinator. It opens the task's ``DoExchange`` (header, plan, feed
partitions), feeds it the work units embedded in the options under the
worker's credit (the same ``FeedDispatcher`` the coordinator uses), reads the
output with ``DoGet`` and half-closes once the task finished. Nothing outlives
the Spark task, so such a DataFrame can be read any number of times.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pyarrow as pa

from flight.coordinator.channel import TaskChannel
from flight.coordinator.dispatch import FeedDispatcher
from flight.coordinator.headers import task_header
from flight.errors import RetryableError, TaskCancelledError, WorkerBusyError, WorkerError
from flight.security import Security, connect
from flight.sources.feed import FeedContext, WorkUnitFeed, WorkUnitFeedProvider
from flight.spark._options import Assignment
from flight.spark._workers import Workers, mark_down
from flight.wire._proto import protocol_pb2
from flight.wire.clients import read_stream, translate_flight_error
from flight.wire.protocol import new_secret

__all__ = ["run_stage_task"]



class _Embedded(WorkUnitFeedProvider):
    """The units of one feed partition, carried in the data source's options."""

    def __init__(self, units: dict[int, list[bytes]]) -> None:
        self.units = units

    def feed(self, partition: int, ctx: FeedContext) -> Iterator[bytes]:
        yield from self.units.get(partition, [])


def run_stage_task(
    plan: bytes, assign: Assignment, task: int, tasks: int, workers: Workers, connect_timeout: float
) -> Iterator[pa.RecordBatch]:
    """Run task ``task`` of ``tasks`` on a healthy worker and yield its output batches."""
    failures: list[str] = []
    for url in workers.candidates(task, failures):
        produced = False
        try:
            for batch in _run_on(url, plan, assign, task, tasks, connect_timeout, workers.security()):
                produced = True
                yield batch
            return
        except RetryableError as exc:
            # Nothing was handed to Spark yet, and the units are in the options: run it elsewhere.
            if produced:
                raise
            if not isinstance(exc, WorkerBusyError):
                mark_down(url)  # a busy worker is healthy: the next candidate may have room
            failures.append(f"{url}: {exc.cause}")


def _run_on(
    url: str, plan: bytes, assign: Assignment, task: int, tasks: int, timeout: float, security: Security
) -> Iterator[pa.RecordBatch]:
    query_id = uuid.uuid4().hex[:16]
    header = task_header(
        query_id=query_id, stage_id=0, task=task, task_count=tasks, plan=plan, url=url, secret=new_secret(),
        feeds={f: sorted(parts) for f, parts in assign.items()},
    )
    key = header.stage_key
    errors: list[BaseException] = []
    dispatcher = FeedDispatcher(query_id, discovery_buffer=256, max_units_per_frame=64, on_error=errors.append)
    channel = TaskChannel(url, header, on_credit=dispatcher.on_credit, on_error=lambda ch, err: dispatcher.stop())
    for feed_id, parts in assign.items():
        feed = WorkUnitFeed(_Embedded(parts), feed_id=feed_id)
        for p in sorted(parts):
            source = dispatcher.add_source(feed, p, max(parts) + 1, shared=False)
            dispatcher.add_slot(source, p, channel)
    dispatcher.start_discovery()
    done = False
    try:
        client = connect(url, security)
    except (pa.ArrowException, OSError) as exc:
        dispatcher.stop()
        raise translate_flight_error(exc, url, channel.key) from exc
    try:
        channel.open(client)
        channel.wait_ready(timeout)
        dispatcher.start_sending()
        ticket = protocol_pb2.Ticket(stage_key=key, partition_start=0, partition_end=1, query_secret=header.query_secret)
        try:
            # Heartbeats skipped; a worker silent past the channel's bound is lost (flight.wire.stall).
            yield from read_stream(client, ticket.SerializeToString(), stall=channel.peer_timeout, url=url)
        except (pa.ArrowException, OSError) as exc:
            channel.done.wait(2.0)  # the task's own error frame says more than the broken stream
            raise (channel.error or translate_flight_error(exc, url, channel.key)) from exc
        channel.finished.wait(timeout)
        if errors:
            raise errors[0]
        if channel.error is not None:
            raise channel.error
        channel.close()
        if not channel.done.wait(timeout):
            raise WorkerError("the worker did not end the task after its output was read", worker_url=url, stage_key=channel.key)
        if channel.error is not None and not isinstance(channel.error, TaskCancelledError):
            raise channel.error
        done = True
    finally:
        dispatcher.stop()
        if not done:
            channel.abort("the Spark task stopped reading")
        channel.finish()
        client.close()
