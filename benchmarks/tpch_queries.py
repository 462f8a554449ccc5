"""TPC-H queries written with flight-exec's builder, their SQL, and a checker.

Ten queries that cover what multi-stage execution must get right: grouped and
global aggregates (Q1, Q6), inner joins of up to six tables with a multi-key join
(Q3, Q5, Q10), a semi join (Q4), a left join followed by two aggregations (Q13),
conditional aggregates (Q12, Q14), a disjunctive join filter (Q19), sorts with
and without limits.

- ``query(n, files)`` builds query ``n`` as a ``flight.Query`` (parameters: the
  spec's validation values). Correlated subqueries are written as the joins they
  decorrelate to. Money columns are cast to float64 before arithmetic: pyarrow
  cannot compare ``decimal128(15, 2)`` with an int, and products such as
  ``price * (1 - disc) * (1 + tax)`` overflow decimal precision. Each query
  yields exactly the columns of the standard query, in the same order.
- ``SQL[n]`` is the standard query text; ``duckdb_answer(n, files)`` runs it in
  DuckDB over views named like the tables, with DECIMAL results made DOUBLE
  (scale 0, e.g. sums of ints, made BIGINT) so they compare with flight-exec's.
- ``ORDERED[n]`` is the ORDER BY key of the queries that have one, and
  ``compare(got, expected, ordered_by)`` says how two results differ (None when
  they do not): floats within a tolerance, row order checked only along the
  sort key, rows tied on the key compared as sets.

``files`` maps each table name to its Parquet files, e.g. ``tpch_files(root)``
for a directory made by ``benchmarks.tpch.ensure_tpch``.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from pathlib import Path

import duckdb
import pyarrow as pa

import flight
from flight import col, if_else, lit

__all__ = [
    "ORDERED",
    "QUERY_NUMBERS",
    "SQL",
    "TABLES",
    "compare",
    "duckdb_answer",
    "duckdb_connection",
    "query",
    "tpch_files",
]

TABLES = ("lineitem", "orders", "customer", "part", "partsupp", "supplier", "nation", "region")
QUERY_NUMBERS = (1, 3, 4, 5, 6, 10, 12, 13, 14, 19)

Files = Mapping[str, Sequence[Path]]

_DEC = pa.decimal128(15, 2)  # the money / quantity columns as tpchgen-cli writes them
REL_TOL = 1e-9
ABS_TOL = 1e-6


def tpch_files(root: str | Path, tables: Sequence[str] = TABLES) -> dict[str, list[Path]]:
    """``{table: [parquet files]}`` under ``root`` (a directory ``ensure_tpch`` returned)."""
    from benchmarks.tpch import table_files

    return {t: table_files(root, t) for t in tables}


# ------------------------------------------------------------------ builder


def _scan(files: Files, table: str) -> flight.Query:
    return flight.read_parquet(list(files[table]))


def _f(name: str) -> flight.Expr:
    """A money / quantity column as float64."""
    return col(name).cast(pa.float64())


def _dec(text: str) -> flight.Expr:
    """A literal of the money columns' own decimal type, for exact comparisons."""
    return lit(Decimal(text), _DEC)


def _date(y: int, m: int, d: int) -> flight.Expr:
    return lit(dt.date(y, m, d))


def _volume() -> flight.Expr:
    """``l_extendedprice * (1 - l_discount)`` in float64."""
    return _f("l_extendedprice") * (1.0 - _f("l_discount"))


def _q1(files: Files) -> flight.Query:
    agg = flight.agg
    price, disc, tax, qty = _f("l_extendedprice"), _f("l_discount"), _f("l_tax"), _f("l_quantity")
    disc_price = price * (1.0 - disc)
    return (
        _scan(files, "lineitem")
        .filter(col("l_shipdate") <= _date(1998, 9, 2))  # date '1998-12-01' - interval '90' day
        .aggregate(
            ["l_returnflag", "l_linestatus"],
            sum_qty=agg.sum(qty),
            sum_base_price=agg.sum(price),
            sum_disc_price=agg.sum(disc_price),
            sum_charge=agg.sum(disc_price * (1.0 + tax)),
            avg_qty=agg.mean(qty),
            avg_price=agg.mean(price),
            avg_disc=agg.mean(disc),
            count_order=agg.count_all(),
        )
        .sort(["l_returnflag", "l_linestatus"])
    )


