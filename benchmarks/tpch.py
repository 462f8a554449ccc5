"""TPC-H Parquet data for the benchmarks, generated once with ``tpchgen-cli`` and cached.

The data lives in ``.bench-cache/tpch/sf{SF}/{table}/{table}.{part}.parquet``
under the repo root (override with ``cache_dir``). Each table is generated into
a scratch directory and renamed into place, and a ``.complete`` marker is
written only after that, so an interrupted run never leaves a table that
looks usable. Tables are split into several files (``parts``) so that a
cluster's tasks each get some.

``tpchgen-cli`` writes ``string_view`` columns: flight-exec normalises them
to ``string`` at the scan, DuckDB reads them as VARCHAR.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["REPO_ROOT", "ROWS_PER_SF", "ensure_tpch", "sf_dir", "table_files", "table_ready", "tpchgen_cli"]

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PARTS = 4
_MARKER = ".complete"

ROWS_PER_SF = {
    "lineitem": 6_000_000, "orders": 1_500_000, "partsupp": 800_000, "part": 200_000,
    "customer": 150_000, "supplier": 10_000, "nation": 25, "region": 5,
}
"""Rows of each table at scale factor 1 (about; nation and region do not scale): a table's share of the work."""


def tpchgen_cli() -> str:
    """The ``tpchgen-cli`` executable: next to this interpreter (a venv) first, then PATH."""
    here = Path(sys.executable).parent / ("tpchgen-cli.exe" if os.name == "nt" else "tpchgen-cli")
    if here.exists():
        return str(here)
    found = shutil.which("tpchgen-cli")
    if found is None:
        raise FileNotFoundError("tpchgen-cli is not installed; run: pip install -e '.[bench]'")
    return found


def sf_dir(sf: float, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where scale factor ``sf`` lives: ``sf0.1``, ``sf1``, ... (``%g`` keeps names short)."""
    base = Path(cache_dir) if cache_dir is not None else REPO_ROOT / ".bench-cache" / "tpch"
    return base / f"sf{sf:g}"


def _complete(table_dir: Path, sf: float, parts: int) -> bool:
    try:
        marker = json.loads((table_dir / _MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("sf") == sf and marker.get("parts") == parts and bool(table_files(table_dir.parent, table_dir.name))


def table_ready(
    sf: float, table: str, cache_dir: str | os.PathLike[str] | None = None, *, parts: int = DEFAULT_PARTS
) -> bool:
    """Whether ``table`` at ``sf`` is already generated and complete (``ensure_tpch`` would skip it)."""
    return _complete(sf_dir(sf, cache_dir) / table, sf, parts)


def ensure_tpch(
    sf: float,
    tables: Sequence[str] = ("lineitem",),
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    parts: int = DEFAULT_PARTS,
) -> Path:
    """The directory holding ``tables`` at scale factor ``sf``, generating what is missing.

    Two processes asking at once (the test suite's ``-n 2`` processes) do not both generate a table: the
    second waits on the directory's lock and finds it complete; one that finds it complete never waits."""
    root = sf_dir(sf, cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    missing = [t for t in tables if not _complete(root / t, sf, parts)]
    if not missing:
        return root
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when a killed holder dies
        for table in missing:
            if not _complete(root / table, sf, parts):
                _generate(root, table, sf, parts)
    return root


def _generate(root: Path, table: str, sf: float, parts: int) -> None:
    final = root / table
    scratch = root / f".tmp-{table}-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    cmd = [tpchgen_cli(), "parquet", "-s", f"{sf:g}", "-T", table, "-p", str(parts),
           "-o", str(scratch), "--no-progress", "-q"]
    print(f"[tpch] generating {table} at SF {sf:g} ({parts} parts) into {final}", file=sys.stderr)
    started = time.perf_counter()
    try:
        subprocess.run(cmd, check=True)
        shutil.rmtree(final, ignore_errors=True)
        (scratch / table).rename(final)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    (final / _MARKER).write_text(json.dumps({"sf": sf, "parts": parts}))
    print(f"[tpch] {table} ready in {time.perf_counter() - started:.1f}s", file=sys.stderr)


def table_files(root: str | os.PathLike[str], table: str) -> list[Path]:
    """The Parquet files of ``table`` under ``root`` (as ``ensure_tpch`` returns it), in part order."""
    files = list((Path(root) / table).glob(f"{table}*.parquet"))
    return sorted(files, key=lambda p: (len(p.name), p.name))  # lineitem.2 before lineitem.10
