"""DnsWorkerResolver against a real DNS server: dnsmasq on loopback, started by these tests.

dnsmasq (Debian's package ``dnsmasq``) runs in the foreground on 127.0.0.1 and a free port,
reads no configuration of the machine (``--conf-file=/dev/null --no-resolv --no-hosts``) and
forwards nothing: it answers for ``flight.test`` from a hosts file the test writes (re-read on
SIGHUP: workers appearing and disappearing) and from ``--srv-host`` / ``--cname`` flags. Real
``flight-worker`` processes on 127.0.0.2-4 (one port) run a query found through it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

import duckdb
import pyarrow as pa
import pytest
from support import wait_until

import flight
from flight import agg, col
from flight.coordinator.resolver import resolver_from_description
from flight.errors import ResolverError

pytestmark = pytest.mark.required

FAST = 0.05  # refresh interval of the resolvers under test
ZONE = "flight.test"  # RFC 2606: never a real name
DNSMASQ = shutil.which("dnsmasq") or next((p for p in ("/usr/sbin/dnsmasq", "/sbin/dnsmasq") if os.access(p, os.X_OK)), None)


def free_port() -> int:
    """A port free for both TCP and UDP on 127.0.0.1 (dnsmasq listens on both)."""
    for _ in range(20):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            tcp.bind(("127.0.0.1", 0))
            port = int(tcp.getsockname()[1])
            try:
                udp.bind(("127.0.0.1", port))
            except OSError:
                continue  # taken for UDP: another
            return port
    pytest.fail("no port free for both TCP and UDP on 127.0.0.1")


class Dnsmasq:
    """dnsmasq as a subprocess: ``hosts`` maps names to addresses (rewritten with :meth:`set_hosts`)."""

    def __init__(self, directory: Path, flags: Sequence[str] = (), hosts: Mapping[str, Sequence[str]] | None = None) -> None:
        assert DNSMASQ is not None
        self.directory = directory
        self.hosts_file = directory / "hosts"
        self.flags = list(flags)
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.set_hosts(hosts or {}, reload=False)

    @property
    def server(self) -> str:
        return f"127.0.0.1:{self.port}"

    def set_hosts(self, hosts: Mapping[str, Sequence[str]], *, reload: bool = True) -> None:
        """Replace the hosts file atomically (name -> addresses) and, if running, make dnsmasq re-read it."""
        lines = [f"{address} {name}.{ZONE}\n" for name, addresses in hosts.items() for address in addresses]
        tmp = self.hosts_file.with_suffix(".tmp")
        tmp.write_text("".join(lines), encoding="utf-8")
        os.replace(tmp, self.hosts_file)
        if reload and self.proc is not None:
            self.proc.send_signal(signal.SIGHUP)

    def start(self, port: int = 0) -> Self:
        """Start on ``port`` (0: a free one, tried again if taken in between); wait until it answers."""
        for _ in range(5):
            self.port = port or free_port()
            with (self.directory / "dnsmasq.log").open("ab") as log:  # the child keeps its own descriptor
                self.proc = subprocess.Popen(self._command(), stdout=subprocess.DEVNULL, stderr=log)
            if self._wait_ready():
                return self
            self.stop()
            if port:
                break
        pytest.fail(f"dnsmasq did not answer on 127.0.0.1:{self.port}; its log: {(self.directory / 'dnsmasq.log').read_text()[-2000:]}")

    def _command(self) -> list[str]:
        return [
            str(DNSMASQ), "--no-daemon", "--conf-file=/dev/null", "--no-resolv", "--no-hosts",
            "--bind-interfaces", "--listen-address=127.0.0.1", f"--port={self.port}",
            f"--local=/{ZONE}/", f"--addn-hosts={self.hosts_file}", f"--host-record=ready.{ZONE},127.0.0.1", *self.flags,
        ]  # fmt: skip

    def _wait_ready(self, timeout: float = 5.0) -> bool:
        """True once a query for ready.flight.test is answered; False if dnsmasq exited or the deadline passed."""
        import dns.exception
        import dns.nameserver
        import dns.resolver

        client = dns.resolver.Resolver(configure=False)
        client.nameservers = [dns.nameserver.Do53Nameserver("127.0.0.1", self.port)]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc is not None and self.proc.poll() is None:
            try:
                client.resolve(f"ready.{ZONE}", "A", lifetime=0.2)
                return True
            except dns.exception.DNSException:
                continue
        return False

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


@pytest.fixture
def dnsmasq_factory(tmp_path: Path) -> Iterator[Callable[..., Dnsmasq]]:
    """Start dnsmasq servers (extra flags, the hosts file's first contents); all are stopped after the test."""
    pytest.importorskip("dns.resolver", reason="dnspython (the fleet extra) is not installed: pip install 'flight-exec[fleet]'")
    if DNSMASQ is None:
        pytest.skip("dnsmasq is not installed (Debian: apt-get install dnsmasq)")
    servers: list[Dnsmasq] = []

    def start(*flags: str, hosts: Mapping[str, Sequence[str]] | None = None) -> Dnsmasq:
        directory = tmp_path / f"dnsmasq-{len(servers)}"
        directory.mkdir()
        server = Dnsmasq(directory, flags, hosts)
        servers.append(server)
        return server.start()

    try:
        yield start
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def dnsmasq(dnsmasq_factory: Callable[..., Dnsmasq]) -> Dnsmasq:
    return dnsmasq_factory()


def resolver(server: Dnsmasq, name: str, port: int | None = None, **kwargs: object) -> flight.DnsWorkerResolver:
    return flight.DnsWorkerResolver(f"{name}.{ZONE}", port, nameservers=[server.server], interval=FAST, **kwargs)  # type: ignore[arg-type]


# --- what the records mean -----------------------------------------------------------------


def test_a_and_aaaa_records_give_one_url_per_address(dnsmasq_factory: Callable[..., Dnsmasq]) -> None:
    dnsmasq = dnsmasq_factory(hosts={"workers": ["127.0.0.10", "127.0.0.2", "::1", "127.0.0.2"], "other": ["127.0.0.99"]})
    with resolver(dnsmasq, "workers", 8815) as any_family:
        assert any_family.get_urls() == ["grpc://127.0.0.2:8815", "grpc://127.0.0.10:8815", "grpc://[::1]:8815"]
        assert any_family.last_error is None
    with resolver(dnsmasq, "workers", 8815, family="ipv4", scheme="grpc+tls") as ipv4:
        assert ipv4.get_urls() == ["grpc+tls://127.0.0.2:8815", "grpc+tls://127.0.0.10:8815"]
    with resolver(dnsmasq, "workers", 8815, family="ipv6") as ipv6:
        assert ipv6.get_urls() == ["grpc://[::1]:8815"]
    with flight.DnsWorkerResolver(f"WORKERS.{ZONE}.", 8815, nameservers=[dnsmasq.server], family="ipv4") as absolute:
        assert absolute.get_urls() == ["grpc://127.0.0.2:8815", "grpc://127.0.0.10:8815"]


def test_srv_records_give_each_target_with_its_port(dnsmasq_factory: Callable[..., Dnsmasq]) -> None:
    server = dnsmasq_factory(
        f"--srv-host=_flight._tcp.pool.{ZONE},w1.{ZONE},7001",
        f"--srv-host=_flight._tcp.pool.{ZONE},w2.{ZONE},7002",
        f"--srv-host=_flight._tcp.pool.{ZONE},gone.{ZONE},7003",  # a target without an address: skipped
        f"--srv-host=_flight._tcp.pool.{ZONE},alias.{ZONE},7004",  # a CNAME: dnsmasq adds no Additional record, so it is looked up
        f"--cname=alias.{ZONE},w1.{ZONE}",
        f"--host-record=w1.{ZONE},127.0.0.2,::1",
        f"--host-record=w2.{ZONE},127.0.0.3",
        f"--srv-host=plain.{ZONE},w2.{ZONE},7005",
        f"--srv-host=_none._tcp.pool.{ZONE}",  # target "." (RFC 2782: no such service here)
    )
    with resolver(server, "_flight._tcp.pool") as srv:
        assert srv.port is None
        assert srv.get_urls() == [
            "grpc://127.0.0.2:7001", "grpc://127.0.0.2:7004", "grpc://127.0.0.3:7002", "grpc://[::1]:7001", "grpc://[::1]:7004",
        ]  # fmt: skip
    with resolver(server, "_flight._tcp.pool", family="ipv4") as ipv4:
        assert ipv4.get_urls() == ["grpc://127.0.0.2:7001", "grpc://127.0.0.2:7004", "grpc://127.0.0.3:7002"]
    with resolver(server, "plain") as plain:  # no port: SRV records, whatever the name looks like
        assert plain.get_urls() == ["grpc://127.0.0.3:7005"]
    with resolver(server, "_none._tcp.pool") as none:
        assert none.get_urls() == []


def test_nxdomain_is_no_workers_and_workers_come_and_go(dnsmasq: Dnsmasq) -> None:
    with resolver(dnsmasq, "workers", 9000) as dns:
        assert dns.get_urls() == []  # NXDOMAIN: an empty list, not an error
        assert dns.last_error is None
        dnsmasq.set_hosts({"workers": ["127.0.0.2"]})
        wait_until(lambda: dns.get_urls() == ["grpc://127.0.0.2:9000"], what="the first worker")
        dnsmasq.set_hosts({"workers": ["127.0.0.2", "127.0.0.3"]})
        wait_until(lambda: dns.get_urls() == ["grpc://127.0.0.2:9000", "grpc://127.0.0.3:9000"], what="a second worker")
        dnsmasq.set_hosts({"workers": ["127.0.0.3"]})
        wait_until(lambda: dns.get_urls() == ["grpc://127.0.0.3:9000"], what="the first worker to go")
        dnsmasq.set_hosts({"elsewhere": ["127.0.0.3"]})
        wait_until(lambda: dns.get_urls() == [], what="every worker to go")
        assert dns.last_error is None


def test_a_stopped_server_keeps_the_last_good_list(dnsmasq_factory: Callable[..., Dnsmasq]) -> None:
    dnsmasq = dnsmasq_factory(hosts={"workers": ["127.0.0.2", "127.0.0.3"]})
    with resolver(dnsmasq, "workers", 9000, timeout=0.3) as dns:
        good = dns.get_urls()
        assert good == ["grpc://127.0.0.2:9000", "grpc://127.0.0.3:9000"]
        port = dnsmasq.port
        dnsmasq.stop()
        wait_until(lambda: isinstance(dns.last_error, ResolverError), what="a failed refresh")
        assert f"workers.{ZONE}" in str(dns.last_error)
        assert dns.get_urls() == good

        dnsmasq.set_hosts({"workers": ["127.0.0.4"]}, reload=False)
        dnsmasq.start(port)  # back, with another worker
        wait_until(lambda: dns.get_urls() == ["grpc://127.0.0.4:9000"], what="recovery")
        wait_until(lambda: dns.last_error is None, what="last_error cleared")


def test_no_answer_at_construction_is_a_resolver_error() -> None:
    pytest.importorskip("dns.resolver", reason="dnspython (the fleet extra) is not installed: pip install 'flight-exec[fleet]'")
    silent = free_port()  # nothing listens there
    started = time.monotonic()
    with pytest.raises(ResolverError, match=f"workers.{ZONE}") as info:
        flight.DnsWorkerResolver(f"workers.{ZONE}", 9000, nameservers=[f"127.0.0.1:{silent}"], timeout=0.3)
    assert time.monotonic() - started < 3.0, "one refresh takes at most about timeout seconds"
    assert isinstance(info.value.__cause__, ResolverError)


# --- arguments, descriptions, packaging ----------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "field"),
    [
        ((None,), {}, "name"),
        (("",), {}, "name"),
        ((42,), {}, "name"),
        (("bad name.test", 1), {}, "name"),
        (("-workers.test", 1), {}, "name"),
        (("a" * 64 + ".test", 1), {}, "name"),
        (("10.0.0.5", 8815), {}, "name"),
        (("workers.test", 0), {}, "port"),
        (("workers.test", 65536), {}, "port"),
        (("workers.test", "8815"), {}, "port"),
        (("workers.test", True), {}, "port"),
        (("_flight._tcp.workers.test", 8815), {}, "port"),
        (("workers.test", 1), {"scheme": "http"}, "scheme"),
        (("workers.test", 1), {"family": "ipv5"}, "family"),
        (("workers.test", 1), {"nameservers": "127.0.0.1"}, "nameservers"),
        (("workers.test", 1), {"nameservers": []}, "nameservers"),
        (("workers.test", 1), {"nameservers": ["dns.example.com"]}, "nameserver"),
        (("workers.test", 1), {"nameservers": ["127.0.0.1:0"]}, "nameserver"),
        (("workers.test", 1), {"nameservers": ["[::1"]}, "nameserver"),
        (("workers.test", 1), {"timeout": 0}, "timeout"),
        (("workers.test", 1), {"timeout": float("nan")}, "timeout"),
    ],
)
def test_bad_arguments_are_resolver_errors_naming_the_field(args: tuple[object, ...], kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ResolverError, match=rf"DnsWorkerResolver: {field} "):
        flight.DnsWorkerResolver(*args, **kwargs)  # type: ignore[arg-type]


