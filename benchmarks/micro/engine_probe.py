"""Engine probe: the same scans, TPC-H Q1/Q3/Q4 and memory checks on each candidate per-task engine.

Why: each task's compute is a pyarrow Acero pipeline fed by Python generators
over ``ParquetFile.iter_batches(use_threads=False)``. Before choosing the
per-task engine (``docs/engine.md``) we measure, on TPC-H Parquet at ``--sf``:
(1) decoding Q1's seven lineitem columns with pyarrow's readers and DuckDB;
(2) Q1 whole in Acero (today's path and a dataset scan), DuckDB (reading the
files itself, fed Arrow batches by a Python generator, fed by per-file DuckDB
scan queries, or one partial aggregate per file merged), DataFusion and Polars;
(3) Q3 and Q4 in DuckDB, DataFusion and Acero; (4) memory: a DuckDB hash join
under ``memory_limit`` (does it spill, how long), process RSS after queries and
after ``con.close()``, and pyarrow's pool after an Acero run and
``release_unused()``. Memory probes run in a fresh child process each.

Every engine gets 2 threads. Timings are the median of ``--runs`` after one
warm-up. Output: a table on stdout, JSON at ``--out``, and last the summary
lines ``name: value``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from datetime import date
from multiprocessing import get_context
from pathlib import Path
from typing import Any

os.environ.setdefault("POLARS_MAX_THREADS", "2")  # read once, when polars is first imported

import duckdb
import pyarrow as pa
import pyarrow.acero as ac
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

import flight
from benchmarks.tpch import ensure_tpch
from benchmarks.tpch_queries import SQL, TABLES, duckdb_connection, query, tpch_files

THREADS = 2
BATCH = 65536
Q1_COLS = ["l_returnflag", "l_linestatus", "l_quantity", "l_extendedprice", "l_discount", "l_tax", "l_shipdate"]
Q1_CUTOFF = date(1998, 9, 2)  # date '1998-12-01' - interval '90' day
Files = dict[str, list[Path]]
Probe = Callable[[], tuple[int, float]]  # -> (result rows, checksum)


def log(msg: str) -> None:
    print(f"[engine_probe] {msg}", file=sys.stderr, flush=True)


def rss_mb(field: str = "VmRSS") -> float:
    """This process's resident memory (``VmRSS``) or its peak (``VmHWM``) in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def duck(files: Files | None = None) -> duckdb.DuckDBPyConnection:
    con = duckdb_connection(files) if files else duckdb.connect()
    con.execute(f"SET threads={THREADS}; SET enable_progress_bar=false")
    return con


HAS_DUCK_ENGINE = True
"""flight-exec's tasks run on DuckDB; ``run_local`` runs either engine."""


def run_local(n: int, files: Files, engine: str = "acero") -> pa.Table:
    """``flight.run_local(query(n, files), engine=engine)``: ``acero`` is the pipeline tasks ran on before."""
    return flight.run_local(query(n, files), engine=engine).read_all()


def _q1_check(t: pa.Table) -> tuple[int, float]:
    return t.num_rows, float(pc.sum(t["count_order"]).as_py())


def _reader_gen(paths: list[Path], use_threads: bool = False, pre_buffer: bool = False) -> Iterator[pa.RecordBatch]:
    """Q1's columns of ``paths``, as today's task sources read them (by default)."""
    for f in paths:
        yield from pq.ParquetFile(f, pre_buffer=pre_buffer).iter_batches(
            batch_size=BATCH, columns=Q1_COLS, use_threads=use_threads)


# ------------------------------------------------------------------ 1. decode


