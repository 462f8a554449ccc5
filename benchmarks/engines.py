"""The engines the harness times, each answering ``run(n) -> pyarrow.Table`` for query ``n`` of a suite.

Each takes its suite's texts (``sql``: ``{n: text}`` in the dialect it needs, ``workload.Workload.texts``);
without them, TPC-H's (``SQL`` and the copies below). What follows says TPC-H's ``SQL[n]``; the TPC-DS
suite hands each engine its own text the same way (``tpcds_bench``).

* ``flight[N]``: this project, ``DistributedExec(query(n, files), resolver)`` on N workers;
* ``acero``: ``flight.run_local(query(n, files), engine="acero")``, the same plan as one streaming Acero
  pipeline in the harness's process (no workers, no network);
* ``duckdb``: ``SQL[n]`` in DuckDB over views of the same Parquet files (the reference answer);
* ``pyspark``: a ``local[N]`` SparkSession started once, ``SQL[n]`` over temporary views of
  the same Parquet files, collected with ``DataFrame.toArrow()``;
* ``datafusion``: ``SQL[n]`` in one DataFusion ``SessionContext`` in the harness's process,
  one ``register_parquet`` listing per table, collected with ``to_arrow_table()``;
* ``polars``: ``SQL[n]`` in a polars ``SQLContext`` over one ``scan_parquet(files)`` per table,
  ``.collect().to_arrow()``;
* ``sail`` / ``sail-cluster``: ``SPARK_SQL[n]`` on a Sail Spark Connect server (local mode, or
  local-cluster mode with N workers) in a subprocess, through a PySpark Connect client in a
  second subprocess (both from a venv of their own, see ``ensure_sail_venv``).

Each engine also names the processes whose memory a run uses (``pids``) and what
its set-up cost (``startup_seconds``, not part of any run).
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import pyarrow as pa

import flight
from benchmarks.engine_base import Engine, FailedEngine
from benchmarks.memory import children_of
from benchmarks.sail_engine import (
    SAIL_VENV,
    SailEngine,
    SailError,
    ensure_sail_venv,
    sail_available,
    sail_requirements,
    sail_venv_info,
)
from benchmarks.tpch_queries import (
    SQL,
    Files,
    decimals_as_numbers,
    duckdb_answer,
    duckdb_connection,
    duckdb_table,
    query,
)
from benchmarks.tpch_sql import POLARS_SQL, SPARK_SQL, run_statements

T = TypeVar("T")

__all__ = [
    "POLARS_SQL",
    "SAIL_VENV",
    "SPARK_SQL",
    "AceroEngine",
    "DataFusionEngine",
    "DuckDBEngine",
    "Engine",
    "FailedEngine",
    "FlightEngine",
    "Plans",
    "PolarsEngine",
    "SailEngine",
    "SailError",
    "SparkEngine",
    "datafusion_available",
    "ensure_sail_venv",
    "java_available",
    "polars_available",
    "sail_available",
    "sail_requirements",
    "sail_venv_info",
    "spark_available",
]


class Plans:
    """What flight-exec runs for query ``n``: ``flight.sql(SQL[n], catalog)`` (``sql``, the default: the
    text every engine runs) or the hand-written builder plan (``builder``, ``tpch_queries.query``).

    Planning (text to the query, and the stages) is timed per run: ``planning_ms`` in the JSON."""

    def __init__(self, files: Files, kind: str = "sql", sql: Mapping[int, str] | None = None) -> None:
        if kind not in ("sql", "builder"):
            raise ValueError(f"plans must be 'sql' or 'builder', not {kind!r}")
        self.kind, self.files = kind, files
        self.sql = SQL if sql is None else sql
        self.catalog = flight.Catalog({t: flight.read_parquet([str(p) for p in paths]) for t, paths in files.items()})
        self.seconds: dict[int, list[float]] = {}

    def query(self, n: int) -> flight.Query:
        return flight.sql(self.sql[n], self.catalog) if self.kind == "sql" else query(n, self.files)

    def timed(self, n: int, make: Callable[[flight.Query], T]) -> T:
        started = time.perf_counter()
        made = make(self.query(n))
        self.seconds.setdefault(n, []).append(time.perf_counter() - started)
        return made

    def describe(self) -> dict[str, object]:
        medians = {n: round(statistics.median(v) * 1000, 2) for n, v in sorted(self.seconds.items())}
        overall = round(statistics.median(medians.values()), 2) if medians else None
        return {"plans": self.kind, "planning_ms": medians, "planning_ms_median": overall}


class FlightEngine(Engine):
    """flight-exec: the coordinator in this process, tasks on the workers behind ``urls``."""

    def __init__(
        self, files: Files, urls: Sequence[str], worker_pids: Sequence[int] | None, security: flight.Security | None = None,
        plans: Plans | None = None,
    ) -> None:
        self.security = security
        self.files = files
        self.plans = plans or Plans(files)
        self.urls = list(urls)
        self.worker_pids = list(worker_pids) if worker_pids is not None else None
        self.key = f"flight[{len(self.urls)}]"
        self.label = f"flight-exec, {len(self.urls)} worker{'s' if len(self.urls) > 1 else ''}"
        self.short = self.label

    def run(self, n: int) -> pa.Table:
        ex = self.plans.timed(n, lambda q: flight.DistributedExec(q, self.urls, security=self.security))
        return ex.to_table()

    def warm_up(self, n: int) -> pa.Table:
        """With ``stage_bars`` (long runs on a terminal: ``flight-bench --stage-bars``), a bar per stage
        while the query runs (``execute(progress=True)``); timed runs never draw them."""
        if not self.stage_bars:
            return self.run(n)
        ex = flight.DistributedExec(self.plans.query(n), self.urls, security=self.security)
        return ex.execute(progress=True).read_all()

    def pids(self) -> list[int]:
        return [os.getpid(), *(self.worker_pids or [])]

    def describe(self) -> dict[str, object]:
        memory = ("coordinator + worker processes" if self.worker_pids is not None
                  else "coordinator only (external workers)")
        return {**super().describe(), "workers": self.urls, "memory_covers": memory, **self.plans.describe()}


class AceroEngine(Engine):
    """The same builder plan as one Acero pipeline in this process: ``flight.run_local``."""

    key = "acero"
    label = "Acero, 1 process"
    short = "Acero"

    def __init__(self, files: Files, plans: Plans | None = None) -> None:
        self.files = files
        self.plans = plans or Plans(files)

    def run(self, n: int) -> pa.Table:
        return flight.run_local(self.plans.query(n), engine="acero").read_all()

    def cannot_run(self, error: Exception) -> bool:
        """Operators the Acero engine does not have (window functions: TPC-DS's ranks and moving averages)."""
        from flight.engine.select import DUCKDB_ONLY_WORDS

        return DUCKDB_ONLY_WORDS in str(error)

    def describe(self) -> dict[str, object]:
        how = "flight.run_local(query, engine='acero'): the same plan, one in-process Acero pipeline"
        return {**super().describe(), "how": how, "plans": self.plans.kind}


class DuckDBEngine(Engine):
    """``SQL[n]`` in an in-memory DuckDB with one view per table over the Parquet files."""

    key = "duckdb"
    label = "DuckDB, 1 process"
    short = "DuckDB"

    def __init__(self, files: Files, sql: Mapping[int, str] | None = None) -> None:
        started = time.perf_counter()
        self.files = files
        self.sql = sql
        self.con = duckdb_connection(files)
        self.startup_seconds = time.perf_counter() - started

    def run(self, n: int) -> pa.Table:
        if self.sql is None:
            return duckdb_answer(n, self.files, self.con)
        return decimals_as_numbers(duckdb_table(self.con, self.sql[n]))  # as duckdb_answer makes TPC-H's

    def describe(self) -> dict[str, object]:
        rows = self.con.execute("select current_setting('threads')").fetchall()
        return {**super().describe(), "threads": rows[0][0] if rows else None}

    def close(self) -> None:
        self.con.close()


# ------------------------------------------------------------------- PySpark

_LOG4J = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


def spark_available() -> bool:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return False
    return True


def java_available() -> bool:
    home = os.environ.get("JAVA_HOME")
    return bool(home and Path(home, "bin", "java").exists()) or shutil.which("java") is not None


class SparkEngine(Engine):
    """A ``local[cores]`` SparkSession (UI off, ``shuffle_partitions`` shuffle partitions, ``memory`` driver heap)."""

    key = "pyspark"
    short = "PySpark"

    def __init__(self, files: Files, cores: int, *, memory: str = "4g", shuffle_partitions: int | None = None,
                 sql: Mapping[int, str] | None = None) -> None:
        from pyspark.sql import SparkSession

        self.sql = SPARK_SQL if sql is None else sql
        self.cores = cores
        self.memory = memory
        self.shuffle_partitions = shuffle_partitions or 2 * cores
        self.label = f"PySpark local[{cores}]"
        # Python workers (none for SQL, but Spark checks) use this interpreter; the harness owns its environment.
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
        self._log4j = tempfile.NamedTemporaryFile("w", prefix="flight-bench-log4j2-", suffix=".properties", delete=False)
        self._log4j.write(_LOG4J)
        self._log4j.close()
        before = set(children_of(os.getpid()))
        started = time.perf_counter()
        self.conf = {
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": str(self.shuffle_partitions),
            "spark.driver.memory": memory,
            "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{self._log4j.name}",
        }
        builder = SparkSession.builder.master(f"local[{cores}]").appName("flight-bench")
        for k, v in self.conf.items():
            builder = builder.config(k, v)
        self.spark = builder.getOrCreate()
        self.spark.sparkContext.setLogLevel("ERROR")
        for table, paths in files.items():
            self.spark.read.parquet(*(str(p) for p in paths)).createOrReplaceTempView(table)
        self.startup_seconds = time.perf_counter() - started
        self.jvm_pids = [p for p in children_of(os.getpid()) if p not in before]
        self.version = self.spark.version

    def run(self, n: int) -> pa.Table:
        df = run_statements(self.sql[n], self.spark.sql)
        to_arrow = getattr(df, "toArrow", None)  # PySpark >= 4.0
        return to_arrow() if to_arrow is not None else pa.Table.from_pandas(df.toPandas(), preserve_index=False)

    def pids(self) -> list[int]:
        return [os.getpid(), *self.jvm_pids]

    def cannot_run(self, error: Exception) -> bool:
        """Spark's parser or analyzer refused the text (``ParseException``, ``AnalysisException``)."""
        return type(error).__name__ in ("ParseException", "AnalysisException")

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "master": f"local[{self.cores}]", "spark_version": self.version,
                "conf": {k: v for k, v in self.conf.items() if k != "spark.driver.extraJavaOptions"},
                "collect": "DataFrame.toArrow()", "memory_covers": "driver Python + Spark JVM"}

    def close(self) -> None:
        try:
            self.spark.stop()
        finally:
            os.unlink(self._log4j.name)