def test_description_round_trip(dnsmasq_factory: Callable[..., Dnsmasq]) -> None:
    dnsmasq = dnsmasq_factory(hosts={"workers": ["127.0.0.2"]})
    with resolver(dnsmasq, "workers", 9000, scheme="grpc+tls", timeout=1.5) as original:
        description = json.loads(json.dumps(original.describe()))
        assert description == {
            "kind": "dns", "name": f"workers.{ZONE}", "port": 9000, "scheme": "grpc+tls", "family": "any",
            "interval": FAST, "nameservers": [dnsmasq.server], "timeout": 1.5,
        }  # fmt: skip
        with resolver_from_description(description) as rebuilt:
            assert isinstance(rebuilt, flight.DnsWorkerResolver)
            assert rebuilt.get_urls() == original.get_urls() == ["grpc+tls://127.0.0.2:9000"]
            assert rebuilt.describe() == description


@pytest.mark.parametrize(
    "description",
    [
        {"kind": "dns"},
        {"kind": "dns", "name": "workers.test", "port": "80"},
        {"kind": "dns", "name": "workers.test", "port": 80, "interval": "5s"},
        {"kind": "dns", "name": "workers.test", "port": 80, "interval": -1},
        {"kind": "dns", "name": "workers.test", "port": 80, "nameservers": "127.0.0.1"},
    ],
)
def test_bad_description_is_a_resolver_error(description: dict[str, object]) -> None:
    with pytest.raises(ResolverError):
        resolver_from_description(description)


