"""A Flight SQL client that leaves ends its query's work: ADBC's cancel, a closed connection, a killed client.

The real ADBC driver runs a statement that would compute for minutes (a join of lineitem with
itself on a column of 7 values: 5·10^10 pairs) through ``flight-coordinator``, with direct
endpoints (the client reads the head task at its worker) and relayed ones (it reads through the
service). Once the workers run its tasks, the client cancels its call (``adbc_cancel``), closes
its connection while it waits for rows, or is killed; then every worker must count no running
task, well before the statement could have ended on its own. The timings are measured by
``benchmarks/micro/cancel.py``; here the bound only separates "stopped" from "ran on".
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from adbc_driver_flightsql import dbapi
from support import running_tasks, tpch_test_files, wait_until

import flight
from benchmarks.tpch_queries import TABLES
from tests.service.test_flightsql import start_service, stop_service

SLOW = "select count(*) as n from lineitem a join lineitem b on a.l_linenumber = b.l_linenumber"
STOPPED_WITHIN = 10.0
"""Seconds the workers have to be back to no task: far below the statement's own minutes."""


@pytest.fixture(scope="module")
def services(cluster: flight.LocalCluster) -> Iterator[dict[str, str]]:
    files = tpch_test_files(0.1)
    tables = [a for t in TABLES for a in ("--table", f"{t}={files[t][0].parent}")]
    workers = ",".join(cluster.urls)
    direct, direct_url = start_service("--workers", workers, *tables)
    relay, relay_url = start_service("--workers", workers, "--endpoints", "relay", *tables)
    try:
        yield {"direct": direct_url, "relay": relay_url}
    finally:
        assert [stop_service(direct), stop_service(relay)] == [0, 0]


def _running(cluster: flight.LocalCluster) -> None:
    wait_until(lambda: running_tasks(cluster.urls) > 0, 30.0, "the statement's tasks to run")


def _stopped(cluster: flight.LocalCluster, what: str) -> None:
    wait_until(lambda: running_tasks(cluster.urls) == 0, STOPPED_WITHIN, f"the workers to end the tasks of a statement whose {what}")


@pytest.mark.parametrize("kind", ["direct", "relay"])
def test_adbc_cancel_while_fetching_ends_the_tasks_on_every_worker(kind: str, services: dict[str, str], cluster: flight.LocalCluster) -> None:
    outcome: list[BaseException | None] = []
    with dbapi.connect(services[kind], autocommit=True) as conn, conn.cursor() as cur:
        def fetch() -> None:
            try:
                cur.execute(SLOW)
                cur.fetch_arrow_table()
                outcome.append(None)
            except BaseException as exc:  # noqa: BLE001 - the test reads it
                outcome.append(exc)

        reader = threading.Thread(target=fetch, daemon=True)
        reader.start()
        _running(cluster)
        time.sleep(0.5)  # the client now waits in its DoGet (or GetFlightInfo) for the count
        cur.adbc_cancel()
        reader.join(STOPPED_WITHIN)
        assert outcome and isinstance(outcome[0], dbapi.Error), outcome
        _stopped(cluster, "client cancelled")


@pytest.mark.parametrize("kind", ["direct", "relay"])
def test_closing_the_connection_mid_result_ends_the_tasks(kind: str, services: dict[str, str], cluster: flight.LocalCluster) -> None:
    conn = dbapi.connect(services[kind], autocommit=True)
    cur = conn.cursor()
    cur.execute(SLOW)
    reader = threading.Thread(target=lambda: _swallow(cur.fetch_arrow_table), daemon=True)
    reader.start()
    _running(cluster)
    time.sleep(0.5)
    cur.adbc_cancel()  # the DB-API cannot close a connection with a call in flight: end it, then close
    reader.join(STOPPED_WITHIN)
    cur.close()
    conn.close()
    _stopped(cluster, "client closed its connection")


CLIENT = """
import sys
import adbc_driver_flightsql.dbapi as dbapi
with dbapi.connect(sys.argv[1], autocommit=True) as conn, conn.cursor() as cur:
    cur.execute(sys.argv[2])
    print("executing", flush=True)
    cur.fetch_arrow_table()
"""


@pytest.mark.parametrize("kind", ["direct", "relay"])
def test_a_killed_client_takes_its_statement_with_it(kind: str, services: dict[str, str], cluster: flight.LocalCluster, tmp_path: Path) -> None:
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    proc = subprocess.Popen([sys.executable, str(script), services[kind], SLOW], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "executing"
        _running(cluster)
        time.sleep(0.5)
        proc.kill()  # SIGKILL: the kernel closes its sockets, gRPC sees the calls end
        proc.wait(10)
        _stopped(cluster, "client was killed")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def _swallow(fn: object) -> None:
    try:
        fn()  # type: ignore[operator]
    except Exception:  # noqa: BLE001 - the call is cancelled: its error is expected
        pass
