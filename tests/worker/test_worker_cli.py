"""The daemon as users run it: a subprocess, its listening line, its actions, SIGTERM."""

from __future__ import annotations

import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.flight as fl
import pytest
from support import worker_info

import flight
from flight.dev.testing import SLEEP_SCHEMA, sleep_unit

LISTENING = "flight-worker listening on grpc://127.0.0.1:"


def start(cmd: list[str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        assert sel.select(timeout=20), "the worker printed nothing within 20s"
    line = proc.stdout.readline().rstrip("\n")
    return proc, line


def stop(proc: subprocess.Popen[str]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(15)
    finally:
        if proc.poll() is None:
            proc.kill()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def _worker() -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc, line = start([sys.executable, "-m", "flight.worker", "--host", "127.0.0.1", "--port", "0",
                        "--grace", "5", "--extension", "flight.dev.testing"])
    try:
        yield proc, line
    finally:
        stop(proc)


@pytest.fixture
def worker() -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A worker of the test's own: for tests that drain or stop it."""
    yield from _worker()


@pytest.fixture(scope="module")
def idle_worker() -> Iterator[tuple[subprocess.Popen[str], str]]:
    """One worker shared by the tests that only look at it (its first line, its actions)."""
    yield from _worker()


def test_first_line_is_exactly_the_listening_line(idle_worker: tuple[subprocess.Popen[str], str]) -> None:
    _, line = idle_worker
    assert line.startswith(LISTENING)
    port = int(line[len(LISTENING):])
    assert 0 < port < 65536


def test_console_script_is_installed() -> None:
    script = shutil.which("flight-worker", path=str(Path(sys.executable).parent)) or shutil.which("flight-worker")
    assert script is not None, "the flight-worker entry point is not installed"
    proc, line = start([script, "--port", "0"])
    assert line.startswith(LISTENING)
    assert stop(proc) == 0


def test_actions_health_info_list(idle_worker: tuple[subprocess.Popen[str], str]) -> None:
    url = idle_worker[1].split(" on ")[1]
    with fl.connect(url) as client:
        names = {a.type for a in client.list_actions()}
        assert names == {"health", "info", "cancel", "drain", "resume"}
        assert [r.body.to_pybytes() for r in client.do_action(fl.Action("health", b""))] == [b"ok"]
        with pytest.raises(Exception, match="unknown action"):
            list(client.do_action(fl.Action("reboot", b"")))
    info = worker_info(url)
    assert info.version == flight.__version__ and info.protocol_version == flight.wire.protocol.PROTOCOL_VERSION
    assert info.running_tasks == 0 and info.url == url


def test_sigterm_lets_running_tasks_finish_then_exits_zero(worker: tuple[subprocess.Popen[str], str]) -> None:
    proc, line = worker
    url = line.split(" on ")[1]

    class Few(flight.WorkUnitFeedProvider):
        def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[bytes]:
            for i in range(5):
                yield sleep_unit(i, ms=150)

    reader = flight.DistributedExec(flight.from_feed(Few(), "testing.sleep", SLEEP_SCHEMA), [url]).execute()
    first = reader.read_next_batch()
    proc.send_signal(signal.SIGTERM)
    rest = reader.read_all()  # the running task drains to completion
    assert first.num_rows + rest.num_rows == 5
    assert proc.wait(15) == 0
    assert proc.stderr is not None and "draining" in proc.stderr.read()


def test_sigterm_cancels_tasks_that_outlive_the_grace() -> None:
    proc, line = start([sys.executable, "-m", "flight.worker", "--port", "0", "--grace", "0.5", "--extension", "flight.dev.testing"])
    url = line.split(" on ")[1]
    try:
        class Endless(flight.WorkUnitFeedProvider):
            def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[bytes]:
                i = 0
                while not ctx.is_cancelled():
                    i += 1
                    yield sleep_unit(i, ms=20)

        reader = flight.DistributedExec(flight.from_feed(Endless(), "testing.sleep", SLEEP_SCHEMA), [url]).execute()
        reader.read_next_batch()
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        with pytest.raises(flight.TaskCancelledError, match="shutting down"):
            reader.read_all()
        assert proc.wait(15) == 0
        assert time.monotonic() - started < 10
    finally:
        stop(proc)


def test_draining_worker_refuses_new_tasks(worker: tuple[subprocess.Popen[str], str]) -> None:
    url = worker[1].split(" on ")[1]
    with fl.connect(url) as client:
        list(client.do_action(fl.Action("drain", b"")))
    q = flight.from_feed(_One(), "testing.sleep", SLEEP_SCHEMA)
    with pytest.raises(flight.WorkerUnavailableError, match="draining"):
        flight.DistributedExec(q, [url]).to_table()


class _One(flight.WorkUnitFeedProvider):
    def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[bytes]:
        yield sleep_unit(1)


def test_logs_go_to_stderr_not_stdout() -> None:
    proc, line = start([sys.executable, "-m", "flight.worker", "--port", "0", "--log-level", "DEBUG"])
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=15)
    assert line.startswith(LISTENING)
    assert out == "", "only the listening line belongs on stdout"
    assert "serving on" in err and "stopped" in err


def test_per_client_limits_below_one_are_refused_at_start() -> None:
    flags = ("--max-tasks-per-client", "--max-queued-per-client")
    # Both workers start at once: each spends its seconds importing before it checks its flags.
    procs = [
        subprocess.Popen([sys.executable, "-m", "flight.worker", "--port", "0", flag, "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for flag in flags
    ]
    try:
        outputs = [proc.communicate(timeout=60) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    for flag, proc, (stdout, stderr) in zip(flags, procs, outputs):
        assert proc.returncode == 2 and stdout == ""
        assert f"{flag} must be at least 1" in stderr
