"""TPC-DS Parquet data and the 99 TPC-DS query texts, made at run time by DuckDB's ``tpcds`` extension.

Where they come from: the PyPI package ``duckdb-extension-tpcds`` ships DuckDB's own (signed) ``tpcds``
extension, that is ``dsdgen`` and ``tpcds_queries()``, built for one DuckDB release: version 1.5.5 holds
``extensions/v1.5.5/tpcds.duckdb_extension`` and requires ``duckdb==1.5.5``. Nothing of it is copied
into this repository: the data and the query texts are made on this machine and cached under
``.bench-cache`` (ignored by git).

Why a venv of its own (``.bench-cache/venvs/tpcds``, made on first use like the Sail venv of
``engines.py``): this project's DuckDB is >= 2.0, which refuses an extension built for 1.5.5, and
DuckDB's own ``INSTALL tpcds`` downloads from extensions.duckdb.org, which a build machine may not
reach. The side venv's DuckDB only generates: the harness's DuckDB (and flight-exec) read the Parquet
files it writes, and run the query texts.

* ``generate(sf, out_dir)``: the 24 tables as ``out_dir/<table>.parquet`` (one file per table), with the
  column types ``dsdgen`` makes (keys BIGINT, amounts DECIMAL(7,2), dates DATE, text VARCHAR). They are
  written into a scratch directory next to ``out_dir`` and renamed into place with their ``.complete``
  marker (scale factor and generator versions), so a killed run never leaves a cache that looks usable.
* ``queries()``: ``{1: text, ..., 99: text}``, DuckDB's TPC-DS query texts (its dialect; the texts
  fill in the substitution parameters of the TPC-DS kit), cached as ``.bench-cache/tpcds/queries-<version>.json``.
* ``python -m benchmarks.tpcds --sf 0.1 [--out DIR]`` generates and prints each table's row count.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.tpch import REPO_ROOT

__all__ = [
    "GENERATOR",
    "TABLES",
    "TPCDS_CACHE",
    "TPCDS_VENV",
    "TPCDS_VERSION",
    "TpcdsError",
    "ensure_tpcds_venv",
    "generate",
    "queries",
    "sf_dir",
    "table_ready",
    "tpcds_requirements",
    "tpcds_venv_info",
]

TPCDS_VERSION = "1.5.5"
"""The ``duckdb-extension-tpcds`` release, and the DuckDB release its extension is built for (they match)."""
GENERATOR = {"duckdb": TPCDS_VERSION, "duckdb-extension-tpcds": TPCDS_VERSION}
"""What makes the data, recorded in each cache's marker: other versions could make other rows, so regenerate."""
TPCDS_VENV = REPO_ROOT / ".bench-cache" / "venvs" / "tpcds"
"""The venv ``dsdgen`` runs in, made once by ``ensure_tpcds_venv``."""
TPCDS_CACHE = REPO_ROOT / ".bench-cache" / "tpcds"
"""Default home of the data (``sf<SF>/``) and of the query texts (``queries-<version>.json``)."""
TABLES = (
    "call_center", "catalog_page", "catalog_returns", "catalog_sales", "customer", "customer_address",
    "customer_demographics", "date_dim", "household_demographics", "income_band", "inventory", "item",
    "promotion", "reason", "ship_mode", "store", "store_returns", "store_sales", "time_dim", "warehouse",
    "web_page", "web_returns", "web_sales", "web_site",
)
"""The 24 tables of TPC-DS, as ``dsdgen`` names them."""
QUERY_COUNT = 99
_MARKER = ".complete"
_IN_MEMORY_UP_TO_SF = 1.0
"""Up to this scale factor ``dsdgen`` fills an in-memory database (SF 1 is about 1 GB); above it, a
database file in the scratch directory, so the tables need not all fit in memory."""
_NOT_FOR_VENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")
"""Variables of the harness's environment that must not reach the side venv's Python."""

Progress = Callable[[str], None]
"""An optional callback for one-line progress messages (the module prints nothing itself)."""


class TpcdsError(RuntimeError):
    """Making the TPC-DS venv, data or query texts failed; the message says which step and why."""


# ---------------------------------------------------------------------- the side venv


def tpcds_requirements() -> list[str]:
    """What the TPC-DS venv installs: the extension package and the one DuckDB release that can load it."""
    return [f"duckdb-extension-tpcds=={TPCDS_VERSION}", f"duckdb=={TPCDS_VERSION}"]


def _venv_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _NOT_FOR_VENV}


def _run(cmd: Sequence[str], timeout: float, what: str) -> str:
    try:
        done = subprocess.run(list(cmd), check=False, capture_output=True, text=True, timeout=timeout, env=_venv_env())
    except subprocess.TimeoutExpired:
        raise TpcdsError(f"{what}: did not finish in {timeout:.0f}s ({' '.join(cmd[:4])} ...)") from None
    if done.returncode != 0:
        tail = " ".join((done.stderr or done.stdout).split())[-1500:]
        raise TpcdsError(f"{what}: exited with code {done.returncode} ({' '.join(cmd[:4])} ...): {tail}")
    return done.stdout


