"""The concurrency soak (``benchmarks/micro/concurrency.py``) at a small size: every concurrent query exact.

Same code path as the benchmark (``run``: DuckDB's answers, a 2-worker
``LocalCluster``, all queries released at once from one thread each), with 150
queries over TPC-H SF 0.01 (about 10 s on 2 cores). 150, not fewer: at SF 0.01
a worker whose thread pools starve under many concurrent tasks hangs somewhere
between 100 and 120 queries on a 2-core machine, and 40 would pass. A hang is
bounded by the soak's own deadlines (then the workers are stopped, which frees
the stuck queries), so the test fails with the failure reasons instead of hanging.
"""

from __future__ import annotations

import pytest
from support import tpch_test_files

from benchmarks.micro.concurrency import CASES, run

QUERIES = 150


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_concurrent_mixed_queries_are_all_exact() -> None:
    files = tpch_test_files(0.01)
    report = run(files, queries=QUERIES, workers=2, query_deadline=60, deadline=150)
    assert {o.case for o in report.outcomes} == {c.name for c in CASES}  # every kind of query ran
    exact = report.exact
    assert exact == QUERIES, f"{exact}/{QUERIES} concurrent queries exact; not exact, by reason:\n{report.summary()}"
    assert report.peak_rss_bytes is None or report.peak_rss_bytes > 0
