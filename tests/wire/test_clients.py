"""The coordinator's Flight clients, kept across queries (``flight.wire.clients.shared_pool``).

Oracles: object identity for what is kept, and real worker processes for what a kept client
must survive (its worker stopped and started again at the same address).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

import flight
from flight.security import Security
from flight.wire.clients import ClientPool, shared_pool

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "worker"))
from test_worker_cli import LISTENING, start, stop


def test_queries_share_the_clients_of_the_same_credentials_only() -> None:
    plain = shared_pool(None)
    assert shared_pool(Security()) is plain and shared_pool(None) is plain
    a, b = shared_pool(Security(token="token-a")), shared_pool(Security(token="token-b"))
    assert a is not b and a is not plain and shared_pool(Security(token="token-a")) is a
    assert "token-a" not in repr(Security(token="token-a"))


def test_a_forked_child_keeps_none_of_its_parent_s_clients() -> None:
    parent = shared_pool(None)
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if it got a pool of its own, and kept it
        code = 1
        try:
            mine = shared_pool(None)
            code = 0 if mine is not parent and shared_pool(None) is mine else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child used its parent's pool"
    assert shared_pool(None) is parent


def test_a_pool_keeps_its_newest_clients_and_forgets_an_unreachable_worker_s() -> None:
    pool = ClientPool(max_clients=2)
    one, two = pool.get("grpc://127.0.0.1:1"), pool.get("grpc://127.0.0.1:2")
    assert pool.get("grpc://127.0.0.1:1") is one  # now the newest used
    pool.get("grpc://127.0.0.1:3")  # a third: the longest unused (port 2) goes
    assert pool.get("grpc://127.0.0.1:1") is one and pool.get("grpc://127.0.0.1:2") is not two
    pool.forget("grpc://127.0.0.1:1")
    assert pool.get("grpc://127.0.0.1:1") is not one
    pool.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(port: int) -> subprocess.Popen[str]:
    proc, line = start([sys.executable, "-m", "flight.worker", "--host", "127.0.0.1", "--port", str(port)])
    assert line == f"{LISTENING}{port}", line
    return proc


def test_a_worker_restarted_at_the_same_address_answers_the_next_query() -> None:
    """The kept client's connection broke with its worker; the query that found the worker gone
    fails naming it, and the next one, after the restart, runs (no reconnect backoff to wait out)."""
    port = _free_port()
    url = f"grpc://127.0.0.1:{port}"
    table = pa.table({"x": list(range(100))})
    proc = _worker(port)
    try:
        assert flight.DistributedExec(flight.from_arrow(table), [url]).to_table().equals(table)
    finally:
        stop(proc)
    with pytest.raises(flight.WorkerUnavailableError) as info:
        flight.DistributedExec(flight.from_arrow(table), [url], connect_timeout=5).to_table()
    assert url in str(info.value)
    proc = _worker(port)
    try:
        got = flight.DistributedExec(flight.from_arrow(table), [url], connect_timeout=5).to_table()
        assert got.sort_by("x").equals(table)
    finally:
        stop(proc)


def test_a_worker_that_never_had_the_task_is_a_lost_worker_and_one_whose_task_ended_is_not() -> None:
    """``ErrorInfo.never_here`` (a restarted worker, or one its coordinator could not reach) reads as UNAVAILABLE
    naming that worker, which recovery runs the query again without; a task that ended there stays a task's failure."""
    from flight.errors import TaskFailedError, WorkerUnavailableError
    from flight.wire._proto import protocol_pb2
    from flight.wire.clients import error_from_info

    url = "grpc://198.18.0.12:4000"
    info = protocol_pb2.ErrorInfo(code=protocol_pb2.ERROR_CODE_NOT_FOUND, message=f"no task q/1/0 on worker {url}: it is not running here",
                                  worker_url=url, never_here=True)
    lost = error_from_info(info, url, "q/1/0")
    assert isinstance(lost, WorkerUnavailableError) and lost.worker_url == url and "never reached it" in str(lost)
    info.never_here = False
    info.message = f"no task q/1/0 on worker {url}: it finished"
    assert isinstance(error_from_info(info, url, "q/1/0"), TaskFailedError)
