"""Flight SQL's messages decoded and the metadata answered, without sockets (``flight.service.commands``),
and a statement's ``?`` parameters numbered (``flight.sql.frontend.number_placeholders``)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from google.protobuf import any_pb2

from flight.errors import ProtocolError
from flight.service.commands import CATALOG, SCHEMA, SQL_INFO_SCHEMA, db_schemas, pack, sql_info, tables, unpack
from flight.sql.frontend import number_placeholders
from flight.wire._proto import FlightSql_pb2 as sql_pb2

SCHEMAS = {"orders": pa.schema([("o_orderkey", pa.int64())]), "order_lines": pa.schema([("l", pa.int32())]), "nation": pa.schema([])}


def test_a_command_round_trips() -> None:
    command = unpack(pack(sql_pb2.CommandStatementQuery(query="select 1")), "descriptor.cmd")
    assert isinstance(command, sql_pb2.CommandStatementQuery) and command.query == "select 1"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\xff\xfe", "not a Flight SQL command"),
        (any_pb2.Any(type_url="type.googleapis.com/some.Other", value=b"").SerializeToString(), "is not a Flight SQL message"),
        (pack(sql_pb2.CommandStatementUpdate(query="delete from t")), "CommandStatementUpdate is not supported"),
        (pack(sql_pb2.CommandStatementSubstraitPlan()), "CommandStatementSubstraitPlan is not supported"),
        (any_pb2.Any(type_url="type.googleapis.com/arrow.flight.protocol.sql.CommandStatementQuery", value=b"\xff").SerializeToString(),
         "a malformed CommandStatementQuery"),
    ],
    ids=["garbage", "foreign", "update", "substrait", "malformed"],
)
def test_what_is_not_answered_is_refused_by_name(data: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message) as raised:
        unpack(data, "descriptor.cmd")
    assert raised.value.field == "descriptor.cmd"


def test_tables_follow_the_patterns_and_carry_their_schemas() -> None:
    got = tables(sql_pb2.CommandGetTables(table_name_filter_pattern="order%", include_schema=True), SCHEMAS)
    assert got["table_name"].to_pylist() == ["order_lines", "orders"]
    assert got["catalog_name"].to_pylist() == [CATALOG] * 2 and got["db_schema_name"].to_pylist() == [SCHEMA] * 2
    assert pa.ipc.read_schema(pa.py_buffer(got["table_schema"][1].as_py())) == SCHEMAS["orders"]
    assert tables(sql_pb2.CommandGetTables(table_name_filter_pattern="order_"), SCHEMAS)["table_name"].to_pylist() == ["orders"]  # _: one character
    assert tables(sql_pb2.CommandGetTables(catalog="other"), SCHEMAS).num_rows == 0
    assert tables(sql_pb2.CommandGetTables(table_types=["VIEW"]), SCHEMAS).num_rows == 0
    assert tables(sql_pb2.CommandGetTables(), SCHEMAS).schema.names == ["catalog_name", "db_schema_name", "table_name", "table_type"]


def test_db_schemas_match_their_pattern() -> None:
    assert db_schemas(sql_pb2.CommandGetDbSchemas(db_schema_filter_pattern="pub%"))["db_schema_name"].to_pylist() == [SCHEMA]
    assert db_schemas(sql_pb2.CommandGetDbSchemas(db_schema_filter_pattern="x%")).num_rows == 0


def test_sql_info_has_the_specifications_schema() -> None:
    everything = sql_info(sql_pb2.CommandGetSqlInfo())
    assert everything.schema == SQL_INFO_SCHEMA
    asked = sql_info(sql_pb2.CommandGetSqlInfo(info=[sql_pb2.FLIGHT_SQL_SERVER_NAME, sql_pb2.FLIGHT_SQL_SERVER_READ_ONLY, 99999]))
    assert asked["info_name"].to_pylist() == [sql_pb2.FLIGHT_SQL_SERVER_NAME, sql_pb2.FLIGHT_SQL_SERVER_READ_ONLY]
    assert asked["value"].to_pylist() == ["flight-exec", True]


@pytest.mark.parametrize(
    ("text", "numbered"),
    [
        ("select * from t where a = ? and b = ?", "select * from t where a = $1 and b = $2"),
        ("select '?' as q, ? as p", "select '?' as q, $1 as p"),
        ('select "a?" from t -- why?\nwhere x = ?', 'select "a?" from t -- why?\nwhere x = $1'),
        ("select $1, $2", "select $1, $2"),
    ],
)
def test_question_marks_outside_quotes_and_comments_are_numbered(text: str, numbered: str) -> None:
    assert number_placeholders(text) == numbered


@pytest.mark.timeout(10)
@pytest.mark.parametrize("pattern", ["%" * 2_000 + "x", "%_" * 40 + "z", "%a" * 25 + "%b", "%" * 100_000, "%p%u%b%l%i%c%" * 20])
def test_a_filter_pattern_cannot_make_matching_backtrack_for_ever(pattern: str) -> None:
    # The service fuzzer's command family: translated to a regular expression, "%%%...%x" against "public" ran for
    # ever in re (holding the GIL: the whole service stopped answering). Now linear in the name, and still LIKE.
    assert db_schemas(sql_pb2.CommandGetDbSchemas(db_schema_filter_pattern=pattern))["db_schema_name"].to_pylist() == (
        [SCHEMA] if pattern.strip("%") == "" else [])
    tables(sql_pb2.CommandGetTables(db_schema_filter_pattern=pattern, table_name_filter_pattern=pattern), SCHEMAS)


@pytest.mark.parametrize(("pattern", "value", "matches"), [
    ("%", "", True), ("", "", True), ("_", "", False), ("a%b", "ab", True), ("a%b", "axxb", True), ("a%b", "axxbx", False),
    ("%b%", "abc", True), ("a_c", "abc", True), ("a_c", "ac", False), ("%%a%%", "bab", True), ("a\\%", "a\\x", True),
    (".*", "abc", False), ("a%", "a\nb", True), ("%_%_%", "a", False), ("%_%_%", "ab", True),
])
def test_like_keeps_its_meaning(pattern: str, value: str, matches: bool) -> None:
    got = tables(sql_pb2.CommandGetTables(table_name_filter_pattern=pattern), {value: SCHEMAS[next(iter(SCHEMAS))]})
    assert (got.num_rows == 1) is matches

