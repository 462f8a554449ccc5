"""The one place a ``TaskHeader`` is built: by ``DistributedExec``, ``map_batches`` and the Spark paths.

Why one place: the header is what a worker checks first (protocol version, stage
key, secret, feed assignments, options), and three callers building their own
drifted apart (one left out the heartbeat, one the secret's length). Each caller
says what differs — the task, its plan, its feeds, its options — and this fills
in the rest the same way.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from flight.wire._proto import protocol_pb2
from flight.wire.protocol import PROTOCOL_VERSION, make_stage_key

__all__ = ["task_header"]


def task_header(
    *,
    query_id: str,
    stage_id: int,
    task: int,
    task_count: int,
    plan: bytes,
    url: str,
    secret: bytes,
    feeds: Mapping[str, Sequence[int]] | None = None,
    shared_windows: Mapping[str, int] | None = None,
    options: protocol_pb2.TaskOptions | None = None,
) -> protocol_pb2.TaskHeader:
    """The header of task ``task`` of stage ``stage_id`` of query ``query_id``, bound for ``url``.

    ``feeds`` maps a feed id to the task's partitions of it; ``shared_windows`` gives a
    shared-queue feed's credit window (0 or absent: the worker's default).
    """
    windows = shared_windows or {}
    return protocol_pb2.TaskHeader(
        protocol_version=PROTOCOL_VERSION,
        stage_key=make_stage_key(query_id, stage_id, task),
        task_count=task_count,
        plan=plan,
        feeds=[
            protocol_pb2.FeedAssignment(feed_id=f, partitions=list(p), window=windows.get(f, 0))
            for f, p in (feeds or {}).items()
        ],
        target_worker_url=url,
        query_start_unix_nanos=time.time_ns(),
        query_secret=secret,
        options=options or protocol_pb2.TaskOptions(),
    )
