"""PySpark integration on a real local SparkSession and real workers.

The session's SparkSession (``spark``, tests/conftest.py: one JVM); the workers are the session's
``cluster`` (two flight-worker processes). TPC-H data is the small scale factor
the TPC-H tests use (``.bench-cache/tpch``, made once by ``tpchgen-cli``);
answers are checked against Spark SQL on the same input or against DuckDB.
"""

from __future__ import annotations

import datetime as dt
import pickle
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from spark_support import dead_url
from support import running_tasks, tpch_test_files, wait_until

import flight
import flight.spark as fs
from benchmarks.tpch_queries import ORDERED, compare, duckdb_answer, duckdb_connection, query
from benchmarks.tpch_sql import SQL
from flight import agg, col, lit
from flight.errors import PlanError, WorkerUnavailableError
from flight.wire.plan_codec import encode_plan

pyspark = pytest.importorskip("pyspark", reason="the Spark tests need the spark extra: pip install -e '.[dev,spark]'")

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SF = 0.05  # lineitem: 300K rows in 4 files
CUTOFF = dt.date(1998, 9, 2)


@pytest.fixture(scope="module")
def files() -> dict[str, list[Path]]:
    return tpch_test_files(SF)


@pytest.fixture(scope="module")
def lineitem(spark, files):  # type: ignore[no-untyped-def]
    cols = ["l_orderkey", "l_linenumber", "l_quantity", "l_extendedprice", "l_discount", "l_returnflag", "l_shipdate"]
    df = spark.read.parquet(*[str(p) for p in files["lineitem"]]).select(*cols)
    df.createOrReplaceTempView("lineitem")
    return df


def _rows(df) -> pa.Table:  # type: ignore[no-untyped-def]
    return df.toArrow()


def _ids(n: int, partitions: int, spark):  # type: ignore[no-untyped-def]
    return spark.range(0, n, 1, numPartitions=partitions).selectExpr(
        "id", "cast(id % 7 as int) as k", "concat('item-', cast(id % 17 as string)) as s"
    )


IDS_SCHEMA = pa.schema([("id", pa.int64()), ("k", pa.int32()), ("s", pa.string())])


def _simple_stage() -> flight.Query:
    return flight.map_input(IDS_SCHEMA).filter(col("k") > 2).select("s", "id", twice=col("id") * 2)


# ------------------------------------------------------------------ mapInArrow


def test_flight_map_equals_spark_sql(spark, lineitem, cluster: flight.LocalCluster) -> None:  # type: ignore[no-untyped-def]
    stage = (
        flight.map_input(fs.input_schema(lineitem))
        .filter((col("l_shipdate") <= lit(CUTOFF)) & (col("l_quantity").cast(pa.float64()) < 30))
        .select(
            "l_orderkey",
            "l_linenumber",
            revenue=col("l_extendedprice").cast(pa.float64()) * (1 - col("l_discount").cast(pa.float64())),
            flag=col("l_returnflag").lower(),
            ship_year=col("l_shipdate").year(),
        )
    )
    fm = fs.flight_map(stage, cluster.urls)
    assert fm.schema == "`l_orderkey` bigint, `l_linenumber` int, `revenue` double, `flag` string, `ship_year` bigint"
    got = _rows(lineitem.mapInArrow(fm, fm.schema))
    want = _rows(
        spark.sql(
            "SELECT l_orderkey, l_linenumber, CAST(l_extendedprice AS DOUBLE) * (1 - CAST(l_discount AS DOUBLE)) AS revenue, "
            "lower(l_returnflag) AS flag, CAST(year(l_shipdate) AS BIGINT) AS ship_year FROM lineitem "
            "WHERE l_shipdate <= DATE'1998-09-02' AND CAST(l_quantity AS DOUBLE) < 30"
        )
    )
    assert got.num_rows > 100_000
    assert got.schema.equals(want.schema)
    assert compare(got, want) is None


def test_empty_partitions_and_an_aggregate_per_partition(spark, cluster: flight.LocalCluster) -> None:  # type: ignore[no-untyped-def]
    df = _ids(5, 8, spark)  # 8 partitions for 5 rows: some are empty
    got = _rows(df.mapInArrow(fs.flight_map(_simple_stage(), cluster.urls), fs.flight_map(_simple_stage(), cluster.urls).schema))
    assert sorted(got["id"].to_pylist()) == [3, 4]
    per_partition = flight.map_input(IDS_SCHEMA).aggregate([], rows=agg.count_all(), total=agg.sum("id"))
    counts = _rows(fs.map_in_arrow(df, per_partition, cluster.urls))
    assert counts.num_rows == 8  # one row per Spark partition, empty ones included
    assert sum(counts["rows"].to_pylist()) == 5
    assert sum(v or 0 for v in counts["total"].to_pylist()) == 10


