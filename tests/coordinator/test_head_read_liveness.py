"""The coordinator's DoGet reads of head tasks end when a worker freezes (SIGSTOP), rather than wait forever.

The task channel's heartbeats already tell the coordinator that the worker is lost; the head
task's DoGet stream is read on a thread of its own, which a frozen worker left blocked for the
process's life (gRPC has no keepalive here). The stream's watch (``flight.wire.stall``, bound
``ExecOptions.peer_timeout``) cancels that read: the query fails naming the worker, or recovers
without it, and no reader is left behind. Real worker processes; rows compared with an oracle.
"""

from __future__ import annotations

import signal
import threading
from collections import Counter
from collections.abc import Iterator

import pyarrow as pa
import pytest
from support import wait_until

import flight
from flight.dev.testing import SLEEP_SCHEMA, sleep_unit

UNITS = 150  # per partition, 20 ms each: the query is surely running when the worker freezes
ROWS = 3
HANG_S = 60.0  # a reader still there after this is a hang (never a measured time)


class Slow(flight.WorkUnitFeedProvider):
    def partitions(self) -> int | None:
        return 2

    def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[bytes]:
        for i in range(UNITS):
            yield sleep_unit(partition * 1000 + i, ms=20, rows=ROWS)


def expected_rows() -> Counter[tuple[int, int]]:
    return Counter((p * 1000 + i, r) for p in range(2) for i in range(UNITS) for r in range(ROWS))


def rows(batches: list[pa.RecordBatch]) -> Counter[tuple[int, int]]:
    table = pa.Table.from_batches(batches, schema=SLEEP_SCHEMA)
    return Counter(zip(table["id"].to_pylist(), table["row"].to_pylist()))


def head_readers() -> list[str]:
    """The coordinator's DoGet reader threads still running (``run.py`` names them ``doget-<task>``)."""
    return [t.name for t in threading.enumerate() if t.name.startswith("doget-")]


@pytest.mark.slow
@pytest.mark.parametrize("recover", [False, True], ids=["fails", "recovers"])
def test_a_head_read_of_a_frozen_worker_ends(recover: bool) -> None:
    with flight.LocalCluster(2, extensions=["flight.dev.testing"]) as cluster:
        victim, url = cluster.processes[1], cluster.urls[1]
        query = flight.from_feed(Slow(), "testing.sleep", SLEEP_SCHEMA)
        ex = flight.DistributedExec(
            query, cluster.urls, heartbeat=0.25, peer_timeout=1.5, unit_recovery=recover, retries=1 if recover else 0
        )
        reader = ex.execute()
        got = [reader.read_next_batch()]
        victim.send_signal(signal.SIGSTOP)
        try:
            if recover:
                got += list(reader)
                assert rows(got) == expected_rows(), "a row was added or lost"
                assert [a.lost for a in ex.attempts] == [(url,)]
            else:
                with pytest.raises(flight.RetryableError) as raised:
                    reader.read_all()
                assert raised.value.worker_url == url, raised.value
            wait_until(lambda: not head_readers(), HANG_S, "the coordinator's DoGet readers to end")
        finally:
            victim.send_signal(signal.SIGCONT)
