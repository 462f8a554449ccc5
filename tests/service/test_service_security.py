"""The service's security, one flag each, tried with the real ADBC driver.

A service with ``--auth-token-file`` refuses a client without its token and one with a wrong
token, and serves one with it; over ``--tls-cert``/``--tls-key`` a client that trusts the CA is
served. In front of a secured fleet (TLS and a token on every worker) the service reaches the
workers with its own credentials (``--worker-*``), relays the rows (clients hold none of the
workers' credentials), and the client's token reaches neither a worker nor the service's log.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import adbc_driver_flightsql.dbapi as dbapi
import pytest
import trustme
from support import tpch_test_files

import flight

TOKEN = "s3cret-for-the-service-only"
QUERY = "select r_name from region order by r_regionkey"
REGIONS = ["AFRICA", "AMERICA", "ASIA", "EUROPE", "MIDDLE EAST"]


@pytest.fixture(scope="module")
def region_arg() -> list[str]:
    return ["--table", f"region={tpch_test_files(0.1)['region'][0].parent}"]


def start(*args: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "flight.service", "--port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("flight-coordinator listening on "), line
    return proc, line.split()[-1]


def stop(proc: subprocess.Popen[str]) -> str:
    """Stop the service; its log."""
    proc.terminate()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err[-2000:]
    return err


def regions(url: str, **db_kwargs: str) -> list[str]:
    with dbapi.connect(url, db_kwargs=db_kwargs, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(QUERY)
        return [r[0] for r in cur.fetchall()]


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("service-auth") / "tokens"
    path.write_text(f"analyst:{TOKEN}\n")
    path.chmod(0o600)
    return path


def test_a_token_is_required_and_taken(cluster: flight.LocalCluster, region_arg: list[str], token_file: Path) -> None:
    proc, url = start("--workers", ",".join(cluster.urls), "--auth-token-file", str(token_file), *region_arg)
    try:
        with pytest.raises(dbapi.Error, match="flight-coordinator requires a bearer token"):
            regions(url)
        with pytest.raises(dbapi.Error, match="an invalid token"):
            regions(url, **{"adbc.flight.sql.authorization_header": "Bearer wrong"})
        assert regions(url, **{"adbc.flight.sql.authorization_header": f"Bearer {TOKEN}"}) == REGIONS
    finally:
        log = stop(proc)
    assert TOKEN not in log
    assert "started for analyst" in log  # the token's name is who asked


def test_tls(cluster: flight.LocalCluster, region_arg: list[str], tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    (tmp_path / "cert.pem").write_bytes(b"".join(b.bytes() for b in cert.cert_chain_pems))
    (tmp_path / "key.pem").write_bytes(cert.private_key_pem.bytes())
    proc, url = start("--workers", ",".join(cluster.urls), "--tls-cert", str(tmp_path / "cert.pem"),
                      "--tls-key", str(tmp_path / "key.pem"), *region_arg)
    try:
        assert url.startswith("grpc+tls://")
        assert regions(url, **{"adbc.flight.sql.client_option.tls_root_certs": ca.cert_pem.bytes().decode()}) == REGIONS
        with pytest.raises(dbapi.Error):
            regions(url)  # the system's CAs do not know this one
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def secure_cluster(data_roots: list[Path]) -> Iterator[flight.LocalCluster]:
    with flight.LocalCluster(2, data_roots=data_roots, secure=True) as c:
        yield c


def test_a_secured_fleet_is_reached_with_the_services_own_credentials(
    secure_cluster: flight.LocalCluster, region_arg: list[str], token_file: Path
) -> None:
    files = secure_cluster.security_files
    proc, url = start("--workers", ",".join(secure_cluster.urls), "--auth-token-file", str(token_file),
                      "--worker-token-file", str(files.token_file), "--worker-tls-ca", str(files.ca_file), *region_arg)
    try:
        assert regions(url, **{"adbc.flight.sql.authorization_header": f"Bearer {TOKEN}"}) == REGIONS
    finally:
        log = stop(proc)
    assert "relay endpoints" in log  # clients hold no worker credentials: the service reads for them
    worker_token = Path(str(files.token_file)).read_text().strip()
    assert TOKEN not in log and worker_token not in log


def test_a_username_and_password_buy_a_session_token(cluster: flight.LocalCluster, region_arg: list[str], tmp_path: Path) -> None:
    """ADBC's username and password go through Handshake; the users file holds only salted hashes."""
    made = subprocess.run([sys.executable, "-m", "flight.service", "hash-password"], input="correct horse\n",
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0 and made.stdout.startswith("scrypt$") and "correct horse" not in made.stdout
    users = tmp_path / "users"
    users.write_text(f"alice:{made.stdout.strip()}\n")
    proc, url = start("--workers", ",".join(cluster.urls), "--users-file", str(users), *region_arg)
    try:
        assert regions(url, username="alice", password="correct horse") == REGIONS
        for name, password in (("alice", "wrong"), ("mallory", "correct horse")):
            with pytest.raises(dbapi.Error, match="wrong username or password"):
                regions(url, username=name, password=password)
        with pytest.raises(dbapi.Error, match="requires a bearer token"):
            regions(url)
    finally:
        log = stop(proc)
    assert "correct horse" not in log and "started for alice" in log


def test_a_bad_users_file_is_refused_at_start(tmp_path: Path) -> None:
    users = tmp_path / "users"
    users.write_text("bob:plaintext-password\n")
    proc = subprocess.run([sys.executable, "-m", "flight.service", "--port", "0", "--workers", "grpc://127.0.0.1:1", "--users-file", str(users)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "line 1 is not 'name:scrypt$N$r$p$SALT$HASH'" in proc.stderr
    assert "plaintext-password" not in proc.stderr
