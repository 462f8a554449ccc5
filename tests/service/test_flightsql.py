"""``flight-coordinator`` as a user runs it: a subprocess, real workers, the real ADBC Flight SQL driver.

Two services share one two-worker ``LocalCluster``: one hands out direct endpoints (clients read
the workers), one relays (clients read through it). TPC-H's 22 queries through ADBC equal DuckDB's
answers over the same files; a prepared statement runs with two parameter values; the metadata
calls list the configured tables; bad SQL fails with its position and the service goes on; a
cancel and a client that never reads both leave the workers with no task; SIGTERM drains and
exits 0.
"""

from __future__ import annotations

import decimal
import subprocess
import threading
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import adbc_driver_flightsql.dbapi as dbapi
import duckdb
import pyarrow as pa
import pyarrow.flight as fl
import pyarrow.parquet as pq
import pytest
from support import running_tasks, tpch_test_files, wait_until

import flight
from benchmarks.tpch_queries import TABLES, decimals_as_numbers, duckdb_connection, duckdb_table
from benchmarks.tpch_sql import ALL_QUERIES, ORDERED, SQL
from flight.service.commands import pack
from flight.wire._proto import Flight_pb2
from flight.wire._proto import FlightSql_pb2 as sql_pb2
from tests.sql.test_tpch_sql import check

SF = 0.1
PREFIX = "flight-coordinator listening on "


def start_service(*args: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "flight.service", "--port", "0", *args], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith(PREFIX), f"first line {line!r}"
    return proc, line[len(PREFIX):].strip()


def stop_service(proc: subprocess.Popen[str]) -> int:
    proc.terminate()
    code = proc.wait(30)
    if proc.stdout is not None:
        proc.stdout.close()
    return code


@pytest.fixture(scope="module")
def files() -> dict[str, list[Path]]:
    return tpch_test_files(SF)


@pytest.fixture(scope="module")
def table_args(files: dict[str, list[Path]]) -> list[str]:
    return [a for t in TABLES for a in ("--table", f"{t}={files[t][0].parent}")]


@pytest.fixture(scope="module")
def services(cluster: flight.LocalCluster, table_args: list[str]) -> Iterator[dict[str, str]]:
    """A direct and a relay service over the session's two workers, by endpoint kind."""
    workers = ",".join(cluster.urls)
    direct, direct_url = start_service("--workers", workers, *table_args)
    relay, relay_url = start_service("--workers", workers, "--endpoints", "relay", *table_args)
    try:
        yield {"direct": direct_url, "relay": relay_url}
    finally:
        codes = [stop_service(direct), stop_service(relay)]
        assert codes == [0, 0], f"the services exited {codes} on SIGTERM"


@pytest.fixture(scope="module")
def con(files: dict[str, list[Path]]) -> Iterator[duckdb.DuckDBPyConnection]:
    c = duckdb_connection(files)
    yield c
    c.close()


