"""Where the workers are: ``WorkerResolver`` and its implementations.

The coordinator asks a resolver for worker URLs twice per query: the planner uses
``len(get_urls())`` as the most tasks a stage may get, and the URLs are bound to
tasks right before execution. Planning is synchronous, so ``get_urls()`` must
answer at once. A resolver whose list changes (a cloud API, DNS, Kubernetes, a
file that an operator rewrites) therefore never looks workers up on the caller's
thread: it refreshes in a background thread and serves the last good list, so a
flaky discovery service slows nothing down and never empties a working cluster.

Every URL goes through :func:`normalize_url` on the way in, so a typo fails where
it was made, naming the URL, instead of as a connection error in the middle of a
query.

A resolver built from plain data (:class:`StaticWorkerResolver`,
:class:`FileWorkerResolver`, ``flight.coordinator.dns.DnsWorkerResolver``) can
:meth:`~WorkerResolver.describe` itself as a small JSON-able dict, and
:func:`resolver_from_description` rebuilds an equivalent one in another process (e.g.
inside a Spark closure). A :class:`PollingWorkerResolver` runs arbitrary user code and
cannot be shipped that way. A kind defined in a module that imports this one (``dns``)
is made known with :func:`register_description_kind`.
"""

from __future__ import annotations

import abc
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Self
from urllib.parse import urlsplit

from flight.errors import ResolverError

__all__ = [
    "FileWorkerResolver",
    "PollingWorkerResolver",
    "StaticWorkerResolver",
    "WorkerResolver",
    "normalize_url",
    "register_description_kind",
    "resolver_from_description",
]

logger = logging.getLogger(__name__)

_SCHEMES = ("grpc", "grpc+tcp", "grpc+tls")
_JOIN_TIMEOUT = 5.0

# Description kinds rebuilt by modules that import this one, so this module cannot import them.
_KINDS: dict[str, Callable[[Mapping[str, object]], WorkerResolver]] = {}


def normalize_url(url: str) -> str:
    """Validate a worker URL and return its canonical form.

    Accepted: ``grpc://host:port``, ``grpc+tcp://host:port``, ``grpc+tls://host:port``
    and a bare ``host:port`` (which becomes ``grpc://host:port``). Surrounding
    whitespace is stripped; the scheme and host are lower-cased; an IPv6 address
    is written in brackets (``[::1]:8815``).

    Raises :class:`~flight.errors.ResolverError` naming the URL and what is wrong
    with it: a missing host or port, a port that is not an integer in 1..65535,
    an unsupported scheme, or a path, query or user name that a worker location
    cannot have.
    """
    if not isinstance(url, str):
        raise ResolverError(f"invalid worker URL {url!r}: expected a string such as 'grpc://host:8815', got {type(url).__name__}.")
    text = url.strip()

    def bad(what: str) -> ResolverError:
        return ResolverError(f"invalid worker URL {url!r}: {what}.")

    if not text:
        raise bad("it is empty; write it as grpc://host:port")
    if any(ch.isspace() for ch in text):
        raise bad("it contains whitespace")
    if "://" not in text:
        text = f"grpc://{text}"
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme not in _SCHEMES:
        raise bad(f"scheme {parts.scheme!r} is not supported; use grpc://, grpc+tcp:// or grpc+tls://")
    if "@" in parts.netloc:
        raise bad("a worker URL cannot carry a user name or password")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise bad("a worker URL is only scheme://host:port, without a path, query or fragment")
    host = parts.hostname
    if not host:
        if parts.netloc.count(":") > 1 and not parts.netloc.startswith("["):
            raise bad("write an IPv6 address in brackets, e.g. [::1]:8815")
        raise bad("the host is missing")
    try:
        port = parts.port
    except ValueError:
        raw = parts.netloc.rpartition(":")[2]
        raise bad(f"port {raw!r} is not an integer in 1..65535") from None
    if port is None:
        raise bad("the port is missing; write it as host:port")
    if not 1 <= port <= 65535:
        raise bad(f"port {port} is not an integer in 1..65535")
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"


def _normalize_all(urls: Sequence[str]) -> list[str]:
    """Normalize every URL, drop duplicates, keep the first occurrence's order."""
    if isinstance(urls, (str, bytes)):
        raise ResolverError(f"expected a list of worker URLs, got the single string {urls!r}; wrap it in a list.")
    return list(dict.fromkeys(normalize_url(u) for u in urls))


def _check_interval(interval: float) -> float:
    if isinstance(interval, bool) or not isinstance(interval, (int, float)):
        raise TypeError(f"interval must be a number of seconds, got {interval!r}")
    if not (math.isfinite(interval) and interval > 0):
        raise ValueError(f"interval must be a positive, finite number of seconds, got {interval!r}")
    return float(interval)


