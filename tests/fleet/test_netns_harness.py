"""The namespaced fleet harness (``flight.dev.fleet``): its namespaces, links, partitions, limits, and a real query.

One fleet of three real workers serves the module (starting one takes seconds); each test
leaves its links as it found them. Everything is checked by what the network does (a
connection made, silent or answered, the qdiscs ``tc`` reports), never by how long it took.
These need root and nftables; where the machine has neither they skip saying why, and CI,
which runs as root with nftables installed, fails on that skip (``required``).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import tpch_test_files

from benchmarks.tpch_queries import TABLES, compare, duckdb_connection, duckdb_table
from benchmarks.tpch_sql import ORDERED, SQL
from flight.dev.fleet import COORDINATOR, Fleet
from flight.dev.netns import PREFIX, Network, netns_unavailable, remove_leftovers

pytestmark = [pytest.mark.required, pytest.mark.skipif(netns_unavailable() is not None, reason=str(netns_unavailable()))]

SF = 0.01


def _root_state() -> str:
    """What the root namespace's network looks like: links, addresses, routes, qdiscs, nftables."""
    out = [subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
           for cmd in (["ip", "-o", "link", "show"], ["ip", "-o", "addr", "show"], ["ip", "route", "show", "table", "all"],
                       ["tc", "qdisc", "show"], ["nft", "list", "ruleset"])]
    return re.sub(r"(valid_lft|preferred_lft|expires) \S+", r"\1 -", "\n".join(out))  # lifetimes count down on their own


def _namespaces(prefix: str) -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in listed.splitlines() if line.startswith(prefix)]


@pytest.fixture(scope="module")
def root_before() -> str:
    return _root_state()


@pytest.fixture(scope="module")
def fleet(root_before: str, data_roots: list[Path]) -> Iterator[Fleet]:
    with Fleet(3, data_roots=data_roots) as f:
        yield f


CONNECT = textwrap.dedent("""
    import socket, sys
    try:
        socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
        print("connected")
    except TimeoutError:
        print("silent")
    except ConnectionRefusedError:
        print("refused")
""")


def _connect(fleet: Fleet, node: object, target: int, timeout: float = 1.5) -> str:
    """From ``node``'s namespace, open a TCP connection to worker ``target``: connected, silent or refused."""
    port = fleet.worker_urls[target].rsplit(":", 1)[1]
    proc = fleet.python(["-I", "-c", CONNECT, fleet.address(target), port, str(timeout)], node=node,  # type: ignore[arg-type]
                        stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=60)
    return out.strip()


def test_a_network_lives_in_its_own_namespaces_and_leaves_nothing(root_before: str) -> None:
    net = Network(["c", "w0"])
    try:
        net.create()
        assert sorted(_namespaces(net.name + "-")) == sorted(net.namespaces) and len(net.namespaces) == 3
        assert net.name.startswith(f"{PREFIX}{os.getpid()}-")
        assert _root_state() == root_before
    finally:
        net.close()
    assert not _namespaces(net.name + "-")
    assert _root_state() == root_before


def test_the_namespaces_of_a_killed_run_are_removed_by_the_next() -> None:
    code = ("import sys, time; from flight.dev.netns import Network; n = Network(['c']); n.create(); "
            "print(' '.join(n.namespaces), flush=True); time.sleep(600)")
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        names = proc.stdout.readline().split()
        proc.send_signal(signal.SIGKILL)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert names and all(n in listed for n in names)
    assert set(names) <= set(remove_leftovers())
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert not any(n in listed for n in names)


def test_the_fleet_touches_nothing_outside_its_namespaces(fleet: Fleet, root_before: str) -> None:
    assert _root_state() == root_before
    assert [u.split("//")[1].rsplit(":", 1)[0] for u in fleet.worker_urls] == [fleet.address(i) for i in range(3)]
    assert all(fleet.address(i).startswith(("198.18.", "198.19.")) for i in range(3))


