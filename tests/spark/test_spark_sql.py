"""SQL from Spark: embedded (``flight.spark.sql``) and through a ``flight-coordinator`` (the data source's
``coordinator`` and ``sql`` options, and ``CREATE TEMPORARY VIEW … USING flight``), with Spark's filters
pushed into the statement.

Every answer is compared with Spark SQL's own on the same Parquet files (views of the session's
SparkSession, made by this module). The service is a real
``flight-coordinator`` subprocess over the session's two workers; what it ran is read from its
JSON API. The filters' SQL is checked for meaning, not spelling: each condition runs through
``flight.sql`` over a table of awkward strings, against the rows Python picks.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from support import running_tasks, tpch_test_files, wait_until

import flight
import flight.spark as fs
from benchmarks.tpch_queries import ORDERED, TABLES, compare, decimals_as_numbers
from benchmarks.tpch_sql import SQL
from flight.errors import PlanError
from flight.spark._service import filter_sql, pushed_text

pyspark = pytest.importorskip("pyspark", reason="the Spark tests need the spark extra: pip install -e '.[dev,spark]'")

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SF = 0.05
PUSHDOWN = tuple(int(x) for x in pyspark.__version__.split(".")[:2]) >= (4, 1)


@pytest.fixture(scope="module")
def files() -> dict[str, list[Path]]:
    return tpch_test_files(SF)


@pytest.fixture(scope="module")
def session(spark: Any, files: dict[str, list[Path]]) -> Any:
    """The session's SparkSession with a view per TPC-H table, all columns (Spark SQL's answers; made again
    here, as another module may have made a view of the same name). Data sources registered in a
    ``newSession()`` are not found by it, so the views are the shared session's."""
    for table in TABLES:
        spark.read.parquet(*[str(p) for p in files[table]]).createOrReplaceTempView(table)
    fs.register(spark)
    return spark


