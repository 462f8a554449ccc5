"""What a suite hands the harness: its tables' files, each query's text in every engine's dialect, and its check.

Why one object: the engines, the timing loop (``suite.run_suite``) and the report are the same for TPC-H and
TPC-DS; only the data, the texts and what makes two answers "the same" differ. A ``Workload`` carries those,
so no engine or report knows which suite it runs.

* ``tpch_workload``: the 22 TPC-H texts (``tpch_sql.SQL``), their Spark and Polars copies (``engines``), the
  data made by ``tpchgen-cli`` table by table; answers compared with ``tpch_queries.compare`` along
  ``ORDERED``'s sort keys.
* ``tpcds_bench.tpcds_workload``: the 99 TPC-DS texts, see there.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from benchmarks.progress import Progress
from benchmarks.tpch import ROWS_PER_SF, ensure_tpch, sf_dir, table_ready
from benchmarks.tpch_queries import ORDERED, SQL, TABLES, Files, compare, tpch_files
from benchmarks.tpch_sql import POLARS_SQL, SPARK_SQL

__all__ = ["DIALECTS", "Check", "Workload", "needed_tables", "tpch_check", "tpch_workload"]

DIALECTS = ("duckdb", "spark", "datafusion", "polars")
"""The text each engine runs: ``duckdb`` (flight-exec's ``flight.sql``, Acero, DuckDB), ``spark`` (PySpark,
Sail, Sail local-cluster), ``datafusion``, ``polars``."""

Check = Callable[[int, pa.Table, pa.Table], str | None]
"""``check(n, got, want)``: None when ``got`` is DuckDB's answer ``want`` to query ``n``, else why not."""


@dataclass(frozen=True)
class Workload:
    """One suite's data and texts at one scale factor."""

    name: str
    """``tpch`` or ``tpcds``: the stem of the output files (``tpcds-sf0.1.md``) and the JSON's ``suite``."""
    title: str
    """``TPC-H`` or ``TPC-DS``, for titles."""
    sf: float
    data_dir: Path
    """The directory holding every table's files (the LocalCluster's data root)."""
    files: Files
    """``{table: [parquet paths]}``."""
    texts: Mapping[str, Mapping[int, str]]
    """``{dialect: {query number: text}}`` for every dialect of ``DIALECTS``."""
    check: Check
    dialects: Mapping[str, str] = field(default_factory=dict)
    """How each dialect's texts were made, for the JSON (e.g. ``sqlglot.transpile(read='duckdb', write='spark')``)."""

    @property
    def queries(self) -> tuple[int, ...]:
        return tuple(sorted(self.texts["duckdb"]))


def needed_tables(numbers: Sequence[int]) -> list[str]:
    """The TPC-H tables the chosen queries read (from their SQL text), in TABLES order: only those are generated."""
    words = set().union(*(re.findall(r"[a-z_]+", SQL[n].lower()) for n in numbers))
    return [t for t in TABLES if t in words]


def _generate_tpch(sf: float, tables: Sequence[str], cache_dir: Path | None, progress: Progress) -> Path:
    """``ensure_tpch`` table by table, with a bar weighted by the tables' sizes."""
    missing = [t for t in tables if not table_ready(sf, t, cache_dir)]
    if not missing:
        progress.log(f"TPC-H SF {sf:g}: {len(tables)} tables cached in {sf_dir(sf, cache_dir)}")
        return sf_dir(sf, cache_dir)
    bar = progress.add(f"generating TPC-H SF {sf:g} with tpchgen-cli ({', '.join(missing)})",
                       total=sum(ROWS_PER_SF[t] for t in missing))
    started = time.perf_counter()
    for table in missing:
        progress.advance(bar, 0, description=f"generating TPC-H SF {sf:g}: {table}")
        ensure_tpch(sf, (table,), cache_dir)
        progress.advance(bar, ROWS_PER_SF[table])
    progress.finish(bar, description=f"TPC-H SF {sf:g} generated in {time.perf_counter() - started:.0f}s")
    return ensure_tpch(sf, tables, cache_dir)


def tpch_check(n: int, got: pa.Table, want: pa.Table) -> str | None:
    """TPC-H's check: ``compare`` along the query's ORDER BY key (``ORDERED``)."""
    return compare(got, want, ORDERED.get(n))


def tpch_workload(sf: float, numbers: Sequence[int], cache_dir: Path | None, progress: Progress) -> Workload:
    """TPC-H at ``sf``: the tables ``numbers`` read, generated when missing; one text per query, with the
    Spark and Polars copies ``engines`` keeps (Q15's view spelled their way)."""
    tables = needed_tables(numbers)
    data_dir = _generate_tpch(sf, tables, cache_dir, progress)
    return Workload(
        "tpch", "TPC-H", sf, data_dir, tpch_files(data_dir, tables),
        {"duckdb": SQL, "spark": SPARK_SQL, "datafusion": SQL, "polars": POLARS_SQL}, tpch_check,
        {"duckdb": "benchmarks/tpch_sql.py SQL", "spark": "tpch_sql.SPARK_SQL (Q15's view temporary)",
         "datafusion": "SQL as is", "polars": "tpch_sql.POLARS_SQL (Q15's view as a CTE)"},
    )