# ---------------------------------------------------------------- DataFusion


def datafusion_available() -> bool:
    try:
        import datafusion  # noqa: F401
    except ImportError:
        return False
    return True


def _listing_dir(table: str, paths: Sequence[Path], scratch: Path) -> Path:
    """A directory whose Parquet files are exactly ``paths`` (DataFusion registers a directory, not a list):
    their own directory when it holds no other Parquet file, else ``scratch/table`` with links to them."""
    files = sorted(Path(p).resolve() for p in paths)
    parents = {p.parent for p in files}
    if len(parents) == 1:
        parent = next(iter(parents))
        if sorted(p.resolve() for p in parent.glob("*.parquet")) == files:
            return parent
    links = scratch / table
    links.mkdir(parents=True)
    for i, path in enumerate(files):
        (links / f"{i}-{path.name}").symlink_to(path)
    return links


class DataFusionEngine(Engine):
    """``SQL[n]`` in one DataFusion ``SessionContext`` in this process, a Parquet listing table per table.

    TPC-H's SQL text runs unchanged (DataFusion parses ``interval '3' month``, ``exists`` and the column
    aliases of Q13's derived table); TPC-DS's is sqlglot's Postgres spelling of DuckDB's, whose ``/``
    divides as DuckDB's does (``tpcds_bench``). The context keeps DataFusion's defaults (as many target partitions
    as cores); its information schema is on only so that ``describe`` can read them."""

    key = "datafusion"
    label = "DataFusion, 1 process"
    short = "DataFusion"

    def __init__(self, files: Files, sql: Mapping[int, str] | None = None) -> None:
        import datafusion

        self.sql = SQL if sql is None else sql
        started = time.perf_counter()
        self.version = datafusion.__version__
        self.ctx = datafusion.SessionContext(datafusion.SessionConfig().with_information_schema(True))
        self._scratch = Path(tempfile.mkdtemp(prefix="flight-bench-datafusion-"))
        self.tables: dict[str, str] = {}
        for table, paths in files.items():
            where = str(_listing_dir(table, paths, self._scratch))
            self.ctx.register_parquet(table, where)
            self.tables[table] = where
        self.startup_seconds = time.perf_counter() - started

    def run(self, n: int) -> pa.Table:
        return run_statements(self.sql[n], self.ctx.sql).to_arrow_table()

    def cannot_run(self, error: Exception) -> bool:
        """DataFusion's parser or planner refused the text (its errors say so in their first words)."""
        return str(error).startswith(("SQL error", "This feature is not implemented", "Error during planning"))

    def describe(self) -> dict[str, object]:
        rows = self.ctx.sql("select value from information_schema.df_settings "
                            "where name = 'datafusion.execution.target_partitions'").to_pylist()
        return {**super().describe(), "datafusion_version": self.version,
                "target_partitions": rows[0]["value"] if rows else None, "tables": self.tables,
                "how": "SessionContext.register_parquet(table, directory); ctx.sql(SQL[n]).to_arrow_table()"}

    def close(self) -> None:
        shutil.rmtree(self._scratch, ignore_errors=True)


