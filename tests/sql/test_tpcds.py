"""All 99 TPC-DS queries through ``flight.sql``, each answer compared with DuckDB's, every way a plan runs.

The ways: ``run_local``; one, two and three workers with the default plans (on one host, small queries run as
one task); and the same workers with every plan forced into stages (``one_host_query_bytes=0,
small_query_bytes=0``: scans split by file, joins shuffled or broadcast, aggregates merged across tasks).
The Flight SQL service (ADBC) and ``flight.spark.sql`` run them in tests/service and tests/spark.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tpcds_support import QUERIES, SF, answer, catalog, data_root, difference, ordered, texts

import flight

WAYS = ["local", "1w", "1w-staged", "2w", "2w-staged", "3w", "3w-staged"]

LIMITS: dict[tuple[str, int], str] = {}
"""Ways a query cannot run yet, and why: not run (the worker would wait for capacity that never comes, 300 s)."""


@pytest.fixture(scope="module")
def clusters() -> Iterator[dict[int, flight.LocalCluster]]:
    """Clusters of 1, 2 and 3 workers, started when first asked for, confined to the data's directory."""
    started: dict[int, flight.LocalCluster] = {}

    class Lazy(dict[int, flight.LocalCluster]):
        def __missing__(self, n: int) -> flight.LocalCluster:
            c = flight.LocalCluster(n, data_roots=[data_root()]).__enter__()
            started[n] = c
            self[n] = c
            return c

    try:
        yield Lazy()
    finally:
        for c in started.values():
            c.__exit__(None, None, None)


def run(way: str, text: str, clusters: dict[int, flight.LocalCluster]) -> flight.Query:
    q = flight.sql(text, flight.Catalog(catalog()))
    if way == "local":
        return flight.run_local(q).read_all()
    options = {"one_host_query_bytes": 0, "small_query_bytes": 0} if way.endswith("staged") else {}
    return flight.DistributedExec(q, clusters[int(way[0])].urls, **options).to_table()


CASES = [
    pytest.param(way, n, id=f"q{n:02d}-{way}", marks=[pytest.mark.xfail(reason=LIMITS[way, n], run=False)] if (way, n) in LIMITS else [])
    for way in WAYS
    for n in QUERIES
]


@pytest.mark.slow
@pytest.mark.parametrize(("way", "n"), CASES)
def test_tpcds_query_matches_duckdb(way: str, n: int, clusters: dict[int, flight.LocalCluster]) -> None:
    text = texts()[n]
    got = run(way, text, clusters)
    why = difference(got, answer(n), ordered(text))
    assert why is None, f"TPC-DS q{n:02d} at SF {SF}, {way}: {why}"


def test_the_99_texts_are_all_there() -> None:
    assert sorted(texts()) == QUERIES
    assert all(t.lower().lstrip().startswith(("select", "with", "(")) for t in texts().values())
