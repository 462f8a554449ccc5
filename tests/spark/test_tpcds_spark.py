"""All 99 TPC-DS queries through ``flight.spark.sql``, each DataFrame's rows compared with DuckDB's answer.

Why: tests/sql/test_tpcds.py reads results with flight-exec's own client; a Spark user gets a DataFrame
whose partitions Spark's tasks read from the workers (the ``flight`` data source), the rows converted
to Spark's types and back (``toArrow``). The texts are DuckDB's dialect, so ``dialect="duckdb"``
(``flight.spark.sql`` defaults to Spark's). The workers are two of this module's own, allowed to read
the data's directory alone.

The 99 run one after another in one Spark session, as a notebook runs them: ``flight.spark.sql`` with its
default ``retain`` (600 s), each DataFrame dropped once read. Between queries the workers' ``info`` must
show no task computing and no source thread taken: a kept result holds only its bytes (issue 41; before,
the kept outputs held the workers' task slots and a session waited for capacity from the 8th query at SF
0.1, the 85th at SF 0.01). At the end, with every DataFrame gone, the kept results must be released
(``flight/spark/_kept.py``). Nothing is normalised: Spark keeps the values and the types flight-exec gives
(decimals, dates, integers, strings).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest
from support import running_tasks, wait_until, worker_info
from tpcds_support import QUERIES, SF, answer, catalog, data_root, difference, ordered, texts

import flight
import flight.spark as fs
from flight.spark._kept import kept as fs_kept

pytest.importorskip("pyspark", reason="the Spark tests need the spark extra: pip install -e '.[dev,spark]'")

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture(scope="module")
def workers() -> Iterator[flight.LocalCluster]:
    with flight.LocalCluster(2, data_roots=[data_root()]) as c:
        yield c


@pytest.mark.parametrize("n", QUERIES, ids=lambda n: f"q{n:02d}")
def test_tpcds_through_spark_matches_duckdb(n: int, spark: Any, workers: flight.LocalCluster) -> None:
    text = texts()[n]
    got = fs.sql(spark, text, flight.Catalog(catalog()), workers.urls, dialect="duckdb").toArrow()  # the DataFrame: dropped
    why = difference(got, answer(n), ordered(text))
    assert why is None, f"TPC-DS q{n:02d} at SF {SF}, flight.spark.sql: {why}"
    wait_until(lambda: computing(workers.urls) == 0, 15.0, f"q{n:02d}'s tasks to end their computation once read")
    for url in workers.urls:
        load = worker_info(url).load
        assert load.source_threads == 0 and load.queued_tasks == 0, f"after q{n:02d}, {url}: {load}"


def computing(urls: list[str]) -> int:
    """Tasks still computing: running, less the outputs kept for re-reads (which hold only their bytes)."""
    return sum(i.running_tasks - i.load.kept_outputs for i in map(worker_info, urls))


def test_the_sessions_kept_results_are_released_once_no_dataframe_can_read_them(
    spark: Any, workers: flight.LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run after the 99 (same module, same session): every DataFrame is gone, so the JVM's next collection
    clears the reads' plans and the kept results are let go (``_kept.GC_EVERY_S`` + a poll). The watcher asks
    the JVM for that collection every 2 s here, not every 30 (its thread reads the period each round): the wait
    for the next one was 30 of this test's 34 s in CI."""
    monkeypatch.setattr(fs._kept, "GC_EVERY_S", 2.0)
    gc.collect()
    # Both, polled together: the watcher releases a query's tasks and then forgets it, so the workers can be
    # seen empty a moment before the registry is (a CI run on 2026-12-05 read 1 there).
    wait_until(lambda: running_tasks(workers.urls) == 0 and fs_kept() == 0, 120.0,
               "the kept results of the collected DataFrames to be released")
    assert running_tasks(workers.urls) == 0 and fs_kept() == 0
