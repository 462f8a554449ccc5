"""The main job: a small TPC-H lineitem suite on flight-exec, checked against DuckDB.

    python -m benchmarks [--sf 0.1] [--workers 2] [--runs 3] [--micro]

Generates (or reuses) TPC-H Parquet data, starts a ``LocalCluster``, and runs
one-stage queries the current API supports (scan, filter, project, limit).
Each query is written twice: as DuckDB SQL, the independent oracle, and once
against a tiny "dialect" (``col``, ``lit``, ``like``, ...) that builds both
the flight-exec query and the single-process pyarrow baseline (one Acero
plan over a ``pyarrow.dataset`` scan), so those two cannot drift apart. Results are
compared as sorted tables (floats and decimals as float64 with a tolerance).

Prints one table (rows, median seconds, ratios) and ``suite: N/N queries
match``; exits 1 on any mismatch or error. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.acero as ac
import pyarrow.compute as pc
import pyarrow.dataset as ds

import flight
from benchmarks.tpch import ensure_tpch, table_files

DEC = pa.decimal128(15, 2)  # lineitem's money columns as tpchgen-cli writes them

# Both dialects build expressions with the same operators (== < & * ...); these cover the rest.
# Decimal literals carry lineitem's type: pyarrow cannot compare decimal128(15, 2) with an int64.
FLIGHT = SimpleNamespace(
    col=flight.col,
    lit=flight.lit,
    dec=lambda s: flight.lit(Decimal(s), DEC),
    like=lambda e, pattern: e.like(pattern),
    year=lambda e: e.year(),
)
ARROW = SimpleNamespace(
    col=pc.field,
    lit=lambda v, t=None: pc.scalar(pa.scalar(v, t)),
    dec=lambda s: pc.scalar(pa.scalar(Decimal(s), DEC)),
    like=lambda e, pattern: pc.match_like(e, pattern),
    year=lambda e: pc.year(e),
)


@dataclass(frozen=True)
class Bench:
    """One query: DuckDB SQL over the view ``lineitem``, and the same query in the dialect.

    Every query selects ``l_orderkey, l_linenumber`` first: lineitem's key, so
    sorting by all columns gives both engines' rows the same order.
    """

    name: str
    sql: str
    select: Callable[[Any], dict[str, Any]]
    where: Callable[[Any], Any] | None = None
    limit: int | None = None


def _key(d: Any) -> dict[str, Any]:
    return {"l_orderkey": d.col("l_orderkey"), "l_linenumber": d.col("l_linenumber")}


QUERIES = [
    Bench(
        "q6_filter",
        "SELECT l_orderkey, l_linenumber, l_extendedprice * l_discount AS revenue FROM lineitem "
        "WHERE l_shipdate >= DATE '1994-01-01' AND l_shipdate < DATE '1995-01-01' "
        "AND l_discount BETWEEN 0.05 AND 0.07 AND l_quantity < 24",
        select=lambda d: {**_key(d), "revenue": d.col("l_extendedprice") * d.col("l_discount")},
        where=lambda d: (d.col("l_shipdate") >= d.lit(dt.date(1994, 1, 1))) & (d.col("l_shipdate") < d.lit(dt.date(1995, 1, 1)))
        & (d.col("l_discount") >= d.dec("0.05")) & (d.col("l_discount") <= d.dec("0.07")) & (d.col("l_quantity") < d.dec("24")),
    ),
    Bench(
        "date_range",
        "SELECT l_orderkey, l_linenumber, l_shipdate, l_quantity, l_extendedprice FROM lineitem "
        "WHERE l_shipdate BETWEEN DATE '1995-03-01' AND DATE '1995-03-31'",
        select=lambda d: {**_key(d), **{c: d.col(c) for c in ("l_shipdate", "l_quantity", "l_extendedprice")}},
        where=lambda d: (d.col("l_shipdate") >= d.lit(dt.date(1995, 3, 1))) & (d.col("l_shipdate") <= d.lit(dt.date(1995, 3, 31))),
    ),
    Bench(
        "comment_like",
        "SELECT l_orderkey, l_linenumber, l_comment FROM lineitem WHERE l_comment LIKE '%special%requests%'",
        select=lambda d: {**_key(d), "l_comment": d.col("l_comment")},
        where=lambda d: d.like(d.col("l_comment"), "%special%requests%"),
    ),
    Bench(
        "returns_expr",
        "SELECT l_orderkey, l_linenumber, year(l_shipdate) AS ship_year, "
        "l_extendedprice * (1 - l_discount) AS disc_price FROM lineitem WHERE l_returnflag = 'R'",
        select=lambda d: {**_key(d), "ship_year": d.year(d.col("l_shipdate")),
                          "disc_price": d.col("l_extendedprice") * (d.dec("1") - d.col("l_discount"))},
        where=lambda d: d.col("l_returnflag") == d.lit("R"),
    ),
    Bench(
        "full_scan",
        "SELECT l_orderkey, l_linenumber, l_quantity, l_extendedprice, l_shipdate, l_shipmode FROM lineitem",
        select=lambda d: {**_key(d), **{c: d.col(c) for c in ("l_quantity", "l_extendedprice", "l_shipdate", "l_shipmode")}},
    ),
    Bench(
        "limit",
        "SELECT l_orderkey, l_linenumber, l_shipmode FROM lineitem WHERE l_shipmode = 'AIR'",
        select=lambda d: {**_key(d), "l_shipmode": d.col("l_shipmode")},
        where=lambda d: d.col("l_shipmode") == d.lit("AIR"),
        limit=1000,
    ),
]


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------- engines


def needed_columns(b: Bench) -> list[str]:
    """The lineitem columns the query reads, for projection pushdown into the scan."""
    exprs = [*b.select(FLIGHT).values(), *([b.where(FLIGHT)] if b.where is not None else [])]
    return sorted(set().union(*(e.referenced_fields() for e in exprs)))


def flight_query(b: Bench, files: list[Path]) -> flight.Query:
    # The planner pushes the columns the query uses into the scan by itself.
    q = flight.read_parquet(files)
    if b.where is not None:
        q = q.filter(b.where(FLIGHT))
    q = q.select(**b.select(FLIGHT))
    return q.limit(b.limit) if b.limit is not None else q


def run_flight(b: Bench, files: list[Path], urls: list[str]) -> pa.Table:
    return flight.DistributedExec(flight_query(b, files), urls).to_table()


def run_acero(b: Bench, dataset: ds.Dataset) -> pa.Table:
    """The same query as one in-process Acero plan: scan, cast views, filter, project, (limit).

    ``string_view`` columns (tpchgen-cli writes them) become ``string`` first, as flight-exec's
    scan does: Acero has no filter/compare/like kernels for views. (Giving the dataset a
    ``string`` schema instead breaks its statistics pushdown: "equal (string, string_view)".)
    """
    select = b.select(ARROW)
    needed = needed_columns(b)
    normalize = [pc.field(n).cast(pa.string()) if dataset.schema.field(n).type == pa.string_view() else pc.field(n)
                 for n in needed]
    steps = [ac.Declaration("scan", ac.ScanNodeOptions(dataset, columns=needed)),
             ac.Declaration("project", ac.ProjectNodeOptions(normalize, needed))]
    if b.where is not None:
        steps.append(ac.Declaration("filter", ac.FilterNodeOptions(b.where(ARROW))))
    steps.append(ac.Declaration("project", ac.ProjectNodeOptions(list(select.values()), list(select))))
    plan = ac.Declaration.from_sequence(steps)
    if b.limit is None:
        return plan.to_table()
    reader = plan.to_reader()
    batches, rows = [], 0
    for batch in reader:
        batches.append(batch)
        rows += batch.num_rows
        if rows >= b.limit:
            break
    reader.close()
    return pa.Table.from_batches(batches, reader.schema).slice(0, b.limit)


def run_duckdb(con: duckdb.DuckDBPyConnection, sql: str) -> pa.Table:
    rel = con.sql(sql)
    fetch = getattr(rel, "to_arrow_table", None) or rel.fetch_arrow_table  # to_arrow_table: duckdb >= 1.4
    return fetch()


# ---------------------------------------------------------------- comparison


def canonical(t: pa.Table) -> pa.Table:
    """Comparable form: decimals and floats as float64, ints as int64, strings as string, sorted."""
    cols = []
    for c in t.columns:
        if pa.types.is_decimal(c.type) or pa.types.is_floating(c.type):
            c = c.cast(pa.float64())
        elif pa.types.is_integer(c.type):
            c = c.cast(pa.int64())
        elif c.type in (pa.string_view(), pa.large_string()):
            c = c.cast(pa.string())
        cols.append(c)
    t = pa.table(cols, names=t.column_names)
    return t.sort_by([(n, "ascending") for n in t.column_names])


def differences(got: pa.Table, want: pa.Table, limit: int | None) -> str | None:
    """Why ``got`` (flight-exec) is not ``want`` (DuckDB); None when they match.

    With a limit, any ``limit`` rows of the unlimited result are right: check count and membership.
    """
    if got.column_names != want.column_names:
        return f"columns {got.column_names} != {want.column_names}"
    got, want = canonical(got), canonical(want)
    if limit is not None:
        expected = min(limit, want.num_rows)
        if got.num_rows != expected:
            return f"{got.num_rows} rows, expected {expected}"
        rows = set(zip(*(want.column(n).to_pylist() for n in want.column_names)))
        missing = sum(r not in rows for r in zip(*(got.column(n).to_pylist() for n in got.column_names)))
        return f"{missing} rows are not in DuckDB's result" if missing else None
    if got.num_rows != want.num_rows:
        return f"{got.num_rows} rows, DuckDB has {want.num_rows}"
    for name in got.column_names:
        a, b = got.column(name), want.column(name)
        if pa.types.is_floating(a.type):
            close = pc.less_equal(pc.abs(pc.subtract(a, b)), pc.add(pc.multiply(pc.abs(b), 1e-9), 1e-6))
            if not pc.all(close).as_py():
                return f"column {name}: {pc.sum(pc.invert(close)).as_py()} values differ beyond tolerance"
        elif not a.equals(b):
            return f"column {name}: values differ"
    return None


# ------------------------------------------------------------------- running


def median_time(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def run_suite(files: list[Path], urls: list[str], runs: int) -> list[dict[str, Any]]:
    con = duckdb.connect()
    con.execute(f"CREATE VIEW lineitem AS SELECT * FROM read_parquet({[str(f) for f in files]!r})")
    dataset = ds.dataset([str(f) for f in files], format="parquet")
    results = []
    for b in QUERIES:
        log(f"{b.name}: checking against DuckDB, then {runs} timed run(s) per engine")
        row: dict[str, Any] = {"query": b.name, "rows": 0, "fe": math.nan, "duck": math.nan, "acero": math.nan}
        try:
            got = run_flight(b, files, urls)  # also the warm-up of each engine
            row["rows"] = got.num_rows
            want = run_duckdb(con, b.sql)
            row["error"] = differences(got, want, b.limit)
            acero_error = differences(run_acero(b, dataset), want, b.limit)
            if acero_error:  # the baseline is wrong, not flight-exec: say so, but keep going
                log(f"{b.name}: the Acero baseline differs from DuckDB: {acero_error}")
            limited_sql = b.sql + (f" LIMIT {b.limit}" if b.limit is not None else "")
            row["fe"] = median_time(lambda: run_flight(b, files, urls), runs)
            row["duck"] = median_time(lambda: run_duckdb(con, limited_sql), runs)
            row["acero"] = median_time(lambda: run_acero(b, dataset), runs)
        except Exception as exc:  # noqa: BLE001 - one broken query must not hide the others
            row["error"] = f"{type(exc).__name__}: {exc}"
        results.append(row)
    con.close()
    return results


def print_table(results: list[dict[str, Any]]) -> None:
    def secs(x: float) -> str:
        return "-" if math.isnan(x) else f"{x:.3f}s"

    def ratio(a: float, b: float) -> str:
        return "-" if math.isnan(a) or math.isnan(b) else f"{a / b:.1f}x"

    print(f"{'query':<14}{'rows':>9}{'flight-exec':>13}{'duckdb':>9}{'acero':>9}{'fe/duckdb':>11}{'fe/acero':>10}  check")
    for r in results:
        print(f"{r['query']:<14}{r['rows']:>9}{secs(r['fe']):>13}{secs(r['duck']):>9}{secs(r['acero']):>9}"
              f"{ratio(r['fe'], r['duck']):>11}{ratio(r['fe'], r['acero']):>10}  {r['error'] or 'ok'}")


def run_micro() -> None:
    """Each micro benchmark in its own process (they start their own clusters); show its last line(s)."""
    here = Path(__file__).resolve().parent
    # slow_discovery.py ends with two figures: first_batch_ms, then slow_discovery_ratio.
    for script, tail in (("transport.py", 1), ("feed.py", 1), ("skew.py", 1), ("slow_discovery.py", 2)):
        log(f"micro benchmark {script}")
        proc = subprocess.run([sys.executable, str(here / "micro" / script)], cwd=here.parent,
                              stdout=subprocess.PIPE, text=True)
        lines = proc.stdout.strip().splitlines()
        print("\n".join(lines[-tail:]) if proc.returncode == 0 and lines else f"{script}: failed with exit code {proc.returncode}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    p.add_argument("--sf", type=float, default=0.1, help="TPC-H scale factor")
    p.add_argument("--workers", type=int, default=2, help="LocalCluster workers")
    p.add_argument("--runs", type=int, default=3, help="timed runs per query and engine (median)")
    p.add_argument("--micro", action="store_true", help="also run benchmarks/micro/{transport,feed,skew,slow_discovery}.py")
    args = p.parse_args(argv)

    log(f"ensuring TPC-H lineitem at SF {args.sf:g}")
    files = table_files(ensure_tpch(args.sf, ("lineitem",)), "lineitem")
    log(f"starting LocalCluster({args.workers})")
    with flight.LocalCluster(args.workers) as cluster:
        results = run_suite(files, cluster.urls, args.runs)
    print(f"TPC-H SF {args.sf:g} lineitem ({len(files)} files), {args.workers} workers, median of {args.runs} run(s)")
    print_table(results)
    if args.micro:
        run_micro()
    ok = sum(not r["error"] for r in results)
    print(f"suite: {ok}/{len(results)} queries match")
    return 0 if ok == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
