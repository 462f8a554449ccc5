"""WorkUnitFeed semantics: local on the coordinator, remote (id only) on a worker."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import flight
from flight._proto import plan_pb2
from flight.feed import unit_bytes


class Pages(flight.WorkUnitFeedProvider):
    def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[bytes]:
        yield f"page-{partition}".encode()


def test_local_feed_holds_its_provider() -> None:
    provider = Pages()
    feed = flight.WorkUnitFeed(provider, "pages")
    assert feed.is_local and feed.inner() is provider and feed.try_inner() is provider
    ctx = flight.FeedContext("q", "pages", 1, 2)
    assert list(feed.feed(1, ctx)) == [b"page-1"]


def test_proto_carries_only_the_id_and_rebuilds_a_remote_feed() -> None:
    msg = flight.WorkUnitFeed(Pages(), "pages").to_proto()
    assert isinstance(msg, plan_pb2.WorkUnitFeed)
    assert [f.name for f, _ in msg.ListFields()] == ["feed_id"]
    remote = flight.WorkUnitFeed.from_proto(plan_pb2.WorkUnitFeed.FromString(msg.SerializeToString()))
    assert not remote.is_local and remote.feed_id == "pages" and remote.try_inner() is None
    with pytest.raises(flight.FeedError, match="remote"):
        remote.inner()


def test_remote_feed_yields_what_its_task_received() -> None:
    class Inbox:
        def units(self, feed_id: str, partition: int) -> Iterator[bytes]:
            yield from (b"a", b"b") if (feed_id, partition) == ("pages", 0) else ()

    remote = flight.WorkUnitFeed.from_proto(plan_pb2.WorkUnitFeed(feed_id="pages"))
    assert list(remote.feed(0, Inbox())) == [b"a", b"b"]
    with pytest.raises(flight.FeedError):
        remote.feed(0, flight.FeedContext("q", "pages", 0, 1))


def test_units_are_bytes_protobuf_or_unit() -> None:
    unit = flight.file_unit("/data/x.parquet", [2])
    assert unit_bytes(unit) == unit.SerializeToString()
    assert unit_bytes(flight.Unit(b"raw", preferred_worker="grpc://h:1", rows=3)) == b"raw"
    assert unit_bytes(bytearray(b"ab")) == b"ab"
    with pytest.raises(TypeError, match="bytes or a protobuf"):
        unit_bytes({"path": "x"})  # type: ignore[arg-type]
    with pytest.raises(flight.FeedError):
        flight.WorkUnitFeed.from_proto(plan_pb2.WorkUnitFeed())


def test_local_cluster_stops_its_workers_after_an_exception() -> None:
    cluster = flight.LocalCluster(2)
    with pytest.raises(RuntimeError, match="boom"):
        with cluster:
            procs = list(cluster.processes)
            assert all(p.poll() is None for p in procs)
            raise RuntimeError("boom")
    assert all(p.returncode == 0 for p in procs), [p.returncode for p in procs]  # drained on SIGTERM, not killed
    assert cluster.processes == []
