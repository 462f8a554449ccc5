"""flight-bench: TPC-H or TPC-DS on flight-exec vs PySpark, Sail, single-process Acero, DataFusion, Polars and DuckDB.

    flight-bench [--suite tpch|tpcds] [--sf 0.1] [--queries 1,6,...]
                 [--engines flight,pyspark,sail,sail-cluster,acero,datafusion,polars,duckdb]
                 [--workers 1,2 | --workers-file F | --urls U,...] [--runs 3] [--out bench-results] [--secure]
    flight-bench micro [NAME ...] [-- ARGS]      (also: python -m benchmarks ...)

Generates the suite's Parquet data into a cache (once per scale factor: TPC-H with
``tpchgen-cli``, TPC-DS with DuckDB's ``tpcds`` extension, ``benchmarks/tpcds.py``),
starts a ``LocalCluster`` (or uses running workers), and runs each query on each
engine, in the dialect it needs (``workload.py``, ``tpcds_bench.py``): one warm-up,
then ``--runs`` timed runs; the median counts. Every result is checked against
DuckDB's; a mismatch or a failure is reported in red and makes the exit code 1
(a text an engine refuses is marked ``unsupported`` and does not). Writes
``OUT/{tpch,tpcds}-sf{SF}.json`` (machine, versions, every run's time and peak RSS),
``.md`` (medians, ratios to flight-exec, geometric means) and ``.png``; prints the
Markdown table on stdout.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping, Sequence
from contextlib import ExitStack, closing
from pathlib import Path

import pyarrow as pa

import flight
from benchmarks import report
from benchmarks.engines import (
    SAIL_VENV,
    AceroEngine,
    DataFusionEngine,
    DuckDBEngine,
    Engine,
    FailedEngine,
    FlightEngine,
    Plans,
    PolarsEngine,
    SailEngine,
    SparkEngine,
    datafusion_available,
    ensure_sail_venv,
    java_available,
    polars_available,
    sail_available,
    sail_requirements,
    sail_venv_info,
    spark_available,
)
from benchmarks.micro import runner as micro
from benchmarks.progress import Progress
from benchmarks.suite import run_suite
from benchmarks.tpcds import QUERY_COUNT, TPCDS_CACHE
from benchmarks.tpcds_bench import tpcds_workload
from benchmarks.tpch import sf_dir
from benchmarks.tpch_queries import QUERY_NUMBERS, Files, decimals_as_numbers, duckdb_connection, duckdb_table
from benchmarks.tpch_sql import ALL_QUERIES
from benchmarks.workload import Workload, tpch_workload

__all__ = ["main"]

ENGINES = ("flight", "pyspark", "sail-cluster", "sail", "acero", "datafusion", "polars", "duckdb")
"""Every engine, in the order of the tables' columns."""
NEEDS = {
    "datafusion": (datafusion_available, "the datafusion package"),
    "polars": (polars_available, "the polars package"),
    "sail": (sail_available, "the pysail package"),
    "sail-cluster": (sail_available, "the pysail package"),
}
"""The optional engines' packages (all in the ``bench`` extra): a check and what to say when it fails."""
OUT_DEFAULT = "bench-results"
SUITES = {"tpch": ALL_QUERIES, "tpcds": tuple(range(1, QUERY_COUNT + 1))}
"""Each suite's queries (``--flight-plans builder``: TPC-H's ``QUERY_NUMBERS`` only)."""


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def _names(text: str) -> list[str]:
    names = [v.strip().lower() for v in text.split(",") if v.strip()]
    unknown = [n for n in names if n not in ENGINES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"engines are a comma-separated subset of {','.join(ENGINES)}; got {text!r}")
    return list(dict.fromkeys(names))


