"""``Fleet``: a coordinator and N workers, each in a network namespace of its own, on links a test can break.

Why: losing a worker, a partition between two machines, a slow or stalling link, a straggler's
thin pipe: what the coordinator and the shuffle must survive happens between machines, and a
fleet on loopback cannot show it. Here each node has its own namespace and address on a bridge
(``flight.dev.netns``: the root namespace is never touched), and the test in the root namespace
breaks links while a query runs (issue 29).

Each worker is the real daemon, ``flight-worker --host <its address> --port 0``, so the URL it
names itself by is the one the coordinator is given and a task reads its own worker's
partitions locally, as on a real fleet. It holds a lifeline (``--parent-fd``, as in
``LocalCluster``): it exits when the fleet's process ends, even by SIGKILL. ``remove_leftovers``
deletes the namespaces of a run that was killed before it could.

Delays, jitter and stalls come from ``flight.dev.delay_proxy`` (this kernel has no netem;
where it has, netem on the veths does delay and jitter and the proxies only stall). With
``proxies=True`` (the default) one proxy runs in each worker's namespace, and nftables
redirects connections that reach the worker's port from outside to it. Every connection of a
fleet has its server end at a worker, so every byte between namespaces passes exactly one
proxy, which applies the link shapes of both ends (``set_delay``). Measured on this 2-core
machine, one stream between two namespaces ran at 700-880 MB/s through a proxy (1.2-1.5 GB/s
direct), and TPC-H queries at SF 0.5 on three workers took no measurably longer: so the proxies
are always there (a delay set later then applies to connections already open too);
``proxies=False`` leaves them out for a fleet that will never be slowed (delays then raise).

The coordinator runs in namespace ``c``: ``query`` starts ``flight.dev.fleet_driver`` there and
returns a ``DriverRun`` (events as they happen, then the result); ``python`` and ``popen`` run
any program there (or in a worker's namespace). Nodes are named by worker index or ``COORDINATOR``.
"""

from __future__ import annotations

import atexit
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from flight.dev import delay_proxy
from flight.dev.delay_proxy import LinkShape
from flight.dev.fleet_driver import DriverRun
from flight.dev.netns import LineReader, NetnsError, Network, netns_unavailable, remove_leftovers
from flight.wire.limits import DEFAULT_MEMORY_FRACTION, physical_memory
from flight.worker.memory import WORKER_ENV

__all__ = ["COORDINATOR", "Fleet", "Node", "ProxyProcess"]

COORDINATOR = "coordinator"
Node = int | str  # a worker's index, or COORDINATOR
_LISTENING = "flight-worker listening on "


class ProxyProcess:
    """A ``delay_proxy`` process (in a namespace, through ``prefix``) and its control channel."""

    def __init__(self, prefix: Sequence[str], listen_host: str, target: str, me: str, timeout: float = 30.0) -> None:
        cmd = [*prefix, sys.executable, "-I", delay_proxy.__file__, "--listen", f"{listen_host}:0", "--target", target, "--me", me]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self._lines = LineReader(self.proc.stdout, f"proxy-{me}")
        self._timeout = timeout
        self.port = 0

    def wait_ready(self) -> int:
        line = self._line()
        if not line.startswith(delay_proxy.READY):
            raise NetnsError(f"delay proxy (pid {self.proc.pid}) said {line!r} instead of {delay_proxy.READY!r}")
        self.port = int(line.rsplit(":", 1)[1])
        return self.port

    def _line(self) -> str:
        try:
            line = self._lines.get(self._timeout)
        except TimeoutError:
            line = None
        if line is None:
            raise NetnsError(f"delay proxy (pid {self.proc.pid}) did not answer within {self._timeout:g}s (exit code {self.proc.poll()})")
        return line

    def set_links(self, shapes: Mapping[str, LinkShape]) -> None:
        """Replace the proxy's link shapes; returns once it has them."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"links": {a: s.to_json() for a, s in shapes.items()}}) + "\n")
        self.proc.stdin.flush()
        if (line := self._line()) != "ok":
            raise NetnsError(f"delay proxy (pid {self.proc.pid}) answered {line!r} to new shapes")

    def close(self) -> None:
        """End of stdin ends the proxy; killed if it lingers."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        _stop(self.proc, None, 5.0)


def _stop(proc: subprocess.Popen[Any], sig: int | None, timeout: float) -> None:
    """Send ``sig`` (if any), wait up to ``timeout``, then SIGKILL."""
    if sig is not None and proc.poll() is None:
        proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@dataclass
class _Worker:
    proc: subprocess.Popen[str]
    lines: LineReader
    port: int = 0
    url: str = ""
    proxy: ProxyProcess | None = None