def test_a_partition_larger_than_one_arrow_batch(spark, cluster: flight.LocalCluster) -> None:  # type: ignore[no-untyped-def]
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "1000")
    try:
        df = _ids(60_000, 1, spark)  # one partition, 60 input batches
        out = fs.map_in_arrow(df, _simple_stage(), cluster.urls)
        (row,) = out.selectExpr("count(*) AS n", "sum(twice) AS t", "count(distinct s) AS d").collect()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    kept = [i for i in range(60_000) if i % 7 > 2]
    assert (row.n, row.t, row.d) == (len(kept), 2 * sum(kept), 17)


def test_a_worker_error_reaches_the_driver_naming_the_worker(spark, cluster: flight.LocalCluster) -> None:  # type: ignore[no-untyped-def]
    bad = flight.map_input(IDS_SCHEMA).select("id", n=col("s").cast(pa.int64()))  # 'item-3' is no number
    with pytest.raises(Exception) as info:
        fs.map_in_arrow(_ids(100, 2, spark), bad, cluster.urls).collect()
    text = str(info.value)
    assert "TaskFailedError" in text
    assert "Failed to parse string: 'item-" in text  # the worker's own error text
    assert any(f"worker {u}" in text for u in cluster.urls)


def test_a_worker_failing_while_input_still_flows_is_a_task_error(cluster: flight.LocalCluster) -> None:
    # A slow reader: the worker ends the call while input is still being sent, and the upload's
    # broken stream, not the worker's error frame, is what map_batches sees first.
    fm = fs.flight_map(flight.map_input(IDS_SCHEMA).select(n=col("s").cast(pa.int64())), cluster.urls[:1])
    good = pa.record_batch([pa.array(range(5000)), pa.array([1] * 5000, pa.int32()), pa.array(["7"] * 5000)], schema=IDS_SCHEMA)
    bad = good.set_column(2, "s", pa.array(["x"] * 5000))

    def batches() -> Iterator[pa.RecordBatch]:
        yield from [good] * 3
        yield bad
        yield from [good] * 200

    pause = threading.Event()  # never set: wait() is a pause
    with pytest.raises(flight.TaskFailedError, match=r"Failed to parse string: 'x'") as info:
        for _ in fm(batches()):
            pause.wait(0.005)  # a slow consumer: input keeps flowing while it reads
    assert info.value.worker_url == cluster.urls[0]
    assert "Traceback" not in str(info.value)


def test_spark_stopping_early_leaves_its_python_workers_healthy(spark, cluster: flight.LocalCluster) -> None:  # type: ignore[no-untyped-def]
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "500")
    try:
        out = fs.map_in_arrow(_ids(200_000, 2, spark), _simple_stage(), cluster.urls)
        assert len(out.limit(3).collect()) == 3  # Spark stops reading while input still flows
        assert out.count() == sum(1 for i in range(200_000) if i % 7 > 2)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")


def test_abandoning_an_exchange_half_way_is_safe(cluster: flight.LocalCluster) -> None:
    from flight.coordinator.map import map_batches

    plan = encode_plan(_simple_stage().stage_plan())
    batch = pa.record_batch([pa.array(range(5000)), pa.array([5] * 5000, pa.int32()), pa.array(["a"] * 5000)], schema=IDS_SCHEMA)
    for _ in range(30):  # flight.map_batches aborts the process here now and then (see docs/spark.md)
        out = map_batches(plan, iter([batch] * 50), cluster.urls[0])
        next(out)
        out.close()
    wait_until(lambda: running_tasks(cluster.urls) == 0, what="the abandoned tasks to be freed")


def test_a_dead_worker_among_live_ones_is_skipped(spark, cluster: flight.LocalCluster) -> None:  # type: ignore[no-untyped-def]
    workers = [dead_url(), *cluster.urls]
    out = _rows(fs.map_in_arrow(_ids(3000, 6, spark), _simple_stage(), workers))
    assert sorted(out["id"].to_pylist()) == [i for i in range(3000) if i % 7 > 2]


