"""The chaos run's processes around the fleet: spill directories, the Flight SQL services, the client, the final checks.

* ``SpillDirs``: a small tmpfs per worker (its ``--spill-dir``), so that the ``spill-full`` fault can fill
  one to its last byte without touching the machine's disk; plain directories where ``mount`` is refused
  (the fault is then left out).
* ``start_service``: a ``flight-coordinator`` per suite (TPC-H and TPC-DS both have a ``customer``
  table) in the coordinator's namespace, on the fleet's workers, ``--query-timeout`` the hang bound.
* ``start_client``: ``benchmarks.chaos.client`` in the coordinator's namespace.
* ``snapshot_code``: the run executes from a copy of the code, so that workers restarted late run what the
  first ones ran (other engineers edit the working tree meanwhile).
* ``leftover_tasks`` and ``stray_processes``: after the load, every worker's ``info`` must say 0 running
  tasks within a deadline, and no process may remain in a namespace but the workers and their proxies.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

from benchmarks.tpch import REPO_ROOT
from flight.dev.fleet import COORDINATOR, Fleet
from flight.dev.netns import LineReader

__all__ = ["CODE_ENV", "ClientProcess", "SpillDirs", "leftover_tasks", "snapshot_code", "start_client", "start_service", "stop",
           "stray_processes"]

_SERVICE = "flight-coordinator listening on "
_LIFELINE = os.pipe()
"""The services' ``--parent-fd``: this process holds the only write end, so they go when it goes, even by SIGKILL."""


CODE_ENV = "FLIGHT_CHAOS_CODE"
"""Set to the snapshot's directory in the run that executes from it."""


def snapshot_code() -> Path:
    """The code as it is now (``flight/`` and ``benchmarks/``) copied to a temporary directory, with the data cache
    linked. Run from there (the current directory leads ``sys.path``, before the editable install), every process
    of the run, a worker restarted half an hour later too, runs the same code while others edit the working tree."""
    root = Path(tempfile.mkdtemp(prefix="flight-chaos-code-"))
    for package in ("flight", "benchmarks"):
        shutil.copytree(REPO_ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    cache = REPO_ROOT / ".bench-cache"
    cache.mkdir(exist_ok=True)  # on a fresh clone it is not there yet: a link to nothing would make the data generator's mkdir fail
    (root / ".bench-cache").symlink_to(cache)
    return root


class SpillDirs:
    """``n`` spill directories, each a tmpfs of ``mb`` MiB when the machine lets us mount one."""

    def __init__(self, n: int, mb: int) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="flight-chaos-spill-"))
        self.dirs = [self.root / f"w{i}" for i in range(n)]
        self.mounted: list[Path] = []
        self.why_not: str | None = None
        for d in self.dirs:
            d.mkdir()
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mb}m", "tmpfs", str(d)], capture_output=True, text=True, check=False)
            if done.returncode != 0:
                self.why_not = f"cannot mount a tmpfs for the spill directories: {(done.stderr or done.stdout).strip()}"
                break
            self.mounted.append(d)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        for d in self.mounted:
            subprocess.run(["umount", "-l", str(d)], capture_output=True, check=False)
        subprocess.run(["rm", "-rf", str(self.root)], check=False)


def _first_line(proc: subprocess.Popen[str], what: str, timeout: float) -> tuple[str, LineReader]:
    assert proc.stdout is not None
    lines = LineReader(proc.stdout, what)
    try:
        line = lines.get(timeout)
    except TimeoutError:
        line = None
    if line is None:
        proc.kill()
        raise RuntimeError(f"{what} (pid {proc.pid}) said nothing within {timeout:g}s (exit code {proc.poll()})")
    return line, lines


