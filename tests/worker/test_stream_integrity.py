"""Stream trailers on the wire (docs/protocol.md, section 17), with a raw client and a hostile producer.

A real worker's DoGet must end every partition with a trailer that counts what it sent, its
CRC-32 computed as the section says (checked here with zlib over the column's bytes, not with the
project's code). And a real worker reading a producer that breaks the rule (here the test's own
Flight server: a trailer missing, counts that lie, a changed byte, a partition out of order)
must fail the consuming task with UNAVAILABLE naming that producer, its task and the partition,
never end with fewer rows.
"""

from __future__ import annotations

import struct
import threading
import uuid
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl
import pytest

import flight
from flight.wire.integrity import StreamIntegrityError
from tests.worker import test_raw_client as raw
from tests.worker.test_raw_client import CALL, PROTOCOL_VERSION, SECRET, Exchange, Protos, info, wait_until

P = raw.P  # the fixtures: the raw protos, a real worker and a client of it
worker = raw.worker
client = raw.client

SCHEMA = pa.schema([("k", pa.int64())])


def _values(P: Protos, rows: int, chunks: int) -> Any:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, SCHEMA) as w:
        for c in range(chunks):
            w.write_batch(pa.record_batch([pa.array(range(c * rows, (c + 1) * rows), pa.int64())], schema=SCHEMA))
    return P.Operator(values=P.Values(ipc_stream=sink.getvalue().to_pybytes()))


def _header(P: Protos, key: Any, root: Any, **options: Any) -> bytes:
    return bytes(
        P.TaskHeader(
            protocol_version=PROTOCOL_VERSION,
            stage_key=key,
            task_count=1,
            plan=P.wire(P.StagePlan(root=root)),
            options=P.TaskOptions(**options),
            query_secret=SECRET,
        ).SerializeToString()
    )


def _until(ex: Exchange, kinds: tuple[str, ...]) -> Any:
    frame = ex.frame()
    while frame.WhichOneof("frame") not in kinds:
        frame = ex.frame()
    return frame


def _doget(P: Protos, client: fl.FlightClient, key: Any) -> list[tuple[Any, pa.RecordBatch]]:
    ticket = P.Ticket(stage_key=key, partition_start=0, partition_end=1, query_secret=SECRET)
    reader = client.do_get(fl.Ticket(ticket.SerializeToString()), options=CALL)
    out = []
    while True:
        try:
            chunk = reader.read_chunk()
        except StopIteration:
            return out
        out.append((P.BatchMetadata.FromString(chunk.app_metadata.to_pybytes()), chunk.data))


@pytest.mark.parametrize("checksum", [True, False])
def test_each_partition_ends_with_a_trailer_of_its_rows_batches_and_crc(P: Protos, client: fl.FlightClient, checksum: bool) -> None:
    key = P.StageKey(query_id=f"raw-{uuid.uuid4().hex[:12]}", stage_id=0, task_number=0)
    ex = Exchange(P, client, _header(P, key, _values(P, rows=1000, chunks=3), no_checksum=not checksum))
    try:
        assert ex.frame().WhichOneof("frame") == "ready"
        assert _until(ex, ("finished",)).finished.rows_out == 3000
        messages = _doget(P, client, key)
    finally:
        ex.writer.done_writing()
        ex.close()
    *data, (last_meta, last_batch) = messages
    assert last_meta.HasField("trailer") and last_meta.partition == 0 and last_batch.num_rows == 0
    rows = [b for m, b in data if not m.heartbeat]
    assert all(not m.HasField("trailer") for m, _ in data)
    assert last_meta.trailer.rows == sum(b.num_rows for b in rows) == 3000
    assert last_meta.trailer.batches == sum(1 for b in rows if b.num_rows)
    # The checksum of the column's values, batch after batch (no nulls: no validity bytes; section 17).
    crc = _crc(rows)
    assert last_meta.trailer.HasField("checksum") == checksum
    if checksum:
        assert last_meta.trailer.checksum == crc


# ------------------------------------------------------------- a hostile producer


def _trailer(P: Protos, rows: int, batches: int, crc: int | None) -> bytes:
    t = P.StreamTrailer(rows=rows, batches=batches)
    if crc is not None:
        t.checksum = crc
    return bytes(P.BatchMetadata(partition=0, trailer=t).SerializeToString())


def _crc(batches: list[pa.RecordBatch]) -> int:
    """Section 17's checksum of one int64 column without nulls, from its definition: a values range of
    4,096 bytes or more goes through the CRC-32 as the wrapping sum of its words and its length."""
    crc = 0
    for b in batches:
        data = memoryview(b.column(0).buffers()[1])[: b.num_rows * 8].tobytes()
        if len(data) < 4096:
            crc = zlib.crc32(data, crc)
        else:
            words = sum(struct.unpack(f"<{len(data) // 8}Q", data)) % 2**64
            crc = zlib.crc32(struct.pack("<QQ", words, len(data)), crc)
    return crc