def decode_probes(li: list[Path]) -> dict[str, Probe]:
    def count(batches: Iterator[pa.RecordBatch]) -> tuple[int, float]:
        return (n := sum(b.num_rows for b in batches)), float(n)

    def scanner(pre_buffer: bool) -> tuple[int, float]:
        opts = ds.ParquetFragmentScanOptions(pre_buffer=pre_buffer, cache_options=pa.CacheOptions(lazy=True))
        sc = ds.dataset(li, format="parquet").scanner(
            columns=Q1_COLS, use_threads=True, batch_size=BATCH, fragment_scan_options=opts)
        return count(iter(sc.to_reader()))

    def duck_decode() -> tuple[int, float]:
        with duck() as con:
            n, *_ = con.execute(
                "SELECT count(l_returnflag), count(l_linestatus), sum(l_quantity), sum(l_extendedprice),"
                f" sum(l_discount), sum(l_tax), max(l_shipdate) FROM read_parquet({[str(f) for f in li]})").fetchone()
        return n, float(n)

    return {
        "1a iter_batches 1 thread": lambda: count(_reader_gen(li)),
        "1b iter_batches threads+pre_buffer": lambda: count(_reader_gen(li, use_threads=True, pre_buffer=True)),
        "1c dataset scanner": lambda: scanner(False),
        "1c dataset scanner pre_buffer+lazy cache": lambda: scanner(True),
        "1d duckdb read_parquet aggregate": duck_decode,
    }


# ---------------------------------------------------------------------- 2. Q1


def acero_scan_q1(li: list[Path]) -> pa.Table:
    """Q1 as a hand-built Acero plan over a dataset ``scan`` node (filter pushed down to the reader)."""
    keep = pc.field("l_shipdate") <= pa.scalar(Q1_CUTOFF, pa.date32())
    f64 = {c: pc.field(c).cast(pa.float64()) for c in ("l_quantity", "l_extendedprice", "l_discount", "l_tax")}
    disc_price = f64["l_extendedprice"] * (pc.scalar(1.0) - f64["l_discount"])
    proj = {
        "l_returnflag": pc.field("l_returnflag"), "l_linestatus": pc.field("l_linestatus"),
        "qty": f64["l_quantity"], "price": f64["l_extendedprice"], "disc": f64["l_discount"],
        "disc_price": disc_price, "charge": disc_price * (pc.scalar(1.0) + f64["l_tax"]),
    }
    aggs = [("qty", "hash_sum", None, "sum_qty"), ("price", "hash_sum", None, "sum_base_price"),
            ("disc_price", "hash_sum", None, "sum_disc_price"), ("charge", "hash_sum", None, "sum_charge"),
            ("qty", "hash_mean", None, "avg_qty"), ("price", "hash_mean", None, "avg_price"),
            ("disc", "hash_mean", None, "avg_disc"), ([], "hash_count_all", None, "count_order")]
    # Acero's filter has no string_view kernel: the reader decodes those columns as plain strings.
    schema = pa.schema([f.with_type(pa.string()) if f.type == pa.string_view() else f for f in pq.read_schema(li[0])])
    dataset = ds.dataset(li, schema=schema, format="parquet")
    opts = ds.ParquetFragmentScanOptions(pre_buffer=True)
    plan = ac.Declaration.from_sequence([
        ac.Declaration("scan", ac.ScanNodeOptions(dataset, columns=Q1_COLS, filter=keep, batch_size=BATCH,
                                                  fragment_scan_options=opts)),
        ac.Declaration("filter", ac.FilterNodeOptions(keep)),
        ac.Declaration("project", ac.ProjectNodeOptions(list(proj.values()), list(proj))),
        ac.Declaration("aggregate", ac.AggregateNodeOptions(aggs, keys=["l_returnflag", "l_linestatus"])),
    ])
    return plan.to_table(use_threads=True).sort_by([("l_returnflag", "ascending"), ("l_linestatus", "ascending")])


