"""An average of a DECIMAL column, which the plan casts to DOUBLE (``flight.plan.agg.mean``), is DuckDB's average of
the DECIMAL itself (``flight.engine.duck.translate.decimal_means``): its answer is DuckDB's own, bit for bit, where
an average of the rows as DOUBLEs rounds each one; a column another aggregate also reads, or a DECIMAL too wide for
64 bits, or anything but a column cast to DOUBLE, keeps its cast."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
from support import difference

import flight
from flight import col
from flight.engine.duck.translate import decimal_means
from flight.wire._proto import plan_pb2

BELOW = pa.schema([("k", pa.string()), ("d", pa.decimal128(15, 2)), ("w", pa.decimal128(30, 1)), ("x", pa.int64())])


def test_only_an_average_of_a_narrow_decimal_cast_to_double_reads_the_decimal() -> None:
    double = pa.float64()
    exprs = {
        "a": col("d").cast(double).cast(double),  # DECIMAL(15, 2) to DOUBLE, read by an average only
        "b": col("d").cast(double),  # also read by var_samp
        "c": col("w").cast(double),  # DECIMAL(30, 1): its sum might not fit 64 bits
        "e": col("x").cast(double),  # not a DECIMAL
        "f": (col("d") * 2).cast(double),  # not a column
        "g": col("d").cast(pa.decimal128(10, 1)).cast(double),  # rounded on the way
        "h": col("d").cast(double),  # also a group key
    }
    op = plan_pb2.Aggregate(keys=["k", "h"], aggregates=[
        *(plan_pb2.AggregateCall(function="mean", column=name, name=f"m_{name}") for name in exprs),
        plan_pb2.AggregateCall(function="var_samp", column="b", name="v"),
    ])
    op.input.project.exprs.extend(plan_pb2.NamedExpression(name=n, expr=e.to_proto()) for n, e in [("k", col("k")), *exprs.items()])
    assert decimal_means(op, BELOW) == {"a": "d"}


def _table(n: int = 3000) -> pa.Table:
    return pa.table({
        "k": pa.array([f"g{i % 5}" for i in range(n)]),
        "d": pa.array([Decimal(f"{(i * 7919) % 100000}.{i % 97:02d}") for i in range(n)], pa.decimal128(15, 2)),
        "w": pa.array([Decimal(f"{i}.5") for i in range(n)], pa.decimal128(30, 1)),
    })


def test_the_average_of_a_decimal_is_duckdbs_own_bit_for_bit(tmp_path: Path) -> None:
    t = _table()
    files = [tmp_path / f"t{i}.parquet" for i in range(4)]  # four units: a plan forced into stages splits them
    for i, path in enumerate(files):
        pq.write_table(t.slice(i * 750, 750), path)
    text = "select k, avg(d) as a, var_samp(w) as v, avg(w) as aw, count(*) as n from t group by k order by k"
    con = duckdb.connect()
    con.execute(f"create view t as select * from read_parquet({[str(f) for f in files]!r})")
    want = con.sql(text).to_arrow_table()
    query = flight.sql(text, {"t": flight.read_parquet(files)})
    with flight.LocalCluster(2, data_roots=[tmp_path]) as cluster:
        got = flight.DistributedExec(query, cluster.urls).to_table()
        # forced into stages: partial sums and counts merged, the averages within DuckDB's to 1e-9
        staged = flight.DistributedExec(query, cluster.urls, one_host_query_bytes=0, small_query_bytes=0)
        split = staged.to_table()
    assert difference(got, want, True) is None
    assert got.column("a").to_pylist() == want.column("a").to_pylist()  # the one rounding DuckDB makes, not one per row
    assert len(staged.stages) > 1 and difference(split, want, True) is None
