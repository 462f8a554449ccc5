"""Helpers of the Spark tests (the session's SparkSession is ``spark`` in tests/conftest.py, made by ``support.spark_session``)."""

from __future__ import annotations

import socket


def dead_url() -> str:
    """A loopback URL where nothing listens (a port that was just free)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"grpc://127.0.0.1:{port}"
