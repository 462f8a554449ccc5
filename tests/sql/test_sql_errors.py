"""Errors a person can act on: unsupported SQL names the construct (and its line:column where it
can be found), unknown names name the nearest ones, a type mismatch names both types, and
statements that would touch the coordinator's files or change data are refused before planning."""

from __future__ import annotations

import pyarrow as pa
import pytest

import flight

TABLES = {
    "items": pa.table({"id": [1, 2], "name": ["a", "b"], "price": pa.array([1, 2], pa.decimal128(10, 2))}),
    "orders": pa.table({"oid": [1], "item": [1]}),
}

REFUSED = [
    ("select nme from items", "unknown column 'nme' at line 1:8; did you mean 'name'?"),
    ("select id,\n  pricee from items", "unknown column 'pricee' at line 2:3; did you mean 'price'?"),
    ("select id from itmes", "unknown table 'itmes' at line 1:16; did you mean 'items'?"),
    ("select id from zzz", "unknown table 'zzz' at line 1:16; tables: items, orders"),
    ("select id from items where name = 1 + 'a'", "Int64 + Utf8"),
    ("selec id from items", "SELEC ID at line 1:1 is not supported"),
    ("select id from items where", "SQL syntax error at the end of the statement that starts at line 1:1: Expected: an expression"),
    ("select id from items\nwhere id = = 2", "SQL syntax error at line 2:"),
    ("select id from items; select name from items", "more than one query (the second at line 1:23)"),
    ("insert into items values (1, 'x', 1.0)", "INSERT INTO at line 1:1 is not supported"),
    ("create external table z stored as csv location '/etc/passwd'", "CREATE EXTERNAL at line 1:1 is not supported"),
    ("copy items to '/tmp/x.csv'", "COPY ITEMS at line 1:1 is not supported"),
    ("create table z as select * from items", "CREATE TABLE at line 1:1 is not supported"),
    ("select * from read_csv('/etc/passwd')", "table function 'read_csv' not found"),
    ("select * from '/etc/passwd'", "unknown table '/etc/passwd'"),
    ("explain select id from items", "EXPLAIN SELECT at line 1:1 is not supported"),
    ("", "the text holds no statement"),
    ("create view v as select id from items", "the text holds no query"),
    ("select approx_distinct(id) from items", "the aggregate function approx_distinct() is not supported"),
    ("select string_agg(distinct name, ',') from items", "STRING_AGG(DISTINCT ...)"),
    ("select try_cast(name as int) from items", "TRY_CAST (TRY_CAST(items.name AS Int32)) is not supported (at line 1:8)"),
    ("with recursive r(n) as (select 1 union all select n + 1 from r where n < 3) select n from r", "WITH RECURSIVE is not supported"),
    ("select id from items where id not in (select oid from orders) or id > 1", "NOT IN under OR"),
    ("select md5(name) from items", "the function md5()"),
    ("select lpad(name, 5, 'ab') from items", "lpad() with a padding of 2 characters"),
    ("select regexp_replace(name, 'a', 'b', 'x') from items", "regexp_replace() with the flags 'x'"),
    ("select date_trunc('decade', current_date) from items", "date_trunc('decade', ...)"),
    ("select id, sum(id) over (order by price range between 0.5 preceding and current row) from items", "a whole number is taken"),
    ("select id from items order by id limit id", "column 'id' cannot be used there"),
    # found by the service fuzzer: the first killed the process (the parser's stack), the second held it for minutes
    ("select id from items where " + " and ".join(["id > 0"] * 20_000), "holds 19999 ANDs and ORs; at most 4096 are taken"),
    ("select " + "case when id > 0 then " * 100 + "1" + " end" * 100 + " from items", "nests CASE expressions 100 deep; at most 16"),
    ("select " + "(" * 70 + "id" + ")" * 70 + " from items", "nests parentheses 70 deep; at most 64"),
]


def test_shapes_within_the_limits_plan() -> None:
    """The limits leave what people write alone: 16 nested CASEs, 4,096 conditions, a ')' inside a string."""
    flight.sql("select " + "case when id > 0 then " * 16 + "1" + " end" * 16 + " as x from items", TABLES)
    flight.sql("select id from items where " + " or ".join(["id = 1"] * 4096), TABLES)
    flight.sql("select id from items where name <> '((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((('", TABLES)


@pytest.mark.parametrize(("text", "says"), REFUSED, ids=[t[:40] or "empty" for t, _ in REFUSED])
def test_refused_with_a_clear_error(text: str, says: str) -> None:
    with pytest.raises(flight.PlanError) as raised:
        flight.sql(text, TABLES)
    message = str(raised.value)
    assert says in message
    assert "Traceback" not in message and "/work" not in message


def test_unknown_dialect_names_the_known_ones() -> None:
    with pytest.raises(flight.PlanError, match="dialect 'oracle' is not one of duckdb, generic, postgres, spark"):
        flight.sql("select 1", {}, dialect="oracle")


def test_nothing_is_read_while_planning(tmp_path: object) -> None:
    """A table's source is not opened until a statement names it (planning reads footers only then)."""
    missing = "/nonexistent/dir/file.parquet"
    catalog = flight.Catalog({"items": TABLES["items"], "ghost": missing})
    assert flight.sql("select id from items", catalog).schema.names == ["id"]
    with pytest.raises(flight.PlanError, match="cannot read the schema"):
        flight.sql("select * from ghost", catalog)


def test_a_kept_session_knows_only_the_next_texts_tables() -> None:
    """Sessions are kept between texts (``frontend._Sessions``): a table an earlier text named is unknown to
    a text over a catalog without it, and one whose schema changed plans with its new columns."""
    for _ in range(3):  # a kept session served each of these after the first
        assert flight.sql("select oid from orders", TABLES).schema.names == ["oid"]
        with pytest.raises(flight.PlanError, match="unknown table 'orders'"):
            flight.sql("select oid from orders", {"items": TABLES["items"]})
        changed = {"orders": pa.table({"oid": ["x"], "note": ["y"]})}
        assert flight.sql("select oid, note from orders", changed).schema == pa.schema([("oid", pa.string()), ("note", pa.string())])