def _q3(files: Files) -> flight.Query:
    agg = flight.agg
    customer = (_scan(files, "customer")
                .filter(col("c_mktsegment") == "BUILDING")
                .select("c_custkey"))
    orders = (_scan(files, "orders")
              .filter(col("o_orderdate") < _date(1995, 3, 15))
              .select("o_orderkey", "o_custkey", "o_orderdate", "o_shippriority"))
    lineitem = (_scan(files, "lineitem")
                .filter(col("l_shipdate") > _date(1995, 3, 15))
                .select("l_orderkey", volume=_volume()))
    return (
        lineitem
        .join(orders.join(customer, left_on="o_custkey", right_on="c_custkey"),
              left_on="l_orderkey", right_on="o_orderkey")
        .aggregate(["l_orderkey", "o_orderdate", "o_shippriority"], revenue=agg.sum(col("volume")))
        .select("l_orderkey", "revenue", "o_orderdate", "o_shippriority")
        .sort(["revenue", "o_orderdate"], descending=[True, False])
        .limit(10)
    )


def _q4(files: Files) -> flight.Query:
    agg = flight.agg
    late = (_scan(files, "lineitem")
            .filter(col("l_commitdate") < col("l_receiptdate"))
            .select("l_orderkey"))
    return (
        _scan(files, "orders")
        .filter((col("o_orderdate") >= _date(1993, 7, 1)) & (col("o_orderdate") < _date(1993, 10, 1)))
        .join(late, left_on="o_orderkey", right_on="l_orderkey", how="semi")  # exists (...)
        .aggregate(["o_orderpriority"], order_count=agg.count_all())
        .sort("o_orderpriority")
    )


def _q5(files: Files) -> flight.Query:
    agg = flight.agg
    region = _scan(files, "region").filter(col("r_name") == "ASIA").select("r_regionkey")
    nation = (_scan(files, "nation")
              .join(region, left_on="n_regionkey", right_on="r_regionkey")
              .select("n_nationkey", "n_name"))
    supplier = (_scan(files, "supplier")
                .select("s_suppkey", "s_nationkey")
                .join(nation, left_on="s_nationkey", right_on="n_nationkey")
                .select("s_suppkey", "s_nationkey", "n_name"))
    customer = _scan(files, "customer").select("c_custkey", "c_nationkey")
    orders = (_scan(files, "orders")
              .filter((col("o_orderdate") >= _date(1994, 1, 1)) & (col("o_orderdate") < _date(1995, 1, 1)))
              .select("o_orderkey", "o_custkey")
              .join(customer, left_on="o_custkey", right_on="c_custkey")
              .select("o_orderkey", "c_nationkey"))
    lineitem = _scan(files, "lineitem").select("l_orderkey", "l_suppkey", volume=_volume())
    return (
        lineitem
        .join(orders, left_on="l_orderkey", right_on="o_orderkey")
        # l_suppkey = s_suppkey and c_nationkey = s_nationkey
        .join(supplier, left_on=["l_suppkey", "c_nationkey"], right_on=["s_suppkey", "s_nationkey"])
        .aggregate(["n_name"], revenue=agg.sum(col("volume")))
        .sort("revenue", descending=True)
    )


def _q6(files: Files) -> flight.Query:
    agg = flight.agg
    return (
        _scan(files, "lineitem")
        .filter(
            (col("l_shipdate") >= _date(1994, 1, 1))
            & (col("l_shipdate") < _date(1995, 1, 1))
            & col("l_discount").between(_dec("0.05"), _dec("0.07"))
            & (col("l_quantity") < _dec("24"))
        )
        .aggregate(revenue=agg.sum(_f("l_extendedprice") * _f("l_discount")))
    )


