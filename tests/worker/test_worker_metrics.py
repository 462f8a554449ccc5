"""``flight-worker --metrics-port``: the worker's state in Prometheus's text format, read with
``prometheus-client``'s own parser, before and after a real query ran on it."""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from prometheus_client.parser import text_string_to_metric_families
from support import wait_until

import flight


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - the test's own worker on loopback
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text) for s in f.samples}


def metrics_url(proc: subprocess.Popen[str]) -> str:
    """The URL the worker's log names for its metrics (logged before its listening line, which was read)."""
    assert proc.stderr is not None
    for _ in range(50):
        m = re.search(r"metrics on (http://\S+/metrics)", proc.stderr.readline())
        if m:
            return m.group(1)
    raise AssertionError("the worker never said where its metrics are")


def test_metrics_count_what_a_query_did(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"k": list(range(1000)), "v": [i % 7 for i in range(1000)]}), path)
    proc = subprocess.Popen([sys.executable, "-m", "flight.worker", "--port", "0", "--metrics-port", "0", "--data-root", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        worker = proc.stdout.readline().split()[-1]
        url = metrics_url(proc)
        before = scrape(url)
        assert before[("flight_worker_running_tasks", ())] == 0
        assert before[("flight_worker_tasks_ended_total", (("how", "finished"),))] == 0
        got = flight.DistributedExec(flight.read_parquet([str(path)]).filter(flight.col("v") == 3), [worker]).to_table()
        assert got.num_rows == sum(1 for i in range(1000) if i % 7 == 3)
        wait_until(lambda: scrape(url)[("flight_worker_tasks_ended_total", (("how", "finished"),))] >= 1, 10.0, "the task to be counted")
        after = scrape(url)
        assert after[("flight_worker_tasks_ended_total", (("how", "finished"),))] >= 1
        assert after[("flight_worker_rows_out_total", ())] >= got.num_rows
        assert after[("flight_worker_bytes_out_total", ())] > 0
        assert after[("flight_worker_source_threads_max", ())] > 0 and after[("flight_worker_draining", ())] == 0
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_a_taken_metrics_port_is_refused_at_start() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "flight.worker", "--port", "0", "--metrics-port", str(port)],
                              capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--metrics-port" in proc.stderr
