"""The error for SQL the translator does not take, worded for the person who wrote it."""

from __future__ import annotations

from flight.errors import PlanError

__all__ = ["unsupported"]


def unsupported(what: str) -> PlanError:
    """``PlanError("SQL: <what> is not supported")``; the front end adds where, when it can find it."""
    return PlanError(f"SQL: {what} is not supported")
