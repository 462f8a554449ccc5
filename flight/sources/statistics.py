"""What a file's footer says of a column, as the planner measures it: key ranges on one number line.

Why here: the providers read the footers (``FileListProvider.key_ranges``, ``column_range``) and
the planner decides with what they found (``planner.colocate``, ``planner.ranges``); this is
the vocabulary both speak, below both.
"""

from __future__ import annotations

import datetime as dt
import decimal
from dataclasses import dataclass

__all__ = ["FileRange", "as_number"]


@dataclass(frozen=True)
class FileRange:
    """One file of one side: its key range (``as_number`` values), rows, and whether any
    row group may hold a null key (counted nulls, or no count)."""

    path: str
    low: float
    high: float
    rows: float = 1.0
    nulls: bool = True
    groups: tuple[tuple[float, float, float], ...] = ()
    """Its row groups' (low, high, rows), when known: what a reader keeping one range skips."""


def as_number(value: object) -> float | None:
    """A value on the line ranges are measured on: numbers as they are, dates as day numbers,
    timestamps as seconds; None for anything else (strings, booleans, nulls)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float, decimal.Decimal)):
        return float(value)
    if isinstance(value, dt.datetime):
        return value.timestamp() if value.tzinfo else value.replace(tzinfo=dt.UTC).timestamp()
    if isinstance(value, dt.date):
        return float(value.toordinal())
    return None
