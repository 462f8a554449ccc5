"""Helpers of the Spark tests (the session's SparkSession is ``spark`` in tests/conftest.py, made by ``support.spark_session``)."""

from __future__ import annotations

import socket
from pathlib import Path


def dead_url() -> str:
    """A loopback URL where nothing listens (a port that was just free)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"grpc://127.0.0.1:{port}"


def fleet_pids() -> set[int]:
    """flight-worker processes whose parent is a Spark Python worker: a ``start_workers`` fleet's, not a
    ``LocalCluster``'s (whose parent is the test's own process)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes()
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            parent = (Path("/proc") / str(ppid) / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if b"flight.worker" in cmd and b"pyspark" in parent:
            found.add(int(entry.name))
    return found
