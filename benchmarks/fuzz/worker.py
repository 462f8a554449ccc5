"""The ``flight-worker`` processes the fuzzer owns: started on port 0, a spare kept starting, stacks dumped on a hang."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.fuzz.proto import REPO_ROOT
from benchmarks.fuzz.settings import LISTENING, START_TIMEOUT

__all__ = ["OwnedWorker", "WorkerPool", "crash_site", "describe_exit", "process_env", "worker_accepts"]


# ------------------------------------------------------------------ the worker


@functools.lru_cache(maxsize=1)
def _worker_help() -> str:
    done = subprocess.run([sys.executable, "-m", "flight.worker", "--help"], capture_output=True, text=True,
                          timeout=START_TIMEOUT, env=process_env(), check=False)
    return done.stdout


def worker_accepts(flag: str) -> bool:
    """Whether ``flight-worker`` has ``flag`` (asked once, with ``--help``: the fuzzer serves several versions)."""
    return re.search(rf"{re.escape(flag)}\b", _worker_help()) is not None


def process_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}  # loopback only, never via a proxy
    env["PYTHONFAULTHANDLER"] = "1"  # a fatal signal prints every thread's Python stack into the log
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")  # Arrow's C++ pool as flight-worker chooses it (flight/worker/memory.py)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


_FATAL = re.compile(r"Fatal Python error: (?:Fatal Python error: )?(Segmentation fault|Bus error|Aborted|Floating-point exception|"
                    r"Illegal instruction|[^\n]+)")
_IDLE = {"wait", "wait_for", "select", "get", "put", "read_frames", "heartbeats", "_watch", "main"}
"""Functions where a worker thread waits (for a lock, the network, a queue) rather than works."""


def crash_site(worker_log: str) -> str:
    """From faulthandler's dump in a worker's log: the fatal error and the Python threads that were busy
    (not waiting) when it struck, e.g. 'Segmentation fault; busy: readers.py:150 read_ipc < pipeline.py:320 batches'."""
    fatal = _FATAL.search(worker_log)
    if not fatal:
        return ""
    busy = []
    for block in worker_log[fatal.end():].split("\n\n")[:80]:
        frames = re.findall(r'File "([^"]+)", line (\d+) in (\S+)', block)
        if frames and frames[0][2] not in _IDLE:
            busy.append(" < ".join(f"{Path(f).name}:{line} {func}" for f, line, func in frames[:3]))
    return fatal.group(1).strip() + (f"; busy: {' | '.join(busy[:2])}" if busy else "")


def describe_exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
        return f"signal {-code}"
    return f"exit code {code}"


class OwnedWorker:
    """A ``flight-worker`` process the fuzzer started in its scratch directory, logging to a file there."""

    def __init__(self, workdir: Path, number: int, extra_args: Sequence[str] = (), *, command: Sequence[str] | None = None,
                 listening: re.Pattern[str] = LISTENING, name: str = "worker") -> None:
        """``command`` (else ``flight-worker`` on port 0) started in ``workdir``; its first stdout line must match
        ``listening``, whose group 1 is its URL (the service fuzzer owns a service and a registry this way)."""
        self.workdir = workdir
        self.log = workdir / f"{name}-{number}.log"
        self.url = ""
        self.listening = listening
        self.name = name
        cmd = [sys.executable, "-m", "flight.worker", "--host", "127.0.0.1", "--port", "0", "--log-level", "WARNING", "--grace", "1",
               *(a.replace("{workdir}", str(workdir)) for a in extra_args)] if command is None else list(command)
        with open(self.log, "wb") as log:
            self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                cmd, cwd=workdir, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, env=process_env()
            )

    def wait_listening(self) -> str:
        try:
            self.url = self._listening()
        except BaseException:
            self.kill()
            raise
        return self.url

    def _listening(self) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        deadline, buf = time.monotonic() + START_TIMEOUT, b""
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while b"\n" not in buf:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"the {self.name} did not start (its log, {self.log}):\n{self.log_since(0)[-3000:]}")
                if sel.select(0.1):
                    chunk = os.read(self.proc.stdout.fileno(), 4096)
                    buf += chunk
                    if not chunk:
                        self.proc.wait(5)
        line = buf.split(b"\n", 1)[0].decode(errors="replace").strip()
        match = self.listening.match(line)
        if not match:
            raise RuntimeError(f"unexpected first line from the {self.name}: {line!r}")
        return match.group(1)

    def died(self, wait: float = 0.0) -> str | None:
        if self.proc is None:
            return None
        try:
            code = self.proc.wait(wait) if wait else self.proc.poll()
        except subprocess.TimeoutExpired:
            code = None
        return None if code is None else f"the {self.name} process ended ({describe_exit(code)})"

    def threads(self) -> int:
        """The process's thread count (0 if unknown): cases that leave hundreds behind slow every later one."""
        return self._status("Threads:")

    def rss_kb(self) -> int:
        """The process's resident memory, KiB (VmRSS; 0 if unknown)."""
        return self._status("VmRSS:")

    def _status(self, key: str) -> int:
        if self.proc is None:
            return 0
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith(key):
                    return int(line.split()[1])
        return 0

    def log_offset(self) -> int:
        with contextlib.suppress(OSError):
            return self.log.stat().st_size
        return 0

    def log_since(self, offset: int) -> str:
        """What the worker logged since ``offset`` (its first 40,000 characters: a fatal error's stacks come first)."""
        try:
            with open(self.log, "rb") as f:
                f.seek(offset)
                return f.read(40_000).decode(errors="replace")
        except OSError:
            return ""

    def dump_stacks(self) -> None:
        """Ask the worker for every thread's stack (``flight-worker`` registers faulthandler on SIGUSR1)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        before = self.log_offset()
        self.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 2.0
        while self.log_offset() == before and time.monotonic() < deadline and self.proc.poll() is None:
            threading.Event().wait(0.02)

    def kill(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def stop(self) -> None:
        """SIGTERM (it drains for its 1 s grace), then kill if it is still there."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(15)
        self.kill()


class WorkerPool:
    """The worker under test and a spare that is already starting: a crash costs no start-up time."""

    def __init__(self, workdir: Path, extra_args: Sequence[str] = ()) -> None:
        self.workdir = workdir
        self.extra_args = list(extra_args)
        self.started = 0
        self.spare: OwnedWorker | None = None

    def _spawn(self) -> OwnedWorker:
        self.started += 1
        return OwnedWorker(self.workdir, self.started, self.extra_args)

    def next(self) -> OwnedWorker:
        worker = self.spare or self._spawn()
        self.spare = self._spawn()
        worker.wait_listening()
        return worker

    def close(self) -> None:
        if self.spare is not None:
            self.spare.kill()
            self.spare = None
