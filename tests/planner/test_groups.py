"""How many groups an aggregate can make (``flight.planner.groups``): bounds from what its keys can hold.

Each bound is checked against the true number of groups, counted by DuckDB over the same files (a bound
below it would be wrong), and for tightness where the data gives one: a dimension's rows, a footer's range.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from support import write_parts

import flight
import flight.coordinator.exec as exec_module
from flight.plan.relnodes import AggregateNode
from flight.planner import small
from flight.planner.groups import GUESS, aggregate_rows, distinct_bound, group_bound
from flight.planner.optimize import push_filters

FACTS = 20_000
URLS = ["grpc://127.0.0.1:1", "grpc://127.0.0.1:2"]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    root = tmp_path_factory.mktemp("groups")
    day = dt.date(2020, 1, 1)
    facts = pa.table({
        "k": pa.array([i % 500 for i in range(FACTS)], pa.int64()),
        "v": pa.array(range(FACTS), pa.int64()),
        "d": pa.array([day + dt.timedelta(days=i % 900) for i in range(FACTS)], pa.date32()),
        "note": pa.array([f"note {i % 77}" for i in range(FACTS)]),
    })
    dims = pa.table({"dk": pa.array(range(500), pa.int64()), "name": pa.array([f"name {i % 13}" for i in range(500)])})
    return {"facts": write_parts(facts, root, "facts", 4), "dims": write_parts(dims, root, "dims", 2)}


def _catalog(files: dict[str, list[Path]]) -> flight.Catalog:
    return flight.Catalog({name: flight.read_parquet(paths) for name, paths in files.items()})


def _aggregate(text: str, files: dict[str, list[Path]]) -> AggregateNode:
    root = push_filters(flight.sql(text, _catalog(files)).node)
    found = [n for n in root.walk() if isinstance(n, AggregateNode) and n.keys]
    assert len(found) == 1, root.explain_lines()
    return found[0]


def _true_groups(text: str, files: dict[str, list[Path]]) -> int:
    con = duckdb.connect()
    for name, paths in files.items():
        con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet({[str(p) for p in paths]})")
    return len(con.execute(text).fetchall())


@pytest.mark.parametrize(
    ("text", "at_most"),
    [
        # A dimension's name after a join: at most the dimension's rows (and a null), not a tenth of the facts.
        ("SELECT name, count(*) FROM facts JOIN dims ON k = dk GROUP BY name", 501),
        # An integer key: the width of its footers' range (0..499) and a null.
        ("SELECT k, sum(v) FROM facts GROUP BY k", 501),
        # A function of one date column: no more values than the column's range of days (900) and a null.
        ("SELECT extract(year FROM d) AS y, count(*) FROM facts GROUP BY extract(year FROM d)", 901),
        # Two keys multiply; a filter keeps no more values than it reads.
        ("SELECT k, name, count(*) FROM facts JOIN dims ON k = dk WHERE v > 100 GROUP BY k, name", 501 * 501),
        # A string of the facts: their rows bound it.
        ("SELECT note, count(*) FROM facts GROUP BY note", FACTS + 1),
        # The null-extended side of an outer join holds one value more: the null.
        ("SELECT name, count(*) FROM facts LEFT JOIN dims ON k = dk GROUP BY name", 502),
    ],
)
def test_the_bound_holds_every_group_and_is_what_the_keys_allow(files: dict[str, list[Path]], text: str, at_most: float) -> None:
    bound = group_bound(_aggregate(text, files))
    assert bound is not None and bound <= at_most
    assert bound >= _true_groups(text, files)


def test_estimates_take_the_least_of_the_guess_and_the_bound(files: dict[str, list[Path]]) -> None:
    """A whole aggregate: a tenth of its input or its keys' bound; the split's partial one, run by each task on its
    own rows: its input, or every task's groups; an unknown input leaves the bound."""
    node = _aggregate("SELECT name, count(*) FROM facts JOIN dims ON k = dk GROUP BY name", files)
    bound = group_bound(node)
    assert bound is not None
    assert aggregate_rows(node, 1_000_000.0) == bound
    assert aggregate_rows(node, 1_000.0) == 1_000.0 * GUESS
    assert aggregate_rows(node, 1_000_000.0, tasks=4, partial=True) == 4 * bound
    assert aggregate_rows(node, 100.0, tasks=4, partial=True) == 100.0
    assert aggregate_rows(node, None) == bound
    unbounded = _aggregate("SELECT k + v AS s, count(*) FROM facts GROUP BY k + v", files)
    assert aggregate_rows(unbounded, None) is None and aggregate_rows(unbounded, 50.0) == 5.0


