"""A worker extension for tests: every stream trailer it sends claims one row more than it sent.

Loaded with ``LocalCluster(extensions=["tests.worker.lying_trailer"])``: the worker is otherwise real,
so its readers (the coordinator, other workers) meet a producer whose trailers do not match its rows.
"""

from __future__ import annotations

from flight.wire import integrity

_trailer = integrity.Tally.trailer


def _lying(self: integrity.Tally) -> object:
    sent = _trailer(self)
    sent.rows += 1
    return sent


integrity.Tally.trailer = _lying  # type: ignore[method-assign, assignment]
