"""Linux network namespaces for the fleet harness: one per node, joined by a bridge in a namespace of its own.

Why namespaces: a fleet on loopback cannot be partitioned, rate-limited or slowed per link.
Here every node (the coordinator, each worker) gets a network namespace with one address,
``eth0``, a veth whose other end is a port of a bridge in a "switch" namespace. Nothing of
it lives in the root namespace: no link, route, qdisc or rule there changes, and deleting the
namespaces removes it all. Addresses come from 198.18.0.0/15 (RFC 2544's benchmark range): a
random /24 per network, though two networks never see each other anyway.

What a network can do to a node's link, all inside its namespaces:

- partitions: nftables rules in the switch's bridge (``bridge`` family, forward hook) drop IP
  packets between two nodes, both ways. ARP still passes, so each side keeps its neighbour and
  sees pure silence: a connection attempt times out, sent data is retransmitted unanswered,
  as across a real partition; never "connection refused". ``heal`` flushes the rules.
- rate limits: ``tc tbf`` on both ends of the node's veth (leaving and reaching the node).
- delay and jitter with ``netem`` where the kernel has it (``netem_available``); this
  machine's has not, so ``flight.dev.fleet`` uses ``flight.dev.delay_proxy`` instead, put in
  front of a worker's port by an nftables ``redirect`` in the worker's namespace (``redirect``).

Namespaces are named ``flightfleet-<pid>-<serial>-<node>``: ``remove_leftovers`` deletes those
of processes that are gone (a run that was SIGKILLed), killing what still runs in them.
Needs root, ``ip`` (iproute2) and ``nft`` (nftables); ``netns_unavailable`` says why not.
"""

from __future__ import annotations

import functools
import ipaddress
import itertools
import logging
import os
import queue
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from typing import IO

__all__ = ["PREFIX", "LineReader", "NetnsError", "Network", "netns_unavailable", "remove_leftovers"]

log = logging.getLogger(__name__)

PREFIX = "flightfleet-"
RANGE = ipaddress.ip_network("198.18.0.0/15")
_serial = itertools.count()


class NetnsError(RuntimeError):
    """A namespace command failed; the message holds the command and what it printed."""


def _run(cmd: Sequence[str], *, input: str | None = None, check: bool = True) -> str:
    done = subprocess.run(list(cmd), input=input, capture_output=True, text=True, timeout=30, check=False)
    if check and done.returncode != 0:
        raise NetnsError(f"{' '.join(cmd)} failed ({done.returncode}): {(done.stderr or done.stdout).strip()}")
    return done.stdout


@functools.cache
def netns_unavailable() -> str | None:
    """Why this machine cannot run a fleet in namespaces (for a test's skip), or None when it can."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces are Linux's; this is {sys.platform}"
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs the fleet tests as root)"
    for tool, package in (("ip", "iproute2"), ("nft", "nftables"), ("tc", "iproute2")):
        if shutil.which(tool) is None:
            return f"the fleet harness needs `{tool}`: install the Debian package {package}"
    probe = f"{PREFIX}{os.getpid()}-probe"
    try:
        _run(["ip", "netns", "add", probe])
    except NetnsError as exc:
        return f"cannot create a network namespace: {exc}"
    try:
        _run(["ip", "netns", "exec", probe, "nft", "-f", "-"],
             input="table bridge probe { chain cut { type filter hook forward priority 0; policy accept; }; }\n"
                   "table ip probe { chain pre { type nat hook prerouting priority dstnat; policy accept; }; }\n")
    except NetnsError as exc:
        return f"nftables does not work in a network namespace here (the kernel needs nf_tables with bridge and nat): {exc}"
    finally:
        _run(["ip", "netns", "del", probe], check=False)
    return None


def _namespaces() -> list[str]:
    return [line.split()[0] for line in _run(["ip", "netns", "list"]).splitlines() if line.strip()]


def _pids(ns: str) -> list[int]:
    return [int(p) for p in _run(["ip", "netns", "pids", ns], check=False).split()]


def _kill_all(namespaces: Iterable[str], timeout: float = 10.0) -> None:
    """SIGKILL every process in ``namespaces`` and wait (with a deadline) until they are gone."""
    pids = [p for ns in namespaces for p in _pids(ns)]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # ended by itself meanwhile
    deadline = time.monotonic() + timeout
    for pid in pids:
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            if _reap(pid):
                break
            time.sleep(0.02)


def _reap(pid: int) -> bool:
    """Collect ``pid`` if it is our child and dead (a zombie stays in /proc); True when it is gone."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == pid
    except ChildProcessError:
        return False  # not ours: its own parent (or init) reaps it


