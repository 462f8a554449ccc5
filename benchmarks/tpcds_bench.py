"""The TPC-DS suite of flight-bench (``--suite tpcds``): the 99 queries in each engine's dialect, and the check.

The data and DuckDB's 99 texts are made at run time by ``benchmarks.tpcds`` (DuckDB's ``tpcds`` extension in a
side venv, cached under ``.bench-cache/tpcds``). Each engine gets the text it needs, made from DuckDB's:

* ``duckdb``: DuckDB's text as is, for flight-exec (``flight.sql``), Acero and DuckDB, and for Polars: polars
  2.1's SQL front end runs all 99 unchanged;
* ``spark`` (PySpark, Sail): ``sqlglot.transpile(text, read="duckdb", write="spark")``, as
  tests/tpcds_spark_support.py makes them (all 99 run in PySpark 4.3; DuckDB's null order written out);
* ``datafusion``: ``sqlglot.transpile(text, read="duckdb", write="postgres")``. DataFusion parses DuckDB's
  text too, but divides as Postgres does: a DECIMAL quotient stays a DECIMAL, truncated at its scale (q59's
  and q66's sums of quotients were off by more than 1e-6). The Postgres writer spells DuckDB's ``/`` as a
  DOUBLE division (and a DESC key's NULLS LAST), so DataFusion computes what DuckDB computes.

The check (``TpcdsCheck``) is TPC-H's ``tpch_queries.compare`` (decimals as numbers, floats within 1e-9
relative or 1e-6 absolute, order checked along the sort key, rows tied on it compared as a multiset), with
what TPC-DS needs on top:

* columns by position: engines name an unaliased expression each their way (and DataFusion lowers case);
* the sort key is the text's own ORDER BY, evaluated on each answer (by DuckDB, over the answer's columns):
  TPC-DS orders by ordinals and by expressions of the output (``sum_sales - avg_monthly_sales``);
* at a LIMIT, the rows tied with the last row on the sort key may be any of the tied rows (TPC-DS's ORDER BY
  keys are not all total): when a full comparison fails, that last group is compared on the key only.

A DECIMAL an engine rounds where DuckDB has a DOUBLE (Spark's ``avg`` of a DECIMAL(7,2) is a DECIMAL(11,6))
is within the 1e-6; a sum of many such quotients may not be (Spark's q66): then the cell says mismatch.
"""

from __future__ import annotations

import functools
import math
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import sqlglot
from sqlglot import exp

from benchmarks import tpcds
from benchmarks.progress import Progress
from benchmarks.tpch_queries import ABS_TOL, REL_TOL, compare
from benchmarks.workload import Workload

__all__ = ["TpcdsCheck", "order_keys", "tpcds_workload", "transpiled"]


def transpiled(texts: dict[int, str], dialect: str) -> dict[int, str]:
    """Each of DuckDB's ``texts`` written in sqlglot's ``dialect`` (``spark``, ``postgres``)."""
    out = {}
    for n, text in texts.items():
        (written,) = sqlglot.transpile(text, read="duckdb", write=dialect)
        out[n] = written
    return out


# ---------------------------------------------------------------------- the sort key


@functools.cache
def _parsed(text: str) -> exp.Expr:
    return sqlglot.parse_one(text, read="duckdb")


def order_keys(text: str, names: list[str]) -> tuple[list[str], int | None]:
    """The ORDER BY of ``text``'s outer query as DuckDB expressions over an answer whose columns are renamed
    ``c0``, ``c1``, ... (``names`` are the answer's own, in order), and its LIMIT (None: none).

    An ordinal is its column; an expression equal to an output column's is that column; otherwise each column
    it names must be an output column. Keys after the first that cannot be written are left out (the rows are
    then checked in order along the keys before it)."""
    tree = _parsed(text)
    limit_node = tree.args.get("limit")
    limit = None
    if limit_node is not None and isinstance(limit_node.expression, exp.Literal) and limit_node.expression.is_int:
        limit = int(limit_node.expression.name)
    order = tree.args.get("order")
    if order is None:
        return [], limit
    lower = [n.lower() for n in names]
    selects = [s.unalias() for s in tree.selects] if hasattr(tree, "selects") else []
    keys: list[str] = []
    for ordered in order.expressions:
        key = ordered.this
        if isinstance(key, exp.Literal) and key.is_int and 1 <= int(key.name) <= len(names):
            keys.append(f"c{int(key.name) - 1}")
            continue
        if key in selects and selects.index(key) < len(names):
            keys.append(f"c{selects.index(key)}")
            continue
        columns = list(key.find_all(exp.Column))
        if not columns or any(c.name.lower() not in lower for c in columns):
            break
        rewritten = key.transform(
            lambda node: exp.column(f"c{lower.index(node.name.lower())}") if isinstance(node, exp.Column) else node)
        keys.append(rewritten.sql("duckdb"))
    return keys, limit