Q1_COLS_SQL = ", ".join(Q1_COLS)
Q1_PARTIAL = f"""
SELECT l_returnflag, l_linestatus, sum(l_quantity) AS sq, sum(l_extendedprice) AS sp,
       sum(l_extendedprice * (1 - l_discount)) AS sdp, sum(l_extendedprice * (1 - l_discount) * (1 + l_tax)) AS sc,
       sum(l_discount) AS sd, count(*) AS n
FROM read_parquet('{{f}}') WHERE l_shipdate <= date '{Q1_CUTOFF}' GROUP BY ALL"""
Q1_MERGE = """
SELECT l_returnflag, l_linestatus, sum(sq) AS sum_qty, sum(sp) AS sum_base_price, sum(sdp) AS sum_disc_price,
       sum(sc) AS sum_charge, sum(sq) / sum(n) AS avg_qty, sum(sp) / sum(n) AS avg_price,
       sum(sd) / sum(n) AS avg_disc, sum(n) AS count_order
FROM partials GROUP BY ALL ORDER BY ALL"""


def q1_probes(files: Files, df_ctx: Any) -> dict[str, Probe]:
    li = files["lineitem"]

    def duck_files() -> tuple[int, float]:
        with duck(files) as con:
            return _q1_check(con.sql(SQL[1]).to_arrow_table())

    def duck_over(gen: Iterator[pa.RecordBatch], schema: pa.Schema, con: duckdb.DuckDBPyConnection) -> pa.Table:
        con.register("lineitem", pa.RecordBatchReader.from_batches(schema, gen))
        return con.sql(SQL[1]).to_arrow_table()

    def duck_python_hop() -> tuple[int, float]:
        schema = pa.schema([pq.read_schema(li[0]).field(c) for c in Q1_COLS])
        with duck() as con:
            return _q1_check(duck_over(_reader_gen(li), schema, con))

    def duck_per_file_scans() -> tuple[int, float]:
        with duck() as con:
            scans = con.cursor()  # the scan queries run beside the task's query: a second connection
            first = f"SELECT {Q1_COLS_SQL} FROM read_parquet('{{}}') WHERE l_shipdate <= date '{Q1_CUTOFF}'"
            readers = (scans.sql(first.format(f)).to_arrow_reader(BATCH) for f in li)
            head = next(readers)

            def gen() -> Iterator[pa.RecordBatch]:
                yield from head
                for r in readers:
                    yield from r

            return _q1_check(duck_over(gen(), head.schema, con))

    def duck_partials_merged() -> tuple[int, float]:
        with duck() as con:
            partials = pa.concat_tables([con.sql(Q1_PARTIAL.format(f=f)).to_arrow_table() for f in li])  # noqa: F841
            return _q1_check(con.sql(Q1_MERGE).to_arrow_table())

    def polars_q1() -> tuple[int, float]:
        import polars as pl

        f = {c: pl.col(c).cast(pl.Float64) for c in ("l_quantity", "l_extendedprice", "l_discount", "l_tax")}
        disc_price = f["l_extendedprice"] * (1 - f["l_discount"])
        out = (pl.scan_parquet([str(p) for p in li]).filter(pl.col("l_shipdate") <= Q1_CUTOFF)
               .group_by("l_returnflag", "l_linestatus")
               .agg(f["l_quantity"].sum().alias("sum_qty"), f["l_extendedprice"].sum().alias("sum_base_price"),
                    disc_price.sum().alias("sum_disc_price"),
                    (disc_price * (1 + f["l_tax"])).sum().alias("sum_charge"),
                    f["l_quantity"].mean().alias("avg_qty"), f["l_extendedprice"].mean().alias("avg_price"),
                    f["l_discount"].mean().alias("avg_disc"), pl.len().alias("count_order"))
               .sort("l_returnflag", "l_linestatus").collect())
        return out.height, float(out["count_order"].sum())

    out: dict[str, Probe] = {
        "2a acero run_local (iter_batches gen)": lambda: _q1_check(run_local(1, files)),
        "2a acero scan node": lambda: _q1_check(acero_scan_q1(li)),
        "2b duckdb read_parquet": duck_files,
        "2c duckdb <- python iter_batches gen": duck_python_hop,
        "2d duckdb <- per-file duckdb scans": duck_per_file_scans,
        "2e duckdb per-file partials merged": duck_partials_merged,
        "2f datafusion": lambda: _q1_check(df_ctx.sql(SQL[1]).to_arrow_table()),
        "2g polars lazy": polars_q1,
    }
    if HAS_DUCK_ENGINE:
        out["2h run_local, flight duckdb engine"] = lambda: _q1_check(run_local(1, files, "duckdb"))
    return out