def test_only_dead_workers_is_a_clear_error(spark) -> None:  # type: ignore[no-untyped-def]
    url = dead_url()
    with pytest.raises(Exception) as info:
        fs.map_in_arrow(_ids(10, 1, spark), _simple_stage(), [url], health_timeout=1.0).collect()
    assert "WorkerUnavailableError" in str(info.value)
    assert f"no worker could run the Spark task ({url}" in str(info.value)


def test_output_is_cast_and_ordered_to_the_declared_schema(spark, cluster: flight.LocalCluster) -> None:  # type: ignore[no-untyped-def]
    # Spark takes columns by position: declare them in another order and other types.
    fm = fs.flight_map(_simple_stage(), cluster.urls, schema="twice double, id int, s string")
    rows = _ids(50, 2, spark).mapInArrow(fm, fm.schema).orderBy("id").collect()
    assert [tuple(r) for r in rows[:2]] == [(6.0, 3, "item-3"), (8.0, 4, "item-4")]
    assert fm.schema == "`twice` double, `id` int, `s` string"


def test_a_declared_schema_that_cannot_fit_is_a_clear_error(spark, cluster: flight.LocalCluster) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PlanError, match="declared column 'nope' is not in the output"):
        fs.flight_map(_simple_stage(), cluster.urls, schema="nope int")
    with pytest.raises(PlanError, match="column 's' is string but declared as list"):
        fs.flight_map(_simple_stage(), cluster.urls, schema="s array<int>")
    fm = fs.flight_map(_simple_stage(), cluster.urls, schema="id tinyint")  # fits the type, not every value
    with pytest.raises(Exception) as info:
        _ids(1000, 1, spark).mapInArrow(fm, fm.schema).collect()
    assert "column 'id' is int64 but declared as int8" in str(info.value)


def test_the_closure_is_small_and_holds_no_client(cluster: flight.LocalCluster) -> None:
    from pyspark import cloudpickle

    fm = fs.flight_map(_simple_stage(), cluster.urls)
    data = cloudpickle.dumps(fm)
    assert len(data) < 4096
    again = pickle.loads(data)
    assert again.plan == fm.plan and again.workers == fm.workers
    assert not any(isinstance(v, pa.flight.FlightClient) for v in vars(again).values())
    # Outside Spark it is a plain function of batches (partition 0).
    batch = pa.record_batch([pa.array([1, 5]), pa.array([1, 5], pa.int32()), pa.array(["a", "b"])], schema=IDS_SCHEMA)
    assert pa.Table.from_batches(list(fm(iter([batch])))).to_pylist() == [{"s": "b", "id": 5, "twice": 10}]


def test_flight_map_needs_a_map_stage(cluster: flight.LocalCluster) -> None:
    with pytest.raises(PlanError, match="map_input"):
        fs.flight_map(flight.from_arrow(pa.table({"a": [1]})), cluster.urls)


# ------------------------------------------------------------------ data source


@pytest.fixture(scope="module")
def expected(files: dict[str, list[Path]]) -> dict[int, pa.Table]:
    con = duckdb_connection(files)
    try:
        return {n: duckdb_answer(n, files, con) for n in (1, 3)}
    finally:
        con.close()


@pytest.mark.parametrize("n", [1, 3], ids=lambda n: f"q{n}")
def test_read_a_tpch_query_as_a_dataframe(spark, files, expected, cluster: flight.LocalCluster, n: int) -> None:  # type: ignore[no-untyped-def]
    handle = fs.start_read(spark, query(n, files), cluster.urls)
    assert handle.df.rdd.getNumPartitions() == handle.partitions == len(handle.query.partitions)
    got = _rows(handle.df)
    assert compare(got, expected[n], ORDERED.get(n)) is None
    assert compare(_rows(handle.df), expected[n], ORDERED.get(n)) is None  # a second action: the same rows
    handle.release()
    assert handle.wait(10)  # released: the query ended and freed its tasks
    wait_until(lambda: running_tasks(cluster.urls) == 0, what="the query's tasks to be freed")


def test_read_a_sql_query_as_a_dataframe(spark, files, cluster: flight.LocalCluster) -> None:  # type: ignore[no-untyped-def]
    """flight.sql's query is a Query like any other: the data source reads it (TPC-H Q4's text, against DuckDB)."""
    catalog = flight.Catalog({t: flight.read_parquet([str(p) for p in files[t]]) for t in ("orders", "lineitem")})
    handle = fs.start_read(spark, flight.sql(SQL[4], catalog), cluster.urls)
    con = duckdb_connection(files)
    try:
        assert compare(_rows(handle.df), duckdb_answer(4, files, con), ORDERED.get(4)) is None
    finally:
        con.close()
        handle.release()
    assert handle.wait(10)