def tpcds_venv_info(venv: Path = TPCDS_VENV) -> dict[str, Any]:
    """What ``ensure_tpcds_venv`` recorded: ``requirements`` and the installed ``versions`` ({} when not made)."""
    try:
        info = json.loads((venv / _MARKER).read_text())
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def ensure_tpcds_venv(venv: Path = TPCDS_VENV, *, timeout: float = 900, progress: Progress | None = None) -> Path:
    """The Python of the TPC-DS venv, made first (``python -m venv`` and ``pip install tpcds_requirements()``)
    when it is missing or was made for other requirements. Returns at once when it is ready; the marker is
    written last, so a venv whose pip was killed is made again."""
    python = venv / "bin" / "python"
    wanted = tpcds_requirements()
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process making the same venv: wait for it
        if python.exists() and tpcds_venv_info(venv).get("requirements") == wanted:
            return python
        if progress is not None:
            progress(f"making the TPC-DS venv {venv} ({', '.join(wanted)})")
        shutil.rmtree(venv, ignore_errors=True)
        _run([sys.executable, "-m", "venv", str(venv)], timeout, "making the TPC-DS venv")
        _run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *wanted], timeout,
             f"pip install {' '.join(wanted)} into the TPC-DS venv")
        script = ("import importlib.metadata as m, json; "
                  "print(json.dumps({d: m.version(d) for d in ('duckdb', 'duckdb-extension-tpcds')}))")
        versions = json.loads(_run([str(python), "-c", script], 60, "reading the TPC-DS venv's versions"))
        if versions != GENERATOR:
            raise TpcdsError(f"the TPC-DS venv has {versions}, not {GENERATOR}")
        (venv / _MARKER).write_text(json.dumps({"requirements": wanted, "versions": versions}) + "\n")
    return python


_LOAD = """
import pathlib, duckdb, duckdb_extension_tpcds
# The package holds the extension file and no code: LOAD it by path (it is signed, so no setting is needed).
extension = pathlib.Path(duckdb_extension_tpcds.__file__).parent / "extensions" / f"v{duckdb.__version__}" / "tpcds.duckdb_extension"
if not extension.exists():
    raise SystemExit(f"no tpcds extension for DuckDB {duckdb.__version__} at {extension}")
"""

_GENERATE = _LOAD + """
import json, sys
args = json.loads(sys.argv[1])
con = duckdb.connect(args["database"])
con.execute("SET enable_progress_bar = false")  # it would draw on stdout
con.execute(f"LOAD '{extension}'")
con.execute(f"CALL dsdgen(sf={args['sf']!r})")
rows = {}
for table in args["tables"]:
    target = str(pathlib.Path(args["out"]) / f"{table}.parquet").replace("'", "''")
    con.execute(f"COPY {table} TO '{target}' (FORMAT parquet)")
    rows[table] = con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
pathlib.Path(args["result"]).write_text(json.dumps(rows))
"""

_QUERIES = _LOAD + """
import json
con = duckdb.connect()
con.execute(f"LOAD '{extension}'")
print(json.dumps({n: text for n, text in con.execute("SELECT query_nr, query FROM tpcds_queries() ORDER BY query_nr").fetchall()}))
"""


# ---------------------------------------------------------------------- data


