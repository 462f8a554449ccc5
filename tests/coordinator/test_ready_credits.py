"""A task's Ready frame carries each feed partition's first credit window (protocol 12): the coordinator's
channel hands them to its credit handler as it does FeedCredit frames, after the ready handler. No sockets:
the frames are handed to the channel's frame handler as its reader thread would."""

from __future__ import annotations

import pyarrow as pa

from flight.coordinator.channel import TaskChannel
from flight.wire._proto import protocol_pb2
from flight.wire.limits import MAX_FEED_WINDOW
from flight.wire.protocol import encode_schema


def test_ready_credits_reach_the_credit_handler_after_ready_and_credit_frames_add_to_them() -> None:
    calls: list[tuple[str, ...]] = []
    channel = TaskChannel(
        "grpc://127.0.0.1:1",
        protocol_pb2.TaskHeader(stage_key=protocol_pb2.StageKey(query_id="q", stage_id=0, task_number=0),
                                feeds=[protocol_pb2.FeedAssignment(feed_id="files", partitions=[0, 1])]),
        on_ready=lambda ch: calls.append(("ready", ch.key)),
        on_credit=lambda ch, feed, partition, credits: calls.append(("credit", feed, str(partition), str(credits))),
    )
    credits = [protocol_pb2.FeedCredit(feed_id="files", partition=p, credits=w) for p, w in ((0, 256), (1, 2))]
    ready = protocol_pb2.Ready(worker_url="grpc://127.0.0.1:1", output_schema=encode_schema(pa.schema([("x", pa.int64())])), credits=credits)
    channel._handle(protocol_pb2.WorkerFrame(ready=ready))
    channel._handle(protocol_pb2.WorkerFrame(credit=protocol_pb2.FeedCredit(feed_id="files", partition=0, credits=128)))
    assert calls == [("ready", channel.key), ("credit", "files", "0", "256"), ("credit", "files", "1", "2"), ("credit", "files", "0", "128")]
    assert channel.ready.is_set() and channel.output_schema == pa.schema([("x", pa.int64())])


def test_a_detached_channel_drops_ready_credits() -> None:
    got: list[int] = []
    header = protocol_pb2.TaskHeader(feeds=[protocol_pb2.FeedAssignment(feed_id="f", partitions=[0])])
    channel = TaskChannel("grpc://127.0.0.1:1", header, on_credit=lambda ch, f, p, n: got.append(n))
    channel.detach()
    channel._handle(protocol_pb2.WorkerFrame(ready=protocol_pb2.Ready(
        output_schema=encode_schema(pa.schema([])), credits=[protocol_pb2.FeedCredit(feed_id="f", partition=0, credits=4)])))
    assert got == []


def test_a_hostile_readys_credits_are_kept_to_the_assigned_partitions_once_each_and_clamped() -> None:
    got: list[tuple[str, int, int]] = []
    header = protocol_pb2.TaskHeader(feeds=[protocol_pb2.FeedAssignment(feed_id="f", partitions=[0, 1])])
    channel = TaskChannel("grpc://127.0.0.1:1", header, on_credit=lambda ch, f, p, n: got.append((f, p, n)))
    hostile = [("f", 0, 4_000_000_000), ("f", 0, 7), ("f", 9, 5), ("other", 0, 5), ("f", 1, 3)] + [("x", i, 1) for i in range(10_000)]
    credits = [protocol_pb2.FeedCredit(feed_id=f, partition=p, credits=n) for f, p, n in hostile]
    channel._handle(protocol_pb2.WorkerFrame(ready=protocol_pb2.Ready(output_schema=encode_schema(pa.schema([])), credits=credits)))
    assert got == [("f", 0, MAX_FEED_WINDOW), ("f", 1, 3)]  # the first of each assigned partition, at most the largest window
