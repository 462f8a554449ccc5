"""``LocalCluster``: N real ``flight-worker`` processes on loopback.

The embedded default for the main job, the tests and the benchmarks: each
worker is the same daemon users run, started as a subprocess with ``--port 0``;
its URL is read from the first line it prints, with a deadline.

The workers go with the process that started them: each inherits the read end of a pipe whose
write end only the cluster holds (``--parent-fd``), and drains and exits at its end of file, which
comes when the cluster stops or its process dies, even of SIGKILL. (A pipe rather than Linux's
parent-death signal, which fires when the *thread* that started the child ends. A child forked
without exec, e.g. by ``multiprocessing``'s fork start method, inherits the write end and keeps the
workers until it ends too.)

Workers read files only under ``data_roots`` (each becomes a ``--data-root``);
without any, their file readers refuse every path.

``secure=True`` makes a throw-away CA (``trustme``, the ``dev`` extra), a
certificate for 127.0.0.1 and a random token in a private temporary directory:
the workers serve ``grpc+tls://``, require the token, and read each other with
both; ``mtls=True`` also requires client certificates. ``cluster.security`` is
what clients pass (``ExecOptions.security``, ``map_batches(security=...)``).
"""

from __future__ import annotations

import logging
import os
import secrets
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from flight.coordinator.resolver import StaticWorkerResolver
from flight.errors import WorkerUnavailableError
from flight.security import Security, SecurityFiles
from flight.wire.limits import DEFAULT_MEMORY_FRACTION, physical_memory
from flight.worker.memory import WORKER_ENV

__all__ = ["LocalCluster"]

log = logging.getLogger(__name__)

_PREFIX = "flight-worker listening on "


