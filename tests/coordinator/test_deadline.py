"""A query's deadline is the whole execution's, not each attempt's.

Why: an attempt that loses a worker before any row reached the caller runs again
(``exec._Attempts``). When each attempt started its own timer with the full
``ExecOptions.deadline``, a query retried after 25 s ended its second attempt at
115 s for a deadline of 90 (the chaos run's short form counted it as hung). The
attempts share ``RunContext.started``: a later one gets what is left.
"""

from __future__ import annotations

import time

import pyarrow as pa

import flight
from flight.config import ExecOptions
from flight.coordinator.context import RunContext
from flight.coordinator.exec import DistributedExec
from flight.coordinator.run import Run
from flight.errors import QueryTimeoutError


def _context(options: ExecOptions, started: float) -> RunContext:
    ex = DistributedExec(flight.from_arrow(pa.table({"x": [1, 2, 3]})), ["grpc://127.0.0.1:1"], options)
    return RunContext(ex.plan, options, ex.estimator, ex.resolver, [], sink=_Sink(), started=started)


class _Sink:
    def named(self, query_id: str, secret: bytes, bound: dict[int, list[str]]) -> None:
        pass

    def finished(self, metrics: object) -> None:
        pass


def test_a_later_attempt_gets_what_is_left_of_the_deadline() -> None:
    now = time.monotonic()
    left = _context(ExecOptions(deadline=90.0), now - 25.0).deadline_left()
    assert left is not None and 64.0 <= left <= 65.0
    assert _context(ExecOptions(deadline=90.0), now - 100.0).deadline_left() == 0.0
    assert _context(ExecOptions(), now - 100.0).deadline_left() is None


def test_an_attempt_that_starts_past_the_deadline_has_failed_with_the_deadline_error() -> None:
    run = Run(_context(ExecOptions(deadline=60.0), time.monotonic() - 100.0))
    assert run.failed.wait(10.0), "an attempt begun past the execution's deadline did not fail"
    assert isinstance(run.error, QueryTimeoutError)
    assert "deadline of 60s" in str(run.error)
