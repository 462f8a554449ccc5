"""All 99 TPC-DS queries through a real ``flight-coordinator`` and the ADBC Flight SQL driver, each answer
compared with DuckDB's.

Why: tests/sql/test_tpcds.py plans and runs the texts in the test's own process; a user sends them to the
service. Here the service is a subprocess (``python -m flight.service``) that plans each text itself (in its
default dialect, DuckDB's, the texts' own), runs it on two workers it owns (``--local-workers 2``, allowed to
read the data's directory alone) and hands out direct endpoints; the rows cross Flight SQL into the ADBC
driver's Arrow. The data and DuckDB's answers are ``tpcds_support``'s.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pyarrow as pa
import pytest
from adbc_driver_flightsql import dbapi
from tpcds_support import QUERIES, SF, answer, catalog, data_root, difference, ordered, texts

PREFIX = "flight-coordinator listening on "


@pytest.fixture(scope="module")
def service() -> Iterator[str]:
    """The URL of a ``flight-coordinator`` with two local workers, serving the 24 TPC-DS tables; it must exit 0 on SIGTERM."""
    tables = [a for name, path in catalog().items() for a in ("--table", f"{name}={path}")]
    proc = subprocess.Popen([sys.executable, "-m", "flight.service", "--port", "0", "--local-workers", "2", "--data-root",
                             str(data_root()), "--log-level", "WARNING", *tables], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        line = proc.stdout.readline()
        assert line.startswith(PREFIX), f"first line {line!r}"
        yield line[len(PREFIX):].strip()
    finally:
        proc.terminate()
        code = proc.wait(30)
        proc.stdout.close()
    assert code == 0, f"the service exited {code} on SIGTERM"


def query(url: str, text: str) -> pa.Table:
    with dbapi.connect(url, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(text)
        return cur.fetch_arrow_table()


@pytest.mark.slow
@pytest.mark.parametrize("n", QUERIES, ids=lambda n: f"q{n:02d}")
def test_tpcds_through_adbc_matches_duckdb(n: int, service: str) -> None:
    text = texts()[n]
    why = difference(query(service, text), answer(n), ordered(text))
    assert why is None, f"TPC-DS q{n:02d} at SF {SF}, flight-coordinator through ADBC: {why}"
