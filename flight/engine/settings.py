"""The process's engine settings (``flight-worker --engine``, ``--memory-limit``, ``--engine-threads``).

Why apart: the DuckDB engine opens its databases with them, and the shared decoding sizes its
thread use by them (``decode.decode_threads``); neither should reach into the other for them.
``duck.engine.configure`` sets them and reopens the databases.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EngineSettings", "set_settings", "settings"]


@dataclass(frozen=True)
class EngineSettings:
    """The process's engine settings; ``flight-worker`` sets them from its flags."""

    engine: str = "duckdb"
    """``duckdb``, or ``acero`` to run every task on the Acero pipeline."""
    memory_limit: int | None = None
    """Bytes DuckDB may hold before it spills (None: DuckDB's default, 80% of RAM)."""
    spill_dir: str | None = None
    threads: int | None = None


_settings = EngineSettings()


def settings() -> EngineSettings:
    """This process's engine settings."""
    return _settings


def set_settings(new: EngineSettings) -> None:
    """Replace them (``duck.engine.configure`` does, and reopens DuckDB's databases)."""
    global _settings
    _settings = new
