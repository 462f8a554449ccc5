"""The engines the harness times, each answering ``run(n) -> pyarrow.Table`` for TPC-H query ``n``.

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

import fcntl
import json
import os
import selectors
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import IO, Any, TypeVar

import pyarrow as pa

import flight
from benchmarks.memory import children_of
from benchmarks.tpch import REPO_ROOT
from benchmarks.tpch_queries import SQL, Files, duckdb_answer, duckdb_connection, query
from benchmarks.tpch_sql import run_statements

T = TypeVar("T")

__all__ = [
    "AceroEngine",
    "DataFusionEngine",
    "DuckDBEngine",
    "Engine",
    "FailedEngine",
    "FlightEngine",
    "Plans",
    "PolarsEngine",
    "SailEngine",
    "SparkEngine",
    "datafusion_available",
    "ensure_sail_venv",
    "java_available",
    "polars_available",
    "sail_available",
    "spark_available",
]


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

    stage_bars = False
    """Whether ``warm_up`` draws a live display of its own (the harness's bars step aside meanwhile)."""

    def warm_up(self, n: int) -> pa.Table:
        """The untimed first run of query ``n``: ``run`` unless the engine shows more while it warms up."""
        return self.run(n)

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


class Plans:
    """What flight-exec runs for query ``n``: ``flight.sql(SQL[n], catalog)`` (``sql``, the default: the
    text every engine runs) or the hand-written builder plan (``builder``, ``tpch_queries.query``).

    Planning (text to the query, and the stages) is timed per run: ``planning_ms`` in the JSON."""

    def __init__(self, files: Files, kind: str = "sql") -> None:
        if kind not in ("sql", "builder"):
            raise ValueError(f"plans must be 'sql' or 'builder', not {kind!r}")
        self.kind, self.files = kind, files
        self.catalog = flight.Catalog({t: flight.read_parquet([str(p) for p in paths]) for t, paths in files.items()})
        self.seconds: dict[int, list[float]] = {}

    def query(self, n: int) -> flight.Query:
        return flight.sql(SQL[n], self.catalog) if self.kind == "sql" else query(n, self.files)

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

    def describe(self) -> dict[str, object]:
        how = "flight.run_local(query, engine='acero'): the same plan, one in-process Acero pipeline"
        return {**super().describe(), "how": how, "plans": self.plans.kind}


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

SPARK_SQL: dict[int, str] = {**SQL, 15: SQL[15].replace("create view", "create temporary view")}
"""The Spark SQL text of each query. ``SQL`` runs unchanged on Spark 4 (``date - interval '90' day``,
``+ interval '3' month``, ``exists``, ``as c_orders (c_custkey, c_count)`` all parse), except Q15's
view: Spark refuses a persistent view over the harness's temporary views, so it is a temporary one."""

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
        df = run_statements(SPARK_SQL[n], self.spark.sql)
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
    """``SQL[n]`` in one DataFusion ``SessionContext`` in this process, a Parquet listing table per TPC-H table.

    The SQL text runs unchanged (DataFusion parses ``interval '3' month``, ``exists`` and the column
    aliases of Q13's derived table). The context keeps DataFusion's defaults (as many target partitions
    as cores); its information schema is on only so that ``describe`` can read them."""

    key = "datafusion"
    label = "DataFusion, 1 process"
    short = "DataFusion"

    def __init__(self, files: Files) -> None:
        import datafusion

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
        return run_statements(SQL[n], self.ctx.sql).to_arrow_table()

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


POLARS_SQL: dict[int, str] = {
    **SQL,
    15: """
with revenue0 (supplier_no, total_revenue) as (
    select l_suppkey, sum(l_extendedprice * (1 - l_discount))
    from lineitem
    where l_shipdate >= date '1996-01-01' and l_shipdate < date '1996-01-01' + interval '3' month
    group by l_suppkey)
select s_suppkey, s_name, s_address, s_phone, total_revenue
from supplier, revenue0
where s_suppkey = supplier_no and total_revenue = (select max(total_revenue) from revenue0)
order by s_suppkey
""",
}
"""polars's text of each query: ``SQL``, except Q15, whose view polars's SQL front end cannot make
(``statement type is not supported``): the same query with the view as a common table expression."""


class PolarsEngine(Engine):
    """``SQL[n]`` in a polars ``SQLContext`` with one ``scan_parquet(files)`` LazyFrame per table, collected.

    The SQL text runs unchanged: polars 2.1's SQL front end parses all ten queries (``exists``,
    ``interval '3' month``, ``as c_orders (c_custkey, c_count)``), so there is no polars dialect copy;
    a query it could not answer would fail its cell."""

    key = "polars"
    label = "Polars, 1 process"
    short = "Polars"

    def __init__(self, files: Files) -> None:
        import polars as pl

        started = time.perf_counter()
        self.version = pl.__version__
        self.threads = pl.thread_pool_size()
        self.ctx = pl.SQLContext({table: pl.scan_parquet([str(p) for p in paths]) for table, paths in files.items()})
        self.startup_seconds = time.perf_counter() - started

    def run(self, n: int) -> pa.Table:
        return run_statements(POLARS_SQL[n], self.ctx.execute).collect().to_arrow()

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "polars_version": self.version, "threads": self.threads,
                "how": "SQLContext({table: scan_parquet(files)}).execute(SQL[n]).collect().to_arrow()"}