def test_read_gives_one_partition_per_head_task(spark, files, cluster: flight.LocalCluster) -> None:  # type: ignore[no-untyped-def]
    q = (
        flight.read_parquet(files["lineitem"])
        .filter(col("l_quantity").cast(pa.float64()) < 5)
        .select("l_orderkey", "l_linenumber", price=col("l_extendedprice").cast(pa.float64()))
    )
    handle = fs.start_read(spark, q, cluster.urls)
    assert handle.partitions == 2 == handle.df.rdd.getNumPartitions()
    (row,) = handle.df.selectExpr("count(*) AS n", "sum(price) AS p").collect()
    con = duckdb_connection(files)
    try:
        ((n, p),) = con.execute("SELECT count(*), sum(CAST(l_extendedprice AS DOUBLE)) FROM lineitem WHERE l_quantity < 5").fetchall()
    finally:
        con.close()
    assert row.n == n and row.p == pytest.approx(p, rel=1e-9)
    handle.release()
    assert handle.wait(10)


def test_a_dead_url_among_live_ones_does_not_fail_read(spark, files, cluster: flight.LocalCluster) -> None:  # type: ignore[no-untyped-def]
    """The launch probes the workers, leaves the dead one out and opens the tasks on the others."""
    handle = fs.start_read(spark, flight.read_parquet(files["orders"]).select("o_orderkey"), [dead_url(), *cluster.urls])
    assert handle.df.count() == sum(pq.ParquetFile(f).metadata.num_rows for f in files["orders"])
    handle.release()


def test_two_actions_on_one_read_see_the_same_rows(spark, files, cluster: flight.LocalCluster) -> None:  # type: ignore[no-untyped-def]
    """The head outputs are retained: a second action (or a retried task) reads them again from the start."""
    with fs.start_read(spark, flight.read_parquet(files["orders"]).select("o_orderkey", "o_totalprice"), cluster.urls) as handle:
        first = sorted(tuple(r) for r in handle.df.collect())
        second = sorted(tuple(r) for r in handle.df.collect())
        assert first == second
        assert len(first) == sum(pq.ParquetFile(f).metadata.num_rows for f in files["orders"])
    wait_until(lambda: running_tasks(cluster.urls) == 0, what="the released query's tasks to be freed")


def test_a_read_once_query_says_why_a_second_read_cannot(spark, cluster: flight.LocalCluster) -> None:  # type: ignore[no-untyped-def]
    df = fs.read(spark, flight.from_arrow(pa.table({"a": [1, 2, 3], "b": ["x", "y", "z"]})), cluster.urls, retain=0)
    assert [tuple(r) for r in df.collect()] == [(1, "x"), (2, "y"), (3, "z")]
    with pytest.raises(Exception) as info:
        df.collect()
    assert "retain=0 each partition can be read once" in str(info.value) and "cache the DataFrame" in str(info.value)
    cached = fs.read(spark, flight.from_arrow(pa.table({"a": [7]})), cluster.urls, retain=0).cache()
    assert cached.count() == 1 and cached.collect()[0].a == 7  # cached: read once, used twice
    cached.unpersist()


def test_closing_an_unread_query_frees_its_tasks(spark, files, cluster: flight.LocalCluster) -> None:  # type: ignore[no-untyped-def]
    with fs.start_read(spark, flight.read_parquet(files["lineitem"]).select("l_orderkey"), cluster.urls) as handle:
        assert running_tasks(cluster.urls) >= 1
    wait_until(lambda: running_tasks(cluster.urls) == 0, what="the closed query's tasks to be freed")
    with pytest.raises(Exception, match="until the query is released"):
        handle.df.count()


