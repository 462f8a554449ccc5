"""A TCP forwarding proxy that delays, jitters and stalls bytes: the fleet harness's slow network.

Why a proxy: the harness (``flight.dev.fleet``) wants links with a delay per direction, jitter
and stalls, and this machine's kernel has no ``netem`` qdisc ("Specified qdisc kind is
unknown"). So each worker's namespace runs one of these in front of the worker: connections
from other namespaces to the worker's port are redirected to it (nftables), and it forwards
every byte, in order, to the worker after the delay of the two links the bytes cross.

The model is netem's on both ends of a link: every node (an address) has a ``LinkShape``:
``out_ms`` for bytes leaving it, ``in_ms`` for bytes arriving, ``jitter_ms`` (± uniform, per
chunk, never reordering: a chunk is released no earlier than the one before it), and stalls:
a one-off ``stalled_until`` or a random schedule (a stall of ``stall_s`` on average every
``stall_every_s``, seeded). Bytes from node A to node B wait ``A.out_ms + B.in_ms``; while A's
or B's link is stalled nothing is forwarded either way (the proxy keeps reading up to a bound,
like a switch's queue, then TCP's flow control stops the sender). A stall schedule is a pure
function of its seed and ``epoch`` (a ``time.monotonic()`` instant, one clock for every
process of the machine), so every proxy agrees on when a link stalls without talking.

Shapes change while it runs: each stdin line is a JSON object ``{"links": {address: shape}}``
replacing all shapes, answered by ``ok`` on stdout; stdin's end (the harness gone) ends the
proxy. The first stdout line is ``delay-proxy listening on HOST:PORT``.

Standard library only, and started by path (``python -I delay_proxy.py``): importing the
``flight`` package would cost every proxy a second or two of start-up.
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import struct
import sys
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, fields
from typing import Any

__all__ = ["READY", "LinkShape", "StallClock", "main", "serve"]

READY = "delay-proxy listening on "
CHUNK = 256 << 10  # bytes read at once
QUEUE_BYTES = 8 << 20  # bytes held per direction before the proxy stops reading (a stall's queue)


@dataclass(frozen=True)
class LinkShape:
    """One node's link: delays in each direction, jitter, stalls (times are ``time.monotonic()``)."""

    out_ms: float = 0.0
    in_ms: float = 0.0
    jitter_ms: float = 0.0
    stall_every_s: float = 0.0
    stall_s: float = 0.0
    seed: int = 0
    epoch: float = 0.0
    stalled_until: float = 0.0

    def to_json(self) -> dict[str, float]:
        return {k: v for k, v in asdict(self).items() if v}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LinkShape:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


class StallClock:
    """When a link's random stall schedule has it stalled: the same answer in every process."""

    def __init__(self) -> None:
        self._windows: dict[tuple[int, float, float, float], tuple[random.Random, list[tuple[float, float]]]] = {}
        self._lock = threading.Lock()

    def stalled_until(self, shape: LinkShape, now: float) -> float:
        """The end of the stall ``shape`` is in at ``now``, or 0.0."""
        end = shape.stalled_until if shape.stalled_until > now else 0.0
        if shape.stall_every_s <= 0 or shape.stall_s <= 0 or now < shape.epoch:
            return end
        key = (shape.seed, shape.stall_every_s, shape.stall_s, shape.epoch)
        with self._lock:
            rng, windows = self._windows.setdefault(key, (random.Random(shape.seed), []))
            while not windows or windows[-1][1] <= now:
                start = (windows[-1][1] if windows else shape.epoch) + rng.expovariate(1.0 / shape.stall_every_s)
                windows.append((start, start + shape.stall_s))
            while len(windows) > 1 and windows[0][1] < now - 600:
                windows.pop(0)
            for start, stop in reversed(windows):
                if start <= now < stop:
                    return max(end, stop)
                if stop <= now:
                    break
        return end


class Links:
    """The shapes in force, by address, and the condition every waiting writer waits on."""

    def __init__(self, me: str) -> None:
        self.me = me
        self.shapes: dict[str, LinkShape] = {}
        self.cond = threading.Condition()
        self.clock = StallClock()

    def replace(self, shapes: dict[str, LinkShape]) -> None:
        with self.cond:
            self.shapes = shapes
            self.cond.notify_all()

    def delay(self, src: str, dst: str) -> tuple[float, float]:
        """Seconds bytes from ``src`` to ``dst`` wait, and their jitter (±)."""
        a, b = self.shapes.get(src, LinkShape()), self.shapes.get(dst, LinkShape())
        return (a.out_ms + b.in_ms) / 1000.0, (a.jitter_ms + b.jitter_ms) / 1000.0

    def stalled_until(self, src: str, dst: str, now: float) -> float:
        empty = LinkShape()
        return max(self.clock.stalled_until(self.shapes.get(src, empty), now),
                   self.clock.stalled_until(self.shapes.get(dst, empty), now))


