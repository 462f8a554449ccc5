"""Where a unit's file lives: a local path, or a URI opened through ``pyarrow.fs`` (workers and coordinator).

Work units may name ``s3://bucket/key``, ``gs://bucket/key``, ``abfs://container@account/key``,
``hdfs://host:port/path`` or ``file:///path`` as well as plain absolute paths, for every
built-in reader and, through ``ReaderContext.open_input_file``, for extension readers.

Why ``pyarrow.fs``: one implementation of every store pyarrow already reads, with the
ranged reads and pre-buffering Parquet needs on object storage, and no second
dependency per store. (DuckDB reads only local files here: a URI's unit is read
by pyarrow and handed to the engine as Arrow.)

**Configuration is the worker's own**, never the plan's or a unit's: its environment
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``, ``AWS_REGION``, …
as pyarrow reads them), and ``flight-worker --fs-option KEY=VALUE`` (repeatable) or
``--fs-config FILE`` (a JSON object of the same keys), such as ``s3.endpoint_override``,
``s3.region``, ``s3.scheme``, ``s3.access_key``, ``gcs.anonymous``,
``abfs.account_name``, ``hdfs.user`` (``OPTIONS`` lists them all). A URI that carries
credentials (``user:secret@``) or options (``?endpoint_override=``) is refused: a
plan must not choose where a worker connects or as whom. One filesystem object per
store (scheme and bucket, container or host) is made on first use and kept.

**Errors name the object, never the configuration**: pyarrow's messages for a
store name the operation and an AWS error code; the built-in readers turn them
into fixed words (``describe``), and no message carries a key or secret.
"""

from __future__ import annotations

import json
import os
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from flight.errors import UnitReadError

__all__ = [
    "OPTIONS",
    "SCHEMES",
    "FileSystems",
    "Location",
    "configure_storage",
    "describe",
    "load_options",
    "open_input",
    "parse_location",
    "process_filesystems",
    "set_filesystems",
]

SCHEMES = ("s3", "gs", "gcs", "abfs", "abfss", "hdfs")
"""Schemes of object stores and remote filesystems (``file://`` is a local path)."""

_STR, _BOOL, _FLOAT, _INT = str, bool, float, int
OPTIONS: dict[str, dict[str, type]] = {
    "s3": {
        "endpoint_override": _STR, "scheme": _STR, "region": _STR, "access_key": _STR, "secret_key": _STR,
        "session_token": _STR, "role_arn": _STR, "anonymous": _BOOL, "connect_timeout": _FLOAT,
        "request_timeout": _FLOAT, "max_attempts": _INT, "force_virtual_addressing": _BOOL,
    },
    "gcs": {
        "anonymous": _BOOL, "endpoint_override": _STR, "scheme": _STR, "project_id": _STR,
        "retry_time_limit": _FLOAT,
    },
    "abfs": {
        "account_name": _STR, "account_key": _STR, "blob_storage_authority": _STR, "blob_storage_scheme": _STR,
        "dfs_storage_authority": _STR, "dfs_storage_scheme": _STR,
    },
    "hdfs": {"user": _STR, "kerb_ticket": _STR, "buffer_size": _INT},
}
"""What ``--fs-option`` accepts: ``<store>.<name>``, and the type its value is read as."""

_SECRET_NAMES = ("secret_key", "session_token", "account_key", "access_key", "kerb_ticket")
_ALIASES = {"gs": "gcs", "abfss": "abfs"}


def load_options(pairs: list[str], config: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """``--fs-option KEY=VALUE`` pairs over ``--fs-config FILE``'s; ``ValueError`` names a bad one."""
    options: dict[str, str] = {}
    if config is not None:
        try:
            loaded = json.loads(Path(config).read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"--fs-config {config}: not a readable JSON object ({type(exc).__name__})") from None
        if not isinstance(loaded, dict):
            raise ValueError(f"--fs-config {config}: not a JSON object")
        options.update({str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in loaded.items()})
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"--fs-option {key!r}: expected KEY=VALUE")
        options[key.strip()] = value
    for key in options:
        _option(key)  # every key is known
    return options


def _option(key: str) -> tuple[str, str, type]:
    store, _, name = key.partition(".")
    store = _ALIASES.get(store, store)
    kinds = OPTIONS.get(store)
    if kinds is None or name not in kinds:
        known = ", ".join(f"{s}.{n}" for s, names in OPTIONS.items() for n in names)
        raise ValueError(f"unknown filesystem option {key!r}; known: {known}")
    return store, name, kinds[name]


