"""DoGet streams beat while they wait, and their readers give up on a worker that went silent.

Real worker processes (``LocalCluster``, the ``flight.dev.testing`` sleep reader); the tasks are
driven with the coordinator's own ``TaskChannel``, without its watch for a silent worker
(``peer_timeout=None``): what notices a frozen worker here is the DoGet stream's watch alone
(``flight.wire.stall``). docs/protocol.md §11, "Heartbeats".
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.flight as fl
import pytest
from support import wait_until

import flight
from flight.coordinator.channel import TaskChannel
from flight.coordinator.headers import task_header
from flight.dev.testing import SLEEP_SCHEMA, sleep_unit
from flight.errors import WorkerUnavailableError
from flight.wire._proto import plan_pb2, protocol_pb2
from flight.wire.clients import read_stream, translate_flight_error
from flight.wire.plan_codec import encode_plan
from flight.wire.protocol import encode_schema, make_stage_key, new_secret

FEED = "s"
BEAT_MS = 200
PEER_TIMEOUT = "2"  # the consumer's worker: its bound for a silent coordinator, and for a silent producer
HANG_S = 60.0  # a read still going after this is a hang (never a measured time)


@pytest.fixture(scope="module")
def cluster() -> Iterator[flight.LocalCluster]:
    """Worker 0 produces (and is frozen); worker 1 consumes, with a short peer timeout."""
    with flight.LocalCluster(2, extensions=["flight.dev.testing"], per_worker_args=[[], ["--peer-timeout", PEER_TIMEOUT]]) as c:
        yield c


def sleep_plan() -> plan_pb2.StagePlan:
    scan = plan_pb2.FeedScan(feed=plan_pb2.WorkUnitFeed(feed_id=FEED), reader="testing.sleep", schema=encode_schema(SLEEP_SCHEMA))
    return plan_pb2.StagePlan(root=plan_pb2.Operator(feed_scan=scan), output=plan_pb2.OutputSpec(partitions=1))


def read_plan(producer_url: str, producer: protocol_pb2.StageKey) -> plan_pb2.StagePlan:
    """A consumer task: the producer's partition 0, read with DoGet from another worker."""
    read = plan_pb2.ShuffleRead(
        stage_id=producer.stage_id,
        producers=[plan_pb2.ProducerTask(url=producer_url, stage_key=producer.SerializeToString())],
        partition_start=0,
        partition_end=1,
        schema=encode_schema(SLEEP_SCHEMA),
    )
    return plan_pb2.StagePlan(root=plan_pb2.Operator(shuffle_read=read), output=plan_pb2.OutputSpec(partitions=1))


class Task:
    """One task on a real worker, through the coordinator's channel: units are sent by hand, under credit."""

    def __init__(
        self, url: str, query_id: str, secret: bytes, stage: int, plan: plan_pb2.StagePlan, *, feeds: bool, retain: bool = False,
        beat_s: float = BEAT_MS / 1000,
    ):
        self.url = url
        self.credit = threading.Semaphore(0)
        options = protocol_pb2.TaskOptions(heartbeat_ms=BEAT_MS, retain_output=retain)
        header = task_header(
            query_id=query_id, stage_id=stage, task=0, task_count=1, plan=encode_plan(plan), url=url, secret=secret,
            feeds={FEED: [0]} if feeds else None, options=options,
        )
        self.key = header.stage_key
        self.ticket = protocol_pb2.Ticket(stage_key=self.key, partition_start=0, partition_end=1, query_secret=secret).SerializeToString()
        self.channel = TaskChannel(url, header, on_credit=self._credit, heartbeat=beat_s, peer_timeout=None)
        self.client = fl.connect(url)
        self.channel.open(self.client)
        self.channel.wait_ready(30.0)

    def _credit(self, channel: TaskChannel, feed: str, partition: int, credits: int) -> None:
        for _ in range(credits):
            self.credit.release()

    def send(self, *units: bytes) -> None:
        for _ in units:
            assert self.credit.acquire(timeout=HANG_S), "no credit from the worker"
        batch = protocol_pb2.WorkUnitBatch(feed_id=FEED, partition=0, units=[protocol_pb2.WorkUnit(body=u, id=i) for i, u in enumerate(units)])
        self.channel.send(protocol_pb2.CoordinatorFrame(units=batch))

    def end(self) -> None:
        self.channel.send(protocol_pb2.CoordinatorFrame(feed_end=protocol_pb2.FeedEnd(feed_id=FEED, partition=0)))

    def close(self) -> None:
        self.channel.abort("the test is over")
        self.channel.finish()
        self.client.close()


def units(count: int, ms: float) -> tuple[list[bytes], list[tuple[int, int]]]:
    """``count`` sleep units of ``ms`` each, unit i making i + 1 rows; and the rows they make (the oracle)."""
    bodies = [sleep_unit(i, ms, rows=i + 1) for i in range(count)]
    return bodies, sorted((i, r) for i in range(count) for r in range(i + 1))


