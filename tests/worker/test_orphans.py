"""No orphans: workers a program started go when it goes, even when it is SIGKILLed (``--parent-fd``).

A real program (a subprocess of the test) starts a ``LocalCluster`` and is killed with SIGKILL,
running no code of its own; its workers, now without their parent, must end within their grace.
Checked by PID in ``/proc``: a process reparented to a PID 1 that does not reap it stays a zombie,
which counts as gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import wait_until

OWNER = """
import sys, threading
import flight
cluster = flight.LocalCluster(2, grace=1.0).start()
print(" ".join(str(p.pid) for p in cluster.processes), flush=True)
threading.Event().wait(600)  # until the test kills it
"""


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc to look processes up by PID (Linux)")
def test_a_sigkilled_owners_workers_exit_within_their_grace() -> None:
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert owner.stdout is not None
        pids = [int(p) for p in owner.stdout.readline().split()]
        assert len(pids) == 2 and all(alive(p) for p in pids)
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        # The grace (1 s), and room for a loaded machine to drain and exit.
        wait_until(lambda: not any(alive(p) for p in pids), 16.0, "the workers to exit")
        left = [p for p in pids if alive(p)]
        assert not left, f"workers {left} outlived the program that started them"
    finally:
        try:
            os.killpg(owner.pid, signal.SIGKILL)  # whatever is left of the owner's session, workers included
        except ProcessLookupError:
            pass
        owner.wait(10)
        if owner.stdout is not None:
            owner.stdout.close()


def test_a_parent_fd_that_is_not_open_is_refused_at_start() -> None:
    proc = subprocess.run([sys.executable, "-m", "flight.worker", "--port", "0", "--parent-fd", "987"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--parent-fd: 987 is not an open file descriptor" in proc.stderr