def _value(key: str, text: str, kind: type) -> object:
    if kind is bool:
        if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise ValueError(f"filesystem option {key!r} must be true or false")
        return text.lower() in ("true", "1", "yes")
    if kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            raise ValueError(f"filesystem option {key!r} must be a number") from None
    return text


@dataclass(frozen=True)
class Location:
    """A file in a remote store, as a unit named it (normalized)."""

    scheme: str
    """``s3``, ``gcs``, ``abfs`` or ``hdfs`` (aliases folded)."""
    authority: str
    """The bucket (``s3``, ``gcs``), ``container@account`` (``abfs``) or ``host:port`` (``hdfs``)."""
    key: str
    """The object's key or path inside it, without a leading ``/``."""

    def __str__(self) -> str:
        return f"{self.scheme}://{self.authority}/{self.key}"

    @property
    def store(self) -> tuple[str, str]:
        """What one filesystem object serves: the scheme and the bucket, account or host."""
        if self.scheme in ("s3", "gcs"):
            return self.scheme, ""
        if self.scheme == "abfs":
            return self.scheme, self.authority.partition("@")[2]
        return self.scheme, self.authority

    @property
    def fs_path(self) -> str:
        """The path the store's ``pyarrow.fs`` filesystem knows the file by."""
        if self.scheme == "abfs":
            return f"{self.authority.partition('@')[0]}/{self.key}"
        if self.scheme == "hdfs":
            return f"/{self.key}"
        return f"{self.authority}/{self.key}"

    def within(self, root: Location) -> bool:
        """Whether this file lies under ``root`` (same store and bucket; key under the root's, by components)."""
        if (self.scheme, self.authority) != (root.scheme, root.authority):
            return False
        if not root.key:
            return True
        return self.key == root.key or self.key.startswith(root.key + "/")


def parse_location(text: str) -> Location | str:
    """A remote file's ``Location``, or the local path ``text`` names (``file://`` URIs become paths).

    ``UnitReadError`` for a URI this worker will not open: control characters in it (an
    SDK may cut a path at a NUL and then resolve ``..``), credentials or options in it, an
    unknown scheme, no bucket, or ``.``/``..`` segments in its key. Errors quote the URI
    without its userinfo, query or fragment: those may hold secrets.
    """
    if "://" not in text:
        return text
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        raise UnitReadError("a URI may not contain control characters")
    try:
        parts = urllib.parse.urlsplit(text)
        authority = parts.netloc
    except ValueError:
        raise UnitReadError(f"a {text.partition(':')[0][:20]!r} URI that does not parse") from None
    if "@" in authority and (":" in authority.rpartition("@")[0] or parts.scheme.lower() not in ("abfs", "abfss")):
        raise UnitReadError("a URI may not carry credentials; the worker's configuration sets them")
    shown = _short(urllib.parse.urlunsplit((parts.scheme, authority, parts.path, "", "")))
    if parts.query or parts.fragment:
        raise UnitReadError(f"{shown!r}: a URI may not carry options; the worker's configuration sets them")
    scheme = parts.scheme.lower()
    if scheme == "file":
        if authority not in ("", "localhost"):
            raise UnitReadError(f"{shown!r}: a file:// URI names no host")
        return urllib.parse.unquote(parts.path)
    scheme = _ALIASES.get(scheme, scheme)
    if scheme not in OPTIONS:
        raise UnitReadError(f"{shown!r}: the scheme {parts.scheme[:20]!r} is not one this worker reads ({', '.join(SCHEMES)}, file)")
    if not authority:
        raise UnitReadError(f"{shown!r}: the URI names no bucket or host")
    segments = [s for s in parts.path.split("/") if s != ""]
    if any(s in (".", "..") for s in segments):
        raise UnitReadError(f"{shown!r}: '.' and '..' are not allowed in a URI's path")
    return Location(scheme, authority, "/".join(segments))


def _short(text: str) -> str:
    return text if len(text) <= 200 else text[:200] + "…"


