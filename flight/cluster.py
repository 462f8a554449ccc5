"""``LocalCluster``: N real ``flight-worker`` processes on loopback.

The embedded default for the main job, the tests and the benchmarks: each
worker is the same daemon users run, started as a subprocess with ``--port 0``;
its URL is read from the first line it prints, with a deadline.
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from types import TracebackType

from flight.errors import WorkerUnavailableError
from flight.resolver import StaticWorkerResolver

__all__ = ["LocalCluster"]

log = logging.getLogger(__name__)

_PREFIX = "flight-worker listening on "


class LocalCluster:
    """Start ``n_workers`` worker processes; stop them on exit, even after an exception."""

    def __init__(
        self,
        n_workers: int = 2,
        *,
        extensions: Sequence[str] = (),
        worker_args: Sequence[str] = (),
        per_worker_args: Sequence[Sequence[str]] | None = None,
        start_timeout: float = 30.0,
        log_level: str = "WARNING",
        grace: float = 5.0,
    ) -> None:
        if n_workers < 1:
            raise ValueError("a LocalCluster needs at least one worker")
        self.n_workers = n_workers
        self._args = [a for m in extensions for a in ("--extension", m)] + list(worker_args)
        self._per_worker = per_worker_args
        self._timeout = start_timeout
        self._log_level = log_level
        self._grace = grace
        self.processes: list[subprocess.Popen[str]] = []
        self.urls: list[str] = []

    def start(self) -> LocalCluster:
        try:
            for i in range(self.n_workers):
                extra = list(self._per_worker[i]) if self._per_worker else []
                cmd = [sys.executable, "-m", "flight.worker", "--host", "127.0.0.1", "--port", "0",
                       "--log-level", self._log_level, "--grace", str(self._grace), *self._args, *extra]
                proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
                self.processes.append(proc)
            self.urls = [self._wait_listening(p) for p in self.processes]
        except BaseException:
            self.stop()
            raise
        return self

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
            f"(exit code {proc.poll()}); its log is on stderr"
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

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