def rows_of(batches: list[pa.RecordBatch]) -> list[tuple[int, int]]:
    table = pa.Table.from_batches(batches, schema=SLEEP_SCHEMA)
    return sorted(zip(table["id"].to_pylist(), table["row"].to_pylist()))


def metadata(chunk: fl.FlightStreamChunk) -> protocol_pb2.BatchMetadata:
    assert chunk.app_metadata is not None, "every DoGet batch carries its BatchMetadata"
    return protocol_pb2.BatchMetadata.FromString(chunk.app_metadata.to_pybytes())


@pytest.mark.parametrize("retain", [False, True], ids=["read-once", "retained"])
def test_a_slow_tasks_stream_beats_while_it_waits_and_carries_exactly_its_rows(cluster: flight.LocalCluster, retain: bool) -> None:
    url = cluster.urls[0]
    task = Task(url, f"beat-{os.urandom(4).hex()}", new_secret(), 0, sleep_plan(), feeds=True, retain=retain)
    try:
        reader = task.client.do_get(fl.Ticket(task.ticket))
        # No unit was sent: the stream has nothing to send, so what comes first is a heartbeat.
        first = reader.read_chunk()
        assert first.data.num_rows == 0 and first.data.schema.equals(SLEEP_SCHEMA)
        assert metadata(first).heartbeat and metadata(first).partition == 0
        also: dict[str, object] = {}
        if retain:  # a second reader of the retained output, through the project's reader, meanwhile
            thread = threading.Thread(target=lambda: also.update(batches=list(read_stream(task.client, task.ticket, stall=30.0, url=url))))
            thread.start()
        bodies, expected = units(6, ms=3 * BEAT_MS)  # each unit longer than an interval: beats between the batches
        task.send(*bodies)
        task.end()
        data, beats = [], 1
        while True:
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                break
            meta = metadata(chunk)
            assert meta.partition == 0
            if meta.heartbeat:
                assert chunk.data.num_rows == 0, "a heartbeat carries no rows"
                beats += 1
            else:
                data.append(chunk.data)
        assert rows_of(data) == expected, "a row was added or lost"
        if retain:
            thread.join(HANG_S)
            assert not thread.is_alive(), "the second reader did not end"
            batches = also["batches"]
            assert isinstance(batches, list) and all(b.num_rows for b in batches), "read_stream handed a heartbeat on"
            assert rows_of(batches) == expected
    finally:
        task.close()


def test_a_reader_gives_up_on_a_frozen_worker_naming_it(cluster: flight.LocalCluster) -> None:
    url, victim = cluster.urls[0], cluster.processes[0]
    task = Task(url, f"stall-{os.urandom(4).hex()}", new_secret(), 0, sleep_plan(), feeds=True)
    try:
        stream = read_stream(task.client, task.ticket, stall=1.5, url=url)
        task.send(sleep_unit(0, 0, rows=5))
        assert next(stream).num_rows == 5
        victim.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(fl.FlightUnavailableError) as raised:
                next(stream)  # the watch cancels the read once it heard nothing for 1.5 s
        finally:
            victim.send_signal(signal.SIGCONT)
    finally:
        task.close()
    error = translate_flight_error(raised.value, url)
    assert isinstance(error, WorkerUnavailableError) and error.worker_url == url
    assert url in str(error) and "sent nothing" in str(error)


def test_a_reader_gives_up_on_a_worker_frozen_before_the_streams_first_message(cluster: flight.LocalCluster) -> None:
    """pyarrow's ``do_get`` returns once the first message (the schema) came: a reader of a worker frozen before it
    waited, unwatched, until TCP gave up. It asks the worker for ``health`` every bound without it, and gives up
    on one that does not answer (``flight.wire.stall.open_stream``)."""
    url, victim = cluster.urls[0], cluster.processes[0]
    outcome: dict[str, BaseException] = {}
    with fl.connect(url) as client:
        ticket = protocol_pb2.Ticket(stage_key=make_stage_key(f"frozen-{os.urandom(4).hex()}", 0, 0), partition_start=0,
                                     partition_end=1, query_secret=new_secret()).SerializeToString()

        def read() -> None:
            try:
                next(read_stream(client, ticket, stall=1.0, url=url))
            except (pa.ArrowException, OSError) as exc:
                outcome["error"] = exc

        victim.send_signal(signal.SIGSTOP)
        try:
            thread = threading.Thread(target=read, daemon=True)
            thread.start()
            thread.join(HANG_S)
            assert not thread.is_alive(), "the reader waited for a frozen worker's first message forever"
        finally:
            victim.send_signal(signal.SIGCONT)
    error = translate_flight_error(outcome["error"], url)
    assert isinstance(error, WorkerUnavailableError) and error.worker_url == url, error
    assert "not even its first message" in str(error) and "health" in str(error), error


