"""The service fuzzer (``benchmarks/fuzz/service``, ``python -m benchmarks.fuzz_service``) against a real
``flight-coordinator`` and a fleet registry: no command, handle, parameter batch, header or registration
may crash or wedge them, nor come back unclear.

As tests/worker/test_fuzz.py does for the worker: the fuzzer runs as a subprocess in its own session
(it starts the service, its worker and the registry itself), a deadline ends the whole group, and the
last stdout lines are the summaries. A few hundred cases of a fixed seed: every family is drawn.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.fuzz.service import REGISTRY_FAMILIES, SERVICE_FAMILIES, ServiceGenerator

ROOT = Path(__file__).resolve().parents[2]
SUMMARY = re.compile(r"^(service|registry)_fuzz_cases: (\d+), crashes: (\d+), hangs: (\d+), unclear: (\d+) \((.*)\)$")
SEED = 20261122
CASES = 250
RUN_TIMEOUT = 240.0
KNOWN_UNCLEAR: set[tuple[str, str]] = set()
"""(family, call) pairs known to give an unclear error. Emptied once GetSchema's errors lost their traceback
(pyarrow does not translate a FlightError raised in get_schema: flight/service/server.py, ``_without_traceback``)
and a parameter Python's datetime cannot hold was refused by name (``_parameters``)."""


def run_fuzzer(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    cmd = [sys.executable, "-m", "benchmarks.fuzz_service", "--corpus", str(tmp_path / "corpus"), *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the fuzzer did not finish within {RUN_TIMEOUT:g} s; its stderr ends with:\n{err[-4000:]}")
    return proc.returncode, out, err


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT + 60)
def test_hostile_commands_handles_parameters_headers_and_registrations_leave_both_servers_serving(tmp_path: Path) -> None:
    code, out, err = run_fuzzer(tmp_path, "--cases", str(CASES), "--registry-cases", str(CASES), "--seed", str(SEED), "--unclear-kept", "100000")
    lines = {m.group(1): m for m in map(SUMMARY.match, out.strip().splitlines()) if m}
    kept = sorted((tmp_path / "corpus").glob("*.json"))
    unexplained = []
    for path in kept:
        record = json.loads(path.read_text())
        call = record["verdict"]["detail"].split(" ")[0]  # the call of the status judged unclear
        if record["verdict"]["kind"] != "unclear" or (record["case"]["family"], call) not in KNOWN_UNCLEAR:
            unexplained.append(f"{path.name}: {record['verdict']} {record['case']['note'][:200]}")
    report = f"{out}\nkept: {unexplained}\nfuzzer report:\n{err[-6000:]}"
    assert set(lines) == {"service", "registry"}, report
    for match in lines.values():
        cases, crashes, hangs = (int(g) for g in match.groups()[1:4])
        assert cases == CASES and crashes == 0 and hangs == 0, report
    assert int(lines["registry"].group(5)) == 0, report
    unclear_kept = sum(json.loads(path.read_text())["verdict"]["kind"] == "unclear" for path in kept)
    assert int(lines["service"].group(5)) == unclear_kept, report  # every unclear case kept, so every one is checked
    assert not unexplained, report
    assert all(f in lines["service"].group(6) for f in SERVICE_FAMILIES), report
    assert code == 0, report


def test_cases_depend_on_seed_and_index_only() -> None:
    for families, namespace in ((SERVICE_FAMILIES, "service"), (REGISTRY_FAMILIES, "registry")):
        first, second = ServiceGenerator(SEED, families, namespace=namespace), ServiceGenerator(SEED, families, namespace=namespace)
        for index in range(0, 300, 7):
            assert first.case(index) == second.case(index)
        assert first.case(1) != ServiceGenerator(SEED + 1, families, namespace=namespace).case(1)


def test_grpc_refusing_too_many_headers_is_judged_by_its_cause() -> None:
    # gRPC refuses headers past its soft limit at random, before any handler runs, and lists every
    # header's size after the cause: a case with a hundred headers was judged "too-long" one run in many.
    from benchmarks.fuzz.exchange import Status
    from benchmarks.fuzz.verdicts import status_reasons

    sizes = " ".join(["authorization:53B"] * 200)
    message = f"gRPC returned resource exhausted error, with message: received metadata size exceeds soft limit (9212 vs. 8192);  :path:82B {sizes}"
    assert status_reasons(Status("DoAction", "ArrowInvalid", message, "")) == []
    assert "too-long" in status_reasons(Status("DoAction", "ArrowInvalid", "unknown table " + "x" * 3000, ""))
