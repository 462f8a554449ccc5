"""Filter estimates from column ranges (``flight.planner.ranges``, ``FileListProvider.column_range``).

The oracle is the data itself: for values spread evenly, the estimated fraction of a range
predicate must be close to the fraction pyarrow's own filter keeps.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import flight
from flight import col, lit
from flight.planner.cost import selectivity
from flight.planner.cut import plan_query
from flight.planner.ranges import MIN_FRACTION, range_selectivity
from flight.sources.providers import FileListProvider
from flight.sources.statistics import as_number

N = 20_000
START = dt.date(1992, 1, 1)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("ranges")
    table = pa.table(
        {
            "d": pa.array([START + dt.timedelta(days=i % 2557) for i in range(N)], pa.date32()),
            "x": pa.array([i % 1000 for i in range(N)], pa.int64()),
            "p": pa.array([Decimal(i % 500) / 10 for i in range(N)], pa.decimal128(10, 2)),
            "s": pa.array([f"v{i % 7}" for i in range(N)]),
        }
    )
    paths = [root / f"f{i}.parquet" for i in range(3)]
    for i, path in enumerate(paths):
        pq.write_table(table.slice(i * N // 3, N // 3 + 1), path, row_group_size=2000)
    return paths


def kept(files: list[Path], predicate: pc.Expression) -> float:
    t = pa.concat_tables(pq.read_table(p) for p in files)
    return t.filter(predicate).num_rows / t.num_rows


@pytest.mark.parametrize(
    "ours, theirs",
    [
        ((col("d") >= lit(dt.date(1995, 9, 1))) & (col("d") < lit(dt.date(1995, 10, 1))),
         (pc.field("d") >= dt.date(1995, 9, 1)) & (pc.field("d") < dt.date(1995, 10, 1))),
        (col("x") < 250, pc.field("x") < 250),
        ((lit(100) <= col("x")) & (col("x") <= 200) & (col("x") > 150), (pc.field("x") >= 151) & (pc.field("x") <= 200)),
        (col("p") >= lit(Decimal("40.00")), pc.field("p") >= Decimal("40.00")),
    ],
    ids=["one-month-of-dates", "int-upper", "three-bounds-flipped", "decimal"],
)
def test_range_estimates_are_close_to_what_the_filter_keeps(files: list[Path], ours: flight.Expr, theirs: pc.Expression) -> None:
    provider = FileListProvider(files)
    estimate = range_selectivity(ours, provider.column_range)
    assert estimate == pytest.approx(kept(files, theirs), abs=0.02)


def test_terms_without_a_range_keep_their_textbook_estimate(files: list[Path]) -> None:
    provider = FileListProvider(files)
    assert provider.column_range("s") is None  # strings have no range here
    assert provider.column_range("nope") is None
    on_strings = col("s") > "v3"
    assert range_selectivity(on_strings, provider.column_range) == selectivity(on_strings.to_proto())
    mixed = (col("x") < 500) & (col("s") == "v1")
    assert range_selectivity(mixed, provider.column_range) == pytest.approx(0.5 * selectivity((col("s") == "v1").to_proto()), abs=0.01)
    empty = (col("x") > 900) & (col("x") < 100)  # contradictory: the floor, not zero
    assert range_selectivity(empty, provider.column_range) == MIN_FRACTION


def test_the_planner_picks_join_sides_from_the_ranges(files: list[Path], tmp_path: Path) -> None:
    other = tmp_path / "other.parquet"
    pq.write_table(pa.table({"k": pa.array(range(2000), pa.int64()), "w": pa.array(range(2000), pa.int64())}), other)
    # 1% of 20,000 rows: smaller than the other side's 2,000 (the textbook 1/3 would say 6,667).
    q = flight.read_parquet(files).filter(col("x") < 10).join(flight.read_parquet([other]), left_on="x", right_on="k")
    (rewrite,) = [r for r in plan_query(q.node, 2).rewrites if "sides swapped" in r]
    assert "the left side (~200 rows" in rewrite, rewrite


def test_values_on_the_line() -> None:
    assert as_number(dt.date(1970, 1, 2)) - as_number(dt.date(1970, 1, 1)) == 1  # type: ignore[operator]
    assert as_number(dt.datetime(1970, 1, 1, 0, 1)) == 60.0
    assert as_number(Decimal("1.5")) == 1.5
    assert as_number("a") is None and as_number(True) is None and as_number(None) is None
