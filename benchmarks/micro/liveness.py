"""Liveness with default settings: how long a silent or frozen peer can hold anything.

Three measurements on real processes, each with the shipped defaults (heartbeat 2 s,
peer timeout 10 s on both sides):

* ``frozen_coordinator_freed_s``: a coordinator process runs a query whose tasks
  wait for units, then is frozen with SIGSTOP; seconds until the worker reports
  no running task.
* ``silent_worker_detected_s``: a worker running a query's task is frozen with
  SIGSTOP; seconds until the coordinator's query fails naming it.
* ``sigterm_silent_client_exit_s``: a client opens an exchange and then neither
  sends nor reads; seconds from SIGTERM to the worker's exit (``--grace 2``),
  and its exit code.

    python -m benchmarks.micro.liveness
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as fl

if __name__ == "__main__" and not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import flight
from flight.dev.testing import waiting_query
from flight.wire._proto import protocol_pb2
from flight.wire.plan_codec import encode_plan
from flight.wire.protocol import PROTOCOL_VERSION, make_stage_key


def _running(url: str) -> int:
    with fl.connect(url) as client:
        body = next(iter(client.do_action("info"))).body.to_pybytes()
    return protocol_pb2.WorkerInfo.FromString(body).running_tasks


def _wait(predicate: Callable[[], bool], timeout: float) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"no change within {timeout}s")
        time.sleep(0.05)
    return time.monotonic() - start


def frozen_coordinator() -> float:
    with flight.LocalCluster(1) as one:
        proc = subprocess.Popen([sys.executable, "-m", "flight.dev.testing", one.urls[0]], stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
            _wait(lambda: _running(one.urls[0]) == 1, 10)
            os.kill(proc.pid, signal.SIGSTOP)
            return _wait(lambda: _running(one.urls[0]) == 0, 60)
        finally:
            proc.kill()
            os.kill(proc.pid, signal.SIGCONT)
            proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()


def silent_worker() -> float:
    waiting = waiting_query()
    with flight.LocalCluster(1) as one:
        pid = one.processes[0].pid
        reader = flight.DistributedExec(waiting, one.urls).execute()
        _wait(lambda: _running(one.urls[0]) == 1, 10)
        os.kill(pid, signal.SIGSTOP)
        start = time.monotonic()
        try:
            reader.read_all()
        except flight.WorkerUnavailableError as exc:
            print(f"[liveness] the query failed with: {exc}", file=sys.stderr)
        finally:
            os.kill(pid, signal.SIGCONT)
        return time.monotonic() - start


def sigterm_silent_client() -> tuple[float, int]:
    one = flight.LocalCluster(1, grace=2.0).start()
    try:
        stage = flight.map_input(pa.schema([("a", pa.int64())])).stage_plan()
        header = protocol_pb2.TaskHeader(
            protocol_version=PROTOCOL_VERSION,
            stage_key=make_stage_key("liveness", 0, 0),
            task_count=1,
            plan=encode_plan(stage),
            query_secret=b"liveness-secret!",
        )
        client = fl.connect(one.urls[0])
        _writer, _reader = client.do_exchange(fl.FlightDescriptor.for_command(header.SerializeToString()))
        _wait(lambda: _running(one.urls[0]) == 1, 10)
        proc = one.processes[0]
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
        return time.monotonic() - start, code
    finally:
        one.stop()


def main() -> None:
    freed = frozen_coordinator()
    print(f"[liveness] frozen coordinator: its task was freed after {freed:.1f}s", file=sys.stderr)
    detected = silent_worker()
    print(f"[liveness] silent worker: the query failed after {detected:.1f}s", file=sys.stderr)
    exited, code = sigterm_silent_client()
    print(f"[liveness] SIGTERM with a silent client (--grace 2): exit {code} after {exited:.1f}s", file=sys.stderr)
    print(f"frozen_coordinator_freed_s: {freed:.1f}")
    print(f"silent_worker_detected_s: {detected:.1f}")
    print(f"sigterm_silent_client_exit_s: {exited:.1f}")
    sys.exit(0 if code == 0 else 1)


if __name__ == "__main__":
    main()
