"""A hostile Flight client against ``flight-coordinator``: every malformed or oversized input is refused
with a clear error (no traceback, no path), and the service goes on serving."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.flight as fl
import pytest
from support import tpch_test_files

import flight
from flight.service.commands import pack
from flight.service.server import MAX_PARAMETER_BYTES, MAX_SQL_CHARS
from flight.wire._proto import FlightSql_pb2 as sql_pb2


@pytest.fixture(scope="module")
def url(cluster: flight.LocalCluster) -> Iterator[str]:
    region = tpch_test_files(0.1)["region"][0].parent
    proc = subprocess.Popen([sys.executable, "-m", "flight.service", "--port", "0", "--workers", ",".join(cluster.urls),
                             "--table", f"region={region}"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    yield proc.stdout.readline().split()[-1]
    proc.terminate()
    assert proc.wait(30) == 0
    proc.stdout.close()


def clean(exc: BaseException) -> str:
    text = str(exc)
    assert "Traceback" not in text and ".py" not in text, text
    return text


def still_serves(client: fl.FlightClient) -> None:
    info = client.get_flight_info(fl.FlightDescriptor.for_command(pack(sql_pb2.CommandStatementQuery(query="select count(*) as n from region"))))
    rows = pa.concat_tables(fl.connect(e.locations[0]).do_get(e.ticket).read_all() for e in info.endpoints)
    assert rows.to_pylist() == [{"n": 5}]


CASES = {
    "garbage command": lambda c: c.get_flight_info(fl.FlightDescriptor.for_command(b"\x00\xff" * 50)),
    "a path descriptor": lambda c: c.get_flight_info(fl.FlightDescriptor.for_path("region")),
    "an empty command": lambda c: c.get_flight_info(fl.FlightDescriptor.for_command(b"")),
    "a huge statement": lambda c: c.get_flight_info(fl.FlightDescriptor.for_command(
        pack(sql_pb2.CommandStatementQuery(query="select 1 " + " " * MAX_SQL_CHARS)))),
    "a garbage ticket": lambda c: c.do_get(fl.Ticket(b"\x01\x02\x03")).read_all(),
    "a forged relay handle": lambda c: c.do_get(fl.Ticket(pack(sql_pb2.TicketStatementQuery(statement_handle=b"x" * 16)))).read_all(),
    "an unknown prepared statement": lambda c: c.get_flight_info(fl.FlightDescriptor.for_command(
        pack(sql_pb2.CommandPreparedStatementQuery(prepared_statement_handle=b"nope")))),
    "an unknown action": lambda c: list(c.do_action(fl.Action("DropEverything", b""))),
    "a garbage cancel": lambda c: list(c.do_action(fl.Action("CancelFlightInfo", b"\xff\xff\xff"))),
    "a garbage prepare": lambda c: list(c.do_action(fl.Action("CreatePreparedStatement", b"\x00"))),
    # pyarrow does not translate a FlightError raised by get_schema: its traceback, paths included, went along
    "a garbage GetSchema": lambda c: c.get_schema(fl.FlightDescriptor.for_command(b"\x00\xff garbage")),
    "bad SQL in GetSchema": lambda c: c.get_schema(fl.FlightDescriptor.for_command(
        pack(sql_pb2.CommandStatementQuery(query="select nope from region")))),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_hostile_input_is_refused_clearly_and_the_service_goes_on(name: str, url: str) -> None:
    client = fl.connect(url)
    with pytest.raises((fl.FlightError, pa.ArrowException)) as raised:  # GetSchema's: pyarrow's "Unknown error"
        CASES[name](client)
    clean(raised.value)
    still_serves(client)
    client.close()


def _prepared(client: fl.FlightClient) -> fl.FlightDescriptor:
    (result,) = list(client.do_action(fl.Action("CreatePreparedStatement", pack(
        sql_pb2.ActionCreatePreparedStatementRequest(query="select r_name from region where r_regionkey = ?")))))
    created = sql_pb2.ActionCreatePreparedStatementResult()
    any_ = __import__("google.protobuf.any_pb2", fromlist=["Any"]).Any()
    any_.ParseFromString(result.body.to_pybytes())
    any_.Unpack(created)
    return fl.FlightDescriptor.for_command(pack(sql_pb2.CommandPreparedStatementQuery(
        prepared_statement_handle=created.prepared_statement_handle)))


def test_oversized_parameters_are_refused_as_they_arrive(url: str) -> None:
    client = fl.connect(url)
    descriptor = _prepared(client)
    big = pa.table({"p": pa.array(["x" * 1000] * (MAX_PARAMETER_BYTES // 1000 + 10))})
    with pytest.raises(fl.FlightError) as raised:
        writer, reader = client.do_put(descriptor, big.schema)
        for batch in big.to_batches(max_chunksize=100):
            writer.write_batch(batch)
        writer.done_writing()
        reader.read()
        writer.close()
    assert "a query takes one row" in clean(raised.value)
    still_serves(client)
    client.close()


@pytest.mark.parametrize("value", [pa.array([2**62], pa.duration("s")), pa.array([2**62], pa.timestamp("s"))], ids=str)
def test_a_parameter_python_cannot_hold_is_refused_naming_it(url: str, value: pa.Array) -> None:
    client = fl.connect(url)
    batch = pa.record_batch([value], names=["1"])
    with pytest.raises(fl.FlightError) as raised:
        writer, reader = client.do_put(_prepared(client), batch.schema)
        writer.write_batch(batch)
        writer.done_writing()
        reader.read()
        writer.close()
    assert f"parameter 1 ({value.type}) holds a value out of range" in clean(raised.value)
    still_serves(client)
    client.close()