def test_the_plan_option_runs_a_one_stage_query_in_the_spark_tasks(spark, files, cluster: flight.LocalCluster) -> None:  # type: ignore[no-untyped-def]
    q = flight.read_parquet(files["lineitem"]).filter(col("l_linenumber") == 1).select("l_orderkey", "l_shipdate")
    options = fs.plan_options(q, tasks=3)
    fs.register(spark)
    df = (
        spark.read.format("flight")
        .options(**options)
        .option("workers", ",".join([dead_url(), *cluster.urls]))
        .load()
    )
    assert df.rdd.getNumPartitions() == 3
    first, second = _rows(df), _rows(df)  # nothing is one-shot here: every action runs the tasks again
    want = pq.read_table(files["lineitem"], columns=["l_orderkey", "l_linenumber", "l_shipdate"])
    want = want.filter(pa.compute.equal(want["l_linenumber"], 1)).select(["l_orderkey", "l_shipdate"])
    assert first.num_rows == second.num_rows == want.num_rows
    assert sorted(first["l_orderkey"].to_pylist()) == sorted(want["l_orderkey"].to_pylist())
    assert first.schema.field("l_shipdate").type == pa.date32()
    wait_until(lambda: running_tasks(cluster.urls) == 0, what="the Spark-driven tasks to be freed")


def test_the_plan_option_alone_runs_a_plan_without_feeds(spark, cluster: flight.LocalCluster) -> None:  # type: ignore[no-untyped-def]
    import base64

    q = flight.from_arrow(pa.table({"a": [1, 2, 3], "b": ["x", "y", "z"]})).filter(col("a") >= 2)
    fs.register(spark)
    plan = base64.b64encode(encode_plan(q.stage_plan())).decode()
    df = spark.read.format("flight").option("plan", plan).option("workers", ",".join(cluster.urls)).load()
    assert [tuple(r) for r in df.collect()] == [(2, "y"), (3, "z")] == [tuple(r) for r in df.collect()]


def test_the_plan_option_refuses_a_multi_stage_query(files) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PlanError, match="flight.spark.read"):
        fs.plan_options(query(1, files), tasks=2)


def test_the_data_source_explains_missing_options(spark) -> None:  # type: ignore[no-untyped-def]
    fs.register(spark)
    with pytest.raises(Exception, match="give options 'coordinator' and 'sql'"):
        spark.read.format("flight").load()


# ------------------------------------------------------------------ feed


def test_a_dataframe_of_files_feeds_a_query(spark, files, cluster: flight.LocalCluster) -> None:  # type: ignore[no-untyped-def]
    paths = spark.createDataFrame([(str(p),) for p in files["lineitem"]], "path string").repartition(3)
    feed = fs.feed_from_dataframe(paths, "path", unit=flight.file_unit)
    schema = pq.read_schema(files["lineitem"][0])
    q = flight.read_parquet(feed, schema=schema).aggregate(["l_returnflag"], n=agg.count_all())
    ex = flight.DistributedExec(q, cluster.urls)
    got = {r["l_returnflag"]: r["n"] for r in ex.to_table().to_pylist()}
    want = pq.read_table(files["lineitem"], columns=["l_returnflag"]).group_by("l_returnflag").aggregate([([], "count_all")])
    assert got == {r["l_returnflag"]: r["count_all"] for r in want.to_pylist()}
    assert ex.metrics is not None and sum(f.units for f in ex.metrics.feeds) == len(files["lineitem"])


def test_objects_in_a_store_read_and_feed_the_same_way(spark, files, data_roots) -> None:  # type: ignore[no-untyped-def]
    """flight.spark.read and feed_from_dataframe with s3:// units: nothing changes on the Spark side."""
    from benchmarks.local_s3 import ACCESS_KEY, SECRET_KEY, local_s3
    from flight.sources.storage import FileSystems, configure_storage, set_filesystems

    pytest.importorskip("moto", reason="needs moto (the dev extra)")
    with local_s3() as s3:
        s3.bucket("flight-spark-tests")
        uris = s3.upload(files["orders"], "flight-spark-tests/orders")
        configure_storage({**s3.fs_options, "s3.access_key": ACCESS_KEY, "s3.secret_key": SECRET_KEY})
        try:
            with flight.LocalCluster(2, data_roots=["s3://flight-spark-tests/orders"], fs_options=s3.fs_options, env=s3.env) as c:
                with fs.start_read(spark, flight.read_parquet(uris).select("o_orderkey"), c.urls) as handle:
                    keys = sorted(r.o_orderkey for r in handle.df.collect())
                assert keys == sorted(pq.read_table(files["orders"], columns=["o_orderkey"])["o_orderkey"].to_pylist())
                feed = fs.feed_from_dataframe(spark.createDataFrame([(u,) for u in uris], "uri string"), "uri", unit=flight.file_unit)
                q = flight.read_parquet(feed, schema=pq.read_schema(files["orders"][0])).aggregate([], n=agg.count_all())
                assert flight.DistributedExec(q, c.urls).to_table()["n"].to_pylist() == [len(keys)]
        finally:
            set_filesystems(FileSystems())


