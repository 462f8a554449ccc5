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

import pyarrow as pa
import pyarrow.compute as pc

from flight.arrow_types import UNIT_COLUMN
from flight.errors import ProtocolError

__all__ = ["UnitGate"]


class UnitGate:
    """One tagged task's rows, let through a unit at a time.

    ``lock`` makes a release and a loss exclusive: the reader holds it while it hands a
    unit's rows over and reports the unit done; the loss sets ``lost`` under it, after
    which nothing more is released.
    """

    def __init__(self, where: str) -> None:
        self.where = where  # names the task in errors: its key and worker URL
        self.lock = threading.Lock()
        self.lost = False
        self.read_all = False  # the task's output ended and everything was released
        self._held: list[pa.RecordBatch] = []
        self._current: int | None = None
        self._completed: set[int] = set()

    @property
    def held_rows(self) -> int:
        return sum(b.num_rows for b in self._held)

    def feed(self, batch: pa.RecordBatch) -> tuple[list[pa.RecordBatch], list[int]]:
        """Take one tagged batch: the rows now releasable (untagged) and the units they complete."""
        if batch.num_columns == 0 or batch.schema.names[-1] != UNIT_COLUMN or batch.schema.types[-1] != pa.uint64():
            raise ProtocolError(f"{self.where}: an output batch has no {UNIT_COLUMN!r} uint64 last column", field=UNIT_COLUMN)
        ids = batch.column(batch.num_columns - 1)
        if ids.null_count:
            raise ProtocolError(f"{self.where}: an output batch has null work unit ids", field=UNIT_COLUMN)
        rows = batch.select(range(batch.num_columns - 1))
        release: list[pa.RecordBatch] = []
        done: list[int] = []
        n = batch.num_rows
        if n == 0:
            return release, done
        if n == 1 or (ids[0] == ids[n - 1] and pc.all(pc.equal(ids, ids[0])).as_py()):
            runs = [(0, n)]
        else:
            changes = pc.indices_nonzero(pc.not_equal(ids.slice(1), ids.slice(0, n - 1)))
            starts = [0] + [int(c) + 1 for c in changes.to_pylist() if c is not None]
            runs = list(zip(starts, starts[1:] + [n]))
        for start, end in runs:
            unit = ids[start].as_py()
            if unit != self._current:
                self._complete(release, done)
                if unit in self._completed:
                    raise ProtocolError(f"{self.where}: rows of work unit {unit} came after a later unit's", field=UNIT_COLUMN)
                self._current = unit
            self._held.append(rows.slice(start, end - start))
        return release, done

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
        self._completed.add(self._current)
        self._held = []
        self._current = None