def test_a_key_computed_from_two_columns_is_not_bounded(files: dict[str, list[Path]]) -> None:
    node = _aggregate("SELECT k + v AS s, count(*) FROM facts GROUP BY k + v", files)
    assert group_bound(node) is None
    assert distinct_bound(node.input, node.keys[0]) is None


def test_a_query_grouping_by_few_values_is_planned_once_on_one_host(files: dict[str, list[Path]], monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-host rule plans a query's split only to see whether it hands rows off, and only when it may aggregate
    many groups: a tenth of 20,000 rows is past a threshold of 1,000, the 501 names the dimension holds are not."""
    monkeypatch.setattr(small, "SPLIT_GROUPS", 1_000)
    calls: list[int] = []
    real = exec_module.plan_query

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(int(args[1]))  # type: ignore[call-overload]
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(exec_module, "plan_query", counted)
    options = {"small_query_bytes": 1, "one_host_query_bytes": 1 << 30}
    few = flight.sql("SELECT name, count(*) AS n FROM facts JOIN dims ON k = dk GROUP BY name", _catalog(files))
    flight.DistributedExec(few, URLS, **options)
    assert calls == [1]
    calls.clear()
    many = flight.sql("SELECT v, count(*) AS n FROM facts JOIN dims ON k = dk GROUP BY v", _catalog(files))
    flight.DistributedExec(many, URLS, **options)
    assert calls[0] == 2  # 20,000 values of v may be many groups: the split is planned first


def test_a_split_mean_of_a_decimal_sums_the_decimal_shared_with_its_sum(cluster: flight.LocalCluster, tmp_path: Path) -> None:
    """TPC-H Q1's averages: split across tasks, ``avg(x)`` of a DECIMAL is the DECIMAL's exact partial sum (the one
    ``sum(x)`` beside it computes) over its count, as DuckDB's own ``avg`` of a DECIMAL; an integer's keeps its cast."""
    from decimal import Decimal

    from flight.planner.groups import exact_mean_input

    n = 4_000
    t = pa.table({"g": pa.array([i % 7 for i in range(n)], pa.int64()),
                  "x": pa.array([Decimal(i * 37 % 1000) / 100 for i in range(n)], pa.decimal128(15, 2)),
                  "i": pa.array([i * 13 % 997 for i in range(n)], pa.int32())})
    paths = write_parts(t, tmp_path, "t", 4)
    text = "SELECT g, sum(x) AS s, avg(x) AS ax, avg(i) AS ai FROM t GROUP BY g ORDER BY g"
    ex = flight.DistributedExec(flight.sql(text, flight.Catalog({"t": flight.read_parquet(paths)})), cluster.urls,
                                small_query_bytes=0, one_host_query_bytes=0)
    [partial] = [n for s in ex.plan.stages for n in s.root.walk() if isinstance(n, AggregateNode) and n.partial]
    calls = [(c.function, repr(c.expr)) for c in partial.calls]
    assert [f for f, e in calls if e == 'col("x")'] == ["sum", "count"], calls  # one sum of x, shared; no DOUBLE cast of it
    assert any("cast" in e and '"i"' in e for f, e in calls if f == "sum"), calls  # the integer's mean keeps its cast
    got = ex.to_table().to_pylist()
    con = duckdb.connect()
    con.execute(f"CREATE VIEW t AS SELECT * FROM read_parquet({[str(p) for p in paths]})")
    want = [dict(zip(("g", "s", "ax", "ai"), r)) for r in con.execute(text).fetchall()]
    assert [(r["g"], r["s"]) for r in got] == [(r["g"], r["s"]) for r in want]
    assert [r["ax"] for r in got] == [pytest.approx(r["ax"], rel=1e-15) for r in want]
    assert [r["ai"] for r in got] == [pytest.approx(r["ai"], rel=1e-12) for r in want]
    assert exact_mean_input(None, t.schema) is None
