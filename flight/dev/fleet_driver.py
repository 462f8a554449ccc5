"""The coordinator of a namespaced fleet: one SQL query run by ``DistributedExec``, reported line by line.

Why a process of its own: the fleet's coordinator must sit in its own network namespace (so
that its link can be cut, slowed or stalled like the workers'), while the test or benchmark
that drives it stays in the root namespace. ``Fleet.query`` starts this module there
(``python -m flight.dev.fleet_driver --spec FILE``) and reads what it prints; the two share
the filesystem, so the result comes back as an Arrow IPC file.

The spec is a JSON object: ``sql``, ``tables`` (name → list of Parquet paths), ``listed`` (name →
a directory read as a shared queue, a unit per row group: ``ListingProvider``), ``workers``
(URLs), ``options`` (``ExecOptions`` fields), ``dialect``, ``out`` (the IPC file, or null),
``info`` (after the query, ask every worker's ``info`` action) and ``settle_s`` (how long to
wait for the workers to report no tasks and no buffered bytes before printing what they say).

Stdout is one JSON object a line, flushed as it happens: ``{"event": "started", "query_id"}``
once the tasks are launched, ``{"event": "rows", "rows": total}`` per batch received, then
``done`` (``rows``, ``seconds``) or ``error`` (``type``, ``message``), then ``info``
(``workers``: one object per URL: ``running_tasks``, ``buffered_bytes``, ``draining``, or
``error``). Exit code 0 after ``done``, 1 after ``error``. ``DriverRun`` is the reading end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl
import pyarrow.parquet as pq

from flight.config import ExecOptions
from flight.coordinator.exec import DistributedExec
from flight.coordinator.resolver import StaticWorkerResolver
from flight.dev.netns import LineReader
from flight.plan.query import read_parquet
from flight.sources.providers import ListingProvider
from flight.sql import Catalog, sql
from flight.wire._proto import protocol_pb2

__all__ = ["DriverEvent", "DriverResult", "DriverRun", "main", "worker_info"]


def _emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def worker_info(url: str, timeout: float = 5.0) -> dict[str, Any]:
    """One worker's ``info`` action as plain values, or ``{"url", "error"}`` when it cannot be had in time."""
    try:
        with fl.connect(url) as client:
            result = next(iter(client.do_action(fl.Action("info", b""), options=fl.FlightCallOptions(timeout=timeout))))
        info = protocol_pb2.WorkerInfo.FromString(result.body.to_pybytes())
    except (pa.ArrowException, OSError, StopIteration) as exc:
        return {"url": url, "error": " ".join(str(exc).split())[:300]}
    load = info.load
    return {"url": url, "running_tasks": info.running_tasks, "buffered_bytes": info.buffered_bytes, "draining": info.draining,
            "queued_tasks": load.queued_tasks, "source_threads": f"{load.source_threads}/{load.source_threads_max}",
            "reserved_mb": f"{load.reserved_bytes >> 20}/{load.memory_budget >> 20}", "kept_outputs": load.kept_outputs}


def _settled_info(urls: list[str], settle_s: float) -> list[dict[str, Any]]:
    """Every worker's info, asked again (until ``settle_s``) while a reachable one still has tasks or bytes."""
    deadline = time.monotonic() + settle_s
    while True:
        infos = [worker_info(u, timeout=max(1.0, min(5.0, deadline - time.monotonic()))) for u in urls]
        busy = any(i.get("running_tasks") or i.get("buffered_bytes") for i in infos)
        if not busy or time.monotonic() >= deadline:
            return infos
        time.sleep(0.1)


def _run_query(spec: dict[str, Any]) -> bool:
    """Run the spec's query, printing its progress; True when it finished."""
    started = time.monotonic()
    rows = 0
    try:
        tables = {name: read_parquet([str(p) for p in paths]) for name, paths in spec["tables"].items()}
        for name, d in spec.get("listed", {}).items():
            schema = pq.read_schema(min(Path(d).glob("*.parquet")))  # a listing's files are found at run time
            tables[name] = read_parquet(ListingProvider(str(d), "*.parquet", split_row_groups=True), schema=schema)
        catalog = Catalog(tables)
        query = sql(spec["sql"], catalog, dialect=spec.get("dialect", "duckdb"))
        ex = DistributedExec(query, StaticWorkerResolver(spec["workers"]), ExecOptions(**spec.get("options", {})))
        reader = ex.execute()
        _emit("started", query_id=ex.query_id)
        with pa.ipc.new_file(spec.get("out") or os.devnull, reader.schema) as writer:
            for batch in reader:
                writer.write_batch(batch)
                rows += batch.num_rows
                _emit("rows", rows=rows)
    except Exception as exc:  # noqa: BLE001 - whatever ended the query is the report, and the exit code says so
        _emit("error", type=type(exc).__name__, message=str(exc), rows=rows)
        return False
    _emit("done", rows=rows, seconds=round(time.monotonic() - started, 3),
          attempts=[{"lost": list(a.lost), "within": a.replayed is not None, "task": a.task, "error": a.error[:300]} for a in ex.attempts],
          units=_units_per_worker(ex))
    return True