# ---------------------------------------------------------------------- Sail

SAIL_VENV = REPO_ROOT / ".bench-cache" / "venvs" / "sail"
"""The venv the Sail server and its Spark Connect client run from, made once by ``ensure_sail_venv``."""
SAIL_CLIENT = Path(__file__).with_name("sail_client.py")
SAIL_CLIENT_REQUIREMENT = "pyspark-client>=4.0,<4.3"
"""Why a venv of its own: Sail's server embeds Python and checks the PySpark of its own interpreter, and
Sail 0.7 accepts PySpark up to 4.2 (its tests use pyspark-client 4.2.0): with the ``spark`` extra's PySpark
4.3 every session fails with "unsupported PySpark version: 4.3.0". ``pyspark-client`` 4.2 cannot share this
venv either, as it installs the same ``pyspark`` package as PySpark 4.3."""
_NOT_FOR_SAIL = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_HOME", "SPARK_REMOTE", "PYTHONPATH", "PYTHONHOME")
"""Variables of the harness's environment (``SparkEngine`` sets some) that must not reach the Sail venv's processes."""


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def sail_available() -> bool:
    """pysail (the ``bench`` extra) is installed here: then the Sail venv is made with the same version."""
    return _dist_version("pysail") is not None


def sail_requirements() -> list[str]:
    """What the Sail venv installs: this venv's pysail version, a Spark Connect client Sail accepts, pandas < 3."""
    pysail = _dist_version("pysail")
    return [f"pysail=={pysail}" if pysail else "pysail>=0.7", SAIL_CLIENT_REQUIREMENT, "pandas<3"]


class SailError(RuntimeError):
    """The Sail server or its client failed; the message says which and why."""


