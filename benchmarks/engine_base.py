"""What the harness needs of an engine (``Engine``), and the stand-in for one that could not start.

Apart from ``engines`` so that the engines of other modules (``sail_engine``) build on it without importing
the others' dependencies (and without an import circle).
"""

from __future__ import annotations

import os

import pyarrow as pa

__all__ = ["Engine", "FailedEngine"]


class Engine:
    """What the harness needs of an engine; subclasses fill in ``run``."""

    key = "engine"
    """Short name in the JSON and on the command line, e.g. ``flight[2]``."""
    label = "engine"
    """Column title in the tables and the chart."""
    short = "engine"
    """Its name in a ratio's column title."""
    startup_seconds = 0.0

    def run(self, n: int) -> pa.Table:
        raise NotImplementedError

    stage_bars = False
    """Whether ``warm_up`` draws a live display of its own (the harness's bars step aside meanwhile)."""

    def warm_up(self, n: int) -> pa.Table:
        """The untimed first run of query ``n``: ``run`` unless the engine shows more while it warms up."""
        return self.run(n)

    def pids(self) -> list[int]:
        """The processes a run of this engine uses (their peak RSS is its memory)."""
        return [os.getpid()]

    def cannot_run(self, error: Exception) -> bool:
        """Whether ``error`` says this engine refuses the query's text (its SQL front end lacks a construct),
        as opposed to failing while it runs: the cell is then marked ``unsupported``, a limit of that engine
        the table shows, not a failure of the run. flight-exec and DuckDB never say so: all they refuse fails."""
        return False

    def describe(self) -> dict[str, object]:
        return {"label": self.label, "startup_seconds": round(self.startup_seconds, 3)}

    def close(self) -> None:
        pass


class FailedEngine(Engine):
    """An engine that could not start: every run raises why, so each of its cells reports it."""

    def __init__(self, key: str, label: str, short: str, error: BaseException) -> None:
        self.key, self.label, self.short, self.error = key, label, short, error

    def run(self, n: int) -> pa.Table:
        raise RuntimeError(f"{self.label} did not start: {type(self.error).__name__}: {self.error}")

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "error": f"{type(self.error).__name__}: {self.error}"}
