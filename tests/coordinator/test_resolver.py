"""WorkerResolver: URL validation, static lists, background refresh, files, descriptions."""

from __future__ import annotations

import gc
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from flight.coordinator.resolver import (
    FileWorkerResolver,
    PollingWorkerResolver,
    StaticWorkerResolver,
    WorkerResolver,
    normalize_url,
    resolver_from_description,
)
from flight.errors import ResolverError

FAST = 0.02  # refresh interval used by the dynamic resolvers under test


def wait_until(condition: Callable[[], object], *, what: str, timeout: float = 3.0) -> None:
    """Poll ``condition`` every 10 ms until it is true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        pause.wait(0.01)


def thread_alive(name: str) -> bool:
    return any(t.name == f"flight-resolver-{name}" and t.is_alive() for t in threading.enumerate())


class Discovery:
    """A controllable ``fetch``: returns ``urls`` or raises ``error``, counting calls."""

    def __init__(self, urls: Sequence[str]) -> None:
        self.urls: Sequence[str] = urls
        self.error: Exception | None = None
        self.calls = 0

    def __call__(self) -> Sequence[str]:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return self.urls

    def wait_for_calls(self, n: int) -> None:
        target = self.calls + n
        wait_until(lambda: self.calls >= target, what=f"{n} more fetch calls")


def write(path: Path, text: str) -> None:
    """Replace ``path`` atomically, the way the FileWorkerResolver docs recommend."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


# --- normalize_url ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("grpc://worker-1:8815", "grpc://worker-1:8815"),
        ("grpc+tcp://10.0.0.5:50051", "grpc+tcp://10.0.0.5:50051"),
        ("grpc+tls://workers.example.com:443", "grpc+tls://workers.example.com:443"),
        ("localhost:8815", "grpc://localhost:8815"),
        ("  localhost:8815\n", "grpc://localhost:8815"),
        ("GRPC://Worker-1:8815/", "grpc://worker-1:8815"),
        ("[::1]:8815", "grpc://[::1]:8815"),
        ("grpc://h:1", "grpc://h:1"),
        ("grpc://h:65535", "grpc://h:65535"),
    ],
)
def test_normalize_url_accepts(url: str, expected: str) -> None:
    assert normalize_url(url) == expected


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("grpc://worker-1", "port is missing"),
        ("worker-1", "port is missing"),
        ("worker-1:", "port is missing"),
        ("grpc://worker-1:0", "1..65535"),
        ("grpc://worker-1:65536", "1..65535"),
        ("grpc://worker-1:http", "1..65535"),
        ("worker-1:-5", "1..65535"),
        ("http://worker-1:8815", "scheme 'http'"),
        ("grpc+unix://worker-1:8815", "scheme 'grpc+unix'"),
        ("grpc://:8815", "host is missing"),
        ("::1:8815", "brackets"),
        ("grpc://worker-1:8815/flight", "path"),
        ("grpc://user@worker-1:8815", "user name"),
        ("worker 1:8815", "whitespace"),
        ("", "empty"),
        ("   ", "empty"),
    ],
)
def test_normalize_url_rejects_naming_the_url(url: str, problem: str) -> None:
    with pytest.raises(ResolverError) as info:
        normalize_url(url)
    assert repr(url) in str(info.value)
    assert problem in str(info.value)


# --- StaticWorkerResolver ----------------------------------------------------------


def test_static_keeps_order_removes_duplicates_and_normalizes() -> None:
    resolver = StaticWorkerResolver(["b:2", "grpc://a:1", "grpc://b:2", " a:1 ", "grpc+tls://c:3"])
    assert resolver.get_urls() == ["grpc://b:2", "grpc://a:1", "grpc+tls://c:3"]
    assert isinstance(resolver, WorkerResolver)


def test_static_empty_list_is_allowed() -> None:
    with StaticWorkerResolver([]) as resolver:
        assert resolver.get_urls() == []


def test_static_bad_url_names_it() -> None:
    with pytest.raises(ResolverError, match=r"'http://a:1'"):
        StaticWorkerResolver(["grpc://ok:1", "http://a:1"])


def test_static_rejects_a_single_string() -> None:
    with pytest.raises(ResolverError, match="wrap it in a list"):
        StaticWorkerResolver("grpc://a:1")


def test_get_urls_returns_a_copy(tmp_path: Path) -> None:
    static = StaticWorkerResolver(["a:1"])
    static.get_urls().append("grpc://evil:1")
    assert static.get_urls() == ["grpc://a:1"]

    with PollingWorkerResolver(lambda: ["a:1"], FAST) as polling:
        polling.get_urls().clear()
        assert polling.get_urls() == ["grpc://a:1"]

    path = tmp_path / "workers.txt"
    write(path, "a:1\n")
    with FileWorkerResolver(path, FAST) as from_file:
        from_file.get_urls().clear()
        assert from_file.get_urls() == ["grpc://a:1"]