# ---------------------------------------------------------------- 3. joins


def join_probes(files: Files, df_ctx: Any) -> dict[str, Probe]:
    def rows(t: pa.Table) -> tuple[int, float]:
        return t.num_rows, float(pc.sum(t.column(1)).as_py())  # revenue (Q3) / order_count (Q4)

    def duck_q(n: int) -> tuple[int, float]:
        with duck(files) as con:
            return rows(con.sql(SQL[n]).to_arrow_table())

    out: dict[str, Probe] = {}
    for n in (3, 4):
        out[f"3 Q{n} duckdb"] = lambda n=n: duck_q(n)
        out[f"3 Q{n} datafusion"] = lambda n=n: rows(df_ctx.sql(SQL[n]).to_arrow_table())
        out[f"3 Q{n} acero run_local"] = lambda n=n: rows(run_local(n, files))
        if HAS_DUCK_ENGINE:
            out[f"3 Q{n} run_local, flight duckdb engine"] = lambda n=n: rows(run_local(n, files, "duckdb"))
    return out


# --------------------------------------------------------------- 4. memory

JOIN_SQL = """
SELECT count(*) AS n, sum(l_extendedprice) AS price, sum(o_totalprice) AS total, sum(length(o_comment)) AS chars
FROM lineitem JOIN orders ON l_orderkey = o_orderkey"""


def memory_duckdb_join(files: Files, limit: str | None, runs: int) -> dict[str, Any]:
    """Child process: the join under ``memory_limit`` (or none), its time, spill peak and RSS."""
    tmp = tempfile.mkdtemp(prefix="engine_probe_spill_")
    start = rss_mb()
    con = duck(files)
    if limit:
        con.execute(f"SET memory_limit='{limit}'; SET temp_directory='{tmp}'")
    peak = [0]
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.02):
            with contextlib.suppress(OSError):  # a spill file may go while it is being counted
                peak[0] = max(peak[0], sum(p.stat().st_size for p in Path(tmp).rglob("*") if p.is_file()))

    threading.Thread(target=watch, daemon=True).start()
    times, error = [], None
    for i in range(runs + 1):
        try:
            t0 = time.perf_counter()
            con.sql(JOIN_SQL).fetchall()
            if i:
                times.append(time.perf_counter() - t0)
        except duckdb.Error as e:
            error = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
            break
    done.set()
    after_query = rss_mb()
    con.close()
    return {"limit": limit, "median_s": statistics.median(times) if times else None, "error": error,
            "spill_peak_mb": peak[0] / 2**20, "rss_start_mb": start, "rss_after_query_mb": after_query,
            "rss_after_close_mb": rss_mb(), "peak_rss_mb": rss_mb("VmHWM")}


def memory_acero(files: Files, n: int) -> dict[str, Any]:
    """Child process: pyarrow's pool and RSS after an Acero run of Q``n``, then after ``release_unused()``."""
    pool = pa.default_memory_pool()
    start = rss_mb()
    t0 = time.perf_counter()
    run_local(n, files)  # the result is dropped at once: what the pool holds after is the plan's
    elapsed = time.perf_counter() - t0
    stats = {"query": f"Q{n}", "backend": pool.backend_name, "s": elapsed,
             "pool_allocated_mb": pool.bytes_allocated() / 2**20, "pool_max_mb": pool.max_memory() / 2**20,
             "rss_start_mb": start, "rss_after_mb": rss_mb(), "peak_rss_mb": rss_mb("VmHWM")}
    pool.release_unused()
    stats["rss_after_release_mb"] = rss_mb()
    return stats


