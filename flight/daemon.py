"""What the daemons (``flight-worker``, ``flight-coordinator``) share: how they wait to be stopped.

Both stop on SIGTERM or Ctrl-C, and a process started with ``--parent-fd`` also when that pipe
ends (the program holding its write end is gone, even of SIGKILL): ``wait_for_stop`` says which.
"""

from __future__ import annotations

import os
import select
import signal

__all__ = ["catch_stop_signals", "wait_for_stop"]


def wait_for_stop(wake_r: int, stop_signals: set[int], parent_fd: int | None) -> str:
    """Block until a stop signal arrives or the parent's pipe ends; why, in words."""
    watched = [wake_r] if parent_fd is None else [wake_r, parent_fd]
    while True:
        ready, _, _ = select.select(watched, [], [])
        if wake_r in ready:
            signum = next((b for b in os.read(wake_r, 64) if b in stop_signals), 0)
            if signum:
                return f"received signal {signum}"
        if parent_fd is not None and parent_fd in ready and not os.read(parent_fd, 64):
            return f"the parent process is gone (end of file on --parent-fd {parent_fd})"


def catch_stop_signals() -> tuple[int, set[int]]:
    """The pipe the stop signals' numbers arrive on (its read end), and those signals.

    A do-nothing Python handler (so no thread ever dies of the default action) plus the
    wakeup fd, which the C-level handler writes the signal number to, from any thread.
    The main thread waits on that pipe; no Python code runs inside a signal handler.
    """
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    stop_signals = {int(signal.SIGTERM), int(signal.SIGINT)}
    for signum in stop_signals:
        signal.signal(signum, lambda *_: None)
    return wake_r, stop_signals