class Connection:
    """One proxied connection: two pipes, four threads; the last thread out closes the sockets."""

    def __init__(self, links: Links, client: socket.socket, upstream: socket.socket, peer: str) -> None:
        self.links = links
        self.socks = (client, upstream)
        self.closed = False
        self._alive = 4
        self._lock = threading.Lock()
        self.pipes = (Pipe(self, client, upstream, peer, links.me), Pipe(self, upstream, client, links.me, peer))

    def start(self) -> None:
        for pipe in self.pipes:
            threading.Thread(target=self._run, args=(pipe.read,), daemon=True, name="proxy-read").start()
            threading.Thread(target=self._run, args=(pipe.write,), daemon=True, name="proxy-write").start()

    def _run(self, step: Any) -> None:
        try:
            step()
        except OSError:
            self.abort()
        except BaseException:
            self.abort()
            raise
        finally:
            with self._lock:
                self._alive -= 1
                last = self._alive == 0
            if last:
                for s in self.socks:
                    s.close()

    def abort(self) -> None:
        """Reset both ends (as the kernel would when a side goes away) and wake every thread."""
        if self.closed:
            return
        self.closed = True
        for s in self.socks:
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already gone: nothing to reset
        for pipe in self.pipes:
            with pipe.cond:
                pipe.cond.notify_all()
        with self.links.cond:
            self.links.cond.notify_all()


class Pipe:
    """One direction: a reader stamps each chunk with its release time, a writer sends it then."""

    def __init__(self, conn: Connection, src: socket.socket, dst: socket.socket, src_node: str, dst_node: str) -> None:
        self.conn, self.src, self.dst = conn, src, dst
        self.nodes = (src_node, dst_node)
        self.queue: deque[tuple[float, bytes | None]] = deque()
        self.queued = 0
        self.cond = threading.Condition()
        self.rng = random.Random()
        self.last = 0.0

    def read(self) -> None:
        while not self.conn.closed:
            data = self.src.recv(CHUNK)
            now = time.monotonic()
            base, jitter = self.conn.links.delay(*self.nodes)
            release = max(self.last, now + max(0.0, base + (self.rng.uniform(-jitter, jitter) if jitter else 0.0)))
            self.last = release
            with self.cond:
                while self.queued > QUEUE_BYTES and not self.conn.closed:
                    self.cond.wait()
                self.queue.append((release, data or None))
                self.queued += len(data)
                self.cond.notify_all()
            if not data:
                return

    def write(self) -> None:
        while not self.conn.closed:
            with self.cond:
                while not self.queue and not self.conn.closed:
                    self.cond.wait()
                if self.conn.closed:
                    return
                release, data = self.queue[0]
            if not self._wait(release):
                return
            with self.cond:
                self.queue.popleft()
                self.queued -= len(data or b"")
                self.cond.notify_all()
            if data is None:
                self.dst.shutdown(socket.SHUT_WR)
                return
            self.dst.sendall(data)

    def _wait(self, release: float) -> bool:
        """Wait until ``release`` and the end of any stall of either link; False when the connection ended."""
        links = self.conn.links
        with links.cond:
            while not self.conn.closed:
                now = time.monotonic()
                until = max(release, links.stalled_until(*self.nodes, now))
                if until <= now:
                    return True
                links.cond.wait(until - now)
        return False


def serve(listener: socket.socket, target: tuple[str, int], links: Links) -> None:
    """Accept forever; each connection is joined to ``target`` by a thread of its own."""
    while True:
        client, addr = listener.accept()
        threading.Thread(target=_join, args=(client, addr[0], target, links), daemon=True, name="proxy-join").start()


def _join(client: socket.socket, peer: str, target: tuple[str, int], links: Links) -> None:
    try:
        upstream = socket.create_connection(target, timeout=10.0)
    except OSError:
        # Nothing listens behind the proxy (its worker was killed): reset, as that host's kernel would.
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()
        return
    upstream.settimeout(None)
    for s in (client, upstream):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    Connection(links, client, upstream, peer).start()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="delay_proxy", description="forward TCP to --target with per-link delays and stalls")
    p.add_argument("--listen", required=True, help="HOST:PORT to listen on (port 0: any)")
    p.add_argument("--target", required=True, help="HOST:PORT to forward to")
    p.add_argument("--me", default=None, help="this end's node address in the shapes (default: --listen's host)")
    args = p.parse_args(argv)
    host, port = _address(args.listen)
    links = Links(args.me or host)
    listener = socket.create_server((host, port), backlog=128)
    print(f"{READY}{host}:{listener.getsockname()[1]}", flush=True)
    threading.Thread(target=serve, args=(listener, _address(args.target), links), daemon=True, name="proxy-accept").start()
    for line in sys.stdin:
        if line.strip():
            shapes = json.loads(line)["links"]
            links.replace({addr: LinkShape.from_json(s) for addr, s in shapes.items()})
            print("ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