def _with_keys(table: pa.Table, keys: list[str]) -> tuple[pa.Table, list[str]]:
    """``table`` with one more column per sort key, its values computed by DuckDB from the row's columns,
    and those columns' names. A key DuckDB cannot compute ends the list (as ``order_keys`` does)."""
    positional = table.rename_columns([f"c{i}" for i in range(table.num_columns)])
    con = duckdb.connect()
    try:
        con.register("answer", positional)
        names: list[str] = []
        for i, key in enumerate(keys):
            try:
                column = con.sql(f"select {key} as k from answer").to_arrow_table().column(0)
            except duckdb.Error:
                break
            name = f"ORDER BY #{i + 1}"
            table = table.append_column(name, column)
            names.append(name)
    finally:
        con.close()
    return table, names


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL) or (math.isnan(a) and math.isnan(b))
    return a == b


def _last_tie(table: pa.Table, keys: list[str]) -> int:
    """Where the run of rows tied with the last row on ``keys`` starts."""
    rows = list(zip(*(table.column(k).to_pylist() for k in keys), strict=True))
    start = len(rows) - 1
    while start > 0 and all(_same(a, b) for a, b in zip(rows[start - 1], rows[-1], strict=True)):
        start -= 1
    return start


# ---------------------------------------------------------------------- the check


class TpcdsCheck:
    """``check(n, got, want)``: None when ``got`` is DuckDB's answer ``want`` to query ``n``, else why not."""

    def __init__(self, texts: dict[int, str]) -> None:
        self.texts = texts

    def __call__(self, n: int, got: pa.Table, want: pa.Table) -> str | None:
        if got.num_columns != want.num_columns:
            return f"{got.num_columns} columns {got.column_names}, DuckDB has {want.num_columns} {want.column_names}"
        names = _unique(want.column_names)
        got, want = got.rename_columns(names), want.rename_columns(names)
        if got.num_rows != want.num_rows:
            return f"{got.num_rows} rows, expected {want.num_rows}"
        keys, limit = order_keys(self.texts[n], want.column_names)
        if keys:
            want, ordered_by = _with_keys(want, keys)
            got, _ = _with_keys(got, keys[:len(ordered_by)])
        else:
            ordered_by = []
        problem = compare(got, want, ordered_by or None)
        if problem is None or not ordered_by or limit is None or want.num_rows != limit or want.num_rows < 2:
            return problem
        # At the LIMIT the rows tied with the last one may be any of the tied rows: compare those on the key only.
        start = _last_tie(want, ordered_by)
        head = compare(got.slice(0, start), want.slice(0, start), ordered_by) if start else None
        if head is not None:
            return problem
        tail = compare(got.slice(start).select(ordered_by), want.slice(start).select(ordered_by), ordered_by)
        return problem if tail is not None else None


def _unique(names: list[str]) -> list[str]:
    """``names`` with a repeated one made distinct (``name#2``): ``compare`` finds columns by name."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return out


# ---------------------------------------------------------------------- the workload


def tpcds_workload(sf: float, cache_dir: Path | None, progress: Progress) -> Workload:
    """TPC-DS at ``sf``: the 24 tables (generated by ``dsdgen`` when missing: one bar, it is one step), DuckDB's 99
    texts, and the Spark and DataFusion copies."""
    out = tpcds.sf_dir(sf, cache_dir)
    if tpcds.table_ready(sf, out):
        progress.log(f"TPC-DS SF {sf:g}: 24 tables cached in {out}")
        paths = tpcds.generate(sf, out)
    else:
        bar = progress.add(f"generating TPC-DS SF {sf:g} with dsdgen (DuckDB's tpcds extension) into {out}", total=1)
        started = time.perf_counter()
        paths = tpcds.generate(sf, out, progress=progress.log)
        progress.finish(bar, description=f"TPC-DS SF {sf:g} generated in {time.perf_counter() - started:.0f}s")
    texts = tpcds.queries(cache_dir, progress=progress.log)
    return Workload(
        "tpcds", "TPC-DS", sf, out, {table: [path] for table, path in paths.items()},
        {"duckdb": texts, "spark": transpiled(texts, "spark"), "datafusion": transpiled(texts, "postgres"),
         "polars": texts},
        TpcdsCheck(texts),
        {"duckdb": f"tpcds_queries() of DuckDB's tpcds extension {tpcds.TPCDS_VERSION}",
         "spark": f"sqlglot {sqlglot.__version__} transpile(read='duckdb', write='spark')",
         "datafusion": f"sqlglot {sqlglot.__version__} transpile(read='duckdb', write='postgres')",
         "polars": "DuckDB's text as is"},
    )