def test_dnspython_is_imported_only_for_a_resolver_and_its_absence_is_explained() -> None:
    code = (
        "import sys\n"
        "import flight\n"
        "print(sorted(m for m in sys.modules if m == 'dns' or m.startswith('dns.')))\n"
        "sys.modules['dns'] = None\n"  # as if dnspython were not installed
        "try:\n    flight.DnsWorkerResolver('workers.test', 8815)\n"
        "except flight.ResolverError as exc:\n    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "[]", "import flight must not import dnspython"
    assert "pip install 'flight-exec[fleet]'" in out[1]


# --- a query on workers found in DNS -------------------------------------------------------------


@pytest.fixture(scope="module")
def fleet(data_roots: list[Path]) -> Iterator[list[str]]:
    """Three real workers on 127.0.0.2, .3 and .4, all on one port (A records carry no port)."""
    if DNSMASQ is None:
        pytest.skip("dnsmasq is not installed (Debian: apt-get install dnsmasq)")
    with flight.LocalCluster(1, data_roots=data_roots, per_worker_args=[["--host", "127.0.0.2"]]) as first:
        port = first.urls[0].rsplit(":", 1)[1]
        rest = [["--host", f"127.0.0.{i}", "--port", port] for i in (3, 4)]
        with flight.LocalCluster(2, data_roots=data_roots, per_worker_args=rest) as others:
            yield first.urls + others.urls


def test_a_query_runs_on_the_workers_dns_names(dnsmasq_factory: Callable[..., Dnsmasq], fleet: list[str], parquet_files: list[Path]) -> None:
    port = int(fleet[0].rsplit(":", 1)[1])
    files = ", ".join(f"'{p}'" for p in parquet_files)
    expected = duckdb.sql(f"select name, count(*) as n, sum(qty) as total from read_parquet([{files}]) group by name").arrow()
    if isinstance(expected, pa.RecordBatchReader):
        expected = expected.read_all()
    query = flight.read_parquet(parquet_files).aggregate(["name"], n=agg.count_all(), total=agg.sum(col("qty")))

    def run(dns: flight.DnsWorkerResolver) -> set[str]:
        ex = flight.DistributedExec(query, dns, small_query_bytes=0)
        got = ex.to_table()
        assert got.sort_by("name").to_pylist() == expected.sort_by("name").to_pylist()
        assert ex.metrics is not None
        return {t.worker_url for t in ex.metrics.tasks}

    dnsmasq = dnsmasq_factory(hosts={"workers": ["127.0.0.2", "127.0.0.3"]})
    with resolver(dnsmasq, "workers", port) as dns:
        assert dns.get_urls() == fleet[:2]
        assert run(dns) == set(fleet[:2])  # six files: every worker gets a task

        dnsmasq.set_hosts({"workers": ["127.0.0.2", "127.0.0.3", "127.0.0.4"]})  # a worker appears
        wait_until(lambda: dns.get_urls() == fleet, what="the third worker")
        assert run(dns) == set(fleet)

        dnsmasq.set_hosts({"workers": ["127.0.0.3", "127.0.0.4"]})  # one disappears
        wait_until(lambda: dns.get_urls() == fleet[1:], what="the first worker to go")
        assert run(dns) == set(fleet[1:])