# -------------------------------------------------------------------- Polars


def polars_available() -> bool:
    try:
        import polars  # noqa: F401
    except ImportError:
        return False
    return True


class PolarsEngine(Engine):
    """``SQL[n]`` in a polars ``SQLContext`` with one ``scan_parquet(files)`` LazyFrame per table, collected.

    The SQL text runs unchanged: polars 2.1's SQL front end parses TPC-H's queries but Q15 (``exists``,
    ``interval '3' month``, ``as c_orders (c_custkey, c_count)``; Q15's view is a CTE in ``POLARS_SQL``)
    and all 99 TPC-DS texts as DuckDB writes them; a text it refuses is marked ``unsupported``
    (``cannot_run``), a query it answers wrongly fails its cell."""

    key = "polars"
    label = "Polars, 1 process"
    short = "Polars"

    def __init__(self, files: Files, sql: Mapping[int, str] | None = None) -> None:
        import polars as pl

        self.sql = POLARS_SQL if sql is None else sql
        started = time.perf_counter()
        self.version = pl.__version__
        self.threads = pl.thread_pool_size()
        self.ctx = pl.SQLContext({table: pl.scan_parquet([str(p) for p in paths]) for table, paths in files.items()})
        self.startup_seconds = time.perf_counter() - started

    def run(self, n: int) -> pa.Table:
        return run_statements(self.sql[n], self.ctx.execute).collect().to_arrow()

    def cannot_run(self, error: Exception) -> bool:
        """polars's SQL front end refused the text (``SQLInterfaceError``, ``SQLSyntaxError``)."""
        return type(error).__name__ in ("SQLInterfaceError", "SQLSyntaxError")

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "polars_version": self.version, "threads": self.threads,
                "how": "SQLContext({table: scan_parquet(files)}).execute(SQL[n]).collect().to_arrow()"}
