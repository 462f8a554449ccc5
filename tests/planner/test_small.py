"""Small queries run as one task on one worker (``flight.planner.small``, ``ExecOptions.small_query_bytes``).

The scans' bytes are estimated from the Parquet footers' row counts and the widths of the columns
read; at most ``small_query_bytes`` (64 MiB by default), the query is one stage of one task, and
a plan run again keeps its worker unless it is busier (``flight.coordinator.placement``). Answers are compared with DuckDB's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import flight
from flight.planner import small
from flight.planner.optimize import push_filters
from flight.planner.small import hands_off, many_groups, one_host, reads_twice, scan_bytes
from flight.sources.feed import FeedContext, WorkUnitFeedProvider
from flight.sources.providers import FileListProvider

URLS = ["grpc://127.0.0.1:1", "grpc://127.0.0.1:2"]
NOTE = "it runs as one task on one worker"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    root = tmp_path_factory.mktemp("small")
    n = 20_000
    facts = pa.table({"k": pa.array([i % 500 for i in range(n)], pa.int64()), "v": pa.array(range(n), pa.int64()),
                      "note": pa.array([f"note {i % 77}" for i in range(n)])})
    dims = pa.table({"dk": pa.array(range(500), pa.int64()), "name": pa.array([f"name {i % 13}" for i in range(500)])})
    out: dict[str, list[Path]] = {"facts": [], "dims": []}
    for name, table, parts in (("facts", facts, 4), ("dims", dims, 2)):
        for i in range(parts):
            path = root / f"{name}{i}.parquet"
            pq.write_table(table.slice(i * table.num_rows // parts, table.num_rows // parts), path)
            out[name].append(path)
    return out


def _query(files: dict[str, list[Path]]) -> flight.Query:
    catalog = flight.Catalog({name: flight.read_parquet(paths) for name, paths in files.items()})
    return flight.sql("SELECT name, count(*) AS n, sum(v) AS s FROM facts JOIN dims ON k = dk GROUP BY name ORDER BY name", catalog)


def test_a_small_query_is_one_task_and_a_larger_one_is_not(files: dict[str, list[Path]]) -> None:
    q = _query(files)
    read = scan_bytes(q.node)
    assert read is not None and 0 < read < 64 << 20
    one = flight.DistributedExec(q, URLS)
    assert [s.task_count for s in one.plan.stages] == [1] and any(NOTE in r for r in one.plan.rewrites), one.explain()
    # One task reads each file list through one feed partition (FileListProvider deals its files over any number).
    assert [f.partitions for f in one.plan.stages[0].feeds] == [1, 1], one.explain()
    # Above the limit (here: below what the scans read), or with the rule off, the stages are cut as before.
    for options in ({"small_query_bytes": int(read) - 1, "one_host_query_bytes": 0}, {"small_query_bytes": 0}):
        many = flight.DistributedExec(q, URLS, **options)
        assert len(many.plan.stages) > 1 and not any(NOTE in r for r in many.plan.rewrites), many.explain()


def test_workers_on_one_host_run_a_query_that_hands_rows_between_stages_as_one_task(files: dict[str, list[Path]]) -> None:
    q = _query(files)
    read = scan_bytes(q.node)
    assert read is not None
    above = {"small_query_bytes": int(read) - 1}  # not small by the fleet's rule
    split = flight.DistributedExec(q, URLS, **above, one_host_query_bytes=0)
    assert len(split.plan.stages) > 1 and hands_off(split.plan), split.explain()
    whole = flight.DistributedExec(q, URLS, **above)  # both URLs name 127.0.0.1
    assert [s.task_count for s in whole.plan.stages] == [1] and "share one host" in whole.plan.rewrites[0], whole.explain()
    for other in (["grpc://10.0.0.1:1", "grpc://10.0.0.2:1"], URLS[:1]):  # two hosts; one worker
        assert not one_host(other)
        assert len(flight.DistributedExec(q, other, **above).plan.stages) > 1 or len(other) == 1
    # Larger than one_host_query_bytes, or with small queries off altogether: split.
    for options in ({**above, "one_host_query_bytes": int(read) - 1}, {"small_query_bytes": 0}):
        assert len(flight.DistributedExec(q, URLS, **options).plan.stages) > 1


def test_a_plan_that_computes_a_cte_twice_or_only_gathers_many_groups_keeps_its_split(
    files: dict[str, list[Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    catalog = flight.Catalog({name: flight.read_parquet(paths) for name, paths in files.items()})
    off = {"small_query_bytes": 0}
    gather = flight.DistributedExec(flight.sql("SELECT k, v FROM facts WHERE v < 100 ORDER BY v", catalog), URLS, **off)
    assert [s.output_mode for s in gather.plan.stages] == ["gather", "head"] and not hands_off(gather.plan), gather.explain()
    grouped = flight.sql("SELECT k, sum(v) AS t FROM facts GROUP BY k", catalog).node  # ~2,000 groups estimated
    assert not many_groups(grouped)
    monkeypatch.setattr(small, "SPLIT_GROUPS", 100)  # as if they were many: a split halves each task's groups
    assert many_groups(grouped)
    twice = flight.sql("WITH s AS (SELECT k, sum(v) AS t FROM facts GROUP BY k) "
                       "SELECT a.k, a.t, b.t AS u FROM s AS a JOIN s AS b ON a.k = b.k + 1", catalog)
    assert reads_twice(push_filters(twice.node))
    scanned_twice = flight.sql("SELECT a.k FROM facts AS a JOIN facts AS b ON a.k = b.v", catalog)
    assert not reads_twice(push_filters(scanned_twice.node))  # a table read twice costs the same split or not
    # On one host, above small_query_bytes: the CTE's query keeps its split, the other is one task.
    for q, tasks in ((twice, None), (scanned_twice, 1)):
        ex = flight.DistributedExec(q, URLS, small_query_bytes=1)
        assert (len(ex.plan.stages) == 1) == (tasks == 1), ex.explain()


@pytest.mark.slow
def test_one_host_queries_answer_as_duckdb(cluster: flight.LocalCluster, files: dict[str, list[Path]]) -> None:
    listed = {name: ", ".join(f"'{p}'" for p in paths) for name, paths in files.items()}
    want = duckdb.sql(f"SELECT name, count(*) AS n, sum(v) AS s FROM read_parquet([{listed['facts']}]) "
                      f"JOIN read_parquet([{listed['dims']}]) ON k = dk GROUP BY name ORDER BY name").arrow().read_all()
    for one_host_bytes in (1 << 30, 0):
        ex = flight.DistributedExec(_query(files), cluster.urls, small_query_bytes=1, one_host_query_bytes=one_host_bytes)
        assert ex.to_table().to_pylist() == want.to_pylist()
        assert ex.metrics is not None and (len(ex.metrics.tasks) == 1) == bool(one_host_bytes)


class _Listing(WorkUnitFeedProvider):
    """Files discovered as the query runs: how many rows they hold is not known when it is planned."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths

    def partitions(self) -> int:
        return 1

    def feed(self, partition: int, ctx: FeedContext) -> Iterator[object]:
        for path in self.paths:
            yield from FileListProvider([str(path)]).file_units(str(path))


