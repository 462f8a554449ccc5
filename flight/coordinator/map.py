"""Map stages: stream batches through a worker on one DoExchange.

The client sends the header in the descriptor, then its input batches; the
worker runs the stage over them and streams the output back on the same
exchange while input still flows. The client's half-close ends the input.
This is what ``flight.spark.flight_map`` calls from inside Spark tasks.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterable, Iterator

import pyarrow as pa
import pyarrow.flight as fl

from flight._proto import plan_pb2, protocol_pb2
from flight.coordinator.channel import error_from_frame, translate_flight_error
from flight.errors import PlanError, TaskFailedError, WorkerError
from flight.plan.nodes import ExchangeInputNode
from flight.plan.query import Query
from flight.protocol import PROTOCOL_VERSION, decode_worker_frame, make_stage_key

__all__ = ["map_batches"]


def map_batches(
    stage: Query | plan_pb2.StagePlan | bytes,
    batches: Iterable[pa.RecordBatch],
    worker_url: str,
    *,
    query_id: str | None = None,
    task_number: int = 0,
    connect_timeout: float = 10.0,
) -> Iterator[pa.RecordBatch]:
    """Run a map stage over ``batches`` on ``worker_url``; yields output batches as they come."""
    plan_bytes = _plan_bytes(stage)
    key = make_stage_key(query_id or uuid.uuid4().hex[:16], 0, task_number)
    header = protocol_pb2.TaskHeader(
        protocol_version=PROTOCOL_VERSION,
        stage_key=key,
        task_count=task_number + 1,
        plan=plan_bytes,
        target_worker_url=worker_url,
        query_start_unix_nanos=time.time_ns(),
    )
    label = f"{key.query_id}/0/{task_number}"
    try:
        client = fl.connect(worker_url)
        writer, reader = client.do_exchange(fl.FlightDescriptor.for_command(header.SerializeToString()))
    except (pa.ArrowException, OSError) as exc:
        raise translate_flight_error(exc, worker_url, label) from exc
    upload_error: list[BaseException] = []
    ready = threading.Event()
    enough = threading.Event()  # the stage finished (e.g. a limit): stop sending input

    def upload() -> None:
        # Input flows while output is read: Spark's iterator is consumed here, on its own thread.
        try:
            if not ready.wait(connect_timeout):
                return
            started = False
            for batch in batches:
                if enough.is_set():
                    break
                if not started:
                    writer.begin(batch.schema)
                    started = True
                writer.write_batch(batch)
            writer.done_writing()
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread below
            upload_error.append(exc)
            try:
                reader.cancel()
            except (pa.ArrowException, OSError):
                pass

    thread = threading.Thread(target=upload, name=f"map-upload-{label}", daemon=True)
    thread.start()
    finished = False
    try:
        while True:
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                break
            if chunk.app_metadata is not None and chunk.app_metadata.size:
                frame = decode_worker_frame(chunk.app_metadata)
                kind = frame.WhichOneof("frame")
                if kind == "ready":
                    ready.set()
                elif kind == "error":
                    raise error_from_frame(frame.error, worker_url, label)
                elif kind == "finished":
                    finished = True
                    enough.set()
            if chunk.data is not None and chunk.data.num_rows:
                yield chunk.data
        if upload_error:
            raise upload_error[0]
        if not finished:
            raise TaskFailedError("the worker ended the map stage before it finished", worker_url=worker_url, stage_key=label)
    except (pa.ArrowException, OSError) as exc:
        if upload_error:
            raise upload_error[0] from exc
        raise translate_flight_error(exc, worker_url, label) from exc
    except WorkerError:
        raise
    finally:
        ready.set()
        try:
            writer.close()
        except (pa.ArrowException, OSError):
            pass
        client.close()


def _plan_bytes(stage: Query | plan_pb2.StagePlan | bytes) -> bytes:
    if isinstance(stage, bytes):
        return stage
    if isinstance(stage, Query):
        if not any(isinstance(n, ExchangeInputNode) for n in stage.node.walk()):
            raise PlanError("map_batches needs a map stage: build it from flight.map_input(schema)")
        return stage.stage_plan().SerializeToString()
    return stage.SerializeToString()