def test_a_stream_whose_task_arrives_late_is_waited_for_while_its_worker_answers(cluster: flight.LocalCluster) -> None:
    """The first message may come late for good reasons (here the task reaches the worker 3 s after its reader asked,
    within the worker's --get-wait): a worker that answers ``health`` meanwhile is waited for, its rows read whole."""
    url = cluster.urls[0]
    query, secret = f"late-{os.urandom(4).hex()}", new_secret()
    ticket = protocol_pb2.Ticket(stage_key=make_stage_key(query, 0, 0), partition_start=0, partition_end=1, query_secret=secret)
    outcome: dict[str, object] = {}

    def read() -> None:
        with fl.connect(url) as client:
            try:
                outcome["rows"] = sum(b.num_rows for b in read_stream(client, ticket.SerializeToString(), stall=0.5, url=url))
            except (pa.ArrowException, OSError) as exc:
                outcome["error"] = exc

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    threading.Event().wait(3.0)  # six of the reader's bounds: it asked for health meanwhile
    task = Task(url, query, secret, 0, sleep_plan(), feeds=True)
    try:
        task.send(sleep_unit(0, 0, rows=7))
        task.end()
        thread.join(HANG_S)
    finally:
        task.close()
    assert not thread.is_alive(), "the read did not end"
    assert outcome == {"rows": 7}, outcome


def consume(consumer: Task) -> tuple[threading.Thread, dict[str, object], threading.Event]:
    """A thread reading the consumer task's output: what it read (``rows``) or its error, and an event set at the first rows."""
    outcome: dict[str, object] = {"rows": 0}
    first_rows = threading.Event()

    def read() -> None:
        try:
            for batch in read_stream(consumer.client, consumer.ticket):
                outcome["rows"] = int(outcome["rows"]) + batch.num_rows  # type: ignore[call-overload]
                first_rows.set()
        except (pa.ArrowException, OSError) as exc:
            outcome["error"] = exc
        first_rows.set()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread, outcome, first_rows


@contextlib.contextmanager
def flowing_shuffle(producer_url: str, consumer_url: str, producer_beat_s: float = BEAT_MS / 1000) -> Iterator[
    tuple[Task, threading.Thread, dict[str, object]]
]:
    """A producer task and a consumer task reading it from another worker, 20 rows already through; yields the
    consumer, the thread reading its output and what that read. Both tasks are closed at the end."""
    query, secret = f"shuffle-{os.urandom(4).hex()}", new_secret()
    producer = Task(producer_url, query, secret, 0, sleep_plan(), feeds=True, beat_s=producer_beat_s)
    consumer = Task(consumer_url, query, secret, 1, read_plan(producer_url, producer.key), feeds=False)
    thread, outcome, first_rows = consume(consumer)
    try:
        producer.send(sleep_unit(0, 0, rows=20))
        assert first_rows.wait(HANG_S) and outcome["rows"] == 20, outcome  # the shuffle's stream is open and flowing
        yield consumer, thread, outcome
    finally:
        consumer.close()
        producer.close()


def test_a_consumer_task_fails_naming_a_producer_worker_frozen_mid_shuffle(cluster: flight.LocalCluster) -> None:
    (producer_url, consumer_url), victim = cluster.urls, cluster.processes[0]
    with flowing_shuffle(producer_url, consumer_url) as (consumer, thread, outcome):
        victim.send_signal(signal.SIGSTOP)
        try:
            thread.join(HANG_S)
            assert not thread.is_alive(), "the consumer task waited for the frozen producer forever"
            wait_until(lambda: consumer.channel.error is not None, HANG_S, "the consumer task's error frame")
        finally:
            victim.send_signal(signal.SIGCONT)
    # The consumer's worker reports its task failed because the producer's worker is lost, and names that worker.
    error = consumer.channel.error
    assert isinstance(error, WorkerUnavailableError) and error.worker_url == producer_url, error
    assert "sent nothing" in str(error), error
    exc = outcome.get("error")
    assert isinstance(exc, fl.FlightError) and producer_url in str(exc), f"the consumer's output did not end with the failure: {outcome}"


def test_a_producer_cut_off_from_its_coordinator_is_named_unavailable_by_its_consumer(cluster: flight.LocalCluster) -> None:
    """Worker 1 frees a task whose coordinator sent nothing for 2 s (--peer-timeout): the consumer reading it on
    worker 0 fails naming worker 1 as unavailable, not with a task error, so that the coordinator counts worker 1
    lost (the fleet's partition test: a cut that heals before the coordinator's probe is still a loss)."""
    consumer_url, producer_url = cluster.urls
    with flowing_shuffle(producer_url, consumer_url, producer_beat_s=10 * HANG_S) as (consumer, thread, _):  # never beats
        thread.join(HANG_S)
        assert not thread.is_alive(), "the consumer task waited for the freed producer forever"
        wait_until(lambda: consumer.channel.error is not None, HANG_S, "the consumer task's error frame")
    error = consumer.channel.error
    assert isinstance(error, WorkerUnavailableError) and error.worker_url == producer_url, error
    assert "heard nothing from the coordinator" in str(error), error