def default_engines() -> list[str]:
    """flight, acero, duckdb; pyspark when it is installed and Java is there to run it; datafusion, polars,
    sail and sail-cluster when their packages are installed (the ``bench`` extra installs them all)."""
    found = ["flight", "acero", "duckdb", *(["pyspark"] if spark_available() and java_available() else [])]
    return found + [name for name, (available, _) in NEEDS.items() if available()]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="flight-bench", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Engines: flight = DistributedExec on the workers; acero = flight.run_local, the same plan as one "
               "Acero pipeline in this process; duckdb = the SQL text in DuckDB (the reference answer); pyspark = "
               "the same SQL text in a local[N] SparkSession; datafusion = the SQL text in a DataFusion "
               "SessionContext in this process; polars = the SQL text in a polars SQLContext in this process; "
               "sail = the SQL text on a Sail Spark Connect server in local mode, sail-cluster = in local-cluster "
               "mode with N workers (N = the largest flight-exec worker count; the Sail server and client run "
               "from a venv of their own, .bench-cache/venvs/sail, made on first use). "
               "'flight-bench micro --help' lists the micro benchmarks.",
    )
    p.add_argument("--suite", choices=tuple(SUITES), default="tpch",
                   help="tpch: the 22 TPC-H queries; tpcds: the 99 TPC-DS queries, DuckDB's texts, each engine "
                        "given its dialect's copy (benchmarks/tpcds_bench.py) (default: %(default)s)")
    p.add_argument("--sf", type=float, default=0.1, help="the suite's scale factor (default: %(default)s)")
    p.add_argument("--queries", type=_ints, default=None,
                   help="comma-separated query numbers (default: all 22 of TPC-H, all 99 of TPC-DS; with "
                        f"--flight-plans builder, the builder's {','.join(map(str, QUERY_NUMBERS))})")
    p.add_argument("--flight-plans", choices=("sql", "builder"), default="sql",
                   help="what flight-exec runs: flight.sql of each query's SQL text, the text every engine runs "
                        "(default), or the hand-written builder plans of TPC-H (benchmarks/tpch_queries.py)")
    p.add_argument("--engines", type=_names, default=None,
                   help=f"comma-separated subset of {','.join(ENGINES)} (default: all; pyspark only "
                        "when it is installed and java is found, the others when their packages are installed)")
    p.add_argument("--workers", type=_ints, default=[2],
                   help="LocalCluster worker counts to run flight-exec with, e.g. 1,2 (default: 2)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--workers-file", type=Path, help="use running workers listed in this file (one URL a line)")
    where.add_argument("--urls", help="use running workers at these comma-separated URLs")
    p.add_argument("--worker-memory", default=None, metavar="SIZE",
                   help="each LocalCluster worker's --memory-limit, e.g. 4GB (default: the workers share half the machine)")
    p.add_argument("--runs", type=int, default=3, help="timed runs per query and engine, after one warm-up (default: 3)")
    p.add_argument("--out", type=Path, default=Path(OUT_DEFAULT), help="output directory (default: %(default)s)")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help=f"the suite's data cache (default: {sf_dir(1).parent} or {TPCDS_CACHE})")
    p.add_argument("--spark-cores", type=int, default=None,
                   help="N of PySpark's local[N] (default: the largest flight-exec worker count)")
    p.add_argument("--spark-memory", default="4g", help="spark.driver.memory (default: %(default)s)")
    p.add_argument("--no-chart", action="store_true", help="skip the PNG chart")
    p.add_argument("--micro", action="store_true", help="also run the default micro benchmarks afterwards")
    p.add_argument("--plain", action="store_true", help="plain progress lines even on a terminal")
    p.add_argument("--stage-bars", choices=("auto", "on", "off"), default="auto",
                   help="during each flight-exec warm-up, a bar per stage (execute(progress=True)); auto: on a "
                        "terminal from SF 10, where a query runs long enough to watch (default: %(default)s)")
    p.add_argument(
        "--secure",
        action="store_true",
        help="TLS and a bearer token: a secured LocalCluster, or with --urls/--workers-file the credentials "
        "named by FLIGHT_EXEC_TOKEN_FILE / FLIGHT_EXEC_TLS_CA / _CERT / _KEY (docs/security.md)",
    )
    return p


STAGE_BARS_SF = 10
"""From this scale factor, ``--stage-bars auto`` shows a flight-exec query's stages on a terminal."""