class WorkerResolver(abc.ABC):
    """Tells the coordinator which workers it may use.

    Planning uses ``len(get_urls())`` as the most tasks a stage may get; the URLs
    are bound to tasks right before execution, so a list that changed in between
    is picked up. An empty list is not an error here: the planner reports it.

    Resolvers are context managers; leaving the ``with`` block calls :meth:`close`.
    """

    @abc.abstractmethod
    def get_urls(self) -> list[str]:
        """Return the current worker URLs, normalized, without duplicates.

        Synchronous and immediate: an implementation whose list changes must
        refresh it elsewhere (a background thread) and never do I/O here. The
        caller owns the returned list.
        """

    def close(self) -> None:  # noqa: B027 - a no-op default is the point
        """Release background resources. Idempotent; the default does nothing."""

    def describe(self) -> dict[str, object]:
        """Return a small JSON-able dict from which :func:`resolver_from_description`
        rebuilds an equivalent resolver in another process."""
        raise ResolverError(
            f"{type(self).__name__} cannot be described for another process. "
            "Pass the worker URLs (StaticWorkerResolver), a file of URLs (FileWorkerResolver) or a DNS name (DnsWorkerResolver) instead."
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class StaticWorkerResolver(WorkerResolver):
    """A fixed list of workers, normalized, in the given order, duplicates removed."""

    def __init__(self, urls: Sequence[str]) -> None:
        self._urls: tuple[str, ...] = tuple(_normalize_all(urls))

    def get_urls(self) -> list[str]:
        return list(self._urls)

    def describe(self) -> dict[str, object]:
        return {"kind": "static", "urls": list(self._urls)}

    def __repr__(self) -> str:
        return f"StaticWorkerResolver({list(self._urls)!r})"


class PollingWorkerResolver(WorkerResolver):
    """Serves the URLs returned by a user's ``fetch()``, refreshed in the background.

    ``fetch`` is your discovery (a cloud API, DNS, Kubernetes, ...). It is called
    once at construction, on the caller's thread: if it raises or returns a bad
    URL, construction fails with :class:`~flight.errors.ResolverError`. After that
    a daemon thread calls it every ``interval`` seconds. A fetch that raises or
    returns a bad URL is logged as a warning (once per distinct message until a
    fetch succeeds again) and the last good list keeps being served. An empty list
    is a valid answer and is served as such.

    ``last_error`` is the exception of the latest fetch, or ``None`` if it
    succeeded; ``last_refresh`` is the :func:`time.monotonic` time of the latest
    successful fetch. :meth:`close` stops the thread promptly; a resolver that is
    garbage-collected without being closed stops its thread too.
    """

    def __init__(self, fetch: Callable[[], Sequence[str]], interval: float = 5.0, *, name: str = "polling") -> None:
        self._fetch = fetch
        self._interval = _check_interval(interval)
        self._name = name
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._logged: set[str] = set()  # distinct failure messages logged since the last success
        self._last_error: BaseException | None = None
        try:
            first = _normalize_all(self._fetch())
        except Exception as exc:
            raise ResolverError(f"the {name} resolver found no usable worker list at start: {exc}") from exc
        self._urls: tuple[str, ...] = tuple(first)
        self._last_refresh = time.monotonic()
        # The thread holds only a weak reference, so a resolver that is dropped
        # without close() does not keep itself (and its thread) alive forever.
        self._thread = threading.Thread(
            target=_poll_loop,
            args=(weakref.ref(self), self._stop, self._interval),
            name=f"flight-resolver-{name}",
            daemon=True,
        )
        weakref.finalize(self, self._stop.set)
        self._thread.start()

    @property
    def name(self) -> str:
        return self._name

    @property
    def interval(self) -> float:
        return self._interval

    @property
    def last_error(self) -> BaseException | None:
        with self._lock:
            return self._last_error

    @property
    def last_refresh(self) -> float:
        with self._lock:
            return self._last_refresh

    def get_urls(self) -> list[str]:
        with self._lock:
            return list(self._urls)

    def close(self) -> None:
        """Stop the refresh thread and wait (a bounded time) for it to end.

        The last list stays available from :meth:`get_urls`. Idempotent.
        """
        self._stop.set()
        thread = self._thread
        if thread is threading.current_thread() or not thread.is_alive():
            return
        thread.join(_JOIN_TIMEOUT)
        if thread.is_alive():
            logger.warning(
                "%s resolver: the refresh thread is still inside fetch() after %.0f s; it will exit when fetch() returns",
                self._name,
                _JOIN_TIMEOUT,
            )

    def _poll_once(self) -> None:
        """Fetch once and record the outcome; runs on the refresh thread."""
        try:
            urls = _normalize_all(self._fetch())
        except Exception as exc:  # noqa: BLE001 - a user's fetch function: kept, reported, and the last good list served
            with self._lock:
                self._last_error = exc
                serving = len(self._urls)
            message = f"{type(exc).__name__}: {exc}"
            if message not in self._logged:
                self._logged.add(message)
                logger.warning(
                    "%s resolver: refresh failed, still serving the last good list of %d worker URL(s): %s",
                    self._name,
                    serving,
                    message,
                )
            return
        with self._lock:
            old = self._urls
            self._urls = tuple(urls)
            self._last_error = None
            self._last_refresh = time.monotonic()
        if self._logged:
            self._logged.clear()
            logger.info("%s resolver: refresh succeeded again", self._name)
        if old != self._urls:
            logger.info("%s resolver: worker list changed from %d to %d URL(s): %s", self._name, len(old), len(urls), urls)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self._name!r}, interval={self._interval}, urls={len(self._urls)})"


