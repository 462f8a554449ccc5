"""WorkUnitFeed semantics: local on the coordinator, remote (id only) on a worker."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import flight
from flight.sources.feed import unit_bytes
from flight.wire._proto import plan_pb2


class Pages(flight.WorkUnitFeedProvider):
    def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[bytes]:
        yield f"page-{partition}".encode()


def test_local_feed_holds_its_provider() -> None:
    provider = Pages()
    feed = flight.WorkUnitFeed(provider, "pages")
    assert feed.inner() is provider
    ctx = flight.FeedContext("q", "pages", 1, 2)
    assert list(feed.feed(1, ctx)) == [b"page-1"]


def test_proto_carries_only_the_id() -> None:
    msg = flight.WorkUnitFeed(Pages(), "pages").to_proto()
    assert isinstance(msg, plan_pb2.WorkUnitFeed)
    assert [f.name for f, _ in msg.ListFields()] == ["feed_id"]
    assert msg.feed_id == "pages"


def test_units_are_bytes_protobuf_or_unit() -> None:
    unit = flight.file_unit("/data/x.parquet", [2])
    assert unit_bytes(unit) == unit.SerializeToString()
    assert unit_bytes(flight.Unit(b"raw", preferred_worker="grpc://h:1", rows=3)) == b"raw"
    assert unit_bytes(bytearray(b"ab")) == b"ab"
    with pytest.raises(TypeError, match="bytes or a protobuf"):
        unit_bytes({"path": "x"})  # type: ignore[arg-type]


def test_local_cluster_stops_its_workers_after_an_exception() -> None:
    cluster = flight.LocalCluster(2)
    with pytest.raises(RuntimeError, match="boom"):
        with cluster:
            procs = list(cluster.processes)
            assert all(p.poll() is None for p in procs)
            raise RuntimeError("boom")
    assert all(p.returncode == 0 for p in procs), [p.returncode for p in procs]  # drained on SIGTERM, not killed
    assert cluster.processes == []