def _external_urls(args: argparse.Namespace) -> list[str] | None:
    if args.urls:
        return [u.strip() for u in args.urls.split(",") if u.strip()]
    if args.workers_file:
        with flight.FileWorkerResolver(args.workers_file) as resolver:
            return resolver.get_urls()
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["micro"]:
        return micro.main(argv[1:], OUT_DEFAULT)
    p = parser()
    args = p.parse_args(argv)
    if args.suite != "tpch" and args.flight_plans == "builder":
        p.error("--flight-plans builder has TPC-H's queries only")
    suite = SUITES[args.suite] if args.flight_plans == "sql" else QUERY_NUMBERS
    if args.queries is None:
        args.queries = list(suite)
    unknown = [n for n in args.queries if n not in suite]
    if unknown:
        p.error(f"queries {unknown} are not in the suite; it has {','.join(map(str, suite))}")
    if args.runs < 1 or min(args.workers) < 1:
        p.error("--runs and --workers must be at least 1")
    explicit = args.engines is not None
    names = args.engines if explicit else default_engines()
    if "pyspark" in names and not spark_available():
        p.error("the pyspark engine needs PySpark: pip install -e '.[spark]'")
    if "pyspark" in names and not java_available():
        p.error("the pyspark engine needs Java (java on PATH or JAVA_HOME)")
    for name in names:
        if name in NEEDS and not NEEDS[name][0]():
            p.error(f"the {name} engine needs {NEEDS[name][1]}: pip install -e '.[bench]'")
    urls = _external_urls(args)
    if urls is not None and not urls:
        p.error("no worker URLs given")

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    started_at, started, load_start = report.now_iso(), time.perf_counter(), report.load_average()
    numbers = list(dict.fromkeys(args.queries))
    with Progress(live=False if args.plain else None) as progress, ExitStack() as stack:
        if not explicit and "pyspark" not in names:
            progress.warn("PySpark (or Java) not found: running without the pyspark engine")
        work: Workload = (tpch_workload(args.sf, numbers, args.cache_dir, progress) if args.suite == "tpch"
                          else tpcds_workload(args.sf, args.cache_dir, progress))
        data_dir, files, texts = work.data_dir, work.files, work.texts

        engines: list[Engine] = []
        plans = Plans(files, args.flight_plans, texts["duckdb"])
        if "duckdb" in names:
            engines.append(stack.enter_context(closing(DuckDBEngine(files, texts["duckdb"]))))
        worker_counts = [len(urls)] if urls is not None else sorted(set(args.workers))
        if "flight" in names:
            if urls is not None:
                engines.append(FlightEngine(files, urls, None, flight.Security.from_env() if args.secure else None, plans))
            else:
                bar = progress.add(f"starting LocalCluster({max(worker_counts)})", total=1)
                memory = ["--memory-limit", args.worker_memory] if args.worker_memory else []
                cluster = stack.enter_context(
                    flight.LocalCluster(max(worker_counts), data_roots=[data_dir], secure=args.secure, worker_args=memory)
                )
                progress.finish(bar, description=f"LocalCluster: {', '.join(cluster.urls)}")
                for k in worker_counts:
                    pids = [p.pid for p in cluster.processes[:k]]
                    engines.append(FlightEngine(files, cluster.urls[:k], pids, cluster.security if args.secure else None, plans))
        bars = args.stage_bars == "on" or (args.stage_bars == "auto" and progress.live and args.sf >= STAGE_BARS_SF)
        for engine in engines:
            engine.stage_bars = bars and isinstance(engine, FlightEngine)
        if "acero" in names:
            engines.append(AceroEngine(files, plans))
        if "pyspark" in names:
            cores = args.spark_cores or max(worker_counts)
            bar = progress.add(f"starting Spark local[{cores}]", total=1)
            try:
                spark = stack.enter_context(closing(SparkEngine(files, cores, memory=args.spark_memory,
                                                                sql=texts["spark"])))
            except Exception as exc:  # noqa: BLE001 - the other engines still run; every pyspark cell shows this
                progress.error(f"Spark local[{cores}] did not start: {type(exc).__name__}: {exc}")
                engines.append(FailedEngine("pyspark", f"PySpark local[{cores}]", "PySpark", exc))
            else:
                progress.finish(bar, description=f"Spark {spark.version} local[{cores}] ready in {spark.startup_seconds:.1f}s")
                engines.append(spark)
        if "datafusion" in names:
            engines.append(stack.enter_context(closing(DataFusionEngine(files, texts["datafusion"]))))
        if "polars" in names:
            engines.append(PolarsEngine(files, texts["polars"]))
        sails = [name for name in ("sail", "sail-cluster") if name in names]
        if sails:
            engines += _start_sail(sails, files, texts["spark"], max(worker_counts), stack, progress)

        reference_con = stack.enter_context(closing(duckdb_connection(files))) if "duckdb" not in names else None

        def reference(n: int) -> pa.Table:
            assert reference_con is not None
            return decimals_as_numbers(duckdb_table(reference_con, texts["duckdb"][n]))

        cells = run_suite(engines, numbers, args.runs, reference, progress, work.check)

        # Ratios are to flight-exec with the most workers (to the first column when flight-exec did not run).
        ordered = sorted(engines, key=_column_order)
        flights = [e for e in ordered if isinstance(e, FlightEngine)]
        ref_key = flights[-1].key if flights else ordered[0].key
        labels = {e.key: e.label for e in ordered}
        shorts = {e.key: e.short for e in ordered}
        if len(flights) == 1:
            shorts[ref_key] = "flight-exec"
        info = report.machine()
        title = _title(work.title, args.sf, info, args.runs)
        stem = f"{work.name}-sf{args.sf:g}"
        markdown = report.markdown(cells, labels, shorts, numbers, ref_key, title)
        (out / f"{stem}.md").write_text(markdown)
        if not args.no_chart:
            report.chart(cells, labels, shorts, numbers, ref_key, title, out / f"{stem}.png")
        rel = report.ratios(cells, ref_key)
        common = report.common_queries(cells, list(labels), numbers)
        report.write_json(out / f"{stem}.json", {
            "started": started_at, "finished": report.now_iso(), "wall_seconds": round(time.perf_counter() - started, 1),
            "command": ["flight-bench", *argv],
            "machine": {**info, "load_average_1_5_15_min": {"start": load_start, "end": report.load_average()}},
            "versions": report.versions(with_java="pyspark" in names),
            "settings": {"suite": work.name, "sf": args.sf, "queries": numbers, "texts": dict(work.dialects),
                         "runs": args.runs, "warmups": 1, "flight_plans": args.flight_plans,
                         "workers": worker_counts, "external_workers": urls is not None,
                         "engines": [e.key for e in engines], "reference_answer": "duckdb",
                         "peak_rss": "per run: the sum of the VmHWM of the engine's processes, each reset before "
                                     "the run (benchmarks/memory.py; a result's peak_rss_method says if sampled VmRSS was used instead)"},
            "engines": {e.key: e.describe() for e in engines},
            "summary": {"ratios_to": ref_key,
                        "geomean_ratio": {e: report.geomean(list(r.values())) for e, r in rel.items()},
                        "geomean_common": {"queries": common, "ratio": {e: report.geomean([r[n] for n in common])
                                                                        for e, r in rel.items()}},
                        "answered": report.answered(cells),
                        "ok": all(c.status in ("ok", "unsupported") for c in cells)},
            "results": [c.to_json() for c in cells],
        })

    print(markdown, flush=True)
    planning = plans.describe()["planning_ms_median"]
    if planning is not None:
        print(f"flight-exec planning ({args.flight_plans} plans, text to stages): median {planning} ms per query", flush=True)
    print(f"wrote {out / stem}.md, .json{'' if args.no_chart else ', .png'} in {time.perf_counter() - started:.0f}s", flush=True)
    problems = [c for c in cells if c.status not in ("ok", "unsupported")]
    ok = not problems
    if problems:
        print(f"FAILED: {len(problems)} of {len(cells)} query x engine results are wrong or failed (see above)",
              file=sys.stderr, flush=True)
    if args.micro:
        with Progress(live=False if args.plain else None) as progress:
            ok = micro.run([n for n in micro.DEFAULT if n in micro.available()], [], out, progress) and ok
    return 0 if ok else 1


