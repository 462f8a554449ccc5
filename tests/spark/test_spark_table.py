"""A Spark DataFrame as a table of a flight query (``flight.spark.table``): its partitions streamed by
Spark's tasks into the flight tasks that read them (input calls, docs/protocol.md section 16), joined
with Parquet that the workers read, the result back as a DataFrame. Every answer is compared with
Spark SQL's own on the same data (the oracle), and every test ends with the workers holding no task.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support import running_tasks, tpch_test_files, wait_until

import flight
import flight.spark as fs
from benchmarks.tpch_queries import decimals_as_numbers
from flight.errors import PlanError

pyspark = pytest.importorskip("pyspark", reason="the Spark tests need the spark extra: pip install -e '.[dev,spark]'")

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SF = 0.05  # lineitem: 300K rows


@pytest.fixture(scope="module")
def files() -> dict[str, list[Path]]:
    return tpch_test_files(SF)


def rows(df: Any) -> list[tuple[Any, ...]]:
    table = decimals_as_numbers(df.toArrow())
    return sorted(tuple(round(v, 6) if isinstance(v, float) else v for v in r.values()) for r in table.to_pylist())


def test_a_million_row_dataframe_joined_with_parquet_lineitem_equals_sparks_own_join(spark, cluster, files) -> None:  # type: ignore[no-untyped-def]
    # 1M rows made by Spark (not a file the workers could read), 6 partitions; the join and the aggregate
    # run on the flight workers; Spark SQL runs the same statement on the same DataFrame and files.
    events = spark.range(1_000_000, numPartitions=6).selectExpr(  # `a.b`: a name Spark would read as a struct field
        "id AS `a.b`", "id % 60000 + 1 AS orderkey", "cast(id % 7 AS int) AS kind", "concat('e', cast(id % 13 AS string)) AS tag")
    lineitem = spark.read.parquet(*[str(p) for p in files["lineitem"]])
    text = (
        "SELECT e.kind, count(*) AS n, sum(l.l_quantity) AS qty, count(DISTINCT e.tag) AS tags, max(e.`a.b`) AS top "
        "FROM events e JOIN lineitem l ON e.orderkey = l.l_orderkey WHERE l.l_returnflag = 'R' GROUP BY e.kind"
    )
    tables = {"events": fs.table(events, name="events"), "lineitem": str(files["lineitem"][0].parent)}
    with fs.start_read(spark, flight.sql(text, tables, dialect="spark"), cluster.urls) as read:
        got = rows(read.df)
        assert rows(read.df) == got  # a second action reads the retained result, the DataFrame is not sent again
    events.createOrReplaceTempView("events")
    lineitem.createOrReplaceTempView("lineitem")
    assert got == rows(spark.sql(text)) and len(got) == 7
    wait_until(lambda: running_tasks(cluster.urls) == 0, 15.0, "the query's tasks to be freed")


def test_a_dataframe_alone_comes_back_whole_through_flight_sql(spark, cluster) -> None:  # type: ignore[no-untyped-def]
    # One stage: the input tasks are the head. Types Spark and Arrow both have (decimal, date, string, null).
    df = spark.createDataFrame(
        [(i, f"név-{i}" if i % 5 else None, i * 1.5) for i in range(5000)], "id long, name string, x double"
    ).selectExpr("id", "name", "cast(x AS decimal(12, 2)) AS price", "date_add(DATE'2024-01-01', cast(id % 400 AS int)) AS day")
    query = flight.sql("SELECT * FROM t WHERE id % 2 = 0", {"t": fs.table(df, partitions=3)})
    with fs.start_read(spark, query, cluster.urls) as read:
        assert read.partitions == 3
        assert rows(read.df) == rows(df.where("id % 2 = 0"))
    wait_until(lambda: running_tasks(cluster.urls) == 0, 15.0, "the query's tasks to be freed")


def test_a_failing_dataframe_fails_the_query_naming_both_sides(spark, cluster) -> None:  # type: ignore[no-untyped-def]
    # Spark fails computing a partition: the query fails with Spark's error and the input it was sending.
    # (The query uses ``ok``: a column it does not use is not sent, and Spark would not compute it.)
    bad = spark.range(100, numPartitions=2).selectExpr("id", "assert_true(id < 90, 'row 90 is refused') AS ok")
    with pytest.raises(Exception) as raised:
        with fs.start_read(spark, flight.sql("SELECT count(ok) AS n FROM bad", {"bad": fs.table(bad, name="bad")}), cluster.urls) as read:
            read.df.collect()
    text = str(raised.value)
    assert "row 90 is refused" in text and "'bad'" in text and "Traceback" not in text, text
    wait_until(lambda: running_tasks(cluster.urls) == 0, 30.0, "the failed query's tasks to be freed")


def test_a_dataframe_used_twice_or_read_once_is_refused_at_planning(spark, cluster) -> None:  # type: ignore[no-untyped-def]
    t = fs.table(spark.range(10), name="t")
    with pytest.raises(PlanError, match="its rows are sent once"):
        fs.sql(spark, "SELECT a.id FROM t a JOIN t b ON a.id = b.id + 1", {"t": t}, cluster.urls)
    with pytest.raises(PlanError, match="retain must be above 0"):
        fs.read(spark, flight.sql("SELECT * FROM t", {"t": t}), cluster.urls, retain=0)
    assert running_tasks(cluster.urls) == 0


def test_the_input_stage_is_planned_one_task_per_partition(spark) -> None:  # type: ignore[no-untyped-def]
    # Only the columns the query uses are sent: `x.y` and `twice` stay in Spark.
    df = spark.range(50, numPartitions=5).selectExpr("id", "id * 2 AS twice", "id AS `x.y`")
    q = flight.sql("SELECT id, count(*) AS n FROM t GROUP BY id", {"t": fs.table(df, name="t")})
    text = flight.DistributedExec(q, ["grpc://127.0.0.1:1", "grpc://127.0.0.1:2"]).explain()
    assert "5 tasks, one per partition" in text, text
    assert "InputCall[spark:t" in text and "5 partitions, id]" in text, text


def test_two_dataframes_join_each_other_on_the_workers(spark, cluster) -> None:  # type: ignore[no-untyped-def]
    left = spark.range(20_000, numPartitions=4).selectExpr("id", "id % 97 AS g")
    right = spark.range(97, numPartitions=2).selectExpr("id AS g", "concat('group-', cast(id AS string)) AS label")
    text = "SELECT r.label, count(*) AS n, max(l.id) AS top FROM l JOIN r ON l.g = r.g WHERE l.id % 3 = 0 GROUP BY r.label"
    tables = {"l": fs.table(left, name="left"), "r": fs.table(right, name="right")}
    with fs.start_read(spark, flight.sql(text, tables), cluster.urls) as read:
        got = rows(read.df)
    left.createOrReplaceTempView("l")
    right.createOrReplaceTempView("r")
    assert got == rows(spark.sql(text)) and len(got) == 97
    wait_until(lambda: running_tasks(cluster.urls) == 0, 15.0, "the query's tasks to be freed")


def test_a_query_failing_on_the_workers_fails_the_spark_job_naming_both(spark, cluster) -> None:  # type: ignore[no-untyped-def]
    # The flight side fails (a value that is no integer): the query fails, and so does the Spark job that
    # meets it, with the worker's reason.
    words = spark.range(2000, numPartitions=2).selectExpr("id", "CASE WHEN id = 1500 THEN 'many' ELSE cast(id AS string) END AS s")
    query = flight.sql("SELECT sum(CAST(s AS INTEGER)) AS total FROM w", {"w": fs.table(words, name="words")})
    with pytest.raises(Exception) as raised:
        with fs.start_read(spark, query, cluster.urls) as read:
            read.df.collect()
    # Which side reports it depends on timing: the sending job (its tasks refused: the error names the DataFrame),
    # or, when the cast fails after the last row was sent, Spark's read of the result (naming the flight query).
    text = str(raised.value)
    assert "Conversion Error" in text and "'many'" in text, text
    assert "DataFrame 'words'" in text or "of flight query" in text, text
    wait_until(lambda: running_tasks(cluster.urls) == 0, 30.0, "the failed query's tasks to be freed")


def test_a_dataframe_broadcast_into_anothers_stage_is_sent_first(spark, cluster) -> None:  # type: ignore[no-untyped-def]
    # The scalar subquery's aggregate over r is broadcast into the stage reading l: r's rows must be sent
    # before l's (stage order), or l's tasks would wait for the broadcast while l's senders wait for them.
    left = spark.range(30_000, numPartitions=3).selectExpr("id", "id % 50 AS g")
    right = spark.range(40, numPartitions=2).selectExpr("id AS g")
    text = "SELECT count(*) AS n, sum(id) AS s FROM l WHERE g = (SELECT max(g) FROM r)"
    with fs.start_read(spark, flight.sql(text, {"l": fs.table(left, name="l"), "r": fs.table(right, name="r")}), cluster.urls) as read:
        got = rows(read.df)
    left.createOrReplaceTempView("l")
    right.createOrReplaceTempView("r")
    assert got == rows(spark.sql(text))
    wait_until(lambda: running_tasks(cluster.urls) == 0, 15.0, "the query's tasks to be freed")


def test_a_query_reading_a_dataframe_is_refused_where_nothing_sends_it(spark, cluster) -> None:  # type: ignore[no-untyped-def]
    query = flight.sql("SELECT count(*) AS n FROM t", {"t": fs.table(spark.range(10), name="t")})
    for run in (lambda: flight.DistributedExec(query, cluster.urls).to_table(),
                lambda: flight.DistributedExec(query, cluster.urls).start_detached(60),
                lambda: fs.plan_options(query)):
        with pytest.raises(PlanError, match="run it with flight.spark.read or flight.spark.sql"):
            run()
    assert running_tasks(cluster.urls) == 0