def _delete(namespaces: Sequence[str]) -> None:
    _kill_all(namespaces)
    for ns in namespaces:
        _run(["ip", "netns", "del", ns], check=False)


def remove_leftovers() -> list[str]:
    """Delete the namespaces of fleets whose process is gone (killed before it could clean up)."""
    stale = []
    for ns in _namespaces():
        m = re.match(rf"{PREFIX}(\d+)-", ns)
        if m is None or int(m.group(1)) == os.getpid():
            continue
        try:
            os.kill(int(m.group(1)), 0)
        except ProcessLookupError:
            stale.append(ns)
        except PermissionError:
            continue  # alive, someone else's
    stale.sort(key=lambda name: name.endswith("-switch"))  # node namespaces first, the switch (and its veths) last
    if stale:
        log.warning("removing %d network namespaces left by earlier fleets: %s", len(stale), ", ".join(stale))
        _delete(stale)
    return stale


class Network:
    """A switch namespace with a bridge, and one namespace per node, each joined to it by a veth pair.

    ``nodes``: short names (``c``, ``w0``, ...: each also names its port on the bridge, ``p-<node>``).
    ``create`` builds it all; ``close`` kills every process in the namespaces and deletes them.
    """

    def __init__(self, nodes: Sequence[str]) -> None:
        if len(set(nodes)) != len(nodes) or not nodes or len(nodes) > 200:
            raise ValueError(f"a network needs 1 to 200 distinct node names, not {list(nodes)}")
        if any(not re.fullmatch(r"[a-z][a-z0-9]{0,9}", n) or n == "switch" for n in nodes):
            raise ValueError(f"node names are short lower-case words (not 'switch'): {list(nodes)}")
        self.nodes = list(nodes)
        self.name = f"{PREFIX}{os.getpid()}-{next(_serial)}"
        self.switch = f"{self.name}-switch"
        net = RANGE.network_address + 256 * random.randrange(RANGE.num_addresses // 256)
        self.subnet = ipaddress.ip_network(f"{net}/24")
        self.addresses = {n: str(net + 10 + i) for i, n in enumerate(self.nodes)}
        self.netem: bool | None = None  # known after create()
        self._created: list[str] = []
        self._cuts: set[tuple[str, str]] = set()

    def ns(self, node: str) -> str:
        if node not in self.addresses:
            raise KeyError(f"no node {node!r} in this network (nodes: {', '.join(self.nodes)})")
        return f"{self.name}-{node}"

    @property
    def namespaces(self) -> list[str]:
        return list(self._created)

    def create(self) -> None:
        try:
            for ns in [self.switch] + [self.ns(n) for n in self.nodes]:
                _run(["ip", "netns", "add", ns])
                self._created.append(ns)
                _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            sw = self.switch
            _run(["ip", "-n", sw, "link", "add", "name", "br0", "type", "bridge"])
            _run(["ip", "-n", sw, "link", "set", "br0", "up"])
            for node in self.nodes:
                self._plug(node)
            self._nft(sw, "table bridge flightfleet { chain cut { type filter hook forward priority 0; policy accept; }; }")
            self.netem = self._probe_netem()
        except BaseException:
            self.close()
            raise

    def _plug(self, node: str) -> None:
        ns, port = self.ns(node), f"p-{node}"
        _run(["ip", "-n", self.switch, "link", "add", "name", port, "type", "veth", "peer", "name", "eth0", "netns", ns])
        _run(["ip", "-n", self.switch, "link", "set", port, "master", "br0", "up"])
        _run(["ip", "-n", ns, "addr", "add", f"{self.addresses[node]}/{self.subnet.prefixlen}", "dev", "eth0"])
        _run(["ip", "-n", ns, "link", "set", "eth0", "up"])

    def _probe_netem(self) -> bool:
        """Whether the kernel has netem: tried on the first port, then removed."""
        port = f"p-{self.nodes[0]}"
        done = subprocess.run(["tc", "-n", self.switch, "qdisc", "add", "dev", port, "root", "netem", "delay", "0ms"],
                              capture_output=True, text=True, timeout=30, check=False)
        if done.returncode != 0:
            log.debug("no netem here (%s): delays come from the proxies", done.stderr.strip())
            return False
        _run(["tc", "-n", self.switch, "qdisc", "del", "dev", port, "root"], check=False)
        return True

    def _nft(self, ns: str, script: str) -> None:
        _run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=script + "\n")

    def exec_prefix(self, node: str) -> list[str]:
        """The command prefix that runs a program in ``node``'s namespace."""
        return ["ip", "netns", "exec", self.ns(node)]

    def cut(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Drop every IP packet between each pair of nodes, both ways (see the module's doc)."""
        rules: list[str] = []
        cuts: set[tuple[str, str]] = set()
        for a, b in pairs:
            if a == b or (a, b) in self._cuts | cuts:
                continue
            cuts |= {(a, b), (b, a)}
            x, y = self.addresses[a], self.addresses[b]
            rules += [f"add rule bridge flightfleet cut ip saddr {x} ip daddr {y} drop",
                      f"add rule bridge flightfleet cut ip saddr {y} ip daddr {x} drop"]
        if rules:
            self._nft(self.switch, "\n".join(rules))
        self._cuts |= cuts

    def heal(self) -> None:
        """Remove every cut."""
        self._nft(self.switch, "flush chain bridge flightfleet cut")
        self._cuts.clear()

    @property
    def cuts(self) -> set[tuple[str, str]]:
        return set(self._cuts)

    def shape(self, node: str, *, mbit: float | None = None, out_ms: float = 0.0, in_ms: float = 0.0, jitter_ms: float = 0.0) -> None:
        """Qdiscs on ``node``'s veth: netem (delay, jitter, rate) where asked and present, else tbf (rate) or none."""
        for ns, dev, delay in ((self.ns(node), "eth0", out_ms), (self.switch, f"p-{node}", in_ms)):
            if delay > 0 or jitter_ms > 0:
                if not self.netem:
                    raise NetnsError("this kernel has no netem qdisc: delays come from flight.dev.delay_proxy")
                spec = ["netem", "delay", f"{delay}ms", f"{jitter_ms}ms"] + (["rate", f"{mbit}mbit"] if mbit else [])
            elif mbit:
                burst = max(16 << 10, int(mbit * 1e6 / 8 / 250))  # at least 4 ms of traffic, and 16 KiB
                spec = ["tbf", "rate", f"{mbit}mbit", "burst", str(burst), "latency", "100ms"]
            else:
                _run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], check=False)
                continue
            _run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", *spec])

    def qdiscs(self, node: str) -> str:
        """``tc qdisc show`` of both ends of ``node``'s veth."""
        return (_run(["tc", "-n", self.ns(node), "qdisc", "show", "dev", "eth0"])
                + _run(["tc", "-n", self.switch, "qdisc", "show", "dev", f"p-{node}"]))

    def redirect(self, node: str, port: int, to_port: int) -> None:
        """In ``node``'s namespace, TCP arriving on ``eth0`` for ``port`` goes to ``to_port`` (a proxy's)."""
        self._nft(self.ns(node), "table ip flightfleet { chain pre { type nat hook prerouting priority dstnat; policy accept; }; }\n"
                                 f"add rule ip flightfleet pre iifname \"eth0\" tcp dport {port} redirect to :{to_port}")

    def close(self) -> None:
        """Kill every process in the namespaces, then delete them (the switch last: its veths go with it)."""
        created, self._created = self._created, []
        _delete(sorted(created, key=lambda name: name == self.switch))


class LineReader:
    """A subprocess's output, line by line, read by a thread so that waiting for a line has a deadline."""

    def __init__(self, stream: IO[str], name: str) -> None:
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.tail: list[str] = []  # the last lines read, for error messages
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True, name=f"lines-{name}")
        self._thread.start()

    def _pump(self, stream: IO[str]) -> None:
        try:
            for line in stream:
                self.tail = (self.tail + [line.rstrip("\n")])[-20:]
                self._lines.put(line.rstrip("\n"))
        except (OSError, ValueError):
            log.debug("a subprocess's output ended with an error", exc_info=True)
        finally:
            stream.close()
            self._lines.put(None)

    def get(self, timeout: float) -> str | None:
        """The next line; None at the end of the output; TimeoutError when none came within ``timeout``."""
        try:
            line = self._lines.get(timeout=max(0.0, timeout))
        except queue.Empty:
            raise TimeoutError(f"no line within {timeout:g}s") from None
        if line is None:
            self._lines.put(None)  # the end stays the end for the next reader
        return line
