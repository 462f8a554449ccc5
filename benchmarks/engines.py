"""The engines the harness times, each answering ``run(n) -> pyarrow.Table`` for TPC-H query ``n``.

* ``flight[N]``: this project, ``DistributedExec(query(n, files), resolver)`` on N workers;
* ``acero``: ``flight.run_local(query(n, files))``, the same plan as one streaming Acero
  pipeline in the harness's process (no workers, no network);
* ``duckdb``: ``SQL[n]`` in DuckDB over views of the same Parquet files (the reference answer);
* ``pyspark``: a ``local[N]`` SparkSession started once, ``SQL[n]`` over temporary views of
  the same Parquet files, collected with ``DataFrame.toArrow()``.

Each engine also names the processes whose memory a run uses (``pids``) and what
its set-up cost (``startup_seconds``, not part of any run).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

import flight
from benchmarks.memory import children_of
from benchmarks.tpch_queries import SQL, Files, duckdb_answer, duckdb_connection, query

__all__ = ["AceroEngine", "DuckDBEngine", "Engine", "FailedEngine", "FlightEngine", "SparkEngine", "java_available", "spark_available"]


class Engine:
    """What the harness needs of an engine; subclasses fill in ``run``."""

    key = "engine"
    """Short name in the JSON and on the command line, e.g. ``flight[2]``."""
    label = "engine"
    """Column title in the tables and the chart."""
    short = "engine"
    """Its name in a ratio's column title."""
    startup_seconds = 0.0

    def run(self, n: int) -> pa.Table:
        raise NotImplementedError

    def pids(self) -> list[int]:
        """The processes a run of this engine uses (their peak RSS is its memory)."""
        return [os.getpid()]

    def describe(self) -> dict[str, object]:
        return {"label": self.label, "startup_seconds": round(self.startup_seconds, 3)}

    def close(self) -> None:
        pass


class FailedEngine(Engine):
    """An engine that could not start: every run raises why, so each of its cells reports it."""

    def __init__(self, key: str, label: str, short: str, error: BaseException) -> None:
        self.key, self.label, self.short, self.error = key, label, short, error

    def run(self, n: int) -> pa.Table:
        raise RuntimeError(f"{self.label} did not start: {type(self.error).__name__}: {self.error}")

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "error": f"{type(self.error).__name__}: {self.error}"}


class FlightEngine(Engine):
    """flight-exec: the coordinator in this process, tasks on the workers behind ``urls``."""

    def __init__(
        self, files: Files, urls: Sequence[str], worker_pids: Sequence[int] | None, security: flight.Security | None = None
    ) -> None:
        self.security = security
        self.files = files
        self.urls = list(urls)
        self.worker_pids = list(worker_pids) if worker_pids is not None else None
        self.key = f"flight[{len(self.urls)}]"
        self.label = f"flight-exec, {len(self.urls)} worker{'s' if len(self.urls) > 1 else ''}"
        self.short = self.label

    def run(self, n: int) -> pa.Table:
        return flight.DistributedExec(query(n, self.files), self.urls, security=self.security).to_table()

    def pids(self) -> list[int]:
        return [os.getpid(), *(self.worker_pids or [])]

    def describe(self) -> dict[str, object]:
        memory = ("coordinator + worker processes" if self.worker_pids is not None
                  else "coordinator only (external workers)")
        return {**super().describe(), "workers": self.urls, "memory_covers": memory}


class AceroEngine(Engine):
    """The same builder plan as one Acero pipeline in this process: ``flight.run_local``."""

    key = "acero"
    label = "Acero, 1 process"
    short = "Acero"

    def __init__(self, files: Files) -> None:
        self.files = files

    def run(self, n: int) -> pa.Table:
        return flight.run_local(query(n, self.files)).read_all()

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "how": "flight.run_local(query(n, files)): the same plan, one in-process Acero pipeline"}


class DuckDBEngine(Engine):
    """``SQL[n]`` in an in-memory DuckDB with one view per table over the Parquet files."""

    key = "duckdb"
    label = "DuckDB, 1 process"
    short = "DuckDB"

    def __init__(self, files: Files) -> None:
        started = time.perf_counter()
        self.files = files
        self.con = duckdb_connection(files)
        self.startup_seconds = time.perf_counter() - started

    def run(self, n: int) -> pa.Table:
        return duckdb_answer(n, self.files, self.con)

    def describe(self) -> dict[str, object]:
        rows = self.con.execute("select current_setting('threads')").fetchall()
        return {**super().describe(), "threads": rows[0][0] if rows else None}

    def close(self) -> None:
        self.con.close()


# ------------------------------------------------------------------- PySpark

SPARK_SQL: dict[int, str] = dict(SQL)
"""The Spark SQL text of each query. ``SQL`` runs unchanged on Spark 4 (``date - interval '90' day``,
``+ interval '3' month``, ``exists``, ``as c_orders (c_custkey, c_count)`` all parse), so this is a copy:
a query whose DuckDB text Spark cannot run would get its Spark dialect here."""

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

    def __init__(self, files: Files, cores: int, *, memory: str = "4g", shuffle_partitions: int | None = None) -> None:
        from pyspark.sql import SparkSession

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
        df = self.spark.sql(SPARK_SQL[n])
        to_arrow = getattr(df, "toArrow", None)  # PySpark >= 4.0
        return to_arrow() if to_arrow is not None else pa.Table.from_pandas(df.toPandas(), preserve_index=False)

    def pids(self) -> list[int]:
        return [os.getpid(), *self.jvm_pids]

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "master": f"local[{self.cores}]", "spark_version": self.version,
                "conf": {k: v for k, v in self.conf.items() if k != "spark.driver.extraJavaOptions"},
                "collect": "DataFrame.toArrow()", "memory_covers": "driver Python + Spark JVM"}

    def close(self) -> None:
        try:
            self.spark.stop()
        finally:
            os.unlink(self._log4j.name)
