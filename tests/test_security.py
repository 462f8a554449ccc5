"""Authenticated, encrypted workers, and queries kept apart (issue 10), on real workers over loopback.

Every refusal is checked for its absence of side effects: no task started, no query
cancelled, no worker drained. Results are compared with pyarrow computing the same thing.
"""

from __future__ import annotations

import gc
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl
import pyarrow.parquet as pq
import pytest
from support import header, running_tasks, wait_until

import flight
from flight import agg, col
from flight.dev.testing import waiting_query
from flight.security import Security, connect
from flight.wire._proto import protocol_pb2
from flight.wire.protocol import error_info_of

pytestmark = pytest.mark.slow  # secure clusters of their own: a few seconds each


@pytest.fixture(scope="module")
def secure() -> Iterator[flight.LocalCluster]:
    with flight.LocalCluster(2, secure=True) as c:
        yield c


def _table(n: int, keys: int) -> pa.Table:
    return pa.table({"k": pa.array([i % keys for i in range(n)], pa.int64()), "v": pa.array(range(n), pa.int64())})


def _no_token(cluster: flight.LocalCluster) -> Security:
    return Security(tls_root_certs=cluster.security.tls_root_certs)


def _unauthenticated(call: object) -> fl.FlightUnauthenticatedError:
    assert isinstance(call, fl.FlightUnauthenticatedError), repr(call)
    return call


def _attempt(fn: object) -> BaseException | None:
    try:
        fn()  # type: ignore[operator]
    except BaseException as exc:  # noqa: BLE001 - the test inspects it
        return exc
    return None


def test_every_call_without_or_with_a_wrong_token_is_unauthenticated_and_does_nothing(secure: flight.LocalCluster) -> None:
    url = secure.urls[0]
    assert url.startswith("grpc+tls://")
    for bad in (_no_token(secure), Security(token="not-the-token", tls_root_certs=secure.security.tls_root_certs)):
        client = connect(url, bad)
        try:
            stage = flight.from_arrow(_table(10, 2)).stage_plan()
            descriptor = fl.FlightDescriptor.for_command(header(stage).SerializeToString())
            exc = _attempt(lambda: _exchange(client, descriptor))
            _unauthenticated(exc)
            assert "bearer token" in str(exc) and "not-the-token" not in str(exc)
            ticket = protocol_pb2.Ticket(stage_key=header(stage).stage_key, partition_start=0, partition_end=1, query_secret=b"s" * 16)
            _unauthenticated(_attempt(lambda: client.do_get(fl.Ticket(ticket.SerializeToString())).read_all()))
            for action in ("health", "info", "drain", "resume", "cancel"):
                _unauthenticated(_attempt(lambda: list(client.do_action(fl.Action(action, b"")))))
            _unauthenticated(_attempt(lambda: list(client.list_actions())))
        finally:
            client.close()
    # No side effect: no task ran, the worker is not drained.
    with connect(url, secure.security) as good:
        assert list(good.do_action(fl.Action("health", b"")))[0].body.to_pybytes() == b"ok"
        info = protocol_pb2.WorkerInfo.FromString(list(good.do_action(fl.Action("info", b"")))[0].body.to_pybytes())
        assert info.running_tasks == 0 and not info.draining


def _exchange(client: fl.FlightClient, descriptor: fl.FlightDescriptor) -> None:
    writer, reader = client.do_exchange(descriptor)
    try:
        reader.read_chunk()
    finally:
        try:
            writer.close()
        except pa.ArrowException:
            pass


def test_a_plaintext_client_to_a_tls_worker_gets_a_clear_error(secure: flight.LocalCluster) -> None:
    plain = secure.urls[0].replace("grpc+tls://", "grpc://")
    with fl.connect(plain) as client:
        with pytest.raises(fl.FlightUnavailableError):
            list(client.do_action(fl.Action("health", b""), options=fl.FlightCallOptions(timeout=5)))
    with pytest.raises(flight.WorkerUnavailableError, match="unavailable"):
        flight.DistributedExec(flight.from_arrow(_table(4, 2)), [plain], connect_timeout=3).to_table()


class _Numbers(flight.WorkUnitFeedProvider):
    """Two feed partitions of numbers as unit bodies: two leaf tasks, so rows cross workers."""

    def __init__(self, n: int) -> None:
        self.n = n

    def partitions(self) -> int:
        return 2

    def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[bytes]:
        for i in range(partition, self.n, 2):
            yield str(i).encode()