def _q10(files: Files) -> flight.Query:
    agg = flight.agg
    orders = (_scan(files, "orders")
              .filter((col("o_orderdate") >= _date(1993, 10, 1)) & (col("o_orderdate") < _date(1994, 1, 1)))
              .select("o_orderkey", "o_custkey"))
    lineitem = (_scan(files, "lineitem")
                .filter(col("l_returnflag") == "R")
                .select("l_orderkey", volume=_volume()))
    customer = (_scan(files, "customer")
                .select("c_custkey", "c_name", "c_address", "c_nationkey", "c_phone", "c_acctbal", "c_comment"))
    nation = _scan(files, "nation").select("n_nationkey", "n_name")
    keys = ["c_custkey", "c_name", "c_acctbal", "c_phone", "n_name", "c_address", "c_comment"]
    return (
        lineitem
        .join(orders, left_on="l_orderkey", right_on="o_orderkey")
        .join(customer, left_on="o_custkey", right_on="c_custkey")
        .join(nation, left_on="c_nationkey", right_on="n_nationkey")
        .aggregate(keys, revenue=agg.sum(col("volume")))
        .select("c_custkey", "c_name", "revenue", "c_acctbal", "n_name", "c_address", "c_phone", "c_comment")
        .sort("revenue", descending=True)
        .limit(20)
    )


def _q12(files: Files) -> flight.Query:
    agg = flight.agg
    high = col("o_orderpriority").isin(["1-URGENT", "2-HIGH"])
    lineitem = (_scan(files, "lineitem")
                .filter(
                    col("l_shipmode").isin(["MAIL", "SHIP"])
                    & (col("l_commitdate") < col("l_receiptdate"))
                    & (col("l_shipdate") < col("l_commitdate"))
                    & (col("l_receiptdate") >= _date(1994, 1, 1))
                    & (col("l_receiptdate") < _date(1995, 1, 1))
                )
                .select("l_orderkey", "l_shipmode"))
    orders = _scan(files, "orders").select("o_orderkey", "o_orderpriority")
    return (
        lineitem
        .join(orders, left_on="l_orderkey", right_on="o_orderkey")
        .aggregate(
            ["l_shipmode"],
            high_line_count=agg.sum(if_else(high, 1, 0)),
            low_line_count=agg.sum(if_else(~high, 1, 0)),
        )
        .sort("l_shipmode")
    )


def _q13(files: Files) -> flight.Query:
    agg = flight.agg
    orders = (_scan(files, "orders")
              .filter(~col("o_comment").like("%special%requests%"))
              .select("o_orderkey", "o_custkey"))
    return (
        _scan(files, "customer")
        .select("c_custkey")
        .join(orders, left_on="c_custkey", right_on="o_custkey", how="left")
        .aggregate(["c_custkey"], c_count=agg.count("o_orderkey"))
        .aggregate(["c_count"], custdist=agg.count_all())
        .sort(["custdist", "c_count"], descending=[True, True])
    )


def _q14(files: Files) -> flight.Query:
    agg = flight.agg
    lineitem = (_scan(files, "lineitem")
                .filter((col("l_shipdate") >= _date(1995, 9, 1)) & (col("l_shipdate") < _date(1995, 10, 1)))
                .select("l_partkey", volume=_volume()))
    part = _scan(files, "part").select("p_partkey", "p_type")
    return (
        lineitem
        .join(part, left_on="l_partkey", right_on="p_partkey")
        .aggregate(
            promo=agg.sum(if_else(col("p_type").like("PROMO%"), col("volume"), 0.0)),
            total=agg.sum(col("volume")),
        )
        .select(promo_revenue=100.0 * col("promo") / col("total"))
    )


def _q19(files: Files) -> flight.Query:
    agg = flight.agg
    qty, brand, container, size = col("l_quantity"), col("p_brand"), col("p_container"), col("p_size")

    def group(b: str, containers: list[str], lo: int, size_hi: int) -> flight.Expr:
        return ((brand == b) & container.isin(containers)
                & qty.between(_dec(str(lo)), _dec(str(lo + 10))) & size.between(1, size_hi))

    # The predicates every group shares are applied to lineitem before the join.
    lineitem = (_scan(files, "lineitem")
                .filter(col("l_shipmode").isin(["AIR", "AIR REG"]) & (col("l_shipinstruct") == "DELIVER IN PERSON"))
                .select("l_partkey", "l_quantity", volume=_volume()))
    part = _scan(files, "part").select("p_partkey", "p_brand", "p_container", "p_size")
    return (
        lineitem
        .join(part, left_on="l_partkey", right_on="p_partkey")
        .filter(
            group("Brand#12", ["SM CASE", "SM BOX", "SM PACK", "SM PKG"], 1, 5)
            | group("Brand#23", ["MED BAG", "MED BOX", "MED PKG", "MED PACK"], 10, 10)
            | group("Brand#34", ["LG CASE", "LG BOX", "LG PACK", "LG PKG"], 20, 15)
        )
        .aggregate(revenue=agg.sum(col("volume")))
    )


