"""A terminal for the shell's tests: ``flight-sql`` in a real tmux pane, keys sent, the screen read back.

Each ``Pane`` runs on a tmux server of its own (``-L``), so the tests never touch a user's tmux. Text is
typed literally (``send-keys -l``); a trailing ``;``, which tmux's command parser would take for its own
separator, is sent as its key code.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import shutil
import subprocess
import time
from pathlib import Path

TMUX = shutil.which("tmux")


class Pane:
    def __init__(self, command: list[str], *, cwd: Path, width: int = 160, height: int = 50) -> None:
        assert TMUX is not None
        self.socket = f"flight-test-{os.getpid()}-{secrets.token_hex(4)}"
        # The command's exit code stays on the screen after it ends (the pane is kept for reading).
        script = f"{shlex.join(command)}; echo \"[flight-sql exited $?]\"; sleep 600"
        self._tmux("new-session", "-d", "-s", "t", "-x", str(width), "-y", str(height), "-c", str(cwd), script)
        self._tmux("set-option", "-g", "history-limit", "20000")

    def _tmux(self, *args: str) -> str:
        done = subprocess.run([TMUX or "tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=30, check=True)
        return done.stdout

    def type(self, text: str) -> None:
        """Type ``text`` (no Enter)."""
        body, semicolon = (text[:-1], True) if text.endswith(";") else (text, False)
        if body:
            self._tmux("send-keys", "-t", "t", "-l", body)
        if semicolon:
            self._tmux("send-keys", "-t", "t", "-H", "3b")

    def line(self, text: str) -> None:
        """Type ``text`` and press Enter."""
        self.type(text)
        self.key("Enter")

    def key(self, name: str) -> None:
        self._tmux("send-keys", "-t", "t", name)

    def screen(self) -> str:
        """Everything the pane showed, scroll-back included, lines joined where the terminal wrapped them."""
        return self._tmux("capture-pane", "-p", "-J", "-S", "-", "-t", "t")

    def wait_for(self, pattern: str, timeout: float = 60.0, count: int = 1) -> str:
        """The screen once ``pattern`` (a regular expression) appears on it ``count`` times."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.screen()
            if len(re.findall(pattern, text, re.MULTILINE)) >= count:
                return text
            if time.monotonic() > deadline:
                raise AssertionError(f"{pattern!r} did not appear {count} time(s) within {timeout:g} s; the screen:\n{text}")
            time.sleep(0.1)

    def close(self) -> None:
        subprocess.run([TMUX or "tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=30, check=False)