B = [pa.record_batch([pa.array(range(i * 10, i * 10 + 10), pa.int64())], schema=SCHEMA) for i in range(3)]
EMPTY = B[0].slice(0, 0)


def _stream(P: Protos, how: str) -> list[tuple[pa.RecordBatch, bytes]]:
    """What the hostile producer sends for partition 0 of its one task."""
    meta = bytes(P.BatchMetadata(partition=0).SerializeToString())
    sent = [(b, meta) for b in B]
    if how == "no trailer":
        return sent
    if how == "a batch lost":
        return sent[:2] + [(EMPTY, _trailer(P, 30, 3, _crc(B)))]
    if how == "a byte changed":
        changed = pa.record_batch([pa.array([7] + list(range(21, 30)), pa.int64())], schema=SCHEMA)
        return sent[:2] + [(changed, meta), (EMPTY, _trailer(P, 30, 3, _crc(B)))]
    if how == "another partition":
        return sent[:1] + [(B[1], bytes(P.BatchMetadata(partition=3).SerializeToString()))]
    raise AssertionError(how)


class _Producer(fl.FlightServerBase):
    def __init__(self, P: Protos, how: str) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.P, self.how = P, how

    def do_get(self, context: fl.ServerCallContext, ticket: fl.Ticket) -> fl.FlightDataStream:
        return fl.GeneratorStream(SCHEMA, iter(_stream(self.P, self.how)))


@pytest.fixture
def producer(P: Protos) -> Iterator[Callable[[str], str]]:
    servers: list[_Producer] = []

    def start(how: str) -> str:
        server = _Producer(P, how)
        servers.append(server)
        threading.Thread(target=server.serve, daemon=True).start()
        return f"grpc://127.0.0.1:{server.port}"

    yield start
    for s in servers:
        s.shutdown()


@pytest.mark.parametrize(
    "how, why",
    [
        ("no trailer", "the stream ended without the partition's trailer (ended short)"),
        ("a batch lost", "the producer sent 30 rows in 3 batches, 20 rows in 2 arrived"),
        ("a byte changed", "checksum"),
        ("another partition", "a message of partition 3 arrived before its trailer"),
    ],
)
def test_a_consumer_fails_unavailable_naming_a_producer_whose_stream_breaks_the_rule(
    P: Protos, client: fl.FlightClient, producer: Callable[[str], str], how: str, why: str
) -> None:
    url = producer(how)
    qid = f"raw-{uuid.uuid4().hex[:12]}"
    made = P.StageKey(query_id=qid, stage_id=1, task_number=0)
    read = P.ShuffleRead(
        stage_id=1,
        producers=[P.ProducerTask(url=url, stage_key=made.SerializeToString())],
        partition_start=0,
        partition_end=1,
        schema=SCHEMA.serialize().to_pybytes(),
    )
    key = P.StageKey(query_id=qid, stage_id=0, task_number=0)
    ex = Exchange(P, client, _header(P, key, P.Operator(shuffle_read=read)))
    try:
        assert ex.frame().WhichOneof("frame") == "ready"
        frame = _until(ex, ("error", "finished"))
        assert frame.WhichOneof("frame") == "error", f"the consumer finished with {frame.finished.rows_out} rows"
        error = frame.error
        assert error.code == P.enum("ErrorCode", "ERROR_CODE_UNAVAILABLE")
        assert error.worker_url == url
        assert why in error.message and "partition" in error.message and f"{qid}/1/0" in error.message
    finally:
        ex.writer.done_writing()
        ex.close()
    wait_until(lambda: info(P, client).running_tasks == 0, "the worker to free the failed consumer")


def test_a_head_stream_that_breaks_its_trailer_fails_the_query_at_once() -> None:
    """The coordinator's head read met a trailer that did not match: the query ends with the integrity error,
    naming the producer (before, the reading thread died and the query waited for its deadline: the chaos run)."""
    with flight.LocalCluster(1, extensions=["tests.worker.lying_trailer"]) as c:
        ex = flight.DistributedExec(flight.from_arrow(pa.table({"x": list(range(100))})), c.urls, deadline=120.0, retries=0)
        with pytest.raises(StreamIntegrityError) as raised:  # not QueryTimeoutError at the deadline
            ex.to_table()
        assert "the producer sent 101 rows in 1 batches, 100 rows in 1 arrived" in str(raised.value)
        assert raised.value.worker_url == c.urls[0]