@pytest.mark.slow
def test_a_partition_is_silence_and_heal_restores_it(fleet: Fleet) -> None:
    assert _connect(fleet, COORDINATOR, 1) == "connected"
    fleet.partition(1, from_=COORDINATOR)
    try:
        assert _connect(fleet, COORDINATOR, 1) == "silent"  # dropped, not refused
        assert _connect(fleet, 0, 1) == "connected"  # the peers still reach it
        assert _connect(fleet, 1, 2) == "connected"
        fleet.partition(0, from_=2)  # one pair of peers
        assert _connect(fleet, 0, 2) == "silent"
        assert _connect(fleet, 2, 0) == "silent"
        assert _connect(fleet, COORDINATOR, 2) == "connected"
    finally:
        fleet.heal()
    assert _connect(fleet, COORDINATOR, 1) == "connected"
    assert _connect(fleet, 0, 2) == "connected"


def test_a_rate_limit_is_a_token_bucket_on_both_ends_of_the_link(fleet: Fleet) -> None:
    fleet.rate_limit(2, 10)
    try:
        shown = fleet.qdiscs(2)
        assert shown.count("qdisc tbf") == 2, shown
        assert shown.count("rate 10Mbit") == 2, shown
        assert "tbf" not in fleet.qdiscs(1)
    finally:
        fleet.rate_limit(2, None)
    assert "tbf" not in fleet.qdiscs(2)


HTTP2 = textwrap.dedent("""
    import socket, sys
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
    s.sendall(b"PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))  # preface, empty SETTINGS
    s.settimeout(1.0)
    try:
        s.recv(1)
        print("answered", flush=True)
    except TimeoutError:
        print("silent", flush=True)
    sys.stdin.readline()
    s.settimeout(30)
    print("answered" if s.recv(1) else "closed", flush=True)
""")


@pytest.mark.slow
def test_a_stalled_link_holds_a_workers_answer_until_it_ends(fleet: Fleet) -> None:
    """The proxy sits on the path between namespaces: a stall of worker 0's link silences its gRPC server."""
    fleet.stall(0, 600)
    try:
        port = fleet.worker_urls[0].rsplit(":", 1)[1]
        proc = fleet.python(["-I", "-c", HTTP2, fleet.address(0), port], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "silent"
    finally:
        fleet.clear_shapes()
    proc.stdin.write("go\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "answered"
    proc.stdin.close()
    proc.stdout.close()
    proc.wait(30)


@pytest.fixture(scope="module")
def tpch() -> tuple[dict[str, list[Path]], dict[int, object]]:
    files = tpch_test_files(SF)
    con = duckdb_connection(files)
    try:
        return files, {n: duckdb_table(con, SQL[n]) for n in (3, 9)}
    finally:
        con.close()


@pytest.mark.slow
@pytest.mark.parametrize("rtt_ms", [0, 8], ids=["clean", "rtt8-jitter"])
def test_tpch_on_three_namespaced_workers_equals_duckdb(fleet: Fleet, tpch: tuple[dict[str, list[Path]], dict[int, object]],
                                                       rtt_ms: float) -> None:
    """Q3 and Q9 with every join shuffled between the workers, on clean links and through jittery ones."""
    files, expected = tpch
    fleet.set_rtt(rtt_ms, jitter_ms=rtt_ms / 2)
    try:
        for n in (3, 9):
            result = fleet.query(SQL[n], {t: files[t] for t in TABLES}, options={"broadcast_bytes": 0, "rows_per_task": 1}).result()
            assert result.error is None and result.table is not None, result.stderr_tail
            assert compare(result.table, expected[n], ORDERED.get(n)) is None  # type: ignore[arg-type]
            assert [(i.get("running_tasks"), i.get("buffered_bytes")) for i in result.infos] == [(0, 0)] * 3, result.infos
    finally:
        fleet.clear_shapes()


@pytest.mark.slow
def test_a_killed_worker_is_gone_until_restarted_at_the_same_url(fleet: Fleet) -> None:
    url = fleet.worker_urls[2]
    fleet.kill(2)
    infos = fleet.worker_info()
    assert "error" in infos[2] and all("error" not in i for i in infos[:2]), infos
    fleet.restart(2)
    assert fleet.worker_urls[2] == url
    assert [i.get("running_tasks") for i in fleet.worker_info()] == [0, 0, 0]