class FileSystems:
    """A process's ``pyarrow.fs`` filesystems, one per store, made on first use from its options."""

    def __init__(self, options: Mapping[str, str] | None = None) -> None:
        self._kwargs: dict[str, dict[str, object]] = {}
        for key, text in (options or {}).items():
            store, name, kind = _option(key)
            self._kwargs.setdefault(store, {})[name] = _value(key, text, kind)
        self._made: dict[tuple[str, str], pafs.FileSystem] = {}
        self._lock = threading.Lock()

    def describe(self) -> str:
        """The options set, secrets masked (for a worker's start-up log line)."""
        shown = [
            f"{store}.{name}={'***' if name in _SECRET_NAMES else value}"
            for store, names in sorted(self._kwargs.items())
            for name, value in sorted(names.items())
        ]
        return ", ".join(shown) or "the environment's defaults"

    def filesystem(self, location: Location) -> pafs.FileSystem:
        key = location.store
        with self._lock:
            made = self._made.get(key)
            if made is None:
                made = self._made[key] = self._make(location)
            return made

    def _make(self, location: Location) -> pafs.FileSystem:
        kw = dict(self._kwargs.get(location.scheme, {}))
        try:
            if location.scheme == "s3":
                attempts = int(kw.pop("max_attempts", 3))  # type: ignore[call-overload]
                kw.setdefault("region", os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1")
                return pafs.S3FileSystem(retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=attempts), **kw)  # type: ignore[arg-type]
            if location.scheme == "gcs":
                return pafs.GcsFileSystem(**kw)  # type: ignore[arg-type]
            if location.scheme == "abfs":
                kw.setdefault("account_name", location.authority.partition("@")[2].split(".")[0])
                return pafs.AzureFileSystem(**kw)  # type: ignore[arg-type]
            host, _, port = location.authority.partition(":")
            return pafs.HadoopFileSystem(host, int(port or 8020), **kw)  # type: ignore[arg-type]
        except (OSError, pa.ArrowException, ValueError, TypeError) as exc:
            raise UnitReadError(f"cannot reach the {location.scheme} store of {str(location)!r}: {describe(exc)}") from None

    def open_input_file(self, location: Location) -> pa.NativeFile:
        """A random-access file (Parquet, IPC); errors as ``describe`` words, naming the object."""
        fs = self.filesystem(location)
        try:
            return fs.open_input_file(location.fs_path)
        except (OSError, pa.ArrowException) as exc:
            raise UnitReadError(f"cannot open {str(location)!r}: {describe(exc)}{self._no_credentials(location, exc)}") from None

    def open_input_stream(self, location: Location) -> pa.NativeFile:
        """A sequential stream (CSV)."""
        fs = self.filesystem(location)
        try:
            return fs.open_input_stream(location.fs_path)
        except (OSError, pa.ArrowException) as exc:
            raise UnitReadError(f"cannot open {str(location)!r}: {describe(exc)}{self._no_credentials(location, exc)}") from None

    def _no_credentials(self, location: Location, exc: BaseException) -> str:
        """A hint when an S3 request failed (not for a missing object) and this process has no credentials
        in sight: its requests went out unsigned. (pyarrow's default chain may still find some: a hint.)"""
        if location.scheme != "s3" or isinstance(exc, FileNotFoundError):
            return ""
        kw = self._kwargs.get("s3", {})
        if kw.get("access_key") or kw.get("anonymous") or kw.get("role_arn"):
            return ""
        if any(os.environ.get(v) for v in _AWS_CREDENTIAL_SOURCES) or Path("~/.aws/credentials").expanduser().exists():
            return ""
        return " (this worker has no S3 credentials: set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY in its environment, or --fs-config)"

    def listing(self, prefix: Location, page_size: int = 1000) -> Iterator[list[tuple[Location, int]]]:
        """The files under ``prefix`` (with their sizes), a page at a time, as the store gives them.

        S3 with ``boto3`` installed: ``ListObjectsV2`` pages of ``page_size`` keys, each
        yielded as it arrives. Otherwise pyarrow lists the whole of one directory level at
        a time (it offers no paging), which still streams a partitioned layout.
        """
        if prefix.scheme == "s3" and _has_boto3():
            yield from self._s3_pages(prefix, page_size)
            return
        fs = self.filesystem(prefix)
        pending = [prefix]
        while pending:
            level = pending.pop(0)
            try:
                infos = fs.get_file_info(pafs.FileSelector(level.fs_path, allow_not_found=True))
            except (OSError, pa.ArrowException) as exc:
                raise UnitReadError(f"cannot list {str(level)!r}: {describe(exc)}") from None
            page = []
            for info in sorted(infos, key=lambda i: i.path):
                child = Location(prefix.scheme, prefix.authority, _key_of(prefix, info.path))
                if info.type == pafs.FileType.Directory:
                    pending.append(child)
                elif info.type == pafs.FileType.File:
                    page.append((child, int(info.size or 0)))
            if page:
                yield page

    def _s3_pages(self, prefix: Location, page_size: int) -> Iterator[list[tuple[Location, int]]]:
        import boto3  # the s3 extra: page-by-page listing
        import botocore.exceptions

        kw = self._kwargs.get("s3", {})
        endpoint = kw.get("endpoint_override")
        if endpoint and "://" not in str(endpoint):
            endpoint = f"{kw.get('scheme', 'https')}://{endpoint}"
        client = boto3.client(
            "s3",
            endpoint_url=endpoint or None,
            region_name=str(kw.get("region") or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"),
            aws_access_key_id=kw.get("access_key"),
            aws_secret_access_key=kw.get("secret_key"),
            aws_session_token=kw.get("session_token"),
        )
        key = prefix.key + "/" if prefix.key else ""
        try:
            pages = client.get_paginator("list_objects_v2").paginate(
                Bucket=prefix.authority, Prefix=key, PaginationConfig={"PageSize": page_size}
            )
            for page in pages:
                found = [
                    (Location("s3", prefix.authority, obj["Key"]), int(obj["Size"]))
                    for obj in page.get("Contents", [])
                    if not obj["Key"].endswith("/")
                ]
                if found:
                    yield found
        except botocore.exceptions.ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            words = {"NoSuchBucket": "no such bucket", "AccessDenied": "access denied: check the credentials for this store"}
            raise UnitReadError(f"cannot list {str(prefix)!r}: {words.get(code, 'the store refused the listing')}") from None
        except botocore.exceptions.BotoCoreError:
            raise UnitReadError(f"cannot list {str(prefix)!r}: the store did not answer: check the endpoint for it") from None

    def info(self, location: Location) -> Any:
        """The object's ``FileInfo`` (type ``NotFound`` when there is none)."""
        try:
            return self.filesystem(location).get_file_info(location.fs_path)
        except (OSError, pa.ArrowException) as exc:
            raise UnitReadError(f"cannot look at {str(location)!r}: {describe(exc)}") from None


_AWS_CREDENTIAL_SOURCES = (
    "AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
)
"""Where AWS's default credential chain looks, besides ``~/.aws/credentials`` and instance metadata."""


def _key_of(prefix: Location, fs_path: str) -> str:
    """The key of a path ``pyarrow.fs`` listed under ``prefix``'s store."""
    head = prefix.fs_path[: len(prefix.fs_path) - len(prefix.key)].rstrip("/")
    return fs_path[len(head):].lstrip("/") if fs_path.startswith(head) else fs_path.lstrip("/")


def _has_boto3() -> bool:
    try:
        import boto3  # noqa: F401
    except ImportError:
        return False
    return True


def describe(exc: BaseException) -> str:
    """A store's failure in fixed words: pyarrow's text names the operation and an AWS error code, which
    is all that is read from it (matching on it is the only way: every failure is a plain ``OSError``)."""
    if isinstance(exc, FileNotFoundError):
        return "no such object (or no such bucket)"
    if isinstance(exc, PermissionError):
        return "access denied"
    text = str(exc)
    for codes, words in (
        (("ACCESS_DENIED", "SIGNATURE_DOES_NOT_MATCH", "INVALID_ACCESS_KEY_ID", "EXPIRED_TOKEN", "Forbidden"),
         "access denied: check the worker's credentials for this store"),
        (("NO_SUCH_BUCKET", "NoSuchBucket"), "no such bucket"),
        (("NO_SUCH_KEY", "NoSuchKey"), "no such object"),
        (("NETWORK_CONNECTION", "curlCode", "Could not connect", "Connection refused"),
         "the store did not answer: check the worker's endpoint for it"),
    ):
        if any(c in text for c in codes):
            return words
    if isinstance(exc, pa.ArrowInvalid):
        return "the store refused the request as invalid"
    return "an I/O error from the store"


_WORKER = FileSystems()
_WORKER_LOCK = threading.Lock()


def set_filesystems(filesystems: FileSystems) -> None:
    """This process's filesystems: a worker's (``--fs-option``) for its readers; a coordinator's
    (``flight.configure_storage``) for listing and reading footers."""
    global _WORKER
    with _WORKER_LOCK:
        _WORKER = filesystems


def process_filesystems() -> FileSystems:
    with _WORKER_LOCK:
        return _WORKER


def open_input(path: str) -> pa.NativeFile:
    """A file this process reads itself (a coordinator reading a schema or a footer): a local path,
    or a URI through ``process_filesystems()``. ``UnitReadError`` or ``OSError`` when it cannot."""
    where = parse_location(path)
    if isinstance(where, Location):
        return process_filesystems().open_input_file(where)
    return pa.memory_map(where)


def configure_storage(options: Mapping[str, str]) -> None:
    """How this process reaches object stores: the ``--fs-option`` keys (``OPTIONS``), over its environment.

    On the coordinator, for listing prefixes and reading the footers planning needs; the
    workers have their own configuration (``flight-worker --fs-option``, ``LocalCluster(fs_options=)``).
    Nothing set here is sent to a worker.
    """
    set_filesystems(FileSystems(options))
