"""A recoverable task's output on the coordinator: rows held until their work unit is complete.

Why: a task that tags its rows (``TaskOptions.tag_units``, ``engine/tagged.py``) sends
every row of a unit before any row of the next. So a unit is known complete when a
row of a later unit arrives, or when the task's output ends; only then are its rows
handed to the caller (without the hidden ``UNIT_COLUMN``). If the task's worker is
lost first, the held rows are dropped and the unit is replayed elsewhere: the caller
sees each unit's rows exactly once. What is held is one unit's output per task.

A plain object, no I/O: the DoGet reader feeds it batches and carries out what it
returns; ``tests/coordinator/test_units.py`` checks it without processes.
"""

from __future__ import annotations

import threading
from typing import Any

import pyarrow as pa

from flight.errors import ProtocolError
from flight.wire.arrow_types import UNIT_COLUMN, UNIT_TYPE

__all__ = ["UnitGate"]


class UnitGate:
    """One tagged task's rows, let through a unit at a time.

    ``lock`` makes a release and a loss exclusive: the reader holds it while it hands a
    unit's rows over and reports the unit done; the loss sets ``lost`` under it, after
    which nothing more is released. Rows of a unit seen again after it was released are
    caught by the state machine (``UnitsDone`` of a unit no longer outstanding fails the
    query before those rows are handed over).
    """

    def __init__(self, where: str) -> None:
        self.where = where  # names the task in errors: its key and worker URL
        self.lock = threading.Lock()
        self.lost = False
        self.read_all = False  # the task's output ended and everything was released
        self._held: list[pa.RecordBatch] = []
        self._current: int | None = None

    @property
    def held_rows(self) -> int:
        return sum(b.num_rows for b in self._held)

    def feed(self, batch: pa.RecordBatch) -> tuple[list[pa.RecordBatch], list[int]]:
        """Take one tagged batch: the rows now releasable (untagged) and the units they complete."""
        units, starts = self._runs(batch)
        rows = batch.select(range(batch.num_columns - 1))
        release: list[pa.RecordBatch] = []
        done: list[int] = []
        if not units:
            return release, done
        if units[0] != self._current:
            self._complete(release, done)
            self._current = units[0]
        if len(units) > 1:  # every unit but the batch's last is complete
            last = starts[-1]
            release.extend(self._held)
            release.append(rows.slice(0, last))
            done.extend(units[:-1])  # units[0] is the current unit
            self._held, self._current = [rows.slice(last)], units[-1]
        else:
            self._held.append(rows)
        return release, done

    def _runs(self, batch: pa.RecordBatch) -> tuple[list[int], list[int]]:
        """The batch's units in order, and where each starts (adjacent runs of one unit merged)."""
        if batch.num_columns == 0 or batch.schema.names[-1] != UNIT_COLUMN or batch.schema.types[-1] != UNIT_TYPE:
            raise ProtocolError(f"{self.where}: an output batch has no {UNIT_COLUMN!r} last column of {UNIT_TYPE}", field=UNIT_COLUMN)
        n = batch.num_rows
        if n == 0:
            return [], []
        tags: Any = batch.column(batch.num_columns - 1)  # a RunEndEncodedArray (pyarrow-stubs lack its methods)
        try:
            tags.validate(full=True)  # a peer's run ends: increasing, within the values (cheap: one run per unit)
        except pa.ArrowInvalid:
            raise ProtocolError(f"{self.where}: an output batch's work unit tags are malformed", field=UNIT_COLUMN) from None
        first, count = tags.find_physical_offset(), tags.find_physical_length()
        values = tags.values.slice(first, count)
        if values.null_count:
            raise ProtocolError(f"{self.where}: an output batch has null work unit ids", field=UNIT_COLUMN)
        ends = tags.run_ends.slice(first, count).to_pylist()
        units: list[int] = []
        starts: list[int] = []
        start = 0
        for unit, end in zip(values.to_pylist(), ends, strict=True):
            if not units or unit != units[-1]:
                units.append(unit)
                starts.append(start)
            start = min(n, end - tags.offset)
        if len(set(units)) != len(units):
            raise ProtocolError(f"{self.where}: a work unit's rows are split by another's in one batch", field=UNIT_COLUMN)
        return units, starts

    def end(self) -> tuple[list[pa.RecordBatch], list[int]]:
        """The task's output ended: the last unit is complete too."""
        release: list[pa.RecordBatch] = []
        done: list[int] = []
        self._complete(release, done)
        self.read_all = True
        return release, done

    def drop(self) -> int:
        """The task is lost: forget the rows held (their unit is replayed); how many there were."""
        rows = self.held_rows
        self._held = []
        self._current = None
        return rows

    def _complete(self, release: list[pa.RecordBatch], done: list[int]) -> None:
        if self._current is None:
            return
        release.extend(self._held)
        done.append(self._current)
        self._held = []
        self._current = None