def _units_per_worker(ex: DistributedExec) -> dict[str, int]:
    """Work units each worker's tasks took (how a shared queue spread them)."""
    units: dict[str, int] = {}
    for task in ex.metrics.tasks if ex.metrics is not None else []:
        units[task.worker_url] = units.get(task.worker_url, 0) + sum(f.units for f in task.feeds)
    return units


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fleet_driver", description="run one SQL query on a fleet's workers, reporting as JSON lines")
    p.add_argument("--spec", required=True, type=Path, help="the query's JSON spec (see the module's doc)")
    args = p.parse_args(argv)
    spec = json.loads(args.spec.read_text())
    ok = _run_query(spec) if spec.get("sql") else True
    if spec.get("info"):
        _emit("info", workers=_settled_info(list(spec["workers"]), float(spec.get("settle_s", 10.0))))
    return 0 if ok else 1


@dataclass(frozen=True)
class DriverEvent:
    """One line the driver printed: ``kind`` (started, rows, done, error, info) and its fields."""

    kind: str
    data: dict[str, Any]

    @property
    def rows(self) -> int:
        return int(self.data.get("rows", 0))


@dataclass
class DriverResult:
    """How a driver run ended: the result table (when it finished), the error, the workers' info."""

    returncode: int
    table: pa.Table | None
    rows: int
    error: str | None
    infos: list[dict[str, Any]] = field(default_factory=list)
    stderr_tail: str = ""


class DriverRun:
    """The reading end of a running driver: its events as they come, then its result."""

    def __init__(self, proc: subprocess.Popen[str], out: Path | None, stderr_path: Path) -> None:
        assert proc.stdout is not None
        self.proc = proc
        self.out = out
        self.stderr_path = stderr_path
        self._lines = LineReader(proc.stdout, f"driver-{proc.pid}")
        self.seen: list[DriverEvent] = []

    def events(self, timeout: float = 120.0) -> Iterator[DriverEvent]:
        """Each event as it is printed, until the driver's output ends; TimeoutError past ``timeout`` in all."""
        deadline = time.monotonic() + timeout
        while True:
            line = self._lines.get(deadline - time.monotonic())
            if line is None:
                return
            try:
                data = json.loads(line)
            except ValueError:
                continue  # not ours: something else printed to stdout
            event = DriverEvent(str(data.pop("event", "")), data)
            self.seen.append(event)
            yield event

    def wait_for(self, kind: str, *, rows: int = 0, timeout: float = 120.0) -> DriverEvent | None:
        """The first event of ``kind`` (with at least ``rows`` rows), or None when the driver ended without one."""
        for event in self.events(timeout):
            if event.kind == kind and event.rows >= rows:
                return event
        return None

    def result(self, timeout: float = 300.0) -> DriverResult:
        """Wait for the driver to end (killing it past ``timeout``) and collect what it reported."""
        for _ in self.events(timeout):
            pass
        try:
            code = self.proc.wait(timeout=10.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        by_kind = {e.kind: e for e in self.seen}
        err = by_kind.get("error")
        done = by_kind.get("done")
        table = pa.ipc.open_file(str(self.out)).read_all() if done is not None and self.out is not None else None
        infos = by_kind["info"].data.get("workers", []) if "info" in by_kind else []
        message = f"{err.data.get('type')}: {err.data.get('message')}" if err is not None else None
        if err is None and done is None:
            message = f"the driver exited with code {code} without reporting (see its stderr)"
        tail = self.stderr_path.read_text(errors="replace")[-4000:] if self.stderr_path.exists() else ""
        return DriverResult(code, table, (done or err or DriverEvent("", {})).rows, message, infos, tail)


if __name__ == "__main__":
    sys.exit(main())
