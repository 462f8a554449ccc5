"""The ``sail`` and ``sail-cluster`` engines: a Sail Spark Connect server and its client, from a venv of their own.

Apart from ``engines`` for size: the venv, the server's and the client's processes and their protocol are
most of it. ``engines`` re-exports every name.
"""

from __future__ import annotations

import fcntl
import json
import os
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import IO, Any

import pyarrow as pa

from benchmarks.engine_base import Engine
from benchmarks.memory import children_of
from benchmarks.tpch import REPO_ROOT
from benchmarks.tpch_queries import Files
from benchmarks.tpch_sql import SPARK_SQL

__all__ = [
    "SAIL_VENV",
    "SailEngine",
    "SailError",
    "ensure_sail_venv",
    "sail_available",
    "sail_requirements",
    "sail_venv_info",
]

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
                 timeout: float = 120, sql: Mapping[int, str] | None = None) -> None:
        self.sql = SPARK_SQL if sql is None else sql
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
            self._ask({"sql": self.sql[n], "out": str(out)})
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