def sf_dir(sf: float, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where scale factor ``sf`` lives by default: ``.bench-cache/tpcds/sf0.1``, ``sf1``, ... (``%g`` keeps names short)."""
    base = Path(cache_dir) if cache_dir is not None else TPCDS_CACHE
    return base / f"sf{sf:g}"


def _paths(out_dir: Path) -> dict[str, Path]:
    return {table: out_dir / f"{table}.parquet" for table in TABLES}


def table_ready(sf: float, out_dir: str | os.PathLike[str]) -> bool:
    """Whether ``out_dir`` holds all 24 tables of scale factor ``sf`` from this generator (``generate`` would skip)."""
    out = Path(out_dir)
    try:
        marker = json.loads((out / _MARKER).read_text())
    except (OSError, ValueError):
        return False
    return (isinstance(marker, dict) and marker.get("sf") == sf and marker.get("generator") == GENERATOR
            and all(p.is_file() for p in _paths(out).values()))


def _replace(out: Path, scratch: Path) -> None:
    """Put ``scratch`` where ``out`` is. An old ``out`` is removed only if it holds nothing but what ``generate``
    writes (a stale or half cache): a directory of someone else's files is never deleted."""
    if out.exists():
        ours = {p.name for p in _paths(out).values()} | {_MARKER}
        foreign = sorted(p.name for p in out.iterdir() if p.name not in ours)
        if foreign:
            raise TpcdsError(f"{out} holds files generate() did not write ({', '.join(foreign[:5])}); choose another directory")
        trash = out.with_name(f".{out.name}.old-{os.getpid()}")
        out.rename(trash)
        shutil.rmtree(trash, ignore_errors=True)
    scratch.rename(out)


def generate(
    sf: float,
    out_dir: str | os.PathLike[str] | None = None,
    *,
    timeout: float | None = None,
    venv: Path = TPCDS_VENV,
    progress: Progress | None = None,
) -> dict[str, Path]:
    """The 24 TPC-DS tables at scale factor ``sf`` as ``{table: out_dir/<table>.parquet}``, generated by
    ``dsdgen`` in the TPC-DS venv unless ``out_dir`` (default ``sf_dir(sf)``) already holds them.

    The venv's Python runs ``dsdgen`` and writes the files with DuckDB's ``COPY ... (FORMAT parquet)``
    (types as ``dsdgen`` makes them) into a scratch directory beside ``out_dir``; the marker goes in last
    and the directory is renamed into place, so a run killed at any point leaves either the old cache or
    the new one (and at worst a ``.<name>.tmp-*`` directory, which the next run clears).
    ``timeout`` bounds the generator process (default: 10 minutes plus 10 per unit of scale factor)."""
    if not (sf > 0 and math.isfinite(sf)):
        raise ValueError(f"scale factor must be a positive number, not {sf!r}")
    out = Path(out_dir) if out_dir is not None else sf_dir(sf)
    if table_ready(sf, out):
        return _paths(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process generating the same directory: wait, then reuse its work
        if table_ready(sf, out):
            return _paths(out)
        for stale in out.parent.glob(f".{out.name}.tmp-*"):  # left by a killed run (its lock died with it)
            shutil.rmtree(stale, ignore_errors=True)
        python = ensure_tpcds_venv(venv, progress=progress)
        if progress is not None:
            progress(f"generating TPC-DS SF {sf:g} into {out}")
        started = time.perf_counter()
        scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
        try:
            scratch.chmod(0o755)  # mkdtemp's 0700 would stay on the cache
            database, result = scratch / ".dsdgen.duckdb", scratch / ".rows.json"
            args = {"sf": sf, "out": str(scratch), "tables": list(TABLES), "result": str(result),
                    "database": ":memory:" if sf <= _IN_MEMORY_UP_TO_SF else str(database)}
            deadline = timeout if timeout is not None else 600 + 600 * sf
            _run([str(python), "-c", _GENERATE, json.dumps(args)], deadline, f"dsdgen(sf={sf:g})")
            rows = json.loads(result.read_text())
            for scrap in (result, database, database.with_name(database.name + ".wal")):
                scrap.unlink(missing_ok=True)
            seconds = round(time.perf_counter() - started, 2)
            (scratch / _MARKER).write_text(json.dumps({"sf": sf, "generator": GENERATOR, "rows": rows, "seconds": seconds}, indent=1) + "\n")
            _replace(out, scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    if progress is not None:
        progress(f"TPC-DS SF {sf:g} ready in {seconds:.1f}s ({sum(rows.values()):,} rows)")
    return _paths(out)


# ---------------------------------------------------------------------- queries


def queries(
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    venv: Path = TPCDS_VENV,
    progress: Progress | None = None,
) -> dict[int, str]:
    """The 99 TPC-DS query texts as ``{1: text, ..., 99: text}``, from ``tpcds_queries()`` in the TPC-DS venv,
    read once and cached as ``<cache_dir>/queries-<version>.json`` (default ``.bench-cache/tpcds``): a cached
    file answers without the venv."""
    path = (Path(cache_dir) if cache_dir is not None else TPCDS_CACHE) / f"queries-{TPCDS_VERSION}.json"
    try:
        cached = {int(n): text for n, text in json.loads(path.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        cached = {}
    if sorted(cached) == list(range(1, QUERY_COUNT + 1)):
        return cached
    python = ensure_tpcds_venv(venv, progress=progress)
    texts = {int(n): text for n, text in json.loads(_run([str(python), "-c", _QUERIES], 120, "tpcds_queries()")).items()}
    if sorted(texts) != list(range(1, QUERY_COUNT + 1)):
        raise TpcdsError(f"tpcds_queries() gave queries {sorted(texts)[:5]}..., not 1..{QUERY_COUNT}")
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(f".{path.name}.{os.getpid()}")
    scratch.write_text(json.dumps({str(n): texts[n] for n in sorted(texts)}, indent=1) + "\n")
    os.replace(scratch, path)  # readers see the old file or the whole new one
    return texts


# ---------------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.tpcds --sf 0.1 [--out DIR]``: generate (or find cached), then one line per table."""
    import pyarrow.parquet as pq

    parser = argparse.ArgumentParser(prog="python -m benchmarks.tpcds", description=__doc__.splitlines()[0])
    parser.add_argument("--sf", type=float, default=0.1, help="scale factor (default 0.1)")
    parser.add_argument("--out", type=Path, default=None, help="output directory (default .bench-cache/tpcds/sf<SF>)")
    args = parser.parse_args(argv)
    files = generate(args.sf, args.out, progress=lambda line: print(f"[tpcds] {line}", file=sys.stderr))
    width = max(map(len, files))
    for table, path in files.items():
        print(f"{table:<{width}} {pq.ParquetFile(path).metadata.num_rows:>12,}  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
