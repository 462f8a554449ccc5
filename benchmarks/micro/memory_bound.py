"""A worker's resident memory against its ``--memory-limit`` while clients do their worst (issue 41).

One worker, ``--memory-limit`` (default 1 GiB), and a hostile client doing one thing at a time:

* ``unread``: 8 queries over TPC-H lineitem (SF 0.5, ~310 MB of Arrow data each) started
  detached, their head outputs never read: each head task fills its output buffer and waits;
* ``many``: 48 such queries at once, never read;
* ``retained``: 8 queries whose head outputs are kept for re-reads (``retain``), never read: they
  spill past their bounds;
* ``flood``: 8 map stages each sent 400 MB of input batches as fast as the worker takes them, their
  output never read.

For each case: the worker's peak RSS (``VmHWM``, reset before the case) and its own accounting
(``info``: the bytes admitted tasks reserved, its output buffers and kept outputs within them; the
engine's own memory, up to ``--memory-limit``, is not in it), then the queries cancelled and the worker
checked back to no task. The last lines: ``memory_<case>_peak_mb: X`` (RSS) beside
``memory_<case>_accounted_mb: Y``, and ``memory_over_limit_mb: Z``, the worst peak past the limit.

    python -m benchmarks.micro.memory_bound [--limit-mb 1024] [--hold 8]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as fl

import flight
from benchmarks.tpch import ensure_tpch
from flight.coordinator.map import map_batches
from flight.plan.query import map_input
from flight.wire._proto import protocol_pb2


def info(url: str) -> protocol_pb2.WorkerInfo:
    with fl.connect(url) as c:
        body = next(iter(c.do_action(fl.Action("info", b"")))).body.to_pybytes()
    return protocol_pb2.WorkerInfo.FromString(body)


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def wait(predicate: Callable[[], bool], timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def scan(files: list[str]) -> flight.Query:
    return flight.read_parquet(files).select("l_orderkey", "l_partkey", "l_comment", "l_extendedprice", "l_shipdate")


def upload(total: int) -> Iterator[pa.RecordBatch]:
    batch = pa.record_batch({"k": pa.array(range(65536), pa.int64()), "s": pa.array(["x" * 48] * 65536)})
    for _ in range(max(1, total // batch.nbytes)):
        yield batch


def case(name: str, url: str, pid: int, files: list[str], hold: float) -> tuple[float, float]:
    """(peak RSS MB, the worker's reserved + buffered MB at the peak's moment) of one hostile case."""
    reset_peak(pid)
    queries: list[flight.DetachedQuery] = []
    threads: list[threading.Thread] = []
    stop = threading.Event()
    if name in ("unread", "many", "retained"):
        count = 48 if name == "many" else 8
        for _ in range(count):
            ex = flight.DistributedExec(scan(files), [url], small_query_bytes=0, admission_wait=5.0)
            try:
                queries.append(ex.start_detached(600 if name == "retained" else 0))
            except flight.FlightExecError as exc:  # past the worker's capacity: refused, as it should
                print(f"[memory] {name}: a query was refused: {str(exc)[:120]}", file=sys.stderr)
    else:
        def flood() -> None:
            try:
                stage = map_input(pa.schema([("k", pa.int64()), ("s", pa.string())]))
                for _ in map_batches(stage, upload(400 << 20), url):
                    stop.wait()  # the output is never read
                    return
            except Exception as exc:  # noqa: BLE001 - cancelled at the end
                print(f"[memory] flood ended: {str(exc)[:120]}", file=sys.stderr)
        threads = [threading.Thread(target=flood, daemon=True) for _ in range(8)]
        for t in threads:
            t.start()
    peak_accounted = 0.0
    end = time.monotonic() + hold
    while time.monotonic() < end:
        i = info(url)
        peak_accounted = max(peak_accounted, i.load.reserved_bytes / 1e6)  # output buffers and kept bytes are within it
        time.sleep(0.2)
    peak = status_kib(pid, "VmHWM") / 1024
    for q in queries:
        q.close()
    stop.set()
    for t in threads:
        t.join(30)
    wait(lambda: info(url).running_tasks == 0, 60)
    return peak, peak_accounted


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--limit-mb", type=int, default=1024)
    p.add_argument("--hold", type=float, default=8.0, help="seconds each case holds the worker")
    p.add_argument("--sf", type=float, default=0.5)
    p.add_argument("--cases", default="unread,many,retained,flood")
    p.add_argument("--worker-arg", action="append", default=[], help="another flag for the worker (repeatable)")
    args = p.parse_args(argv)
    data_dir = ensure_tpch(args.sf, ("lineitem",))
    files = sorted(str(f) for f in Path(data_dir, "lineitem").glob("*.parquet"))
    worst = 0.0
    lines = []
    with flight.LocalCluster(1, data_roots=[data_dir], worker_args=["--memory-limit", f"{args.limit_mb}MB", *args.worker_arg]) as cluster:
        url = cluster.urls[0]
        pid = cluster.processes[0].pid
        idle = status_kib(pid, "VmRSS") / 1024
        print(f"worker idle RSS {idle:.0f} MB, --memory-limit {args.limit_mb} MB", file=sys.stderr)
        for name in args.cases.split(","):
            peak, accounted = case(name, url, pid, files, args.hold)
            worst = max(worst, peak - args.limit_mb)
            print(f"[memory] {name}: peak RSS {peak:.0f} MB, accounted {accounted:.0f} MB", file=sys.stderr, flush=True)
            lines += [f"memory_{name}_peak_mb: {peak:.0f}", f"memory_{name}_accounted_mb: {accounted:.0f}"]
    print(f"memory_idle_mb: {idle:.0f}")
    for line in lines:
        print(line)
    print(f"memory_over_limit_mb: {worst:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
