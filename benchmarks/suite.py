"""Run a suite's queries on several engines: a warm-up, then timed runs, each result checked against DuckDB's.

For every query, engine by engine (DuckDB first: its answer is the reference):
one warm-up run (its result is checked, its time kept apart), then ``runs``
timed runs, each with the peak RSS of the engine's processes
(:mod:`benchmarks.memory`) and each result checked again. A check is the suite's
(``workload.Workload.check``; TPC-H's by default: ``tpch_queries.compare``, floats
within a tolerance, order along the ORDER BY key). A mismatch or an exception is
recorded on the query's cell, reported at once, and the harness goes on with the
other cells. An exception by which the engine says it cannot run the text at all
(``Engine.cannot_run``: Polars's SQL front end lacks a construct, Acero has no
window functions) marks the cell ``unsupported``: a limit of that engine, shown
in the table, not a failure.
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
from benchmarks.workload import Check, tpch_check

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
    """``ok``, ``mismatch`` (a result differs from DuckDB's), ``error`` (the engine raised) or ``unsupported``
    (the engine refused the query's text: ``Engine.cannot_run``)."""
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
    check: Check | None = None,
) -> list[Cell]:
    """Every query on every engine; ``reference(n)`` is DuckDB's answer when no engine is ``duckdb``;
    ``check(n, got, want)`` says why an answer is not DuckDB's (default: TPC-H's, ``compare`` along ``ORDERED``)."""
    check = check or tpch_check
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
                _check(cell, got, want, progress, "warm-up", check)
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
                    _check(cell, got, want, progress, f"run {i + 1}", check)
            except Exception as exc:  # noqa: BLE001 - one failing engine must not hide the others' figures
                cell.problem = f"{type(exc).__name__}: {exc}"
                if done == 0 and engine.cannot_run(exc):
                    cell.status = "unsupported"
                    progress.warn(f"Q{n}: {engine.key} cannot run the text: {_first_line(cell.problem)}")
                else:
                    cell.status = "error"
                    progress.error(f"Q{n} on {engine.key} failed: {cell.problem}")
                progress.advance(bar, 1 + runs - done)
            if not progress.live:
                median = f"{cell.median:.3f}s" if cell.median is not None else "-"
                progress.log(f"Q{n} {engine.key}: median {median} of {len(cell.runs)} run(s), {cell.rows} rows, {cell.status}")
    progress.finish(bar, description=f"{len(numbers)} queries x {len(engines)} engines: done")
    return cells


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def _check(cell: Cell, got: pa.Table, want: pa.Table, progress: Progress, which: str, check: Check) -> None:
    if cell.status != "ok":
        return  # one report per cell is enough
    problem = check(cell.query, got, want)
    if problem is not None:
        cell.status, cell.problem = "mismatch", f"{which}: {problem}"
        progress.error(f"Q{cell.query} on {cell.engine} does not match DuckDB's result ({which}):\n{problem}")