_BUILDERS: dict[int, Callable[[Files], flight.Query]] = {
    1: _q1, 3: _q3, 4: _q4, 5: _q5, 6: _q6, 10: _q10, 12: _q12, 13: _q13, 14: _q14, 19: _q19,
}


def query(n: int, files: Files) -> flight.Query:
    """TPC-H query ``n`` (one of ``QUERY_NUMBERS``) over ``files`` (``{table: [parquet paths]}``)."""
    try:
        build = _BUILDERS[n]
    except KeyError:
        raise ValueError(f"TPC-H query {n} is not in this suite; it has {QUERY_NUMBERS}") from None
    return build(files)


from benchmarks.tpch_sql import ORDERED, SQL, run_statements  # noqa: E402  (re-exported: the harness imports them from here)

# ------------------------------------------------------------------- DuckDB


def _sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def duckdb_connection(files: Files) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with one view per table of ``files`` over its Parquet files."""
    con = duckdb.connect()
    for table, paths in files.items():
        listed = ", ".join(_sql_string(str(p)) for p in paths)
        con.execute(f"create view {table} as select * from read_parquet([{listed}])")
    return con


def decimals_as_numbers(table: pa.Table) -> pa.Table:
    """DECIMAL columns as float64, or int64 when their scale is 0 (DuckDB sums ints as HUGEINT)."""
    columns = []
    for column in table.columns:
        if pa.types.is_decimal(column.type):
            column = column.cast(pa.int64() if column.type.scale == 0 else pa.float64())
        columns.append(column)
    return pa.table(columns, names=table.column_names)


def duckdb_answer(n: int, files: Files, con: duckdb.DuckDBPyConnection | None = None) -> pa.Table:
    """DuckDB's result of ``SQL[n]`` over ``files`` (or over the views of ``con``), decimals made numbers."""
    own = con is None
    if con is None:
        con = duckdb_connection(files)
    try:
        return decimals_as_numbers(duckdb_table(con, SQL[n]))
    finally:
        if own:
            con.close()


def duckdb_table(con: duckdb.DuckDBPyConnection, text: str) -> pa.Table:
    """The result of the one query in ``text`` (which may also create and drop views, as Q15 does)."""
    def run(statement: str) -> pa.Table | None:  # a query's rows are fetched at once: a later DROP VIEW ends its relation
        rel = con.sql(statement)
        if rel is None:
            return None
        fetch = getattr(rel, "to_arrow_table", None) or rel.fetch_arrow_table  # to_arrow_table: duckdb >= 1.4
        return fetch()

    table = run_statements(text, run)
    assert table is not None
    return table


# --------------------------------------------------------------- comparison


def _canonical(table: pa.Table) -> pa.Table:
    """Types that differ only in width or layout made the same: int64, float64, string, binary."""
    columns = []
    for column in table.columns:
        t = column.type
        if pa.types.is_dictionary(t):
            column = column.cast(t.value_type)
            t = column.type
        if pa.types.is_decimal(t):
            column = column.cast(pa.int64() if t.scale == 0 else pa.float64())
        elif pa.types.is_integer(t):
            column = column.cast(pa.int64())
        elif pa.types.is_floating(t):
            column = column.cast(pa.float64())
        elif t in (pa.string_view(), pa.large_string()):
            column = column.cast(pa.string())
        elif t in (pa.binary_view(), pa.large_binary()):
            column = column.cast(pa.binary())
        columns.append(column)
    return pa.table(columns, names=table.column_names)


def _close(a: object, b: object) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) or isinstance(b, float):
        if math.isnan(a) or math.isnan(b):  # type: ignore[arg-type]
            return math.isnan(a) and math.isnan(b)  # type: ignore[arg-type]
        diff = abs(a - b)  # type: ignore[operator]
        return diff <= ABS_TOL or diff <= REL_TOL * max(abs(a), abs(b))  # type: ignore[arg-type]
    return a == b


