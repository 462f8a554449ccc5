"""A worker's ``TaskMetrics.notes`` (what its engine decided, shown by explain()) are a peer's words: the coordinator
keeps few of them, each short, however many and however long a worker sends."""

from __future__ import annotations

from flight.coordinator.metrics import TaskStats
from flight.wire._proto import protocol_pb2


def test_a_workers_notes_are_clamped_in_count_and_length() -> None:
    m = protocol_pb2.TaskMetrics(worker_url="grpc://w:1", notes=["x" * 100_000] * 1_000)
    stats = TaskStats.from_proto(protocol_pb2.TaskMetrics.FromString(m.SerializeToString()), "grpc://w:1")
    assert len(stats.notes) == 16
    assert all(n.startswith("x" * 300) and "more characters" in n and len(n) < 340 for n in stats.notes)  # clipped, saying so


def test_a_worker_without_notes_gives_none() -> None:
    assert TaskStats.from_proto(protocol_pb2.TaskMetrics(), "grpc://w:1").notes == ()
