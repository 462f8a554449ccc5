"""Many threads open and abandon task exchanges while heartbeats, units and credits are written.

Why: two operations of one kind on a gRPC call (two writes, two half-closes) abort the
whole process (GRPC_CALL_ERROR_TOO_MANY_OPERATIONS). benchmarks/micro/concurrency.py
aborted that way in 7 of 10 runs: a task given up while queued was sent a Cancel and
then half-closed from one thread while the reader thread, seeing the worker end the call,
half-closed it too (docs/protocol.md §9, "One writer"). This test drives ``TaskChannel``
through every way a channel ends, from many threads at once, against a real worker whose
admission is small enough that tasks queue, are refused and are given up while queued.

The stress runs in a child process (this file run as a script): an abort kills the child
(signal 6), not pytest, and the test fails naming it.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as fl
import pyarrow.parquet as pq
import pytest

ROUNDS = 20
THREADS = 16
ENDINGS = ("release", "abort", "finish", "abort_while_feeding", "bad_frame", "cancel_call", "finish_then_abort")


def _child(workdir: Path) -> int:
    import flight
    from flight.coordinator.channel import TaskChannel
    from flight.coordinator.headers import task_header
    from flight.sources.feed import file_unit
    from flight.wire._proto import protocol_pb2
    from flight.wire.plan_codec import encode_plan
    from flight.wire.protocol import new_secret

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: tests/ holds support.py
    from support import wait_until

    path = workdir / "rows.parquet"
    pq.write_table(pa.table({"x": list(range(2_000))}), path, row_group_size=100)
    plan = flight.read_parquet([str(path)]).stage_plan()
    feed_id = plan.root.feed_scan.feed.feed_id
    unit = protocol_pb2.WorkUnit(body=file_unit(str(path), [0]).SerializeToString())
    # Few slots and a short queue: tasks are queued, refused and abandoned while queued.
    with flight.LocalCluster(1, data_roots=[str(workdir)], worker_args=["--max-tasks", "4", "--queue-length", "6", "--queue-wait", "0.5"]) as cluster:
        url = cluster.urls[0]
        client = fl.connect(url)
        errors: list[str] = []
        rng = random.Random(7)
        seeds = [rng.random() for _ in range(THREADS)]

        def one(seed: float, n: int) -> None:
            r = random.Random(seed * 1000 + n)
            ending = ENDINGS[n % len(ENDINGS)]
            header = task_header(
                query_id=os.urandom(8).hex(), stage_id=0, task=0, task_count=1, plan=encode_plan(plan), url=url,
                secret=new_secret(), feeds={feed_id: [0]},
                options=protocol_pb2.TaskOptions(heartbeat_ms=50),
            )
            box: dict[str, TaskChannel] = {}

            def on_credit(channel: TaskChannel, fid: str, partition: int, credits: int) -> None:
                # Credits are answered on the reader thread, beside the heartbeat thread's writes.
                channel.send(protocol_pb2.CoordinatorFrame(units=protocol_pb2.WorkUnitBatch(feed_id=fid, partition=partition, units=[unit] * min(credits, 2))))

            channel = TaskChannel(url, header, on_credit=on_credit, heartbeat=0.01, peer_timeout=30.0)
            box["c"] = channel
            channel.open(client)
            # The ending lands anywhere: right away, once the worker accepted or queued the task, or later.
            moment = r.choice(("at once", "news", "finished"))
            if moment == "news":
                channel.ready.wait(r.random() * 0.05)  # accepted (or queued, or the moment passed)
            elif moment == "finished":
                channel.finished.wait(r.random() * 0.05)
            if ending == "release":
                channel.close()
            elif ending == "abort":
                channel.abort("the stress test gives up")
            elif ending == "finish":
                channel.finish()
            elif ending == "abort_while_feeding":
                feeder = threading.Thread(target=lambda: [channel.send(protocol_pb2.CoordinatorFrame(heartbeat=protocol_pb2.Heartbeat())) for _ in range(200)])
                feeder.start()
                channel.abort("given up while frames are written")
                feeder.join()
            elif ending == "bad_frame":
                # A protocol error: the worker ends the call on its own while our heartbeats are written.
                channel.send(protocol_pb2.CoordinatorFrame(units=protocol_pb2.WorkUnitBatch(feed_id="no-such-feed", partition=9, units=[unit])))
                channel.close()
            elif ending == "cancel_call":
                channel.cancel_call()
            else:
                channel.finish()
                channel.abort("after the end")
            channel.finish()
            if not channel.done.wait(15.0):
                errors.append(f"{ending}: the exchange did not end")

        def run(seed: float) -> None:
            for n in range(ROUNDS):
                try:
                    one(seed, n)
                except Exception as exc:  # noqa: BLE001 - a refusal or a broken call is fine; an abort is not
                    if "did not end" in str(exc):
                        errors.append(str(exc))

        threads = [threading.Thread(target=run, args=(s,)) for s in seeds]
        for t in threads:
            t.start()
        for t in threads:
            t.join(240)
        if any(t.is_alive() for t in threads):
            print("stress threads did not finish", file=sys.stderr)
            return 3
        def running() -> int:
            return protocol_pb2.WorkerInfo.FromString(next(iter(client.do_action(fl.Action("info", b"")))).body.to_pybytes()).running_tasks

        try:
            wait_until(lambda: running() == 0, 30.0, "the worker to free every task")
        except AssertionError:
            print(f"the worker still runs {running()} tasks", file=sys.stderr)
            return 4
        if errors:
            print("\n".join(errors[:10]), file=sys.stderr)
            return 5
    print(f"stress: {THREADS} threads x {ROUNDS} exchanges ended every way, no abort")
    return 0


@pytest.mark.slow
def test_abandoning_exchanges_from_many_threads_never_aborts_the_process(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, __file__, str(tmp_path)], capture_output=True, text=True, timeout=400, cwd=Path(__file__).resolve().parents[2]
    )
    if proc.returncode < 0:
        pytest.fail(f"the process died of {signal.Signals(-proc.returncode).name}:\n{proc.stderr[-3000:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "no abort" in proc.stdout


if __name__ == "__main__":
    sys.exit(_child(Path(sys.argv[1])))
