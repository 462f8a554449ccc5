"""The chaos run's client: one process in the fleet's coordinator namespace that runs the queries it is sent.

Why a long-lived process: a query needs the coordinator's namespace (its link is cut and slowed like
the workers'), and starting ``flight.dev.fleet_driver`` per query costs seconds of imports on a small
machine. This process plans and runs queries on a pool of threads, each query either way a user can:

* ``api``: ``flight.sql`` planned here, run by ``DistributedExec`` on the fleet's workers
  (``ExecOptions`` as the request says, ``deadline`` the hang bound);
* ``sql``: sent to a ``flight-coordinator`` (the Flight SQL service) through the ADBC Flight SQL
  driver, one connection per thread and service, made again after an error.

Its spec (``--spec FILE``, JSON): ``workers`` (URLs), ``suites`` (name → ``files``: table → Parquet
paths, ``texts``: query number → SQL), ``services`` (suite → the service's URL), ``threads`` and
``deadline`` (seconds). Stdin: one request a line, ``{"id", "via", "suite", "n", "options", "out"}``;
the result goes to ``out`` (an Arrow IPC file). Stdout: one line per request as it ends,
``{"id", "ok": true, "rows", "seconds", "attempts"}`` or ``{"id", "ok": false, "type", "code",
"message", "seconds"}``. The end of stdin ends the process once the queries in flight are done.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa

__all__ = ["main"]


class Client:
    """Runs requests on ``threads`` threads and prints each outcome as a JSON line."""

    def __init__(self, spec: dict[str, Any]) -> None:
        from flight.plan.query import read_parquet
        from flight.sql import Catalog

        self.spec = spec
        self.deadline = float(spec.get("deadline", 120.0))
        self.catalogs = {name: Catalog({t: read_parquet([str(p) for p in paths]) for t, paths in suite["files"].items()})
                         for name, suite in spec["suites"].items()}
        self.texts = {name: {int(n): text for n, text in suite["texts"].items()} for name, suite in spec["suites"].items()}
        self._out = threading.Lock()
        self._local = threading.local()

    def run(self, request: dict[str, Any]) -> None:
        started = time.monotonic()
        reply: dict[str, Any]
        try:
            table, attempts = self._sql(request) if request["via"] == "sql" else self._api(request)
            with pa.ipc.new_file(request["out"], table.schema) as writer:
                writer.write_table(table)
            reply = {"ok": True, "rows": table.num_rows, "attempts": attempts}
        except Exception as exc:  # noqa: BLE001 - every failure is the report: its type, code and message
            if request["via"] == "sql":
                self._drop_connection(request["suite"])
            code = getattr(exc, "status_code", None)
            reply = {"ok": False, "type": type(exc).__name__, "code": getattr(code, "name", None) if code is not None else None,
                     "message": str(exc)}
        self._emit({"id": request["id"], "seconds": round(time.monotonic() - started, 3), **reply})

    def _api(self, request: dict[str, Any]) -> tuple[pa.Table, int]:
        from flight.config import ExecOptions
        from flight.coordinator.exec import DistributedExec
        from flight.coordinator.resolver import StaticWorkerResolver
        from flight.sql import sql

        query = sql(self.texts[request["suite"]][request["n"]], self.catalogs[request["suite"]])
        options = ExecOptions(**{"deadline": self.deadline, **request.get("options", {})})
        ex = DistributedExec(query, StaticWorkerResolver(self.spec["workers"]), options)
        table = ex.to_table()
        return table, len(ex.attempts)

    def _sql(self, request: dict[str, Any]) -> tuple[pa.Table, int]:
        suite = request["suite"]
        conn = self._connection(suite)
        with conn.cursor() as cur:
            cur.execute(self.texts[suite][request["n"]])
            return cur.fetch_arrow_table(), 0

    def _connection(self, suite: str) -> Any:
        from adbc_driver_flightsql import dbapi

        conns: dict[str, Any] = self._local.__dict__.setdefault("conns", {})
        if suite not in conns:
            conns[suite] = dbapi.connect(self.spec["services"][suite], autocommit=True)
        return conns[suite]

    def _drop_connection(self, suite: str) -> None:
        conn = self._local.__dict__.get("conns", {}).pop(suite, None)
        if conn is not None:
            try:
                conn.close()
            except Exception as exc:  # noqa: BLE001 - a broken connection may fail to close; it is dropped all the same
                print(f"chaos client: closing a connection after an error: {exc}", file=sys.stderr)

    def _emit(self, reply: dict[str, Any]) -> None:
        with self._out:
            print(json.dumps(reply), flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.chaos.client", description="run the chaos run's queries, one JSON line each")
    p.add_argument("--spec", required=True, type=Path)
    args = p.parse_args(argv)
    spec = json.loads(args.spec.read_text())
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the harness asks for the stacks of a query past its deadline
    client = Client(spec)
    print(json.dumps({"ready": True}), flush=True)
    with ThreadPoolExecutor(int(spec.get("threads", 4)), thread_name_prefix="chaos-query") as pool:
        for line in sys.stdin:
            if line.strip():
                pool.submit(client.run, json.loads(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