class Fleet:
    """A coordinator namespace and ``workers`` worker processes in namespaces of their own; everything goes on exit.

    ``worker_args`` go to every ``flight-worker``, ``per_worker_args[i]`` to worker i only;
    ``data_roots`` and ``extensions`` become ``--data-root`` and ``--extension``. ``seed`` makes
    the stall schedules reproducible. Needs root, ``ip``, ``tc`` and ``nft``:
    ``netns_unavailable()`` says why a machine cannot (tests skip with it).
    """

    def __init__(
        self,
        workers: int = 3,
        *,
        worker_args: Sequence[str] = (),
        per_worker_args: Sequence[Sequence[str]] | None = None,
        data_roots: Sequence[str | os.PathLike[str]] = (),
        extensions: Sequence[str] = (),
        proxies: bool = True,
        start_timeout: float = 60.0,
        log_level: str = "WARNING",
        grace: float = 2.0,
        env: Mapping[str, str] | None = None,
        seed: int | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError("a fleet needs at least one worker")
        self.n_workers = workers
        self.network = Network(["c"] + [f"w{i}" for i in range(workers)])
        self.proxies = proxies
        self.seed = random.randrange(1 << 30) if seed is None else seed
        share = int(physical_memory() * DEFAULT_MEMORY_FRACTION / workers) >> 20
        defaults = [] if any(a.startswith("--memory-limit") for a in worker_args) else ["--memory-limit", f"{share}MB"]
        if not any(a.startswith("--engine-threads") for a in worker_args):
            defaults += ["--engine-threads", str(max(1, (os.cpu_count() or 1) // workers))]
        self._args = [*defaults, *(a for m in extensions for a in ("--extension", m)),
                      *(a for d in data_roots for a in ("--data-root", os.path.abspath(d))), *worker_args]
        self._per_worker = [list(a) for a in per_worker_args] if per_worker_args else [[] for _ in range(workers)]
        self._timeout, self._log_level, self._grace = start_timeout, log_level, grace
        self._env = {**os.environ, **WORKER_ENV, **(env or {}), "PYTHONUNBUFFERED": "1"}
        self.workers: list[_Worker] = []
        self.shapes: dict[str, LinkShape] = {}  # by node name (c, w0, ...)
        self.mbit: dict[str, float] = {}
        self._procs: list[subprocess.Popen[Any]] = []
        self._life: tuple[int, int] | None = None
        self._queries = 0
        self.dir = Path()  # logs, query specs and results: a temporary directory from start() to close()

    # -- names

    def node(self, node: Node) -> str:
        """The network's name of ``node`` (a worker index or COORDINATOR)."""
        if node == COORDINATOR:
            return "c"
        if isinstance(node, int) and 0 <= node < self.n_workers:
            return f"w{node}"
        raise ValueError(f"no node {node!r}: nodes are worker indexes 0..{self.n_workers - 1} and {COORDINATOR!r}")

    def address(self, node: Node) -> str:
        return self.network.addresses[self.node(node)]

    def ns(self, node: Node) -> str:
        return self.network.ns(self.node(node))

    @property
    def coordinator_ns(self) -> str:
        return self.network.ns("c")

    @property
    def worker_urls(self) -> list[str]:
        return [w.url for w in self.workers]

    def log(self, i: int) -> str:
        """What worker ``i`` wrote to stderr (all its lives)."""
        path = self.dir / f"w{i}.log"
        return path.read_text(errors="replace") if self.dir != Path() and path.exists() else ""

    # -- life

    def start(self) -> Self:
        reason = netns_unavailable()
        if reason is not None:
            raise NetnsError(reason)
        remove_leftovers()
        atexit.register(self.close)
        self.dir = Path(tempfile.mkdtemp(prefix="flightfleet-"))
        try:
            self.network.create()
            self._life = os.pipe()
            self.workers = [self._spawn(i, 0) for i in range(self.n_workers)]
            for i in range(self.n_workers):
                self._listening(i)
            if self.proxies:
                for i, w in enumerate(self.workers):
                    w.proxy = ProxyProcess(self.network.exec_prefix(f"w{i}"), self.address(i), f"{self.address(i)}:{w.port}",
                                           self.address(i), self._timeout)
                for i, w in enumerate(self.workers):
                    assert w.proxy is not None
                    self.network.redirect(f"w{i}", w.port, w.proxy.wait_ready())
        except BaseException:
            self.close()
            raise
        return self

    def _spawn(self, i: int, port: int) -> _Worker:
        assert self._life is not None
        life_r = self._life[0]
        cmd = [*self.network.exec_prefix(f"w{i}"), sys.executable, "-m", "flight.worker", "--host", self.address(i),
               "--port", str(port), "--parent-fd", str(life_r), "--log-level", self._log_level, "--grace", str(self._grace),
               *self._args, *self._per_worker[i]]
        with open(self.dir / f"w{i}.log", "a") as log:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, pass_fds=(life_r,), env=self._env)
        assert proc.stdout is not None
        return _Worker(proc, LineReader(proc.stdout, f"w{i}"))

    def _listening(self, i: int) -> None:
        w = self.workers[i]
        deadline = time.monotonic() + self._timeout
        while time.monotonic() < deadline:
            try:
                line = w.lines.get(deadline - time.monotonic())
            except TimeoutError:
                break
            if line is None:
                break
            if line.startswith(_LISTENING):
                w.url = line[len(_LISTENING):].strip()
                w.port = int(w.url.rsplit(":", 1)[1])
                return
        raise NetnsError(f"worker {i} (pid {w.proc.pid}) did not report listening within {self._timeout:g}s "
                         f"(exit code {w.proc.poll()}); its log:\n{self.log(i)[-3000:]}")

    def kill(self, i: int) -> None:
        """SIGKILL worker ``i`` (its proxy stays: new connections to it are reset, as by a host whose process died)."""
        self.node(i)
        _stop(self.workers[i].proc, signal.SIGKILL, 10.0)

    def restart(self, i: int) -> None:
        """Start worker ``i`` again on the same address and port (after ``kill``, or it is killed first)."""
        old = self.workers[i]
        if old.proc.poll() is None:
            self.kill(i)
        self.workers[i] = replace(self._spawn(i, old.port), proxy=old.proxy)
        self._listening(i)
        if self.workers[i].url != old.url:
            raise NetnsError(f"worker {i} came back as {self.workers[i].url}, not {old.url}")

    def close(self) -> None:
        """Stop every process of the fleet and delete its namespaces; safe to call twice, and after a failed start."""
        atexit.unregister(self.close)
        for proc in self._procs:
            _stop(proc, signal.SIGKILL, 5.0)
        self._procs = []
        for w in self.workers:
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGTERM)
        for w in self.workers:
            _stop(w.proc, None, self._grace + 3.0)
            if w.proxy is not None:
                w.proxy.close()
        self.workers = []
        if self._life is not None:
            for fd in self._life:
                os.close(fd)
            self._life = None
        self.network.close()
        if self.dir != Path():
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = Path()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # -- the network

    def partition(self, node: Node, from_: Node | Iterable[Node] | None = None) -> None:
        """Cut ``node`` off from ``from_`` (a node or several; default: every other node): silence, both ways."""
        others: Iterable[Node]
        if from_ is None:
            others = [COORDINATOR, *range(self.n_workers)]
        elif isinstance(from_, (int, str)):
            others = [from_]
        else:
            others = from_
        a = self.node(node)
        self.network.cut((a, self.node(o)) for o in others if self.node(o) != a)

    def heal(self) -> None:
        """Undo every partition (connections that timed out meanwhile stay gone, as on a real network)."""
        self.network.heal()

    def rate_limit(self, node: Node, mbit: float | None) -> None:
        """Limit ``node``'s link to ``mbit`` Mbit/s each way (``tc tbf``); None lifts the limit."""
        name = self.node(node)
        if mbit is None:
            self.mbit.pop(name, None)
        else:
            self.mbit[name] = float(mbit)
        self._apply_qdisc(name)

    def qdiscs(self, node: Node) -> str:
        """``tc qdisc show`` of both ends of ``node``'s link."""
        return self.network.qdiscs(self.node(node))

    def set_delay(self, node: Node, one_way_ms: float = 0.0, *, in_ms: float | None = None, jitter_ms: float = 0.0,
                  stall_every_s: float = 0.0, stall_s: float = 0.0) -> None:
        """Shape ``node``'s link: ``one_way_ms`` for bytes leaving it (and arriving, unless ``in_ms``), ± ``jitter_ms``,
        and a stall of ``stall_s`` seconds on average every ``stall_every_s``. Bytes between two nodes cross both
        nodes' links: their round trip is the sum of the four directions (``set_rtt`` shapes every link alike)."""
        name = self.node(node)
        seed = self.seed * 1000 + self.network.nodes.index(name)
        self.shapes[name] = LinkShape(out_ms=one_way_ms, in_ms=one_way_ms if in_ms is None else in_ms, jitter_ms=jitter_ms,
                                      stall_every_s=stall_every_s, stall_s=stall_s, seed=seed, epoch=time.monotonic(),
                                      stalled_until=self.shapes.get(name, LinkShape()).stalled_until)
        self._apply_qdisc(name)
        self._push_shapes()

    def set_rtt(self, rtt_ms: float, *, jitter_ms: float = 0.0, stall_every_s: float = 0.0, stall_s: float = 0.0) -> None:
        """Every link alike, so that any two nodes see ``rtt_ms`` of round trip (each direction of each link: a quarter)."""
        for node in [COORDINATOR, *range(self.n_workers)]:
            self.set_delay(node, rtt_ms / 4, jitter_ms=jitter_ms / 2, stall_every_s=stall_every_s, stall_s=stall_s)

    def stall(self, node: Node, seconds: float) -> None:
        """Stop everything crossing ``node``'s link for ``seconds`` from now (both ways; nothing is lost)."""
        name = self.node(node)
        self.shapes[name] = replace(self.shapes.get(name, LinkShape()), stalled_until=time.monotonic() + seconds)
        self._push_shapes()

    def clear_shapes(self) -> None:
        """No delay, jitter or stall on any link (rate limits stay)."""
        self.shapes.clear()
        for name in self.network.nodes:
            self._apply_qdisc(name)
        self._push_shapes()

    def _apply_qdisc(self, name: str) -> None:
        shape = self.shapes.get(name, LinkShape())
        if self.network.netem:
            self.network.shape(name, mbit=self.mbit.get(name), out_ms=shape.out_ms, in_ms=shape.in_ms, jitter_ms=shape.jitter_ms)
        else:
            self.network.shape(name, mbit=self.mbit.get(name))

    def _push_shapes(self) -> None:
        """Every proxy gets every link's shape, by address (without the delays netem already adds)."""
        netem = bool(self.network.netem)
        shapes = {self.network.addresses[n]: replace(s, out_ms=0.0, in_ms=0.0, jitter_ms=0.0) if netem else s
                  for n, s in self.shapes.items()}
        delayed = any(s.out_ms or s.in_ms or s.jitter_ms or s.stall_s or s.stalled_until for s in shapes.values())
        if delayed and not self.proxies:
            raise NetnsError("this fleet was made with proxies=False: it cannot delay or stall links")
        for w in self.workers:
            if w.proxy is not None:
                w.proxy.set_links(shapes)

    # -- programs in the namespaces

    def popen(self, node: Node, cmd: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``cmd`` in ``node``'s namespace; the fleet kills it on exit if it still runs."""
        kwargs.setdefault("env", self._env)
        proc = subprocess.Popen([*self.network.exec_prefix(self.node(node)), *cmd], **kwargs)
        self._procs.append(proc)
        return proc

    def python(self, args: Sequence[str], *, node: Node = COORDINATOR, **kwargs: Any) -> subprocess.Popen[Any]:
        """This interpreter with ``args`` (``["-m", "mymodule", ...]``, a script...) in the coordinator's namespace."""
        return self.popen(node, [sys.executable, *args], **kwargs)

    def query(self, sql: str | None, tables: Mapping[str, Sequence[str | os.PathLike[str]]] | None = None, *,
              options: Mapping[str, Any] | None = None, dialect: str = "duckdb", info: bool = True, settle_s: float = 10.0,
              workers: Sequence[str] | None = None, listed: Mapping[str, str | os.PathLike[str]] | None = None) -> DriverRun:
        """Run ``sql`` over ``tables`` (name → Parquet files) with ``DistributedExec`` in the coordinator's namespace,
        on ``workers`` (default: every worker's URL), with ``options`` (``ExecOptions`` fields); ``listed`` tables (name →
        directory) are read as a shared queue, a unit per row group. See ``fleet_driver``."""
        self._queries += 1
        out = self.dir / f"result-{self._queries}.arrow"
        spec = {"sql": sql, "tables": {k: [os.path.abspath(p) for p in v] for k, v in (tables or {}).items()},
                "workers": list(workers or self.worker_urls), "options": dict(options or {}), "dialect": dialect,
                "out": str(out), "info": info, "settle_s": settle_s,
                "listed": {k: os.path.abspath(v) for k, v in (listed or {}).items()}}
        spec_path = self.dir / f"query-{self._queries}.json"
        spec_path.write_text(json.dumps(spec))
        err_path = self.dir / f"query-{self._queries}.stderr"
        with open(err_path, "w") as err:
            proc = self.python(["-m", "flight.dev.fleet_driver", "--spec", str(spec_path)], stdout=subprocess.PIPE, stderr=err, text=True)
        return DriverRun(proc, out if sql else None, err_path)

    def worker_info(self, timeout: float = 60.0) -> list[dict[str, Any]]:
        """Every worker's ``info`` as the coordinator's namespace sees it now (``running_tasks``, ``buffered_bytes``, or ``error``)."""
        return self.query(None, info=True, settle_s=0.0).result(timeout).infos
