"""run_local: the same engine in one process, checked against DuckDB."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

import flight
from flight import agg, col


def test_run_local_matches_duckdb(parquet_files: list[Path]) -> None:
    q = (
        flight.read_parquet(parquet_files)
        .filter(col("qty") > 5)
        .aggregate(["name"], n=agg.count_all(), total=agg.sum("qty"), avg=agg.mean("qty"))
        .sort("name", nulls="first")
    )
    got = flight.run_local(q).read_all()
    files = ", ".join(f"'{p}'" for p in parquet_files)
    expected = duckdb.sql(
        f"select name, count(*) as n, sum(qty) as total, avg(qty) as avg from read_parquet([{files}]) "
        "where qty > 5 group by name order by name nulls first"
    ).fetchall()
    rows = list(zip(*[got[c].to_pylist() for c in got.column_names]))
    assert len(rows) == len(expected)
    for g, e in zip(rows, expected):
        assert g[:3] == e[:3] and g[3] == pytest.approx(e[3], rel=1e-12)


def test_run_local_refuses_a_map_stage() -> None:
    import pyarrow as pa

    with pytest.raises(flight.PlanError, match="map stage"):
        flight.run_local(flight.map_input(pa.schema([("a", pa.int64())])))