def _numbers(n: int, keys: int, value: str) -> flight.Query:
    v = col("unit").cast(pa.string()).cast(pa.int64())
    return flight.units(_Numbers(n)).select(k=v - (v / keys) * keys, **{value: v})


def test_queries_with_a_shuffle_and_a_map_stage_run_on_a_secured_cluster(secure: flight.LocalCluster) -> None:
    left, right = _table(2_000, 50), _table(500, 50).rename_columns(["k", "w"])
    q = _numbers(2_000, 50, "v").join(_numbers(500, 50, "w"), on="k").aggregate(["k"], n=agg.count_all(), s=agg.sum("w"))
    ex = flight.DistributedExec(q, secure.resolver(), security=secure.security, broadcast_bytes=0)
    assert len(ex.stages) > 1
    got = ex.to_table().sort_by("k")
    joined = left.join(right, "k")
    expected = joined.group_by("k").aggregate([([], "count_all"), ("w", "sum")]).sort_by("k")
    assert got.column("n").to_pylist() == expected.column("count_all").to_pylist()
    assert got.column("s").to_pylist() == expected.column("w_sum").to_pylist()
    assert ex.metrics is not None and any(t.bytes_in > t.bytes_in_local for t in ex.metrics.tasks)  # worker to worker, over TLS

    stage = flight.map_input(left.schema).filter(col("k") < 10)
    batches = left.to_batches(max_chunksize=300)
    out = pa.Table.from_batches(list(flight.map_batches(stage, batches, secure.urls[1], security=secure.security)))
    assert out.num_rows == pc.sum(pc.less(left.column("k"), 10)).as_py()
    with pytest.raises(flight.UnauthenticatedError):
        list(flight.map_batches(stage, batches, secure.urls[1], security=_no_token(secure)))


def test_mutual_tls_refuses_a_client_without_a_certificate(tmp_path: Path) -> None:
    with flight.LocalCluster(1, mtls=True) as c:
        ok = flight.DistributedExec(flight.from_arrow(_table(6, 3)), c.resolver(), security=c.security).to_table()
        assert ok.num_rows == 6
        without_cert = Security(token=c.security.token, tls_root_certs=c.security.tls_root_certs)
        with connect(c.urls[0], without_cert) as client:
            with pytest.raises(fl.FlightUnavailableError):
                list(client.do_action(fl.Action("health", b""), options=fl.FlightCallOptions(timeout=5)))