def _start_sail(names: Sequence[str], files: Files, sql: Mapping[int, str], workers: int, stack: ExitStack,
                progress: Progress) -> list[Engine]:
    """The Sail engines: the Sail venv made when missing, then a server and a client per engine; one
    that fails to start is a FailedEngine (every cell of its column shows why) and the others still run."""
    venv_error: Exception | None = None
    if sail_venv_info().get("requirements") != sail_requirements():
        bar = progress.add(f"making the Sail venv {SAIL_VENV}: pip install {' '.join(sail_requirements())}", total=1)
        started = time.perf_counter()
        try:
            ensure_sail_venv()
        except Exception as exc:  # noqa: BLE001 - the other engines still run
            progress.error(f"the Sail venv could not be made: {type(exc).__name__}: {exc}")
            venv_error = exc
        else:
            progress.finish(bar, description=f"Sail venv made in {time.perf_counter() - started:.0f}s: {SAIL_VENV}")
    engines: list[Engine] = []
    for name in names:
        k = workers if name == "sail-cluster" else None
        key, label, short = SailEngine.names(k)
        if venv_error is not None:
            engines.append(FailedEngine(key, label, short, venv_error))
            continue
        bar = progress.add(f"starting {label}", total=1)
        try:
            sail = stack.enter_context(closing(SailEngine(files, k, sql=sql)))
        except Exception as exc:  # noqa: BLE001 - the other engines still run; every cell of this one shows this
            progress.error(f"{label} did not start: {type(exc).__name__}: {exc}")
            engines.append(FailedEngine(key, label, short, exc))
        else:
            progress.finish(bar, description=f"{label}: Sail {sail.versions.get('pysail')} on 127.0.0.1:{sail.port}, "
                                             f"ready in {sail.startup_seconds:.1f}s")
            engines.append(sail)
    return engines


def _column_order(e: Engine) -> tuple[int, int]:
    head = e.key.split("[")[0]
    return (ENGINES.index(head) if head in ENGINES else len(ENGINES), len(getattr(e, "urls", [])))


def _title(suite: str, sf: float, info: dict[str, object], runs: int) -> str:
    memory = info.get("memory_bytes")
    gib = f", {int(memory) / (1 << 30):.0f} GiB" if isinstance(memory, int) else ""
    return (f"{suite} SF {sf:g} on {info.get('cores')} cores{gib} ({info.get('cpu', info.get('machine'))}): "
            f"median of {runs} run(s) after 1 warm-up")


if __name__ == "__main__":
    sys.exit(main())