@pytest.fixture(scope="module")
def service(cluster: flight.LocalCluster, files: dict[str, list[Path]]) -> Iterator[tuple[str, str]]:
    """(Flight SQL URL, page URL) of a flight-coordinator over the session's workers, serving the TPC-H tables."""
    tables = [a for t in TABLES for a in ("--table", f"{t}={','.join(str(p) for p in files[t])}")]
    proc = subprocess.Popen([sys.executable, "-m", "flight.service", "--port", "0", "--http-port", "0", "--workers",
                             ",".join(cluster.urls), "--log-level", "WARNING", *tables], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url, page = proc.stdout.readline().split()[-1], proc.stdout.readline().split()[-1]
        yield url, page
    finally:
        proc.terminate()
        proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()
    # Its statements' results were kept readable for Spark (retain): stopping the service frees them.
    wait_until(lambda: running_tasks(cluster.urls) == 0, 15.0, "the stopped service's tasks to be freed")


def arrow(df: Any) -> pa.Table:
    return decimals_as_numbers(df.toArrow())


def same(got: Any, want: Any, ordered: list[str] | None = None) -> None:
    difference = compare(arrow(got), arrow(want), ordered)
    assert difference is None, difference


def statements(page: str) -> list[dict[str, Any]]:
    """What the service ran and runs (a Spark read's results stay readable: its statement is still running)."""
    with urllib.request.urlopen(page + "api/queries", timeout=10) as response:
        data = json.loads(response.read())
    return [*data["running"], *data["ended"]]


def detail(page: str, query_id: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{page}api/queries/{query_id}", timeout=10) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


# ---------------------------------------------------------------- the two ways


def test_embedded_sql_is_spark_sqls_answer(session: Any, cluster: flight.LocalCluster, files: dict[str, list[Path]]) -> None:
    tables = {t: flight.read_parquet([str(p) for p in files[t]]) for t in TABLES}
    # Read once (retain=0): a retained query would hold the session's workers for its ten minutes.
    df = fs.sql(session, SQL[3], tables, cluster.urls, retain=0)
    same(df, session.sql(SQL[3]), ORDERED.get(3))
    wait_until(lambda: running_tasks(cluster.urls) == 0, 15.0, "the query's tasks to be freed once read")


def test_a_statement_for_the_coordinator_is_spark_sqls_answer(session: Any, service: tuple[str, str]) -> None:
    url, page = service
    df = session.read.format("flight").option("coordinator", url).option("sql", SQL[3]).load()
    same(df, session.sql(SQL[3]), ORDERED.get(3))
    assert any(q["sql"] == SQL[3] and q["state"] in ("running", "finished") for q in statements(page))


def test_a_temporary_view_using_flight_reads_the_coordinator(session: Any, service: tuple[str, str]) -> None:
    url, _ = service
    text = "select l_returnflag, l_linestatus, count(*) as n, sum(l_quantity) as qty from lineitem group by l_returnflag, l_linestatus"
    session.sql(f"CREATE OR REPLACE TEMPORARY VIEW flight_q1 USING flight OPTIONS (coordinator '{url}', sql '{text}')")
    same(session.sql("select * from flight_q1 order by l_returnflag, l_linestatus"), session.sql(text + " order by 1, 2"),
         ["l_returnflag", "l_linestatus"])


def test_the_data_source_speaks_sparks_dialect_unless_told(session: Any, service: tuple[str, str]) -> None:
    """Spark's text gives Spark's answer, types and all: TPC-H Q1's ``avg(l_discount)`` is Spark's DECIMAL, not
    DuckDB's DOUBLE; a view ``USING flight`` takes backticks and Spark's functions. ``dialect duckdb`` asks for
    DuckDB's (a DOUBLE average) and takes its double-quoted names."""
    url, _ = service
    text = ("select l_returnflag, avg(l_discount) as disc, nvl(sum(l_tax), 0) as tax from lineitem "
            "where `l_shipdate` <= date_sub(date '1998-12-01', 90) group by l_returnflag")
    got = session.read.format("flight").option("coordinator", url).option("sql", text).load().toArrow()
    want = session.sql(text).toArrow()
    assert got.schema.types == want.schema.types, (got.schema, want.schema)  # DECIMAL(16,6): Spark's avg of DECIMAL(12,2)
    rows = want.sort_by("l_returnflag").to_pylist()  # values and types compared; Spark marks its sum NOT NULL here
    assert got.sort_by("l_returnflag").to_pylist() == rows
    quoted = text.replace("'", "\\'")  # Spark's string escape
    session.sql(f"CREATE OR REPLACE TEMPORARY VIEW flight_spark USING flight OPTIONS (coordinator '{url}', sql '{quoted}')")
    view = session.sql("select * from flight_spark").toArrow()
    assert view.schema.types == want.schema.types and view.sort_by("l_returnflag").to_pylist() == rows
    duck = "select avg(l_discount) as \"disc\" from lineitem"
    read = session.read.format("flight").option("coordinator", url).option("sql", duck).option("dialect", "duckdb").load()
    assert read.toArrow().schema.field("disc").type == pa.float64()
    with pytest.raises(Exception, match="option 'dialect' must be spark"):
        session.read.format("flight").option("coordinator", url).option("sql", duck).option("dialect", "sql2016").load()


def test_the_services_errors_reach_spark_with_their_position(session: Any, service: tuple[str, str]) -> None:
    url, _ = service
    with pytest.raises(Exception, match=r"unknown column|No field named|nope") as raised:
        session.read.format("flight").option("coordinator", url).option("sql", "select nope from nation").load().collect()
    assert "line 1" in str(raised.value) or "1:8" in str(raised.value)
    with pytest.raises(Exception, match="option 'sql' needs option 'coordinator'"):
        session.read.format("flight").option("sql", "select 1").load().collect()


# ------------------------------------------------------------------ pushdown


@pytest.mark.skipif(not PUSHDOWN, reason="filter pushdown needs PySpark 4.1 or later (DataSourceReader.pushFilters)")
def test_filters_spark_offers_run_on_the_workers(session: Any, service: tuple[str, str]) -> None:
    from pyspark.sql import functions as F

    url, page = service
    text = "select l_orderkey, l_linenumber, l_quantity, l_shipmode, l_shipdate from lineitem"
    read = session.read.format("flight").option("coordinator", url).option("sql", text).option("pushdown", "true").load()
    where = (F.col("l_orderkey") < 2000) & (F.col("l_shipdate") >= dt.date(1995, 1, 1)) & F.col("l_shipmode").startswith("RE")
    same(read.filter(where), session.sql(text).filter(where), ["l_orderkey", "l_linenumber"])
    pushed = next(q for q in statements(page) if "flight_pushed" in q["sql"])
    assert "`l_orderkey` < 2000" in pushed["sql"] and "DATE '1995-01-01'" in pushed["sql"] and "startswith(`l_shipmode`, 'RE')" in pushed["sql"]
    # The same statement without filters (a DataFrame of its own: docs/spark.md), for the bytes it moves.
    assert session.read.format("flight").option("coordinator", url).option("sql", text).load().count() == session.sql(text).count()
    whole = next(q for q in statements(page) if q["sql"] == text)
    moved = {q["id"]: sum(t["bytes"] for s in detail(page, q["id"])["stages"] if not s["consumers"] for t in s["tasks"])
             for q in (pushed, whole)}
    assert moved[pushed["id"]] * 10 < moved[whole["id"]], moved  # Spark received the matching rows only


def test_by_default_a_filtered_dataframe_never_changes_the_one_it_came_from(session: Any, service: tuple[str, str]) -> None:
    """PySpark 4.x keeps pushed partitions on the data source the two DataFrames share (see
    ``_options._pushdown_by_default``): without asking for pushdown, both counts are exact."""
    from pyspark.sql import functions as F

    url, _ = service
    text = "select l_orderkey, l_quantity from lineitem"
    read = session.read.format("flight").option("coordinator", url).option("sql", text).load()
    assert read.filter(F.col("l_orderkey") < 100).count() == session.sql(text).filter(F.col("l_orderkey") < 100).count()
    assert read.count() == session.sql(text).count()


def test_a_filter_that_sql_cannot_state_stays_with_spark() -> None:
    from pyspark.sql.datasource import EqualTo, GreaterThan, In, Not, StringContains

    assert filter_sql(EqualTo(("a", "b"), 1)) is None  # a nested field
    assert filter_sql(GreaterThan(("t",), dt.datetime(2020, 1, 1))) is None  # a timestamp: Spark's session time zone
    assert filter_sql(GreaterThan(("x",), float("nan"))) is None
    assert filter_sql(Not(In(("x",), (1, None)))) is None  # NOT IN with a null: three-valued, left to Spark
    assert filter_sql(StringContains(("s",), "a")) is not None
    assert pushed_text("select 1 as a;", []) == "select 1 as a;"


def test_pushed_conditions_mean_what_spark_meant() -> None:
    from pyspark.sql.datasource import (
        EqualNullSafe,
        EqualTo,
        GreaterThanOrEqual,
        In,
        IsNotNull,
        IsNull,
        LessThan,
        Not,
        StringContains,
        StringEndsWith,
        StringStartsWith,
    )

    strings = ["it's", "50%", "5_0", "a\\b", "'; drop table t; --", "", None, "über", "x%y_z"]
    t = pa.table({"s": strings, "n": list(range(len(strings))),
                  "d": pa.array([decimal.Decimal(f"{i}.25") for i in range(len(strings))], pa.decimal128(10, 2)),
                  "day": pa.array([dt.date(2020, 1, 1) + dt.timedelta(days=i) for i in range(len(strings))])})
    cases = [
        (EqualTo(("s",), "it's"), lambda r: r["s"] == "it's"),
        (EqualTo(("s",), "'; drop table t; --"), lambda r: r["s"] == "'; drop table t; --"),
        (StringContains(("s",), "%"), lambda r: r["s"] is not None and "%" in r["s"]),
        (StringContains(("s",), "_"), lambda r: r["s"] is not None and "_" in r["s"]),
        (StringContains(("s",), "\\"), lambda r: r["s"] is not None and "\\" in r["s"]),
        (StringStartsWith(("s",), "'"), lambda r: r["s"] is not None and r["s"].startswith("'")),
        (StringEndsWith(("s",), "%y_z"), lambda r: r["s"] is not None and r["s"].endswith("%y_z")),
        (IsNull(("s",)), lambda r: r["s"] is None),
        (IsNotNull(("s",)), lambda r: r["s"] is not None),
        (EqualNullSafe(("s",), None), lambda r: r["s"] is None),
        (Not(EqualTo(("s",), "50%")), lambda r: r["s"] is not None and r["s"] != "50%"),
        (In(("n",), (1, 3, 5)), lambda r: r["n"] in (1, 3, 5)),
        (Not(In(("n",), (1, 3))), lambda r: r["n"] not in (1, 3)),
        (GreaterThanOrEqual(("d",), decimal.Decimal("3.25")), lambda r: r["d"] >= decimal.Decimal("3.25")),
        (LessThan(("day",), dt.date(2020, 1, 4)), lambda r: r["day"] < dt.date(2020, 1, 4)),
    ]
    for dialect in ("spark", "duckdb"):  # Spark's quoting (backticks, backslash escapes) and DuckDB's
        for f, keep in cases:
            condition = filter_sql(f, dialect)
            assert condition is not None, f
            got = flight.run_local(flight.sql(f"select n from t where {condition}", {"t": t}, dialect=dialect)).read_all()
            want = [r["n"] for r in t.to_pylist() if keep(r)]
            assert sorted(got.column("n").to_pylist()) == want, (dialect, f, condition)


def test_options_name_files_never_secrets(tmp_path: Path) -> None:
    from flight.spark._options import decode_options

    token = tmp_path / "token"
    token.write_text("s3cret\n")
    spec = decode_options({"coordinator": "grpc://127.0.0.1:1", "sql": "select 1", "token_file": str(token)})
    assert spec.security_files.token_file == str(token) and "s3cret" not in repr(spec)  # type: ignore[union-attr]
    with pytest.raises(PlanError, match="grpc:// or grpc\\+tls:// URL"):
        decode_options({"coordinator": "http://x", "sql": "select 1"})