def test_public_health_and_token_rotation(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("# rotating\nold-token-aaaaaaaaaaaa\nnew-token-bbbbbbbbbbbb\n")
    args = ["--auth-token-file", str(tokens), "--public-health"]
    with flight.LocalCluster(1, worker_args=args) as c:
        with fl.connect(c.urls[0]) as anonymous:
            assert list(anonymous.do_action(fl.Action("health", b"")))[0].body.to_pybytes() == b"ok"
            with pytest.raises(fl.FlightUnauthenticatedError) as raised:
                list(anonymous.do_action(fl.Action("drain", b"")))
            assert error_info_of(raised.value).code == protocol_pb2.ERROR_CODE_UNAUTHENTICATED  # type: ignore[union-attr]
        for token in ("old-token-aaaaaaaaaaaa", "new-token-bbbbbbbbbbbb"):
            got = flight.DistributedExec(flight.from_arrow(_table(5, 5)), c.resolver(), security=Security(token=token)).to_table()
            assert got.num_rows == 5


def test_drain_can_be_undone_with_resume(cluster: flight.LocalCluster) -> None:
    url = cluster.urls[1]
    with fl.connect(url) as client:
        list(client.do_action(fl.Action("drain", b"")))
        wait_until(lambda: _health(client) is False, 5.0, "the worker to drain")
        list(client.do_action(fl.Action("resume", b"")))
        assert _health(client) is True
    assert flight.DistributedExec(flight.from_arrow(_table(3, 3)), [url]).to_table().num_rows == 3


def _health(client: fl.FlightClient) -> bool:
    try:
        return list(client.do_action(fl.Action("health", b"")))[0].body.to_pybytes() == b"ok"
    except fl.FlightUnavailableError:
        return False


def test_another_querys_ticket_and_cancel_are_refused_without_its_secret(cluster: flight.LocalCluster) -> None:
    ex = flight.DistributedExec(waiting_query(), [cluster.urls[0]])
    reader = ex.execute()
    try:
        wait_until(lambda: running_tasks([cluster.urls[0]]) >= 1, 10.0, "the victim's task")
        assert ex.query_id is not None and ex.query_secret is not None
        key = protocol_pb2.StageKey(query_id=ex.query_id, stage_id=0, task_number=0)
        with fl.connect(cluster.urls[0]) as attacker:
            for guess in (b"\x00" * 16, ex.query_secret[:-1] + bytes([ex.query_secret[-1] ^ 1])):
                ticket = protocol_pb2.Ticket(stage_key=key, partition_start=0, partition_end=1, query_secret=guess)
                with pytest.raises(fl.FlightUnauthorizedError) as raised:
                    attacker.do_get(fl.Ticket(ticket.SerializeToString())).read_all()
                assert error_info_of(raised.value).code == protocol_pb2.ERROR_CODE_PERMISSION_DENIED  # type: ignore[union-attr]
                body = protocol_pb2.CancelRequest(query_id=ex.query_id, query_secret=guess).SerializeToString()
                (res,) = list(attacker.do_action(fl.Action("cancel", body)))
                assert protocol_pb2.CancelResult.FromString(res.body.to_pybytes()).cancelled_tasks == 0
        assert running_tasks([cluster.urls[0]]) >= 1  # the victim still runs
    finally:
        del reader
        gc.collect()
    wait_until(lambda: running_tasks(cluster.urls) == 0, 10.0, "the victim's tasks to be freed")


def test_an_unauthenticated_cancel_leaves_the_query_running(secure: flight.LocalCluster) -> None:
    ex = flight.DistributedExec(waiting_query(), secure.urls[:1], security=secure.security)
    reader = ex.execute()
    try:
        with connect(secure.urls[0], secure.security) as good:
            def running() -> int:
                body = list(good.do_action(fl.Action("info", b"")))[0].body.to_pybytes()
                return protocol_pb2.WorkerInfo.FromString(body).running_tasks

            wait_until(lambda: running() == 1, 10.0, "the query's task")
            body = protocol_pb2.CancelRequest(query_id=ex.query_id, query_secret=ex.query_secret).SerializeToString()
            with connect(secure.urls[0], _no_token(secure)) as anonymous:
                _unauthenticated(_attempt(lambda: list(anonymous.do_action(fl.Action("cancel", body)))))
            assert running() == 1  # not cancelled
    finally:
        del reader
        gc.collect()


def test_a_path_outside_the_data_roots_is_permission_denied(cluster: flight.LocalCluster) -> None:
    with tempfile.TemporaryDirectory() as elsewhere:  # not under pytest's base temp, the test workers' root
        outside = Path(elsewhere) / "elsewhere.parquet"
        pq.write_table(pa.table({"a": [1, 2]}), outside)
        with pytest.raises(flight.PermissionDeniedError, match="path refused"):
            flight.DistributedExec(flight.read_parquet([str(outside)]), cluster.resolver()).to_table()


# ------------------------------------------------------------ named tokens and identities (issue 24)


def _token_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tokens"
    path.write_text(text)
    return path


def test_a_token_file_names_its_tokens_and_keeps_bare_tokens_working(tmp_path: Path) -> None:
    from flight.worker.auth import read_tokens

    path = _token_file(tmp_path, "# team tokens\nalice:tok-aaaaaaaaaaaa\n\nbare-token-bbbbbbbbbbbb\nbob: tok-cccccccccccc \nweird token:with colon\n")
    tokens = read_tokens(path)
    assert [t.name for t in tokens] == ["alice", "token-2", "bob", "token-4"]  # bare ones by position, nothing of the token
    assert [t.secret for t in tokens] == [b"tok-aaaaaaaaaaaa", b"bare-token-bbbbbbbbbbbb", b"tok-cccccccccccc", b"weird token:with colon"]
    assert "tok-" not in repr(tokens) and "alice" in repr(tokens)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("alice:one-secret\nalice:other-secret\n", "line 2: the name 'alice' is already used on line 1"),
        ("first-secret\ntoken-1:second-secret\n", "the name 'token-1' is already used on line 1"),
        ("alice:same-secret\nbob:same-secret\n", "line 2: the same token is listed on line 1"),
        ("anonymous:a-secret\n", "reserved"),
        ("alice:\n", "the token named 'alice' is empty"),
        ("# nothing\n\n", "lists no token"),
    ],
)
def test_a_token_file_with_clashing_or_empty_entries_is_refused_clearly(tmp_path: Path, text: str, message: str) -> None:
    from flight.worker.auth import read_tokens

    with pytest.raises(ValueError, match=message) as raised:
        read_tokens(_token_file(tmp_path, text))
    assert "-secret" not in str(raised.value)  # no token in the message