# --- PollingWorkerResolver ---------------------------------------------------------


def test_polling_picks_up_a_change() -> None:
    discovery = Discovery(["a:1"])
    with PollingWorkerResolver(discovery, FAST) as resolver:
        assert resolver.get_urls() == ["grpc://a:1"]
        assert discovery.calls == 1  # the first fetch ran at construction
        discovery.urls = ["a:1", "b:2", "a:1"]
        wait_until(lambda: resolver.get_urls() == ["grpc://a:1", "grpc://b:2"], what="the new list")


def test_polling_serves_last_good_list_when_fetch_raises(caplog: pytest.LogCaptureFixture) -> None:
    discovery = Discovery(["a:1", "b:2"])
    with PollingWorkerResolver(discovery, FAST, name="cloud") as resolver:
        good_refresh = resolver.last_refresh
        assert resolver.last_error is None
        with caplog.at_level(logging.WARNING, logger="flight.coordinator.resolver"):
            discovery.error = ConnectionError("discovery API down")
            discovery.wait_for_calls(5)
            assert resolver.get_urls() == ["grpc://a:1", "grpc://b:2"]
            assert isinstance(resolver.last_error, ConnectionError)
            assert resolver.last_refresh >= good_refresh
        warnings = [r for r in caplog.records if "discovery API down" in r.getMessage()]
        assert len(warnings) == 1, "a repeated failure is logged once, not every poll"
        assert "cloud" in warnings[0].getMessage()

        discovery.error = None
        discovery.urls = ["c:3"]
        wait_until(lambda: resolver.get_urls() == ["grpc://c:3"], what="recovery")
        wait_until(lambda: resolver.last_error is None, what="last_error cleared")
        assert resolver.last_refresh > good_refresh


def test_polling_keeps_last_good_list_when_fetch_returns_a_bad_url() -> None:
    discovery = Discovery(["a:1"])
    with PollingWorkerResolver(discovery, FAST) as resolver:
        discovery.urls = ["b:2", "http://nope:80"]
        wait_until(lambda: isinstance(resolver.last_error, ResolverError), what="the bad URL to be seen")
        assert "http://nope:80" in str(resolver.last_error)
        assert resolver.get_urls() == ["grpc://a:1"]


def test_polling_construction_failure_is_a_resolver_error() -> None:
    def broken() -> list[str]:
        raise TimeoutError("DNS timed out")

    with pytest.raises(ResolverError, match="DNS timed out") as info:
        PollingWorkerResolver(broken, FAST, name="dns")
    assert isinstance(info.value.__cause__, TimeoutError)
    assert "dns" in str(info.value)

    with pytest.raises(ResolverError, match="grpc://a"):
        PollingWorkerResolver(lambda: ["grpc://a"], FAST)


def test_polling_close_stops_the_thread_promptly() -> None:
    name = f"close-{uuid.uuid4().hex}"
    resolver = PollingWorkerResolver(lambda: ["a:1"], interval=60.0, name=name)
    assert thread_alive(name)
    started = time.monotonic()
    resolver.close()
    assert time.monotonic() - started < 1.0, "close() must not wait out the interval"
    assert not thread_alive(name)
    resolver.close()  # idempotent
    assert resolver.get_urls() == ["grpc://a:1"]


def test_polling_close_stops_fetching() -> None:
    discovery = Discovery(["a:1"])
    name = f"stop-{uuid.uuid4().hex}"
    with PollingWorkerResolver(discovery, FAST, name=name):
        discovery.wait_for_calls(2)
    assert not thread_alive(name), "close() joins the thread, so fetch is never called again"


def test_polling_thread_ends_when_resolver_is_dropped() -> None:
    name = f"dropped-{uuid.uuid4().hex}"
    resolver = PollingWorkerResolver(lambda: ["a:1"], interval=60.0, name=name)
    assert thread_alive(name)
    del resolver
    gc.collect()
    wait_until(lambda: not thread_alive(name), what="the orphaned thread to end")


@pytest.mark.parametrize("interval", [0, -1.0, float("nan"), float("inf")])
def test_polling_rejects_bad_interval(interval: float) -> None:
    with pytest.raises(ValueError, match="interval"):
        PollingWorkerResolver(lambda: [], interval)


# --- FileWorkerResolver ------------------------------------------------------------


def test_file_ignores_comments_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "workers.txt"
    write(path, "# the fleet\n\nworker-1:8815   # rack A\n  grpc+tls://worker-2:8815\n\n# worker-3:8815\nworker-1:8815\n")
    with FileWorkerResolver(path, FAST) as resolver:
        assert resolver.get_urls() == ["grpc://worker-1:8815", "grpc+tls://worker-2:8815"]


