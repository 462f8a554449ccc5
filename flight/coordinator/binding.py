"""What one task of an attempt is sent: its stage's plan bound to the producer tasks it reads, and its header.

Why apart from ``run.py``: binding is a pure function of the plan, the attempt's
query id and the URLs its tasks were bound to; ``Run`` owns the I/O (channels,
feeds, results) and calls this once per task, again after each admission retry
(a new query id).
"""

from __future__ import annotations

from collections.abc import Mapping

from flight.config import ExecOptions
from flight.coordinator.headers import task_header
from flight.planner.stages import StageSpec
from flight.wire._proto import plan_pb2, protocol_pb2
from flight.wire.operators import operators
from flight.wire.plan_codec import encode_plan
from flight.wire.protocol import COMPRESSION, encode_schema, make_stage_key

__all__ = ["Epochs", "bound_header", "task_plan"]


Epochs = Mapping[tuple[int, int], int]
"""(stage id, task) -> the epoch of the task's current run (absent: 0, the first); ``rerun.py``."""


def task_plan(
    stage: StageSpec, task: int, counts: dict[int, int], query_id: str, bound: dict[int, list[str]], epochs: Epochs | None = None
) -> bytes:
    """The stage's operators for one task: its reads bound to the producers' URLs and keys
    (each producer's current run: ``epochs``).

    Bound in a copy of the stage's plan, never in the shared plan nodes: one
    ``DistributedExec`` may run several executions at once.
    """
    plan = plan_pb2.StagePlan(
        output=stage.output_spec([counts[c] for c in stage.consumers] or [1]),
        output_schema=encode_schema(stage.output_schema),
    )
    plan.root.CopyFrom(stage.root_proto(task))  # not root=...: protobuf would copy a deep tree by parsing it again
    modes = {read.stage_id: read.mode for read in stage.reads}
    for op in operators(plan.root):
        if op.WhichOneof("kind") != "shuffle_read":
            continue
        read = op.shuffle_read  # the plan's own message: bound in place
        del read.producers[:]
        read.producers.extend(
            plan_pb2.ProducerTask(
                url=url, stage_key=make_stage_key(query_id, read.stage_id, t, (epochs or {}).get((read.stage_id, t), 0)).SerializeToString()
            )
            for t, url in enumerate(bound[read.stage_id])
        )
        read.partition_start = task if modes.get(read.stage_id) == "hash" else 0
        read.partition_end = read.partition_start + 1
    return encode_plan(plan)


def bound_header(
    stage: StageSpec,
    task: int,
    counts: dict[int, int],
    assigned: dict[str, list[int]],
    *,
    query_id: str,
    secret: bytes,
    bound: dict[int, list[str]],
    options: ExecOptions,
    retain: bool,
    tagged: bool,
    recoverable: bool = False,
    epochs: Epochs | None = None,
) -> protocol_pb2.TaskHeader:
    """Task ``task`` of ``stage``'s header: its bound plan, its feed partitions, and the attempt's options.

    ``retain``: a detached query's head outputs are kept for any number of reads (a stage read by
    several consumers always is: a consumer that reads late, e.g. a join's probe side waiting for its
    build side, must not hold the producer and through it the other consumers);
    ``tagged``: the tasks tag their rows with their work unit (``replay.py``);
    ``recoverable``: every stage below the head keeps its outputs until the query ends, so that
    a task run again after a lost worker can read them again (``rerun.py``); ``epochs``: which run
    of each task this is bound to.
    """
    epoch = (epochs or {}).get((stage.stage_id, task), 0)
    header = task_header(
        query_id=query_id,
        stage_id=stage.stage_id,
        task=task,
        task_count=counts[stage.stage_id],
        plan=task_plan(stage, task, counts, query_id, bound, epochs),
        url=bound[stage.stage_id][task],
        secret=secret,
        feeds=assigned,
        shared_windows={f.feed.feed_id: options.shared_window for f in stage.shared_feeds},
        options=protocol_pb2.TaskOptions(
            ipc_compression=COMPRESSION[options.compression],
            feed_window=options.feed_window,
            output_buffer_bytes=options.output_buffer_bytes,
            heartbeat_ms=int(options.heartbeat * 1000),
            retain_output=(retain and stage.consumer is None) or stage.shared or (recoverable and stage.consumer is not None),
            tag_units=tagged,
            whole_query=len(counts) == 1 and counts[stage.stage_id] == 1,
            no_checksum=not options.stream_checksums,
            head=stage.consumer is None and not stage.shared,
        ),
    )
    header.stage_key.epoch = epoch
    return header
