"""The delay proxy on loopback: every byte forwarded exactly, both ways; a stall holds bytes and loses none.

The proxy is the real program (``python -I flight/dev/delay_proxy.py``) driven through its
control channel, in front of a real TCP server in this process; no namespace is needed, so
these run everywhere. Nothing here asserts a duration: a stall is ended by a command, and
"nothing arrived while stalled" is checked over a short wait inside a stall that lasts minutes.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from flight.dev.delay_proxy import LinkShape, StallClock
from flight.dev.fleet import ProxyProcess

pytestmark = pytest.mark.required

MIB = 1 << 20


class Server:
    """Accepts one connection; sends ``size`` random bytes while hashing everything it receives."""

    def __init__(self, size: int) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sent = hashlib.sha256()
        self.received = hashlib.sha256()
        self.received_bytes = 0
        self.size = size
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            sender = threading.Thread(target=_send_random, args=(conn, self.size, self.sent))
            sender.start()
            while data := conn.recv(MIB):
                self.received.update(data)
                self.received_bytes += len(data)
            sender.join()

    def close(self) -> None:
        self.listener.close()


def _send_random(sock: socket.socket, size: int, digest: hashlib._Hash) -> None:
    block = os.urandom(MIB)
    for i in range(size // MIB):
        chunk = block[i % 7:] + block[: i % 7]  # not the same block every time
        digest.update(chunk)
        sock.sendall(chunk)
    sock.shutdown(socket.SHUT_WR)


@pytest.fixture
def proxied() -> Iterator[tuple[Server, ProxyProcess]]:
    server = Server(48 * MIB)
    proxy = ProxyProcess((), "127.0.0.1", f"127.0.0.1:{server.port}", me="proxy")
    try:
        proxy.wait_ready()
        yield server, proxy
    finally:
        proxy.close()
        server.close()


def test_a_large_stream_is_forwarded_exactly_both_ways_with_delay_and_jitter(proxied: tuple[Server, ProxyProcess]) -> None:
    server, proxy = proxied
    proxy.set_links({"proxy": LinkShape(out_ms=2, in_ms=1, jitter_ms=1), "127.0.0.1": LinkShape(out_ms=1, jitter_ms=3)})
    client = socket.create_connection(("127.0.0.1", proxy.port), timeout=60)
    sent, received = hashlib.sha256(), hashlib.sha256()
    sender = threading.Thread(target=_send_random, args=(client, 40 * MIB, sent))
    sender.start()
    n = 0
    while data := client.recv(MIB):
        received.update(data)
        n += len(data)
    sender.join()
    client.close()
    server.thread.join(60)
    assert n == 48 * MIB
    assert received.hexdigest() == server.sent.hexdigest()
    assert server.received_bytes == 40 * MIB
    assert server.received.hexdigest() == sent.hexdigest()


def test_a_stall_holds_everything_and_loses_nothing(proxied: tuple[Server, ProxyProcess]) -> None:
    server, proxy = proxied
    client = socket.create_connection(("127.0.0.1", proxy.port), timeout=60)
    first = client.recv(MIB)  # the link works
    assert first
    proxy.set_links({"proxy": LinkShape(stalled_until=time.monotonic() + 600)})
    drained = bytearray(first)
    client.settimeout(1.0)
    try:  # what was already on its way before the stall may still come (the chunk being sent); then nothing
        while data := client.recv(MIB):
            drained += data
    except TimeoutError:
        pass
    client.settimeout(1.0)
    with pytest.raises(TimeoutError):
        client.recv(MIB)
    proxy.set_links({})  # the stall ends
    client.settimeout(60)
    received = hashlib.sha256(drained)
    n = len(drained)
    while data := client.recv(MIB):
        received.update(data)
        n += len(data)
    client.close()
    assert n == 48 * MIB
    assert received.hexdigest() == server.sent.hexdigest()


def test_a_connection_to_a_dead_target_is_reset_not_held() -> None:
    dead = socket.create_server(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()  # nothing listens there now
    proxy = ProxyProcess((), "127.0.0.1", f"127.0.0.1:{port}", me="proxy")
    try:
        proxy.wait_ready()
        with pytest.raises(ConnectionResetError):  # the reset may come as the connection opens, or at the first read
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as client:
                client.recv(1)
    finally:
        proxy.close()


def test_every_process_agrees_on_a_random_stall_schedule() -> None:
    shape = LinkShape(stall_every_s=5, stall_s=1, seed=7, epoch=1000.0)
    a, b = StallClock(), StallClock()
    times = [1000.0 + i * 0.25 for i in range(400)]
    ends_a = [a.stalled_until(shape, t) for t in times]
    ends_b = [b.stalled_until(shape, t) for t in reversed(times)][::-1]  # asked in another order
    assert ends_a == ends_b
    stalled = [t for t, end in zip(times, ends_a) if end]
    assert 0 < len(stalled) < len(times)
    assert all(t < end <= t + 1.0 for t, end in zip(times, ends_a) if end)