def _rows(table: pa.Table) -> list[tuple[object, ...]]:
    return list(zip(*(c.to_pylist() for c in table.columns), strict=True)) if table.num_columns else []


def _sort_key(float_last: list[int]) -> Callable[[tuple[object, ...]], tuple[object, ...]]:
    """Sort rows by every column, floats last (their rounding must not decide the order of the rest)."""
    return lambda row: tuple((v is not None, v if v is not None else 0) for v in (row[i] for i in float_last))


def _row_text(names: list[str], row: tuple[object, ...]) -> str:
    return "{" + ", ".join(f"{n}: {v!r}" for n, v in zip(names, row, strict=True)) + "}"


def _first_difference(names: list[str], got: list[tuple[object, ...]], want: list[tuple[object, ...]],
                      start: int, where: str) -> str | None:
    for offset, (g, w) in enumerate(zip(got, want, strict=True)):
        for name, a, b in zip(names, g, w, strict=True):
            if not _close(a, b):
                return (f"row {start + offset}{where}, column {name}: got {a!r}, expected {b!r}\n"
                        f"  got      {_row_text(names, g)}\n  expected {_row_text(names, w)}")
    return None


def compare(got: pa.Table, expected: pa.Table, ordered_by: Sequence[str] | None = None) -> str | None:
    """None when ``got`` matches ``expected``, else a description of the first difference.

    Same column names in the same order (a column DuckDB names by its expression, by position
    only) and the same row count; integer widths,
    decimals (as float64) and string layouts are made alike, then types must
    agree; floats match within ``REL_TOL`` relative or ``ABS_TOL`` absolute,
    everything else exactly. Row order matters only along ``ordered_by``: the
    sort-key values must agree row by row, and rows tied on the key (in
    ``expected``) are compared as multisets. Without ``ordered_by`` the rows are
    compared as multisets.
    """
    names = got.column_names
    if names != expected.column_names:
        # An unaliased expression's column (Q18's sum(l_quantity)) is named as each engine prints
        # it (DataFusion: sum(lineitem.l_quantity)): such a column is matched by its position.
        same = len(names) == len(expected.column_names) and all(
            a == b or "(" in b for a, b in zip(names, expected.column_names)
        )
        if not same:
            return f"columns {names}, expected {expected.column_names}"
        got = got.rename_columns(expected.column_names)
        names = got.column_names
    if got.num_rows != expected.num_rows:
        return f"{got.num_rows} rows, expected {expected.num_rows}"
    got, expected = _canonical(got), _canonical(expected)
    for name in names:
        a, b = got.schema.field(name).type, expected.schema.field(name).type
        if a != b:
            return f"column {name}: type {a}, expected {b}"
    unknown = [k for k in ordered_by or () if k not in names]
    if unknown:
        raise ValueError(f"ordered_by names {unknown}, which are not columns of {names}")

    is_float = [pa.types.is_floating(got.schema.field(n).type) for n in names]
    float_last = [i for i, f in enumerate(is_float) if not f] + [i for i, f in enumerate(is_float) if f]
    key = _sort_key(float_last)
    got_rows, want_rows = _rows(got), _rows(expected)

    if not ordered_by:
        return _first_difference(names, sorted(got_rows, key=key), sorted(want_rows, key=key), 0, " (rows sorted)")

    positions = [names.index(k) for k in ordered_by]
    for i, (g, w) in enumerate(zip(got_rows, want_rows, strict=True)):
        for p in positions:
            if not _close(g[p], w[p]):
                return (f"row {i}: sort key {names[p]} is {g[p]!r}, expected {w[p]!r} (order by {list(ordered_by)})\n"
                        f"  got      {_row_text(names, g)}\n  expected {_row_text(names, w)}")
    start = 0
    for end in range(1, len(want_rows) + 1):
        if end < len(want_rows) and all(_close(want_rows[end][p], want_rows[end - 1][p]) for p in positions):
            continue  # still tied with the previous row
        group_got = sorted(got_rows[start:end], key=key)
        group_want = sorted(want_rows[start:end], key=key)
        where = "" if end - start == 1 else f" (of rows {start}..{end - 1}, tied on the sort key, sorted)"
        diff = _first_difference(names, group_got, group_want, start, where)
        if diff is not None:
            return diff
        start = end
    return None
