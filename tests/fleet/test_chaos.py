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
from pathlib import Path

import pytest

from benchmarks.chaos.tally import unclear_reason
from benchmarks.tpch import REPO_ROOT
from flight.dev.netns import netns_unavailable

namespaced = pytest.mark.skipif(netns_unavailable() is not None, reason=str(netns_unavailable()))

SUMMARY = re.compile(r"^chaos: answers (\d+), wrong (\d+), errors (\d+).*, unclear (\d+), hung (\d+), faults (\d+).*"
                     r", leftover tasks (\d+), stray processes (\d+)$")


@pytest.mark.timeout(300)
@pytest.mark.required
@pytest.mark.slow
@namespaced
def test_a_minute_of_chaos_gives_no_wrong_answer_no_unclear_error_and_leaves_nothing_behind(tmp_path: Path) -> None:
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
    if hung:  # the evidence the run kept: where the client's and the workers' threads waited (faulthandler's dumps)
        for log in sorted(tmp_path.glob("chaos-*/client.log")) + sorted(tmp_path.glob("chaos-*/w*.log")):
            report += f"\n--- {log.name}, its end:\n" + log.read_text(errors="replace")[-6000:]
    assert (wrong, unclear, hung, leftover, stray) == (0, 0, 0, 0, 0), report
    assert done.returncode == 0, f"exit code {done.returncode}:\n{report}\n{done.stderr[-3000:]}"
    assert answers >= 50 and faults >= 5, report
    print(f"chaos short form: {time.monotonic() - started:.0f}s; {lines[-1]}")


@pytest.mark.parametrize(("kind", "message", "clear"), [
    ("WorkerUnavailableError", "worker grpc://198.18.1.11:4000 sent nothing for 5s (heartbeats included): it is frozen", True),
    ("OperationalError(UNAVAILABLE)", "[FlightSQL] the query's stage 2 lost its worker (Unavailable; DoGet)", True),
    ("QueryTimeoutError", "the query's deadline of 120s passed", True),
    ("InternalError(INTERNAL)", "INTERNAL: [FlightSQL] internal error (Internal; ExecuteQuery)", False),
    ("FlightUnavailableError", "Socket closed", False),
    ("KeyError", "grpc://198.18.1.11:4000", False),
    ("TaskFailedError", "Traceback (most recent call last):\n  File x, line 1\nValueError: stage 3", False),
    ("ArrowInvalid", "expected 3 columns, got 2", False),
], ids=["url", "stage", "deadline", "bare-internal", "socket-closed", "keyerror", "traceback", "no-cause"])
def test_an_error_message_is_clear_when_it_names_a_worker_a_stage_or_a_reason(kind: str, message: str, clear: bool) -> None:
    assert (unclear_reason(kind, message) is None) is clear


def test_the_chaos_modules_are_small_and_each_is_on_the_architecture_map() -> None:
    modules = {str(p.relative_to(REPO_ROOT)): len(p.read_text().splitlines()) for p in (REPO_ROOT / "benchmarks" / "chaos").glob("*.py")}
    assert all(n <= 450 for n in modules.values()), modules
    text = (REPO_ROOT / "docs" / "architecture.md").read_text()
    mapped = set(re.findall(r"^\|\s*`(benchmarks/chaos/[\w/]+\.py)`\s*\|", text, flags=re.MULTILINE))
    assert mapped == set(modules), f"missing from docs/architecture.md: {sorted(set(modules) - mapped)}; gone: {sorted(mapped - set(modules))}"
