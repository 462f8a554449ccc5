"""The package's shape: public API, generated code freshness, a light import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import flight

ROOT = Path(__file__).resolve().parent.parent

EXPECTED_API = {
    "DefaultTaskEstimator", "DiscoverySample", "TaskEstimate", "TaskEstimator", "Unit",
    "DistributedExec", "DnsWorkerResolver", "ExecOptions", "Expr", "FeedContext", "FeedError", "FeedStats", "FileListProvider", "ListingProvider",
    "FileWorkerResolver", "FlightExecError", "InvalidTaskError", "LocalCluster", "PlanError",
    "PollingWorkerResolver", "PermissionDeniedError", "ProtocolError", "QueryTimeoutError", "Query", "QueryMetrics", "ReaderContext", "ResolverError",
    "RetryableError", "Security", "StaticWorkerResolver", "TaskCancelledError", "TaskFailedError", "TaskStats", "UnauthenticatedError", "UnitReadError",
    "VersionMismatchError", "WorkUnit", "WorkUnitFeed", "WorkUnitFeedProvider", "WorkerError", "WorkerOptions",
    "WorkerResolver", "WorkerBusyError", "WorkerUnavailableError", "__version__", "agg", "call", "coalesce", "col", "configure_storage", "file_unit",
    "from_arrow", "from_feed", "if_else", "lit", "map_batches", "map_input", "read_delta", "read_iceberg", "read_ipc", "read_parquet",
    "register_reader", "run_local", "units", "sql", "Catalog",
}


def test_public_api_is_exactly_what_is_exported() -> None:
    assert set(flight.__all__) == EXPECTED_API
    for name in flight.__all__:
        assert hasattr(flight, name), name


def test_generated_protobuf_code_is_fresh() -> None:
    """Editing a .proto without running scripts/gen_proto.py fails here."""
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_import_stays_light() -> None:
    """``import flight`` loads nothing heavy beyond what pyarrow and protobuf load themselves."""
    code = (
        "import sys; import pyarrow.acero, pyarrow.dataset, pyarrow.flight, pyarrow.parquet, google.protobuf; "
        "base = set(sys.modules); import flight; "
        "print(sorted(m for m in set(sys.modules) - base if m.split('.')[0] in ('pyspark', 'pandas', 'duckdb', 'py4j', 'datafusion')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_ships_type_information() -> None:
    assert (Path(flight.__file__).parent / "py.typed").exists()


def test_ruff_finds_nothing_in_the_package() -> None:
    """The rule set is pyproject.toml's ``[tool.ruff]``; a finding fails CI here."""
    pytest.importorskip("ruff", reason="ruff is a dev dependency")
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "flight"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


@pytest.mark.slow
def test_mypy_finds_nothing_in_the_package() -> None:
    """``[tool.mypy]`` in pyproject.toml; pyarrow's types come from pyarrow-stubs (a dev dependency)."""
    pytest.importorskip("mypy", reason="mypy is a dev dependency")
    done = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
