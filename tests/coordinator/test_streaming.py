"""Units stream into execution: results flow before discovery ends, under credit."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator

import pyarrow as pa
from support import wait_until

import flight
from flight.dev.testing import SLEEP_SCHEMA, sleep_unit

_pause = threading.Event()  # never set: wait() is a pause that needs no sleep


class SlowDiscovery(flight.WorkUnitFeedProvider):
    """Yields a unit every ``ms`` milliseconds; records how far it got."""

    def __init__(self, n: int, ms: float) -> None:
        self.n, self.ms = n, ms
        self.yielded = 0
        self.finished = threading.Event()
        self._pause = threading.Event()

    def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[bytes]:
        for i in range(partition, self.n, ctx.partitions):
            self._pause.wait(self.ms / 1000)
            self.yielded += 1
            yield sleep_unit(i, rows=2)
        if partition == ctx.partitions - 1:
            self.finished.set()


def test_first_results_arrive_before_the_provider_finishes(cluster: flight.LocalCluster) -> None:
    provider = SlowDiscovery(n=60, ms=25)
    reader = flight.DistributedExec(flight.from_feed(provider, "testing.sleep", SLEEP_SCHEMA), cluster.resolver()).execute()
    first = reader.read_next_batch()
    assert first.num_rows > 0
    assert not provider.finished.is_set(), "the first batch waited for the whole discovery"
    rest = reader.read_all()
    ids = sorted(set(first["id"].to_pylist()) | set(rest["id"].to_pylist()))
    assert ids == list(range(60))
    assert first.num_rows + rest.num_rows == 120


class AsyncPages(flight.WorkUnitFeedProvider):
    """An async generator provider, like a paginated API client."""

    def partitions(self) -> int | None:
        return 3

    async def feed(self, partition: int, ctx: flight.FeedContext) -> AsyncIterator[bytes]:
        for page in range(10):
            await asyncio.sleep(0.001)
            yield sleep_unit(partition * 100 + page)


def test_async_generator_provider_with_declared_partitions(cluster: flight.LocalCluster) -> None:
    ex = flight.DistributedExec(flight.from_feed(AsyncPages(), "testing.sleep", SLEEP_SCHEMA), cluster.resolver())
    assert ex.stage.task_count == 2  # 3 partitions, but only 2 workers
    got = ex.to_table()
    assert sorted(got["id"].to_pylist()) == sorted(p * 100 + i for p in range(3) for i in range(10))
    assert ex.metrics is not None and ex.metrics.units == 30


class FirstUnitStalls(flight.WorkUnitFeedProvider):
    """Unit 0 takes seconds on the worker; the rest are instant."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.yielded = 0

    def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[bytes]:
        for i in range(self.n):
            self.yielded += 1
            yield sleep_unit(i, ms=3000 if i == 0 else 0)


def test_credit_bounds_what_is_sent_and_discovered_ahead(cluster: flight.LocalCluster) -> None:
    """While a task is stuck, it holds at most its window and discovery stops a bounded step ahead."""
    provider = FirstUnitStalls(300)
    window, buffer = 4, 10
    ex = flight.DistributedExec(
        flight.from_feed(provider, "testing.sleep", SLEEP_SCHEMA), [cluster.urls[0]], feed_window=window, discovery_buffer=buffer
    )
    reader = ex.execute()
    bound = window + buffer + 1  # in the task, queued on the coordinator, and one held by the blocked put
    wait_until(lambda: provider.yielded == bound, timeout=2.5, what=f"discovery to reach its bound of {bound}")
    _pause.wait(0.3)
    assert provider.yielded == bound, "discovery ran past the credit window and its buffer"
    got = reader.read_all()
    assert sorted(got["id"].to_pylist()) == list(range(300))
    assert ex.metrics is not None
    stats = ex.metrics.tasks[0].feeds[0]
    assert stats.units == 300 and stats.received_to_processed_ms > 0


def test_empty_feed_gives_an_empty_result_with_the_schema(cluster: flight.LocalCluster) -> None:
    class Empty(flight.WorkUnitFeedProvider):
        def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[bytes]:
            return iter(())

    got = flight.DistributedExec(flight.from_feed(Empty(), "testing.sleep", SLEEP_SCHEMA), cluster.resolver()).to_table()
    assert got.num_rows == 0 and got.schema.equals(SLEEP_SCHEMA)


def test_units_reader_returns_every_unit_exactly_once(cluster: flight.LocalCluster) -> None:
    class Bodies(flight.WorkUnitFeedProvider):
        def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[bytes]:
            for i in range(partition, 5000, ctx.partitions):
                yield i.to_bytes(4, "big")

    got = flight.DistributedExec(flight.units(Bodies()), cluster.resolver()).to_table()
    assert got.schema == pa.schema([("unit", pa.binary())])
    assert sorted(int.from_bytes(b, "big") for b in got["unit"].to_pylist()) == list(range(5000))