def _run(cmd: Sequence[str], timeout: float) -> str:
    try:
        done = subprocess.run(list(cmd), check=False, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SailError(f"{' '.join(cmd[:4])} ... did not finish in {timeout:.0f}s") from None
    if done.returncode != 0:
        tail = " ".join((done.stderr or done.stdout).split())[-1500:]
        raise SailError(f"{' '.join(cmd[:4])} ... exited with code {done.returncode}: {tail}")
    return done.stdout


def ensure_sail_venv(venv: Path = SAIL_VENV, *, timeout: float = 900) -> Path:
    """The Python of the Sail venv, made first (``python -m venv`` and ``pip install sail_requirements()``)
    when it is missing or was made for other requirements. Returns at once when it is ready."""
    python = venv / "bin" / "python"
    marker = venv / ".complete"
    wanted = sail_requirements()
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another harness making the same venv: wait for it
        if python.exists() and sail_venv_info(venv).get("requirements") == wanted:
            return python
        shutil.rmtree(venv, ignore_errors=True)
        _run([sys.executable, "-m", "venv", str(venv)], timeout)
        _run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *wanted], timeout)
        script = ("import importlib.metadata as m, json; "
                  "print(json.dumps({d: m.version(d) for d in ('pysail', 'pyspark-client', 'pyarrow', 'pandas')}))")
        versions = _run([str(python), "-c", script], 60)
        marker.write_text(json.dumps({"requirements": wanted, "versions": json.loads(versions)}) + "\n")
    return python


def sail_venv_info(venv: Path = SAIL_VENV) -> dict[str, Any]:
    """What ``ensure_sail_venv`` recorded: ``requirements`` and the installed ``versions`` ({} when not made)."""
    try:
        info = json.loads((venv / ".complete").read_text())
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, chars: int = 1500) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return " | ".join(line for line in text[-chars:].splitlines() if line.strip())


def _stop(proc: subprocess.Popen[Any] | None, grace: float) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(grace)


