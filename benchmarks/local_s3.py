"""A real S3-compatible server on loopback, for the object-storage tests and benchmarks.

``moto``'s standalone server (``ThreadedMotoServer``) runs in this process on
127.0.0.1, on a free port. Workers reach it as they would a real store: through
their own configuration (``LocalS3.fs_options`` → ``--fs-option``, credentials in
``LocalS3.env``), never through a plan. Every server in one process shares moto's
state: use a bucket name of your own.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

__all__ = ["LocalS3", "local_s3"]

ACCESS_KEY = "flight-test-access"
SECRET_KEY = "flight-test-secret-never-shown"  # tests check it appears in no plan, unit, error or log


@dataclass(frozen=True)
class LocalS3:
    endpoint: str
    """``host:port`` of the server (plain HTTP)."""
    fs: pafs.S3FileSystem
    """A client of the server that may create buckets (for setting data up)."""

    @property
    def fs_options(self) -> dict[str, str]:
        """The workers' ``--fs-option``s (no secret among them)."""
        return {"s3.endpoint_override": self.endpoint, "s3.scheme": "http", "s3.region": "us-east-1"}

    @property
    def env(self) -> dict[str, str]:
        """The workers' credentials, as a real deployment would pass them: in the environment."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_EC2_METADATA_DISABLED": "true"}

    def bucket(self, name: str) -> str:
        self.fs.create_dir(name)
        return name

    def upload(self, files: Sequence[str | os.PathLike[str]], prefix: str) -> list[str]:
        """Copy local ``files`` under ``prefix`` (``bucket/dir``); their ``s3://`` URIs, in order."""
        keys = [f"{prefix.rstrip('/')}/{Path(f).name}" for f in files]

        def put(pair: tuple[str | os.PathLike[str], str]) -> None:
            pafs.copy_files(os.fspath(pair[0]), pair[1], destination_filesystem=self.fs)

        with ThreadPoolExecutor(8) as pool:  # one request each: in parallel
            list(pool.map(put, zip(files, keys, strict=True)))
        return [f"s3://{k}" for k in keys]


@contextmanager
def local_s3() -> Iterator[LocalS3]:
    """Start the server; stop it on exit."""
    from moto.server import ThreadedMotoServer  # a dev dependency

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one access-log line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"{host}:{port}"
        fs = pafs.S3FileSystem(
            endpoint_override=endpoint, scheme="http", region="us-east-1",
            access_key=ACCESS_KEY, secret_key=SECRET_KEY, allow_bucket_creation=True,
        )
        yield LocalS3(endpoint, fs)
    finally:
        server.stop()
