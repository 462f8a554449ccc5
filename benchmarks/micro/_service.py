"""A ``flight-coordinator`` subprocess for the micro benchmarks, serving TPC-H tables as file lists.

File lists, as the in-process catalog has them (a directory would be listed as each query runs, and
its plans would differ: no sizes or key ranges from the footers while planning).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def coordinator(workers: Sequence[str], files: Mapping[str, Sequence[Path]]) -> Iterator[tuple[str, str, int]]:
    """(Flight SQL URL, web page URL, PID) of a service over ``workers``; SIGTERM (it drains) on exit."""
    tables = [a for t, paths in files.items() for a in ("--table", f"{t}={','.join(str(p) for p in paths)}")]
    proc = subprocess.Popen([sys.executable, "-m", "flight.service", "--port", "0", "--http-port", "0", "--workers",
                             ",".join(workers), "--log-level", "WARNING", *tables], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url, page = proc.stdout.readline().split()[-1], proc.stdout.readline().split()[-1]
        yield url, page, proc.pid
    finally:
        proc.terminate()
        proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()