class SailEngine(Engine):
    """``SPARK_SQL[n]`` on a Sail Spark Connect server, collected with ``DataFrame.toArrow()``.

    ``workers=None``: Sail's local mode (one process, threads). ``workers=N``: Sail's local-cluster
    mode, a driver and N workers (threads of the server process) that exchange data over Arrow Flight,
    the closest peer to flight-exec. The server (``python -m pysail spark server``) listens on a free
    port of 127.0.0.1; the client (``sail_client.py``) is a second process of the Sail venv that writes
    each result as an Arrow IPC file this process reads. A run's time includes that hand-over (results
    are at most a few dozen rows)."""

    def __init__(self, files: Files, workers: int | None = None, *, venv: Path = SAIL_VENV,
                 timeout: float = 120) -> None:
        self.workers = workers
        self.key, self.label, self.short = self.names(workers)
        self.env = {"SAIL_MODE": "local" if workers is None else "local-cluster"}
        if workers is not None:
            self.env.update({
                "SAIL_CLUSTER__WORKER_INITIAL_COUNT": str(workers),
                "SAIL_CLUSTER__WORKER_MAX_COUNT": str(workers),
                # Keep the workers for the whole run (by default one idle for 60 s is removed; the other
                # engines' runs of a query can keep Sail idle that long).
                "SAIL_CLUSTER__WORKER_MAX_IDLE_TIME_SECS": "86400",
            })
        self.server: subprocess.Popen[bytes] | None = None
        self.client: subprocess.Popen[str] | None = None
        self._logs: list[IO[bytes]] = []
        self._dir = Path(tempfile.mkdtemp(prefix=f"flight-bench-{self.key}-"))
        try:
            started = time.perf_counter()
            python = ensure_sail_venv(venv)
            self.venv = venv
            self.venv_seconds = time.perf_counter() - started
            self.versions = sail_venv_info(venv).get("versions", {})
            started = time.perf_counter()
            env = {k: v for k, v in os.environ.items() if k not in _NOT_FOR_SAIL and not k.startswith("SAIL_")}
            self.port = _free_port()
            server_log = open(self._dir / "server.log", "wb")
            self._logs.append(server_log)
            self.server = subprocess.Popen(
                [str(python), "-m", "pysail", "spark", "server", "--ip", "127.0.0.1", "--port", str(self.port)],
                env={**env, **self.env}, stdin=subprocess.DEVNULL, stdout=server_log, stderr=subprocess.STDOUT)
            self._wait_listening(timeout)
            client_log = open(self._dir / "client.log", "wb")
            self._logs.append(client_log)
            self.client = subprocess.Popen([str(python), str(SAIL_CLIENT)], env=env, stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, stderr=client_log, text=True)
            tables = {t: [str(p) for p in paths] for t, paths in files.items()}
            answer = self._ask({"remote": f"sc://127.0.0.1:{self.port}", "tables": tables}, timeout)
            self.spark_version = answer.get("version")
            self.startup_seconds = time.perf_counter() - started
        except BaseException:
            self.close()
            raise

    @staticmethod
    def names(workers: int | None) -> tuple[str, str, str]:
        """``(key, label, short)`` of the engine: local mode when ``workers`` is None, else local-cluster."""
        if workers is None:
            return "sail", "Sail, 1 process", "Sail"
        return "sail-cluster", f"Sail local-cluster, {workers} worker{'s' if workers > 1 else ''}", "Sail cluster"

    def _wait_listening(self, timeout: float) -> None:
        assert self.server is not None
        deadline = time.monotonic() + timeout
        while True:
            code = self.server.poll()
            if code is not None:
                raise SailError(f"the Sail server exited with code {code}: {_tail(self._dir / 'server.log')}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise SailError(f"the Sail server did not listen on 127.0.0.1:{self.port} in {timeout:.0f}s") from None
                time.sleep(0.05)

    def _ask(self, request: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """Send one request to the client, wait for its answer (up to ``timeout`` seconds when given)."""
        client = self.client
        assert client is not None and client.stdin is not None and client.stdout is not None
        try:
            client.stdin.write(json.dumps(request) + "\n")
            client.stdin.flush()
        except OSError:
            pass  # it exited: the empty read below says so
        if timeout is not None:
            with selectors.DefaultSelector() as selector:
                selector.register(client.stdout, selectors.EVENT_READ)
                if not selector.select(timeout):
                    raise SailError(f"the Spark Connect client did not answer in {timeout:.0f}s: {_tail(self._dir / 'client.log')}")
        line = client.stdout.readline()
        if not line:
            raise SailError(f"the Spark Connect client exited with code {client.wait()}: {_tail(self._dir / 'client.log')}")
        answer: dict[str, Any] = json.loads(line)
        if not answer.get("ok"):
            problem = str(answer.get("error"))
            if self.server is not None and self.server.poll() is not None:
                problem += f" (the Sail server exited with code {self.server.returncode}: {_tail(self._dir / 'server.log')})"
            raise SailError(problem)
        return answer

    def run(self, n: int) -> pa.Table:
        out = self._dir / "result.arrow"
        try:
            self._ask({"sql": SPARK_SQL[n], "out": str(out)})
            return pa.ipc.open_file(pa.py_buffer(out.read_bytes())).read_all()
        finally:
            out.unlink(missing_ok=True)

    def pids(self) -> list[int]:
        procs = [p.pid for p in (self.client, self.server) if p is not None]
        extra = children_of(self.server.pid) if self.server is not None else []
        return [os.getpid(), *procs, *extra]

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "mode": self.env["SAIL_MODE"], "workers": self.workers, "env": self.env,
                "versions": self.versions, "spark_version_reported": self.spark_version, "venv": str(self.venv),
                "venv_seconds": round(self.venv_seconds, 3), "sql": "SPARK_SQL[n]", "collect": "DataFrame.toArrow()",
                "memory_covers": "harness + Spark Connect client process + Sail server process (its workers are threads)"}

    def close(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            if client.stdin is not None:
                try:
                    client.stdin.close()  # end of input: the client stops its session and exits
                except OSError:
                    pass
            try:
                client.wait(10)
            except subprocess.TimeoutExpired:
                _stop(client, 5)
            if client.stdout is not None:
                client.stdout.close()
        server, self.server = self.server, None
        _stop(server, 10)
        for log in self._logs:
            log.close()
        self._logs = []
        shutil.rmtree(self._dir, ignore_errors=True)
