"""Run TPC-H queries on several engines: a warm-up, then timed runs, each result checked against DuckDB's.

For every query, engine by engine (DuckDB first: its answer is the reference):
one warm-up run (its result is checked, its time kept apart), then ``runs``
timed runs, each with the peak RSS of the engine's processes
(:mod:`benchmarks.memory`) and each result checked again. A check compares with
``tpch_queries.compare`` (floats within a tolerance, order along the ORDER BY key).
A mismatch or an exception is recorded on the query's cell, reported at once,
and the harness goes on with the other cells.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from benchmarks.engines import Engine
from benchmarks.memory import PeakRSS
from benchmarks.progress import Progress
from benchmarks.tpch_queries import ORDERED, compare

__all__ = ["Cell", "Run", "run_suite"]


@dataclass
class Run:
    seconds: float
    peak_rss_bytes: int | None
    peak_rss_parts: list[int | None] = field(default_factory=list)
    """Per process, in the engine's ``pids()`` order (for flight: coordinator, then workers)."""


@dataclass
class Cell:
    """One query on one engine."""

    query: int
    engine: str
    warmup_seconds: float | None = None
    runs: list[Run] = field(default_factory=list)
    rows: int | None = None
    status: str = "ok"
    """``ok``, ``mismatch`` (a result differs from DuckDB's) or ``error`` (the engine raised)."""
    problem: str | None = None
    peak_rss_method: str | None = None
    """How the runs' peak RSS was measured: ``VmHWM``, ``sampled VmRSS`` or ``none``."""

    @property
    def median(self) -> float | None:
        return statistics.median(r.seconds for r in self.runs) if self.runs else None

    @property
    def median_peak_rss(self) -> int | None:
        peaks = [r.peak_rss_bytes for r in self.runs if r.peak_rss_bytes is not None]
        return int(statistics.median(peaks)) if peaks else None

    def to_json(self) -> dict[str, object]:
        return {
            "query": self.query, "engine": self.engine, "status": self.status, "problem": self.problem,
            "rows": self.rows, "warmup_seconds": self.warmup_seconds,
            "runs": [{"seconds": r.seconds, "peak_rss_bytes": r.peak_rss_bytes, "peak_rss_by_process": r.peak_rss_parts}
                     for r in self.runs],
            "median_seconds": self.median, "median_peak_rss_bytes": self.median_peak_rss,
            "peak_rss_method": self.peak_rss_method,
        }


def _quiesce() -> None:
    """Free what earlier runs left behind, so one run's garbage is not the next run's cost."""
    gc.collect()
    pa.default_memory_pool().release_unused()


def run_suite(
    engines: Sequence[Engine],
    numbers: Sequence[int],
    runs: int,
    reference: Callable[[int], pa.Table],
    progress: Progress,
) -> list[Cell]:
    """Every query on every engine; ``reference(n)`` is DuckDB's answer when no engine is ``duckdb``."""
    engines = sorted(engines, key=lambda e: e.key != "duckdb")  # DuckDB first: its result is the reference
    cells: list[Cell] = []
    bar = progress.add(f"{len(numbers)} queries x {len(engines)} engines", total=len(numbers) * len(engines) * (1 + runs))
    for n in numbers:
        want: pa.Table | None = None
        for engine in engines:
            cell = Cell(n, engine.key)
            cells.append(cell)
            done = 0
            try:
                progress.advance(bar, 0, description=f"Q{n} {engine.key}: warm-up")
                _quiesce()
                started = time.perf_counter()
                with progress.suspended(engine.stage_bars):
                    got = engine.warm_up(n)
                cell.warmup_seconds = time.perf_counter() - started
                cell.rows = got.num_rows
                done += 1
                progress.advance(bar)
                if want is None:
                    want = got if engine.key == "duckdb" else reference(n)
                _check(cell, got, want, progress, "warm-up")
                for i in range(runs):
                    progress.advance(bar, 0, description=f"Q{n} {engine.key}: run {i + 1}/{runs}")
                    _quiesce()
                    with PeakRSS(engine.pids()) as peak:
                        started = time.perf_counter()
                        got = engine.run(n)
                        seconds = time.perf_counter() - started
                    cell.runs.append(Run(seconds, peak.bytes, peak.parts))
                    cell.peak_rss_method = peak.method
                    done += 1
                    progress.advance(bar)
                    _check(cell, got, want, progress, f"run {i + 1}")
            except Exception as exc:  # noqa: BLE001 - one failing engine must not hide the others' figures
                cell.status, cell.problem = "error", f"{type(exc).__name__}: {exc}"
                progress.error(f"Q{n} on {engine.key} failed: {cell.problem}")
                progress.advance(bar, 1 + runs - done)
            if not progress.live:
                median = f"{cell.median:.3f}s" if cell.median is not None else "-"
                progress.log(f"Q{n} {engine.key}: median {median} of {len(cell.runs)} run(s), {cell.rows} rows, {cell.status}")
    progress.finish(bar, description=f"{len(numbers)} queries x {len(engines)} engines: done")
    return cells


def _check(cell: Cell, got: pa.Table, want: pa.Table, progress: Progress, which: str) -> None:
    if cell.status != "ok":
        return  # one report per cell is enough
    problem = compare(got, want, ORDERED.get(cell.query))
    if problem is not None:
        cell.status, cell.problem = "mismatch", f"{which}: {problem}"
        progress.error(f"Q{cell.query} on {cell.engine} does not match DuckDB's result ({which}):\n{problem}")