def test_the_worker_refuses_a_token_file_with_a_duplicate_name_at_start(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = _token_file(tmp_path, "alice:secret-one-aaaaaaaa\nalice:secret-two-bbbbbbbb\n")
    proc = subprocess.run(
        [sys.executable, "-m", "flight.worker", "--port", "0", "--auth-token-file", str(path)],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert "the name 'alice' is already used on line 1" in proc.stderr
    assert "secret-" not in proc.stderr


def test_named_tokens_and_the_whole_line_authenticate_as_their_name(tmp_path: Path) -> None:
    path = _token_file(tmp_path, "alice:alice-secret-aaaaaaaa\nbare-secret-bbbbbbbbbbbb\n")
    with flight.LocalCluster(1, worker_args=["--auth-token-file", str(path)], log_level="INFO") as c:
        for token, name in (("alice-secret-aaaaaaaa", "alice"), ("alice:alice-secret-aaaaaaaa", "alice"), ("bare-secret-bbbbbbbbbbbb", "token-2")):
            sec = Security(token=token)
            ex = flight.DistributedExec(waiting_query(), c.urls, security=sec)
            reader = ex.execute()
            try:
                wait_until(lambda: _running_of(c.urls[0], sec, name) == 1, 10.0, f"a task of {name}")
            finally:
                del reader
                gc.collect()
            wait_until(lambda: _running_of(c.urls[0], sec, name) == 0, 10.0, f"{name}'s task to be freed")
        with pytest.raises(flight.UnauthenticatedError):
            flight.DistributedExec(flight.from_arrow(_table(3, 3)), c.urls, security=Security(token="alice")).to_table()


def _running_of(url: str, security: Security, name: str) -> int:
    with connect(url, security) as client:
        body = list(client.do_action(fl.Action("info", b"")))[0].body.to_pybytes()
    info = protocol_pb2.WorkerInfo.FromString(body)
    return sum(c.running_tasks for c in info.clients if c.identity == name)


def test_a_client_certificate_names_the_caller_under_mutual_tls_without_tokens() -> None:
    import trustme

    from flight.worker.auth import ServerSecurity
    from flight.worker.server import WorkerServer

    ca = trustme.CA()
    server_cert, client_cert = ca.issue_cert("127.0.0.1"), ca.issue_cert("analytics-team")
    pem = ca.cert_pem.bytes()
    chain = b"".join(b.bytes() for b in server_cert.cert_chain_pems)
    sec = ServerSecurity(tls_cert=chain, tls_key=server_cert.private_key_pem.bytes(), client_ca=pem)
    mine = Security(
        tls_root_certs=pem,
        cert_chain=b"".join(b.bytes() for b in client_cert.cert_chain_pems),
        private_key=client_cert.private_key_pem.bytes(),
    )
    with WorkerServer(security=sec) as server:
        assert server.admission.capacity.client_cap == 48  # callers have identities: 3/4 of --max-tasks
        ex = flight.DistributedExec(waiting_query(), [server.url], security=mine)
        reader = ex.execute()
        try:
            wait_until(lambda: _running_of(server.url, mine, "cert:analytics-team") == 1, 10.0, "the task of the certificate's identity")
        finally:
            del reader
            gc.collect()
        wait_until(lambda: len(server.registry) == 0, 15.0, "the task to be freed")


def test_a_client_token_file_skips_the_comments_a_worker_skips(tmp_path: Path) -> None:
    # The same file serves both sides: a leading comment must not be presented as the token.
    path = _token_file(tmp_path, "# the team's token\n\n  alice:tok-aaaaaaaaaaaa\n")
    assert flight.Security.from_files(token_file=path).token == "alice:tok-aaaaaaaaaaaa"