def query(url: str, text: str, params: tuple[object, ...] | None = None) -> pa.Table:
    with dbapi.connect(url, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(text, parameters=params)
        return cur.fetch_arrow_table()


@pytest.mark.slow
@pytest.mark.parametrize("n", ALL_QUERIES, ids=lambda n: f"q{n}")
def test_tpch_through_adbc_equals_duckdb(n: int, services: dict[str, str], con: duckdb.DuckDBPyConnection) -> None:
    check(n, query(services["direct"], SQL[n]), duckdb_table(con, SQL[n]), "ADBC, direct endpoints")


@pytest.mark.parametrize("kind", ["direct", "relay"])
def test_both_kinds_of_endpoint_give_the_rows(kind: str, services: dict[str, str], con: duckdb.DuckDBPyConnection) -> None:
    check(3, query(services[kind], SQL[3]), duckdb_table(con, SQL[3]), f"ADBC, {kind} endpoints")
    assert ORDERED.get(3)


def test_a_prepared_statement_runs_with_two_values(services: dict[str, str], con: duckdb.DuckDBPyConnection) -> None:
    text = "select n_name, n_regionkey from nation where n_regionkey = ? order by n_name"
    with dbapi.connect(services["direct"], autocommit=True) as conn, conn.cursor() as cur:
        for value in (1, 3):
            cur.execute(text, parameters=(value,))  # the DB-API prepares every statement, then binds
            got = cur.fetch_arrow_table()
            want = con.execute(text, [value]).fetchall()
            assert [tuple(r.values()) for r in got.to_pylist()] == want and got.num_rows == 5


def test_metadata_lists_the_configured_tables(services: dict[str, str], files: dict[str, list[Path]]) -> None:
    with dbapi.connect(services["direct"], autocommit=True) as conn:
        objects = conn.adbc_get_objects(depth="tables").read_all().to_pylist()
        tables = {t["table_name"] for c in objects for s in c["catalog_db_schemas"] for t in s["db_schema_tables"]}
        assert tables == set(TABLES)
        schema = conn.adbc_get_table_schema("orders")
        assert schema.names == pq.read_schema(files["orders"][0]).names
        assert conn.adbc_get_table_types() == ["TABLE"]


def test_bad_sql_names_where_and_the_service_goes_on(services: dict[str, str]) -> None:
    with pytest.raises(dbapi.Error, match=r"unknown column 'nope' at line 1:8"):
        query(services["direct"], "select nope from nation")
    with pytest.raises(dbapi.Error, match=r"SQL syntax error at line 1:"):
        query(services["direct"], "select from where")
    assert query(services["direct"], "select count(*) as c from region").to_pylist() == [{"c": 5}]


def test_a_cancel_ends_the_query_and_frees_its_tasks(services: dict[str, str], cluster: flight.LocalCluster) -> None:
    client = fl.connect(services["direct"])
    descriptor = fl.FlightDescriptor.for_command(pack(sql_pb2.CommandStatementQuery(query=SQL[9])))
    info = client.get_flight_info(descriptor)
    wait_until(lambda: running_tasks(cluster.urls) > 0, 10.0, "the query's tasks")
    body = Flight_pb2.CancelFlightInfoRequest()
    body.info.ParseFromString(info.serialize())
    result = Flight_pb2.CancelFlightInfoResult()
    result.ParseFromString(next(iter(client.do_action(fl.Action("CancelFlightInfo", body.SerializeToString())))).body.to_pybytes())
    assert result.status == Flight_pb2.CANCEL_STATUS_CANCELLED
    wait_until(lambda: running_tasks(cluster.urls) == 0, 15.0, "the workers to free the cancelled query's tasks")
    with pytest.raises(fl.FlightError):
        fl.connect(info.endpoints[0].locations[0]).do_get(info.endpoints[0].ticket).read_all()
    client.close()


def test_results_never_read_are_freed_within_the_ttl(cluster: flight.LocalCluster, table_args: list[str]) -> None:
    proc, url = start_service("--workers", ",".join(cluster.urls), "--result-ttl", "2", *table_args)
    try:
        client = fl.connect(url)
        client.get_flight_info(fl.FlightDescriptor.for_command(pack(sql_pb2.CommandStatementQuery(query=SQL[1]))))
        wait_until(lambda: running_tasks(cluster.urls) > 0, 10.0, "the query's tasks")
        started = time.monotonic()
        wait_until(lambda: running_tasks(cluster.urls) == 0, 20.0, "the workers to be back to no task")
        assert time.monotonic() - started < 20.0
        client.close()
    finally:
        assert stop_service(proc) == 0


def test_get_schema_plans_a_statement_without_running_it(services: dict[str, str], cluster: flight.LocalCluster) -> None:
    text = "select n_name, n_regionkey + 1 as r from nation"
    with fl.connect(services["direct"]) as client:
        result = client.get_schema(fl.FlightDescriptor.for_command(pack(sql_pb2.CommandStatementQuery(query=text))))
    assert result.schema.names == ["n_name", "r"]
    assert running_tasks(cluster.urls) == 0  # nothing ran


def test_the_dialect_header_plans_sparks_text_with_sparks_types(services: dict[str, str], con: duckdb.DuckDBPyConnection) -> None:
    """``x-flight-exec-dialect: spark`` (here through the ADBC driver's call-header option): backticks and
    Spark's functions plan, and an average of a DECIMAL is Spark's DECIMAL(p + 4, s + 4), where DuckDB's is a
    DOUBLE; a dialect the service does not know fails the call naming the header."""
    header = "adbc.flight.sql.rpc.call_header.x-flight-exec-dialect"
    text = "select `n_name`, nvl(n_comment, 'x') as c, avg(cast(n_nationkey as decimal(10, 2))) as a from nation group by 1, 2"
    with dbapi.connect(services["direct"], db_kwargs={header: "spark"}, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(text)
        got = cur.fetch_arrow_table()
    assert got.schema.field("a").type == pa.decimal128(14, 6)
    want = duckdb_table(con, "select n_name, coalesce(n_comment, 'x') as c, avg(n_nationkey) as a from nation group by 1, 2")
    assert sorted(zip(got["n_name"].to_pylist(), got["a"].to_pylist())) == sorted(
        (n, decimal.Decimal(a).quantize(decimal.Decimal("0.000001"))) for n, a in zip(want["n_name"].to_pylist(), want["a"].to_pylist()))
    with fl.connect(services["direct"]) as client:
        call = fl.FlightCallOptions(headers=[(b"x-flight-exec-dialect", b"spark")])
        descriptor = fl.FlightDescriptor.for_command(pack(sql_pb2.CommandStatementQuery(query=text)))
        assert client.get_schema(descriptor, call).schema.field("a").type == pa.decimal128(14, 6)
        bad = fl.FlightCallOptions(headers=[(b"x-flight-exec-dialect", b"sql2016")])
        with pytest.raises(fl.FlightError, match="header x-flight-exec-dialect: 'sql2016' is not one of") as raised:
            client.get_flight_info(descriptor, bad)
        assert "Traceback" not in str(raised.value)


def test_a_statement_whose_client_gave_up_while_it_waited_is_cancelled_when_it_starts(
    cluster: flight.LocalCluster, table_args: list[str]
) -> None:
    """A client whose GetFlightInfo is cancelled (here: its deadline) while the statement waits for a slot never
    reads its results: once the slot frees, the statement is planned and started, then cancelled at once, so its
    tasks do not hold the workers until the result TTL."""
    proc, url = start_service("--workers", ",".join(cluster.urls), "--max-queries", "1", "--queue-wait", "30", *table_args)
    try:
        with fl.connect(url) as client:
            def info(text: str, timeout: float | None = None) -> fl.FlightInfo:
                descriptor = fl.FlightDescriptor.for_command(pack(sql_pb2.CommandStatementQuery(query=text)))
                return client.get_flight_info(descriptor, fl.FlightCallOptions(timeout=timeout))

            holder = info("select count(*) as n from lineitem")  # holds the one slot until it is read
            with pytest.raises(fl.FlightError):
                info("select l_orderkey, l_quantity from lineitem", timeout=1.0)  # waits for the slot; its deadline passes
            rows = 0
            for e in holder.endpoints:  # direct endpoints: read at the workers; the slot frees once all are read
                with fl.connect(e.locations[0].uri.decode()) as worker:
                    rows += worker.do_get(e.ticket).read_all().num_rows
            assert rows == 1
        wait_until(lambda: running_tasks(cluster.urls) == 0, 20.0, "the abandoned statement's tasks to be freed")
    finally:
        stop_service(proc)


def test_an_unknown_command_is_refused_by_name(services: dict[str, str]) -> None:
    client = fl.connect(services["direct"])
    update = fl.FlightDescriptor.for_command(pack(sql_pb2.CommandStatementUpdate(query="delete from nation")))
    with pytest.raises(fl.FlightError, match="CommandStatementUpdate is not supported by flight-coordinator") as raised:
        client.get_flight_info(update)
    assert "Traceback" not in str(raised.value) and ".py" not in str(raised.value)
    with pytest.raises(fl.FlightError, match="not a Flight SQL command"):
        client.get_flight_info(fl.FlightDescriptor.for_command(b"\xff\xff garbage"))
    client.close()


@pytest.mark.slow
def test_sixteen_clients_at_once_all_get_exact_results(services: dict[str, str], con: duckdb.DuckDBPyConnection) -> None:
    numbers = [1, 3, 5, 6, 10, 12, 13, 14] * 2
    answers = {n: duckdb_table(con, SQL[n]) for n in set(numbers)}
    results: dict[int, pa.Table | BaseException] = {}

    def client(i: int) -> None:
        try:
            results[i] = query(services["direct"], SQL[numbers[i]])
        except BaseException as exc:  # noqa: BLE001 - reported below, with the query it ran
            results[i] = exc

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(numbers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i, n in enumerate(numbers):
        got = results.get(i)
        assert isinstance(got, pa.Table), f"client {i} (Q{n}): {got!r}"
        check(n, got, answers[n], f"client {i} of {len(numbers)} at once")


def test_beyond_admission_a_query_is_refused_clearly(cluster: flight.LocalCluster, table_args: list[str]) -> None:
    proc, url = start_service("--workers", ",".join(cluster.urls), "--max-queries", "1", "--queue-wait", "0.5", *table_args)
    try:
        holder = fl.connect(url)
        held = holder.get_flight_info(fl.FlightDescriptor.for_command(pack(sql_pb2.CommandStatementQuery(query=SQL[6]))))
        with pytest.raises(dbapi.Error, match=r"no slot after 0.5 s of waiting: the service runs 1 queries \(--max-queries 1\)"):
            query(url, "select count(*) from region")
        for endpoint in held.endpoints:  # the holder reads its rows: its slot is free again
            fl.connect(endpoint.locations[0]).do_get(endpoint.ticket).read_all()
        wait_until(lambda: _answers(url), 10.0, "a query to be admitted again")
        holder.close()
    finally:
        assert stop_service(proc) == 0


def _answers(url: str) -> bool:
    try:
        return query(url, "select count(*) as c from region").to_pylist() == [{"c": 5}]
    except dbapi.Error:
        return False


def test_a_workers_error_reaches_the_go_client_with_its_own_code_and_words(services: dict[str, str], cluster: flight.LocalCluster) -> None:
    """A worker's error status carries its ErrorInfo in the grpc-status-details-bin trailer. grpc-go (under the ADBC
    driver) reads that trailer as a google.rpc.Status and turned one whose code differed from the call's into INTERNAL
    "grpc-status-details-bin mismatch" (the chaos run's unclear errors). Read here through the driver: a direct
    endpoint of a cancelled query, read from its worker, fails with the worker's own words and code."""
    descriptor = fl.FlightDescriptor.for_command(pack(sql_pb2.CommandStatementQuery(query=SQL[1])))
    with fl.connect(services["direct"]) as client:
        info = client.get_flight_info(descriptor)
        body = Flight_pb2.CancelFlightInfoRequest()
        body.info.ParseFromString(info.serialize())
        client.do_action(fl.Action("CancelFlightInfo", body.SerializeToString())).close()
    wait_until(lambda: running_tasks(cluster.urls) == 0, 15.0, "the workers to free the cancelled query's tasks")
    endpoint = info.endpoints[0]
    assert str(endpoint.locations[0]).removeprefix("<pyarrow.flight.Location b'").rstrip("'>") in cluster.urls
    with dbapi.connect(services["direct"], autocommit=True) as conn, conn.cursor() as cur:
        with pytest.raises(dbapi.Error) as raised:
            cur.adbc_read_partition(fl.FlightInfo(info.schema, descriptor, [endpoint], -1, -1).serialize())  # the driver's partition
            cur.fetch_arrow_table()
    message = str(raised.value)
    assert "mismatch" not in message and not isinstance(raised.value, dbapi.InternalError), message
    assert "no task" in message and "[field: ticket.stage_key]" in message, message
