"""The chaos run's short form (issue 41, item 3): a minute of queries on a namespaced fleet under random faults.

``python -m benchmarks.chaos`` as a user runs it (a subprocess: its own fleet, its client in the coordinator's
namespace, two ``flight-coordinator`` services), for 60 s at 3 queries at once, on a few fast TPC-H and TPC-DS
queries (DuckDB's answers are made first), every fault kind drawn from. Its last line is the summary: no wrong
answer, no unclear error, no hang, no task nor process left behind; some answers and some faults. The long
form (``--seconds 1800``) is docs/fleet-harness.md's "The chaos run".
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

from benchmarks.tpch import REPO_ROOT
from flight.dev.netns import netns_unavailable

pytestmark = [pytest.mark.required, pytest.mark.slow, pytest.mark.skipif(netns_unavailable() is not None, reason=str(netns_unavailable()))]

SUMMARY = re.compile(r"^chaos: answers (\d+), wrong (\d+), errors (\d+).*, unclear (\d+), hung (\d+), faults (\d+).*"
                     r", leftover tasks (\d+), stray processes (\d+)$")


@pytest.mark.timeout(300)
def test_a_minute_of_chaos_gives_no_wrong_answer_no_unclear_error_and_leaves_nothing_behind(tmp_path: object) -> None:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.chaos", "--seconds", "60", "--concurrency", "3", "--seed", "41",
         "--queries", "tpch:1,3,5,6,12,14,19;tpcds:3,7,19,42,52,55,96,98", "--hang", "90", "--settle", "30",
         "--out", str(tmp_path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=280, check=False)
    lines = done.stdout.strip().splitlines()
    assert lines, f"no output (exit code {done.returncode}):\n{done.stderr[-3000:]}"
    summary = SUMMARY.match(lines[-1])
    assert summary is not None, f"the last line is not the summary: {lines[-1]!r}\n{done.stdout[-5000:]}\n{done.stderr[-3000:]}"
    answers, wrong, _errors, unclear, hung, faults, leftover, stray = map(int, summary.groups())
    report = "\n".join(lines[-40:])
    assert (wrong, unclear, hung, leftover, stray) == (0, 0, 0, 0, 0), report
    assert done.returncode == 0, f"exit code {done.returncode}:\n{report}\n{done.stderr[-3000:]}"
    assert answers >= 50 and faults >= 5, report
    print(f"chaos short form: {time.monotonic() - started:.0f}s; {lines[-1]}")
