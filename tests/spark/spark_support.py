"""The SparkSession of the Spark tests: one JVM per module, local[2] unless said, loopback only, no UI."""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@contextmanager
def spark_session(tmp: Path, master: str = "local[2]") -> Iterator[SparkSession]:
    """Start a local SparkSession (``local[2]``: no task retries) whose Python workers run this
    interpreter; stop it on exit."""
    pyspark = pytest.importorskip("pyspark", reason="the Spark tests need the spark extra: pip install -e '.[dev,spark]'")
    del pyspark
    from pyspark.sql import SparkSession

    with pytest.MonkeyPatch.context() as mp:
        # Spark's Python workers (and the data source planner) must import flight-exec: this venv.
        mp.setenv("PYSPARK_PYTHON", sys.executable)
        mp.setenv("PYSPARK_DRIVER_PYTHON", sys.executable)
        spark = (
            SparkSession.builder.master(master)
            .appName("flight-exec tests")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.default.parallelism", "2")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.sql.warehouse.dir", str(tmp / "warehouse"))
            .config("spark.local.dir", str(tmp / "local"))
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        try:
            yield spark
        finally:
            spark.stop()


def dead_url() -> str:
    """A loopback URL where nothing listens (a port that was just free)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"grpc://127.0.0.1:{port}"