def start_service(fleet: Fleet, files: Mapping[str, Sequence[Path]], log: IO[str], *, query_timeout: float,
                  timeout: float = 60.0) -> tuple[subprocess.Popen[str], str]:
    """A ``flight-coordinator`` in the coordinator's namespace serving ``files`` on the fleet's workers; and its URL."""
    tables = [a for name, paths in files.items() for a in ("--table", f"{name}={','.join(str(p) for p in paths)}")]
    proc = fleet.python(["-m", "flight.service", "--host", fleet.address(COORDINATOR), "--port", "0",
                         "--workers", ",".join(fleet.worker_urls), "--log-level", "WARNING", "--grace", "5",
                         "--query-timeout", str(query_timeout), "--parent-fd", str(_LIFELINE[0]), *tables],
                        stdout=subprocess.PIPE, stderr=log, text=True, pass_fds=(_LIFELINE[0],))
    line, _ = _first_line(proc, "flight-coordinator", timeout)
    if not line.startswith(_SERVICE):
        proc.kill()
        raise RuntimeError(f"flight-coordinator's first line was {line!r}")
    return proc, line[len(_SERVICE):].strip()


class ClientProcess:
    """The client in the coordinator's namespace: ``send`` a request, ``reply`` the next outcome."""

    def __init__(self, proc: subprocess.Popen[str], lines: LineReader) -> None:
        self.proc, self.lines = proc, lines

    def send(self, request: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()

    def reply(self, timeout: float) -> dict[str, Any] | None:
        """The next outcome, or None when there is none yet; EOFError when the client is gone."""
        try:
            line = self.lines.get(timeout)
        except TimeoutError:
            return None
        if line is None:
            raise EOFError(f"the chaos client (pid {self.proc.pid}) ended (exit code {self.proc.poll()})")
        return json.loads(line)

    def close(self, timeout: float) -> bool:
        """End of its stdin: it ends once its queries are done. False when it had to be killed."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return stop(self.proc, None, timeout)


def start_client(fleet: Fleet, spec: dict[str, Any], log: IO[str], timeout: float = 120.0) -> ClientProcess:
    path = fleet.dir / "chaos-client.json"
    path.write_text(json.dumps(spec))
    proc = fleet.python(["-m", "benchmarks.chaos.client", "--spec", str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                        stderr=log, text=True, cwd=str(REPO_ROOT))
    line, lines = _first_line(proc, "the chaos client", timeout)
    if json.loads(line) != {"ready": True}:
        proc.kill()
        raise RuntimeError(f"the chaos client's first line was {line!r}")
    return ClientProcess(proc, lines)


def stop(proc: subprocess.Popen[Any], sig: int | None, timeout: float) -> bool:
    """Send ``sig`` (if any) and wait ``timeout``; SIGKILL past it. True when it ended by itself."""
    if sig is not None and proc.poll() is None:
        proc.send_signal(sig)
    try:
        proc.wait(timeout)
        return True
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return False


def leftover_tasks(fleet: Fleet, deadline_s: float) -> tuple[int, list[dict[str, Any]]]:
    """Running tasks on the workers once ``deadline_s`` passed (or as soon as there are none); an unreachable worker
    counts as one. Also returns the last infos."""
    end = time.monotonic() + deadline_s
    while True:
        infos = fleet.worker_info(timeout=60.0)
        left = sum(int(i.get("running_tasks", 0)) for i in infos) + sum(1 for i in infos if "error" in i)
        if left == 0 or time.monotonic() >= end:
            return left, infos
        time.sleep(1.0)


def stray_processes(fleet: Fleet) -> list[str]:
    """Processes in the fleet's namespaces that should not be there: anything in the coordinator's, and anything in a
    worker's beside the worker and its proxy. Each as ``ns: pid cmdline``."""
    expected = {w.proc.pid for w in fleet.workers} | {w.proxy.proc.pid for w in fleet.workers if w.proxy is not None}
    stray = []
    for node in [COORDINATOR, *range(fleet.n_workers)]:
        ns = fleet.ns(node)
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=False).stdout.split()
        for pid in map(int, pids):
            if pid not in expected:
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                except OSError:
                    continue  # gone meanwhile
                stray.append(f"{fleet.node(node)}: {pid} {cmd[:200]}")
    return stray