class _Fixed(_Listing):
    """Partition ``p`` is file ``p``: a provider that does not deal its units over however many partitions."""

    def partitions(self) -> int:
        return len(self.paths)

    def feed(self, partition: int, ctx: FeedContext) -> Iterator[object]:
        path = self.paths[partition]
        yield from FileListProvider([str(path)]).file_units(str(path))


def test_one_task_keeps_the_partitions_of_a_provider_that_does_not_deal_its_units(
    cluster: flight.LocalCluster, files: dict[str, list[Path]]
) -> None:
    schema = pq.read_schema(files["facts"][0])
    q = flight.read_parquet(_Fixed(files["facts"]), schema=schema).aggregate([], n=flight.agg.count("v"), s=flight.agg.sum("v"))
    ex = flight.DistributedExec(q, cluster.urls[:1])
    assert [f.partitions for st in ex.plan.stages for f in st.feeds] == [4], ex.explain()
    listed = ", ".join(f"'{p}'" for p in files["facts"])
    assert ex.to_table().to_pylist() == duckdb.sql(f"SELECT count(v) AS n, sum(v) AS s FROM read_parquet([{listed}])").arrow().read_all().to_pylist()


def test_a_scan_of_unknown_size_is_never_small(files: dict[str, list[Path]]) -> None:
    schema = pq.read_schema(files["facts"][0])
    q = flight.read_parquet(_Listing(files["facts"]), schema=schema).aggregate(["k"], s=flight.agg.sum("v"))
    assert scan_bytes(q.node) is None
    assert not any(NOTE in r for r in flight.DistributedExec(q, URLS).plan.rewrites)


def test_small_queries_answer_as_duckdb_a_plan_run_again_keeps_its_worker_and_runs_at_once_spread(
    cluster: flight.LocalCluster, files: dict[str, list[Path]]
) -> None:
    """The same plan run again goes back to the worker that ran it (its memos and its DuckDB are warm there:
    ``flight.coordinator.placement``); two of its executions at once take two workers."""
    listed = {name: ", ".join(f"'{p}'" for p in paths) for name, paths in files.items()}
    want = duckdb.sql(f"SELECT name, count(*) AS n, sum(v) AS s FROM read_parquet([{listed['facts']}]) "
                      f"JOIN read_parquet([{listed['dims']}]) ON k = dk GROUP BY name ORDER BY name").arrow().read_all()
    query = _query(files)
    used = []
    for _ in range(4):
        ex = flight.DistributedExec(query, cluster.urls)
        assert ex.to_table().to_pylist() == want.to_pylist()
        assert ex.metrics is not None and len(ex.metrics.tasks) == 1
        used.append(ex.metrics.tasks[0].worker_url)
    assert len(set(used)) == 1, used  # run again, one after the other: the same worker each time
    first, second = flight.DistributedExec(query, cluster.urls), flight.DistributedExec(query, cluster.urls)
    readers = [first.execute(), second.execute()]  # both launched before either is read
    for reader in readers:
        assert reader.read_all().to_pylist() == want.to_pylist()
    at_once = {url for ex in (first, second) for urls in ex.bound.values() for url in urls}
    assert len(at_once) == 2, at_once  # running at once: the second gave way to the idle worker


def test_a_text_planned_again_has_the_same_plan_key_and_another_text_another(files: dict[str, list[Path]]) -> None:
    """The key a plan's start is chosen by (``placement.plan_key``) is its encoded operators: a benchmark or a dashboard
    plans its text anew each run (over the catalog it keeps), and each run must find the worker that ran it before."""
    from flight.coordinator.placement import plan_key

    catalog = flight.Catalog({name: flight.read_parquet(paths) for name, paths in files.items()})  # a session's, kept
    text = "SELECT name, count(*) AS n, sum(v) AS s FROM facts JOIN dims ON k = dk GROUP BY name ORDER BY name"
    keys = [plan_key(flight.DistributedExec(flight.sql(text, catalog), URLS).plan.stages) for _ in range(3)]
    assert len(set(keys)) == 1
    other = flight.sql("SELECT name, count(*) AS n FROM facts JOIN dims ON k = dk GROUP BY name ORDER BY name", catalog)
    assert plan_key(flight.DistributedExec(other, URLS).plan.stages) != keys[0]