def _poll_loop(ref: weakref.ref[PollingWorkerResolver], stop: threading.Event, interval: float) -> None:
    while not stop.wait(interval):
        resolver = ref()
        if resolver is None:
            return
        resolver._poll_once()
        del resolver


class FileWorkerResolver(PollingWorkerResolver):
    """Worker URLs read from a text file that may be rewritten while running.

    One URL per line; blank lines and ``#`` comments (whole-line or trailing) are
    ignored. Every ``interval`` seconds the file is ``stat``-ed, and re-read only
    when its (mtime_ns, size, inode) changed. A missing or unreadable file, or one
    holding a bad URL, keeps the last good list (with a warning); at construction
    it raises :class:`~flight.errors.ResolverError` naming the path and, for a bad
    URL, the line. Replace the file atomically (write a temporary file, then
    rename it over) so a half-written file is never read.
    """

    def __init__(self, path: str | os.PathLike[str], interval: float = 1.0) -> None:
        self._path = os.path.abspath(os.fspath(path))
        self._file_lock = threading.Lock()
        self._seen: tuple[int, int, int] | None = None
        self._cached: list[str] | str = []  # the last parse: URLs, or why the file is bad
        super().__init__(self._read, interval, name="file")

    @property
    def path(self) -> str:
        return self._path

    def describe(self) -> dict[str, object]:
        return {"kind": "file", "path": self._path, "interval": self.interval}

    def __repr__(self) -> str:
        return f"FileWorkerResolver({self._path!r}, interval={self.interval})"

    def _read(self) -> list[str]:
        with self._file_lock:
            try:
                st = os.stat(self._path)
            except OSError as exc:
                self._seen = None
                raise ResolverError(f"cannot read the worker list {self._path}: {exc.strerror or exc}") from exc
            signature = (st.st_mtime_ns, st.st_size, st.st_ino)
            if signature != self._seen:
                self._cached = self._parse()
                self._seen = signature
            if isinstance(self._cached, str):
                raise ResolverError(self._cached)
            return list(self._cached)

    def _parse(self) -> list[str] | str:
        """Read and validate the file; what is wrong is returned (not raised) so it is cached."""
        try:
            with open(self._path, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            return f"cannot read the worker list {self._path}: {reason}"
        urls: list[str] = []
        for number, line in enumerate(lines, start=1):
            entry = line.split("#", 1)[0].strip()
            if not entry:
                continue
            try:
                urls.append(normalize_url(entry))
            except ResolverError as exc:
                return f"{self._path}, line {number}: {exc}"
        return list(dict.fromkeys(urls))


def register_description_kind(kind: str, build: Callable[[Mapping[str, object]], WorkerResolver]) -> None:
    """Let :func:`resolver_from_description` rebuild descriptions of ``kind`` with ``build``.

    For resolvers in modules that import this one (``flight.coordinator.dns``). ``import flight``
    imports them, so their kinds are known in every process that uses the package.
    """
    _KINDS[kind] = build


def resolver_from_description(d: Mapping[str, object]) -> WorkerResolver:
    """Rebuild a resolver from :meth:`WorkerResolver.describe`'s output.

    Raises :class:`~flight.errors.ResolverError` for an unknown kind or a
    malformed description.
    """
    if not isinstance(d, Mapping):
        raise ResolverError(f"a resolver description is a dict, got {type(d).__name__}.")
    kind = d.get("kind")
    if kind == "static":
        urls = d.get("urls")
        if not isinstance(urls, (list, tuple)) or not all(isinstance(u, str) for u in urls):
            raise ResolverError(f"a static resolver description needs 'urls', a list of strings; got {urls!r}.")
        return StaticWorkerResolver(urls)
    if kind == "file":
        path = d.get("path")
        interval = d.get("interval", 1.0)
        if not isinstance(path, str) or not path:
            raise ResolverError(f"a file resolver description needs 'path', a string; got {path!r}.")
        if isinstance(interval, bool) or not isinstance(interval, (int, float)):
            raise ResolverError(f"a file resolver description's 'interval' must be a number of seconds; got {interval!r}.")
        return FileWorkerResolver(path, interval=interval)
    build = _KINDS.get(kind) if isinstance(kind, str) else None
    if build is not None:
        return build(d)
    expected = ", ".join(repr(k) for k in ["static", "file", *sorted(_KINDS)])
    raise ResolverError(f"unknown resolver kind {kind!r}; expected one of {expected}.")