class LocalCluster:
    """Start ``n_workers`` worker processes; stop them on exit, even after an exception.

    ``data_roots``: the directories the workers may read files under (``--data-root``, each
    resolved by the worker), or store prefixes (``s3://bucket/prefix``); a missing directory
    makes the workers fail to start. ``fs_options``: how they reach object stores
    (``--fs-option``, docs/storage.md); ``env``: variables added to their environment (a
    store's credentials, say, which then never appear on a command line).
    """

    def __init__(
        self,
        n_workers: int = 2,
        *,
        extensions: Sequence[str] = (),
        data_roots: Sequence[str | os.PathLike[str]] = (),
        worker_args: Sequence[str] = (),
        per_worker_args: Sequence[Sequence[str]] | None = None,
        start_timeout: float = 30.0,
        log_level: str = "WARNING",
        grace: float = 5.0,
        secure: bool = False,
        mtls: bool = False,
        fs_options: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        hosts: Sequence[str] | None = None,
        cpus: Sequence[Sequence[int]] | None = None,
        log_file: str | os.PathLike[str] | None = None,
    ) -> None:
        """``hosts``: worker i listens on ``hosts[i]`` (loopback addresses such as ``127.0.0.2``: distinct hosts to
        the planner); ``cpus``: worker i runs on those cores only (``taskset``); ``log_file``: the workers' logs go
        there, not to this process's stderr (``flight-sql``'s workers, whose lines would cut into its screen)."""
        if n_workers < 1:
            raise ValueError("a LocalCluster needs at least one worker")
        for name, given in (("hosts", hosts), ("cpus", cpus)):
            if given is not None and len(given) != n_workers:
                raise ValueError(f"LocalCluster: {name} must name one entry per worker ({n_workers}), got {len(given)}")
        self._hosts = list(hosts) if hosts is not None else ["127.0.0.1"] * n_workers
        self._cpus = [list(c) for c in cpus] if cpus is not None else None
        self.security = Security()
        self._secrets: tempfile.TemporaryDirectory[str] | None = None
        secure_args: list[str] = []
        if secure or mtls:
            self._secrets = tempfile.TemporaryDirectory(prefix="flight-exec-secrets-")
            secure_args, self.security = _throwaway_credentials(Path(self._secrets.name), mtls)
        self.n_workers = n_workers
        # Store prefixes (s3://bucket/prefix) stay as they are; directories become absolute.
        self.data_roots = [os.fspath(d) if "://" in os.fspath(d) else os.path.abspath(d) for d in data_roots]
        self._env = dict(env or {})
        # The workers share this machine: together their engines may use the share one worker would.
        share = int(physical_memory() * DEFAULT_MEMORY_FRACTION / n_workers) >> 20
        memory = [] if any(a.startswith("--memory-limit") for a in worker_args) else ["--memory-limit", f"{share}MB"]
        # And its cores: engines that together start more threads than cores only take turns.
        threads = max(1, (os.cpu_count() or 1) // n_workers)
        cores = [] if any(a.startswith("--engine-threads") for a in worker_args) else ["--engine-threads", str(threads)]
        self._args = (
            memory
            + cores
            + [a for m in extensions for a in ("--extension", m)]
            + [a for d in self.data_roots for a in ("--data-root", d)]
            + secure_args
            + [a for k, v in (fs_options or {}).items() for a in ("--fs-option", f"{k}={v}")]
            + list(worker_args)
        )
        self._per_worker, self._log_file = per_worker_args, log_file
        self._timeout, self._log_level, self._grace = start_timeout, log_level, grace
        self.processes: list[subprocess.Popen[str]] = []
        self.urls: list[str] = []
        self._lifeline: int | None = None  # the write end of the workers' --parent-fd pipe

    def start(self) -> Self:
        try:
            life_r, self._lifeline = os.pipe()  # neither end is inherited by anything but the workers
            try:
                for i in range(self.n_workers):
                    self.processes.append(self._spawn(life_r, list(self._per_worker[i]) if self._per_worker else [], i))
            finally:
                os.close(life_r)
            self.urls = [self._wait_listening(p) for p in self.processes]
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, life_r: int, extra: list[str], i: int) -> subprocess.Popen[str]:
        cmd = [sys.executable, "-m", "flight.worker", "--host", self._hosts[i], "--port", "0", "--parent-fd", str(life_r),
               "--log-level", self._log_level, "--grace", str(self._grace), *self._args, *extra]
        if self._cpus is not None:
            cmd = ["taskset", "-c", ",".join(map(str, self._cpus[i])), *cmd]
        env = {**os.environ, **WORKER_ENV, **self._env, "PYTHONUNBUFFERED": "1"}
        # A process group of their own: a Ctrl-C at this process's terminal (a shell's, a notebook's) is
        # for this process, and must not stop the workers; they still go with it (the pipe above).
        if self._log_file is None:
            return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, pass_fds=(life_r,), env=env, process_group=0)
        with open(self._log_file, "ab") as log_file:
            return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log_file, text=True, pass_fds=(life_r,), env=env, process_group=0)

    def _wait_listening(self, proc: subprocess.Popen[str]) -> str:
        assert proc.stdout is not None
        deadline = time.monotonic() + self._timeout
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if sel.select(timeout=0.1):
                    line = proc.stdout.readline()
                    if line.startswith(_PREFIX):
                        return line[len(_PREFIX):].strip()
                    if not line:
                        break
                if proc.poll() is not None:
                    break
        raise WorkerUnavailableError(
            f"flight-worker (pid {proc.pid}) did not report listening within {self._timeout:g}s "
            f"(exit code {proc.poll()}); its log is {'on stderr' if self._log_file is None else 'in ' + os.fspath(self._log_file)}"
        )

    @property
    def security_files(self) -> SecurityFiles:
        """Where this cluster's client credentials are (paths only: for Spark closures and options)."""
        if self._secrets is None:
            return SecurityFiles()
        d = Path(self._secrets.name)
        mtls = self.security.cert_chain is not None
        return SecurityFiles(
            token_file=str(d / "token"),
            ca_file=str(d / "ca.pem"),
            cert_file=str(d / "client.pem") if mtls else None,
            key_file=str(d / "client.key") if mtls else None,
        )

    def resolver(self) -> StaticWorkerResolver:
        return StaticWorkerResolver(self.urls)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM every worker (they drain), then kill what is still running after ``timeout``."""
        for proc in self.processes:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self.processes:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("worker pid %d did not stop in time; killing it", proc.pid)
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        self.processes = []
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None
        if self._secrets is not None:
            self._secrets.cleanup()
            self._secrets = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def _throwaway_credentials(d: Path, mtls: bool) -> tuple[list[str], Security]:
    """A CA, a certificate for 127.0.0.1 and a token, written under ``d`` (mode 0600); worker flags and client side."""
    try:
        import trustme
    except ImportError as exc:
        raise ImportError("LocalCluster(secure=True) makes its test certificates with trustme: pip install trustme") from exc
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("flight-exec-client")
    token = secrets.token_urlsafe(32)
    files = {
        "ca.pem": ca.cert_pem.bytes(),
        "cert.pem": b"".join(blob.bytes() for blob in server.cert_chain_pems),
        "key.pem": server.private_key_pem.bytes(),
        "client.pem": b"".join(blob.bytes() for blob in client.cert_chain_pems),
        "client.key": client.private_key_pem.bytes(),
        "token": token.encode() + b"\n",
    }
    for name, data in files.items():
        path = d / name
        path.write_bytes(data)
        path.chmod(0o600)
    args = ["--tls-cert", str(d / "cert.pem"), "--tls-key", str(d / "key.pem"), "--tls-ca", str(d / "ca.pem"),
            "--auth-token-file", str(d / "token")]
    if mtls:
        args += ["--tls-client-ca", str(d / "ca.pem")]
    security = Security(
        token=token,
        tls_root_certs=files["ca.pem"],
        cert_chain=files["client.pem"] if mtls else None,
        private_key=files["client.key"] if mtls else None,
    )
    return args, security