def test_file_picks_up_a_rewritten_file(tmp_path: Path) -> None:
    path = tmp_path / "workers.txt"
    write(path, "a:1\n")
    with FileWorkerResolver(path, FAST) as resolver:
        write(path, "a:1\nb:2\n")
        wait_until(lambda: resolver.get_urls() == ["grpc://a:1", "grpc://b:2"], what="the rewritten file")
        path.write_text("c:3\n", encoding="utf-8")  # rewritten in place, not renamed over
        wait_until(lambda: resolver.get_urls() == ["grpc://c:3"], what="the file rewritten in place")


def test_file_keeps_last_good_list_while_it_holds_a_bad_url(tmp_path: Path) -> None:
    path = tmp_path / "workers.txt"
    write(path, "a:1\n")
    with FileWorkerResolver(path, FAST) as resolver:
        write(path, "a:1\n# fine\nhttp://b:2\n")
        wait_until(lambda: isinstance(resolver.last_error, ResolverError), what="the bad line to be seen")
        message = str(resolver.last_error)
        assert str(path) in message and "line 3" in message and "http://b:2" in message
        assert resolver.get_urls() == ["grpc://a:1"]

        write(path, "b:2\n")
        wait_until(lambda: resolver.get_urls() == ["grpc://b:2"], what="the fixed file")
        wait_until(lambda: resolver.last_error is None, what="last_error cleared")


def test_file_keeps_last_good_list_while_it_is_deleted(tmp_path: Path) -> None:
    path = tmp_path / "workers.txt"
    write(path, "a:1\nb:2\n")
    with FileWorkerResolver(path, FAST) as resolver:
        path.unlink()
        wait_until(lambda: isinstance(resolver.last_error, ResolverError), what="the missing file to be seen")
        assert str(path) in str(resolver.last_error)
        assert resolver.get_urls() == ["grpc://a:1", "grpc://b:2"]

        write(path, "c:3\n")
        wait_until(lambda: resolver.get_urls() == ["grpc://c:3"], what="the file to come back")


def test_file_bad_at_construction_names_path_and_line(tmp_path: Path) -> None:
    path = tmp_path / "workers.txt"
    write(path, "# workers\na:1\nb\n")
    with pytest.raises(ResolverError) as info:
        FileWorkerResolver(path, FAST)
    message = str(info.value)
    assert str(path) in message
    assert "line 3" in message
    assert "'b'" in message and "port is missing" in message


def test_file_missing_at_construction_names_path(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.txt"
    with pytest.raises(ResolverError, match="nowhere.txt") as info:
        FileWorkerResolver(path, FAST)
    assert isinstance(info.value.__cause__, ResolverError)


def test_file_empty_is_an_empty_list(tmp_path: Path) -> None:
    path = tmp_path / "workers.txt"
    write(path, "# nothing yet\n")
    with FileWorkerResolver(path, FAST) as resolver:
        assert resolver.get_urls() == []
        write(path, "a:1\n")
        wait_until(lambda: resolver.get_urls() == ["grpc://a:1"], what="the first worker")


# --- describe / resolver_from_description ------------------------------------------


def test_static_description_round_trip() -> None:
    original = StaticWorkerResolver(["b:2", "grpc+tls://a:1"])
    description = json.loads(json.dumps(original.describe()))
    assert description == {"kind": "static", "urls": ["grpc://b:2", "grpc+tls://a:1"]}
    rebuilt = resolver_from_description(description)
    assert isinstance(rebuilt, StaticWorkerResolver)
    assert rebuilt.get_urls() == original.get_urls()


def test_file_description_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "workers.txt"
    write(path, "a:1\nb:2\n")
    monkeypatch.chdir(tmp_path)
    with FileWorkerResolver("workers.txt", FAST) as original:
        description = json.loads(json.dumps(original.describe()))
        assert description == {"kind": "file", "path": str(path), "interval": FAST}
        with resolver_from_description(description) as rebuilt:
            assert isinstance(rebuilt, FileWorkerResolver)
            assert rebuilt.get_urls() == original.get_urls() == ["grpc://a:1", "grpc://b:2"]


def test_polling_cannot_be_described() -> None:
    with PollingWorkerResolver(lambda: ["a:1"], FAST) as resolver:
        with pytest.raises(ResolverError, match="StaticWorkerResolver.*FileWorkerResolver"):
            resolver.describe()


@pytest.mark.parametrize(
    "description",
    [
        {"kind": "kubernetes", "namespace": "x"},
        {"urls": ["a:1"]},
        {"kind": "static", "urls": "grpc://a:1"},
        {"kind": "static", "urls": ["http://a:1"]},
        {"kind": "file"},
        {"kind": "file", "path": "/x", "interval": "1s"},
    ],
)
def test_bad_description_is_a_resolver_error(description: dict[str, object]) -> None:
    with pytest.raises(ResolverError):
        resolver_from_description(description)
