"""Python numbers beside DECIMAL columns in the builder: exact, as DuckDB computes the same SQL."""

from __future__ import annotations

from decimal import Decimal

import duckdb
import pyarrow as pa
import pytest

import flight
from flight import agg, col

TABLE = pa.table({
    "price": pa.array([Decimal("99.50"), Decimal("150.25"), None, Decimal("-3.10")], pa.decimal128(15, 2)),
    "disc": pa.array([Decimal("0.05"), Decimal("0.10"), Decimal("0.00"), Decimal("0.07")], pa.decimal128(15, 2)),
    "n": pa.array([1, 2, 3, 4], pa.int64()),
})

CASES = [
    (lambda q: q.filter(col("price") > 100).select("n"), "select n from t where price > 100"),
    (lambda q: q.filter(col("price") <= 99.5).select("n"), "select n from t where price <= 99.5"),
    (lambda q: q.select("n", net=col("price") * (1 - col("disc"))), "select n, price * (1 - disc) as net from t"),
    (lambda q: q.select("n", half=col("price") * 0.5), "select n, price * 0.5 as half from t"),
    (lambda q: q.select("n", more=col("price") + 10), "select n, price + 10 as more from t"),
    (lambda q: q.aggregate([], s=agg.sum(col("price") * 2)), "select sum(price * 2) as s from t"),
    (lambda q: q.select("n", m=col("n") + 1), "select n, n + 1 as m from t"),  # no decimal: unchanged
]


@pytest.mark.parametrize(("build", "sql"), CASES, ids=[c[1] for c in CASES])
def test_numbers_beside_decimals_are_exact(build, sql) -> None:  # type: ignore[no-untyped-def]
    t = TABLE  # noqa: F841 - DuckDB reads it by name
    want = duckdb.sql(sql).to_arrow_table()
    got = flight.run_local(build(flight.from_arrow(TABLE))).read_all()
    rows = lambda table: sorted(map(tuple, (r.values() for r in table.to_pylist())), key=repr)  # noqa: E731
    assert rows(got) == rows(want)
    for f in want.schema:
        if pa.types.is_decimal(f.type):
            assert pa.types.is_decimal(got.schema.field(f.name).type), f"{f.name} is {got.schema.field(f.name).type}"