def in_child(fn: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as ex:
        return ex.submit(fn, *args).result()


# ------------------------------------------------------------------- main


def measure(name: str, fn: Probe, runs: int) -> dict[str, Any]:
    try:
        fn()  # warm-up
    except Exception as e:  # noqa: BLE001 - a probe that cannot run here is reported, not fatal
        error = f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"
        print(f"{name:<42} failed: {error}", flush=True)
        return {"probe": name, "error": error}
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        rows, check = fn()
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    print(f"{name:<42} {med:8.3f}s {min(times):8.3f}s {rows:>10,} {check:>16,.2f}", flush=True)
    return {"probe": name, "median_s": med, "min_s": min(times), "rows": rows, "check": check}


def datafusion_ctx(files: Files) -> Any:
    from datafusion import SessionConfig, SessionContext

    ctx = SessionContext(SessionConfig().with_target_partitions(THREADS))
    for table, paths in files.items():
        ctx.register_parquet(table, str(paths[0].parent), file_extension=".parquet")
    return ctx


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sf", type=float, default=1.0)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--out", default="/tmp/engine_probe.json")
    args = p.parse_args(argv)
    pa.set_cpu_count(THREADS)
    log(f"TPC-H SF {args.sf}: generating or reusing data")
    files = tpch_files(ensure_tpch(args.sf, TABLES), TABLES)
    import datafusion
    import polars

    versions = {"pyarrow": pa.__version__, "duckdb": duckdb.__version__, "datafusion": datafusion.__version__,
                "polars": polars.__version__, "threads": THREADS, "cpus": os.cpu_count()}
    print(f"TPC-H SF {args.sf:g}, median of {args.runs} after a warm-up; " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    print(f"{'probe':<42} {'median':>9} {'min':>9} {'rows':>10} {'check':>16}")
    ctx = datafusion_ctx(files)
    probes = {**decode_probes(files["lineitem"]), **q1_probes(files, ctx), **join_probes(files, ctx)}
    results = [measure(name, fn, args.runs) for name, fn in probes.items()]

    log("memory probes (each in a fresh process)")
    memory = [in_child(memory_duckdb_join, files, limit, args.runs) for limit in (None, "200MB", "64MB")]
    memory += [in_child(memory_acero, files, n) for n in (1, 3)]
    print("memory: duckdb lineitem JOIN orders (count, sums, length(o_comment)); RSS in MiB")
    for m in memory[:3]:
        t = f"{m['median_s']:.3f}s" if m["median_s"] is not None else m["error"]
        print(f"  limit {m['limit'] or 'none':>6}: {t}  spill peak {m['spill_peak_mb']:.0f} MiB  "
              f"RSS start {m['rss_start_mb']:.0f}, after query {m['rss_after_query_mb']:.0f}, after close {m['rss_after_close_mb']:.0f}, "
              f"peak {m['peak_rss_mb']:.0f}")
    for m in memory[3:]:
        print(f"  acero {m['query']} ({m['backend']}): {m['s']:.2f}s  pool allocated {m['pool_allocated_mb']:.0f} "
              f"max {m['pool_max_mb']:.0f}  RSS start {m['rss_start_mb']:.0f}, after {m['rss_after_mb']:.0f}, after release_unused "
              f"{m['rss_after_release_mb']:.0f}, peak {m['peak_rss_mb']:.0f}")
    Path(args.out).write_text(json.dumps({"sf": args.sf, "runs": args.runs, "versions": versions,
                                          "probes": results, "memory": memory}, indent=2))
    by = {r["probe"]: r.get("median_s", float("nan")) for r in results}
    print(f"results: {args.out}")
    print(f"python_hop_cost_s: {by['2c duckdb <- python iter_batches gen'] - by['2b duckdb read_parquet']:.3f}")
    print(f"q1_duckdb_vs_acero: {by['2b duckdb read_parquet'] / by['2a acero run_local (iter_batches gen)']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