def test_the_dataframe_feed_streams_rather_than_collects(spark) -> None:  # type: ignore[no-untyped-def]
    from pyspark.sql.functions import udf

    @udf("string")
    def boom(i):  # type: ignore[no-untyped-def] - no hints: pyspark would take them for a pandas UDF
        if i >= 30:
            raise RuntimeError("later partitions are not computed before they are needed")
        return f"unit-{i}"

    df = spark.range(0, 40, 1, numPartitions=4).select(boom("id").alias("u"))
    provider = fs.feed_from_dataframe(df, "u", prefetch=False)
    stream = provider.feed(0, flight.FeedContext("q", "f", 0, 1))
    assert [next(stream) for _ in range(3)] == [b"unit-0", b"unit-1", b"unit-2"]  # partition 3 never ran
    stream.close()
    with pytest.raises(PlanError, match="no column 'nope'"):
        fs.feed_from_dataframe(df, "nope")


# ------------------------------------------------------------------ example


def test_the_example_pipeline(spark, files, cluster: flight.LocalCluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from examples.spark_pipeline import run_pipeline

    out = tmp_path / "summary"
    run_pipeline(spark, cluster.urls, files["lineitem"], out)
    got = pq.read_table(out).sort_by([("l_returnflag", "ascending"), ("l_linestatus", "ascending"), ("ship_year", "ascending")])
    con = duckdb_connection(files)
    try:
        rel = con.sql(
            """
            SELECT l_returnflag, l_linestatus, CAST(year(l_shipdate) AS INTEGER) AS ship_year,
                   count(*) AS lines,
                   sum(CAST(l_extendedprice AS DOUBLE) * (1 - CAST(l_discount AS DOUBLE))) AS revenue,
                   sum(CAST(l_extendedprice AS DOUBLE) * (1 - CAST(l_discount AS DOUBLE)) * (1 + CAST(l_tax AS DOUBLE))) AS charge,
                   CAST(sum(CASE WHEN l_receiptdate > l_commitdate THEN 1 ELSE 0 END) AS BIGINT) AS late_lines
            FROM lineitem WHERE l_shipdate <= DATE '1998-09-02'
            GROUP BY ALL ORDER BY ALL
            """
        )
        want = (getattr(rel, "to_arrow_table", None) or rel.fetch_arrow_table)()
    finally:
        con.close()
    assert got.num_rows == want.num_rows > 0
    assert compare(got, want, ["l_returnflag", "l_linestatus", "ship_year"]) is None


def test_unavailable_workers_are_described(cluster: flight.LocalCluster) -> None:
    from flight.spark._workers import Workers, describe_workers

    workers = Workers(describe_workers([dead_url()]), health_timeout=1.0)
    with pytest.raises(WorkerUnavailableError, match="no worker could run"):
        next(workers.candidates(0, []))


def test_flight_map_and_read_on_a_secured_cluster(spark) -> None:  # type: ignore[no-untyped-def]
    """TLS and a token end to end; the closure and the options carry only the credentials' paths."""
    with flight.LocalCluster(2, secure=True) as secure:
        files = secure.security_files
        df = spark.range(0, 1_000, numPartitions=2).selectExpr("id", "id % 7 AS k")
        schema = pa.schema([("id", pa.int64()), ("k", pa.int64())])
        stage = flight.map_input(schema).filter(col("k") == 3)
        f = fs.flight_map(stage, secure.urls, security_files=files)
        closure = pickle.dumps(f)
        assert secure.security.token is not None and secure.security.token.encode() not in closure
        got = df.mapInArrow(f, f.schema).toArrow()
        assert sorted(got.column("id").to_pylist()) == [i for i in range(1_000) if i % 7 == 3]

        q = flight.from_arrow(pa.table({"a": list(range(50))})).filter(col("a") >= 40)
        read = fs.read(spark, q, secure.urls, security=secure.security, security_files=files)
        assert sorted(r["a"] for r in read.collect()) == list(range(40, 50))
        without = fs.flight_map(stage, secure.urls, health_timeout=1.0)  # no credentials: refused, clearly
        with pytest.raises(Exception, match="UNAUTHENTICATED|bearer token|no worker could run"):
            df.mapInArrow(without, without.schema).toArrow()
