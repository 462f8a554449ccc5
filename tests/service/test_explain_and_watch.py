"""``EXPLAIN``, ``EXPLAIN ANALYZE`` and a statement's progress and cancel by its tag, through the real ADBC driver.

The service answers ``EXPLAIN`` with the plan as rows and ``EXPLAIN ANALYZE`` with the plan and what
each task measured after running the statement (its row count checked against DuckDB's); a client that
tags its statement (``x-flight-exec-tag``) asks its progress and cancels it over plain Flight, and
another user, with the same tag, sees and cancels nothing.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow.flight as fl
import pytest
from adbc_driver_flightsql import dbapi
from support import running_tasks, tpch_test_files, wait_until

import flight
from benchmarks.tpch_queries import TABLES, duckdb_connection
from benchmarks.tpch_sql import SQL
from tests.service.test_flightsql import start_service, stop_service

SLOW = "select count(*) as n from lineitem a join lineitem b on a.l_linenumber = b.l_linenumber"
TAG = "adbc.flight.sql.rpc.call_header.x-flight-exec-tag"


@pytest.fixture(scope="module")
def files() -> dict[str, list[Path]]:
    return tpch_test_files(0.1)


@pytest.fixture(scope="module")
def service(cluster: flight.LocalCluster, files: dict[str, list[Path]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tokens = tmp_path_factory.mktemp("tokens") / "tokens"
    tokens.write_text("alice:alice-secret-token\nbob:bob-secret-token\n")
    tables = [a for t in TABLES for a in ("--table", f"{t}={files[t][0].parent}")]
    proc, url = start_service("--workers", ",".join(cluster.urls), "--auth-token-file", str(tokens), *tables)
    try:
        yield url
    finally:
        assert stop_service(proc) == 0


@pytest.fixture(scope="module")
def con(files: dict[str, list[Path]]) -> Iterator[duckdb.DuckDBPyConnection]:
    c = duckdb_connection(files)
    yield c
    c.close()


def _connect(url: str, user: str) -> dbapi.Connection:
    return dbapi.connect(url, db_kwargs={"adbc.flight.sql.authorization_header": f"Bearer {user}-secret-token"}, autocommit=True)


def _action(url: str, user: str, kind: str, tag: str) -> dict[str, object]:
    with fl.connect(url) as client:
        call = fl.FlightCallOptions(headers=[(b"authorization", f"Bearer {user}-secret-token".encode())], timeout=10)
        return dict(json.loads(next(iter(client.do_action(fl.Action(kind, tag.encode()), call))).body.to_pybytes()))


def test_explain_shows_the_stages_and_runs_nothing(service: str, cluster: flight.LocalCluster) -> None:
    with _connect(service, "alice") as conn, conn.cursor() as cur:
        cur.execute("-- the plan, please\nEXPLAIN " + SQL[3])
        plan = cur.fetch_arrow_table()
    assert plan.schema.names == ["plan"]
    lines = plan["plan"].to_pylist()
    assert lines[0] == "SQL logical plan (DataFusion, optimized):"
    assert any(line.startswith("Stage ") and "[upper, head]" in line for line in lines)
    assert any(url in line for line in lines for url in cluster.urls)  # tasks placed on the workers
    assert not any("rows in" in line for line in lines)  # nothing measured: nothing ran
    assert running_tasks(cluster.urls) == 0


def test_explain_analyze_runs_the_statement_and_shows_what_each_task_did(service: str, con: duckdb.DuckDBPyConnection) -> None:
    text = "select l_returnflag, count(*) as n from lineitem where l_quantity > 30 group by 1"
    with _connect(service, "alice") as conn, conn.cursor() as cur:
        cur.execute("explain analyze " + text)
        lines = cur.fetch_arrow_table()["plan"].to_pylist()
    want = len(con.sql(text).fetchall())
    assert lines[-1].startswith(f"Rows returned: {want:,} ")
    assert any("| rows in " in line for line in lines)  # each task's measured rows
    assert any(line.startswith("Executed query ") for line in lines)


def test_explain_of_a_prepared_statement_takes_its_parameter(service: str) -> None:
    with _connect(service, "alice") as conn, conn.cursor() as cur:
        cur.execute("explain select n_name from nation where n_regionkey = ?", parameters=(3,))
        lines = cur.fetch_arrow_table()["plan"].to_pylist()
    assert any("Stage " in line for line in lines)
    with pytest.raises(dbapi.Error, match="unknown column 'nope'"), _connect(service, "alice") as conn, conn.cursor() as cur:
        cur.execute("explain select nope from nation")


def test_a_tagged_statement_shows_its_progress_to_its_user_alone_and_is_cancelled_by_its_tag(
    service: str, cluster: flight.LocalCluster
) -> None:
    tag = "shell-test-tag-1"
    outcome: list[BaseException | None] = []
    conn = _connect(service, "alice")
    cur = conn.cursor()
    cur.adbc_statement.set_options(**{TAG: tag})

    def run() -> None:
        try:
            cur.execute(SLOW)
            cur.fetch_arrow_table()
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            outcome.append(exc)

    caller = threading.Thread(target=run, daemon=True)
    caller.start()
    try:
        # The workers run its tasks a moment before the service has the query (it is launched first).
        wait_until(lambda: _action(service, "alice", "flight-exec.progress", tag)["state"] == "running", 30.0, "the statement to run")
        assert running_tasks(cluster.urls) > 0
        mine = _action(service, "alice", "flight-exec.progress", tag)
        assert mine["state"] == "running" and int(mine["stages"]) >= 2 and int(mine["tasks"]) >= int(mine["tasks_done"])
        # Bob, with the same tag, finds nothing, and cancels nothing.
        assert _action(service, "bob", "flight-exec.progress", tag) == {"state": "unknown"}
        assert _action(service, "bob", "flight-exec.cancel", tag) == {"cancelled": False}
        assert _action(service, "alice", "flight-exec.progress", tag)["state"] == "running"
        assert _action(service, "alice", "flight-exec.cancel", tag) == {"cancelled": True}
        wait_until(lambda: running_tasks(cluster.urls) == 0, 10.0, "the workers to end the cancelled statement's tasks")
        caller.join(10.0)
        assert outcome and isinstance(outcome[0], dbapi.Error), outcome
        ended = _action(service, "alice", "flight-exec.progress", tag)
        assert ended["state"] == "cancelled" and "flight-exec.cancel" in str(ended["error"])
    finally:
        cur.close()
        conn.close()


@pytest.mark.parametrize("body", [b"", b"x" * 65, b"bad tag!", "\u00e9t\u00e9".encode()])
def test_a_tag_that_is_no_tag_names_nothing(service: str, body: bytes) -> None:
    with fl.connect(service) as client:
        call = fl.FlightCallOptions(headers=[(b"authorization", b"Bearer alice-secret-token")], timeout=10)
        answer = json.loads(next(iter(client.do_action(fl.Action("flight-exec.progress", body), call))).body.to_pybytes())
    assert answer == {"state": "unknown"}
