"""``flight-sql`` in scripts: ``-c``, ``-f`` and piped statements, CSV out, exit codes, and the service's credentials.

Against a real ``flight-coordinator`` that wants a bearer token or a user's password, over the session's
workers; every answer is compared with DuckDB's.
"""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

import flight
from tests.service.test_flightsql import start_service, stop_service

SHELL = [sys.executable, "-m", "flight.shell"]
TOKEN = "shell-test-token-3b9f"
PASSWORD = "correct horse battery"
NATIONS = "select n_name, n_regionkey from nation where n_regionkey < 2 order by n_name"


@pytest.fixture(scope="module")
def service(cluster: flight.LocalCluster, files: dict[str, list[Path]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A service wanting a token (in the returned file) or alice's password."""
    where = tmp_path_factory.mktemp("secrets")
    (where / "tokens").write_text(f"ci:{TOKEN}\n")
    made = subprocess.run([sys.executable, "-m", "flight.service", "hash-password"], input=PASSWORD + "\n",
                          capture_output=True, text=True, timeout=60, check=True)
    (where / "users").write_text(f"alice:{made.stdout.strip()}\n")
    tables = [a for t in ("nation", "region") for a in ("--table", f"{t}={files[t][0].parent}")]
    proc, url = start_service("--workers", ",".join(cluster.urls), "--auth-token-file", str(where / "tokens"),
                              "--users-file", str(where / "users"), *tables)
    try:
        yield url, where / "tokens"
    finally:
        assert stop_service(proc) == 0


def _shell(*args: str, stdin: str = "", env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SHELL, *args], input=stdin, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})}, check=False)


def _csv(text: str) -> list[tuple[str, ...]]:
    return [tuple(row) for row in csv.reader(io.StringIO(text))]


def test_c_runs_statements_and_prints_csv_equal_to_duckdbs(service: tuple[str, Path], con: duckdb.DuckDBPyConnection) -> None:
    url, tokens = service
    done = _shell(url, "--token-file", str(tokens), "--format", "csv", "-c", f"{NATIONS}; select count(*) as n from region")
    assert done.returncode == 0, done.stderr
    rows = _csv(done.stdout)
    want = [(name, str(key)) for name, key in con.sql(NATIONS).fetchall()]
    assert rows == [("n_name", "n_regionkey"), *want, ("n",), ("5",)]


def test_a_table_by_default_and_an_error_stops_the_script_with_exit_code_1(service: tuple[str, Path]) -> None:
    url, tokens = service
    done = _shell(url, "--token-file", str(tokens), "-c", "select count(*) as n from region; select nope from nation; select 42 as never")
    assert done.returncode == 1
    assert "│     5 │" in done.stdout  # the first statement's table
    assert "42" not in done.stdout  # nothing after the error ran
    assert "Error: SQL: unknown column 'nope' at line 1:8" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_file_and_piped_input_run_as_scripts(service: tuple[str, Path], tmp_path: Path, con: duckdb.DuckDBPyConnection) -> None:
    url, tokens = service
    script = tmp_path / "report.sql"
    script.write_text(f"-- nations of two regions\n.mode csv\n{NATIONS};\n")
    want = [("n_name", "n_regionkey"), *((name, str(key)) for name, key in con.sql(NATIONS).fetchall())]
    by_file = _shell(url, "--token-file", str(tokens), "-f", str(script))
    assert by_file.returncode == 0, by_file.stderr
    assert _csv(by_file.stdout) == want
    piped = _shell(url, "--token-file", str(tokens), stdin=script.read_text() + "select nope from nation;\n")
    assert piped.returncode == 1 and _csv(piped.stdout) == want and "unknown column 'nope'" in piped.stderr


def test_without_the_token_the_service_refuses_and_the_shell_says_so(service: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = service
    done = _shell(url, "-c", "select 1")
    assert done.returncode == 1 and "bearer token" in done.stderr
    wrong = tmp_path / "wrong"
    wrong.write_text("ci:not-the-token\n")
    done = _shell(url, "--token-file", str(wrong), "-c", "select 1")
    assert done.returncode != 0 and "not-the-token" not in done.stderr + done.stdout


def test_a_user_logs_in_with_a_password_from_the_environment(service: tuple[str, Path]) -> None:
    url, _ = service
    done = _shell(url, "--user", "alice", "--format", "csv", "-c", "select count(*) as n from nation", env={"FLIGHT_SQL_PASSWORD": PASSWORD})
    assert done.returncode == 0, done.stderr
    assert _csv(done.stdout) == [("n",), ("25",)]
    refused = _shell(url, "--user", "alice", "-c", "select 1", env={"FLIGHT_SQL_PASSWORD": "wrong"})
    assert refused.returncode != 0 and "wrong username or password" in refused.stderr and "Traceback" not in refused.stderr


def test_a_tls_service_with_client_certificates(cluster: flight.LocalCluster, files: dict[str, list[Path]], tmp_path: Path) -> None:
    """``grpc+tls://`` with ``--tls-root-certs``, and a service that wants client certificates (``--tls-cert``/``--tls-key``)."""
    import trustme

    ca = trustme.CA()
    server, client = ca.issue_cert("127.0.0.1", "localhost"), ca.issue_cert("shell-client")
    for name, cert in (("server", server), ("client", client)):
        (tmp_path / f"{name}.pem").write_bytes(b"".join(b.bytes() for b in cert.cert_chain_pems))
        (tmp_path / f"{name}.key").write_bytes(cert.private_key_pem.bytes())
    (tmp_path / "ca.pem").write_bytes(ca.cert_pem.bytes())
    proc, url = start_service("--workers", ",".join(cluster.urls), "--tls-cert", str(tmp_path / "server.pem"), "--tls-key",
                              str(tmp_path / "server.key"), "--tls-client-ca", str(tmp_path / "ca.pem"),
                              "--table", f"region={files['region'][0].parent}")
    try:
        assert url.startswith("grpc+tls://")
        done = _shell(url, "--tls-root-certs", str(tmp_path / "ca.pem"), "--tls-cert", str(tmp_path / "client.pem"),
                      "--tls-key", str(tmp_path / "client.key"), "--format", "csv", "-c", "select count(*) as n from region")
        assert done.returncode == 0, done.stderr
        assert _csv(done.stdout) == [("n",), ("5",)]
        without = _shell(url, "--tls-root-certs", str(tmp_path / "ca.pem"), "-c", "select 1")  # no client certificate
        assert without.returncode != 0 and "Traceback" not in without.stderr
    finally:
        assert stop_service(proc) == 0


def test_its_own_workers_over_a_catalog_file(files: dict[str, list[Path]], tmp_path: Path, con: duckdb.DuckDBPyConnection) -> None:
    """No URL: the shell starts workers of its own over ``--catalog`` (the service's TOML) and a ``--table``."""
    catalog = tmp_path / "tpch.toml"
    catalog.write_text(f'[tables]\nnation = "{files["nation"][0].parent}"\n')
    text = "select r_name, count(*) as n from nation join region on n_regionkey = r_regionkey group by 1 order by 1"
    done = _shell("--catalog", str(catalog), "--table", f"region={files['region'][0].parent}", "--local-workers", "1",
                  "--format", "csv", "-c", ".tables", "-c", text)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == ["nation", "region"]
    assert _csv("\n".join(lines[2:])) == [("r_name", "n"), *((name, str(n)) for name, n in con.sql(text).fetchall())]
