"""A broadcast build's keys kept by a scan below another join (flight/engine/duck/keyfilter.py).

``resolve`` is checked on real Parquet footers and a real DuckDB table: the filter where the build holds few of
the keys the footers allow, ``TRUE`` where it holds most. The queries whose co-located stages get it (TPC-H Q3:
customers of one segment, broadcast above orders ⋈ lineitem; Q7: every customer, so no filter) run on two
workers on their own addresses and answer as DuckDB does; each task's decision reaches explain().
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support import tpch_test_files

import flight
from benchmarks.tpch_queries import TABLES, compare, decimals_as_numbers
from benchmarks.tpch_sql import ORDERED, SQL
from flight.engine.duck.keyfilter import KeyFilter, build_source, resolve

SPLIT = {"small_query_bytes": 0, "one_host_query_bytes": 0, "replicate_rows": 0}  # two tasks a stage; broadcasts are stages


@pytest.fixture()
def keyed(tmp_path: Path) -> str:
    path = tmp_path / "orders.parquet"
    pq.write_table(pa.table({"o_custkey": pa.array(range(1, 1001), pa.int64())}), path, row_group_size=250)
    return str(path)


def _resolved(keys: int, path: str) -> str:
    cur = duckdb.connect()
    cur.execute(f"CREATE TEMP TABLE __flight_source_3_table AS SELECT range + 1 AS c_custkey FROM range({keys})")
    kept = KeyFilter("__flight_keys_1__", "plan.root.scan", "o_custkey", build_source("(SELECT * FROM __flight_source_3) AS r") or "",
                     "c_custkey")
    text, builds, notes = resolve(cur, [kept], {"plan.root.scan": [path]}, "SELECT * FROM x WHERE __flight_keys_1__",
                                  [("b", "SELECT 1 WHERE __flight_keys_1__")])
    assert builds[0][1] == text.replace("SELECT * FROM x", "SELECT 1")
    assert len(notes) == 1 and notes[0].startswith("'o_custkey' " + ("kept" if "IN" in text else "not kept"))
    return text


def test_a_build_of_few_of_the_footers_keys_filters_the_scan(keyed: str) -> None:
    assert _resolved(100, keyed) == 'SELECT * FROM x WHERE "o_custkey" IN (SELECT "c_custkey" FROM __flight_source_3_table)'


def test_a_build_of_most_keys_filters_nothing(keyed: str) -> None:
    assert _resolved(900, keyed) == "SELECT * FROM x WHERE TRUE"


def test_a_scan_without_integer_footers_is_not_filtered(tmp_path: Path) -> None:
    path = tmp_path / "names.parquet"
    pq.write_table(pa.table({"o_custkey": ["a", "b"]}), path)
    assert _resolved(1, str(path)) == "SELECT * FROM x WHERE TRUE"


@pytest.fixture(scope="module")
def two_hosts(data_roots: list[Path]) -> Iterator[flight.LocalCluster]:
    with flight.LocalCluster(2, hosts=["127.0.0.2", "127.0.0.3"], data_roots=data_roots, worker_args=["--engine", "duckdb"]) as c:
        yield c


@pytest.mark.parametrize("q", [3, 5, 7, 8, 10])
def test_queries_whose_broadcast_keys_may_filter_a_scan_answer_as_duckdb(two_hosts: flight.LocalCluster, q: int) -> None:
    files = tpch_test_files(0.1)  # four files a table: orders and lineitem co-located by key ranges
    catalog = flight.Catalog({t: flight.read_parquet([str(p) for p in files[t]]) for t in TABLES})
    oracle = duckdb.connect()
    for t in TABLES:
        oracle.sql(f"create view {t} as select * from read_parquet({[str(p) for p in files[t]]})")
    ex = flight.DistributedExec(flight.sql(SQL[q], catalog), two_hosts.urls, **SPLIT)
    got = ex.to_table()
    assert compare(got, decimals_as_numbers(oracle.sql(SQL[q]).to_arrow_table()), ORDERED.get(q)) is None
    notes = [n for t in ex.metrics.tasks for n in t.notes]  # explain(analyze=True) prints them under each task
    if q == 3:  # a fifth of the customers (one market segment), broadcast above orders ⋈ lineitem: orders keeps their keys
        assert len(notes) == 2 and all(n.startswith("'o_custkey' kept to a broadcast's 'c_custkey' keys") for n in notes)
        assert "    note: 'o_custkey' kept to a broadcast's 'c_custkey' keys" in ex.explain(analyze=True)
    else:  # every customer, or no such join: nothing kept
        assert not [n for n in notes if " kept " in n and "not kept" not in n]


def test_a_scan_whose_footers_cannot_be_read_is_not_filtered(tmp_path: Path) -> None:
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"not parquet at all")
    assert _resolved(1, str(path)) == "SELECT * FROM x WHERE TRUE"
