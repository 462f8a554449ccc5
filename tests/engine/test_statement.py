"""``flight.engine.duck.task.Statement``: a task's query run once, straight from its text.

DuckDB's Python relation parses and binds its text to describe itself, then submits it again when it
runs; a task's query needs only the run. The rows must be the relation's, and an error must come where
the callers catch the engine's errors: when the rows are read.
"""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest

from flight.engine.duck.task import ENGINE_ERRORS, Statement, stream

TEXT = "SELECT k, sum(v) AS s FROM range(1000) AS t(k), (SELECT 2 AS v) GROUP BY k ORDER BY k"


def test_a_statement_streams_the_relations_rows_without_making_the_relation(monkeypatch: pytest.MonkeyPatch) -> None:
    from duckdb import _seam

    cur = duckdb.connect().cursor()
    want = pa.RecordBatchReader.from_stream(cur.sql(TEXT)).read_all()
    described = []
    for name in ("bind", "prepare_script_parsed"):  # what making a relation does before it runs
        original = getattr(_seam, name)
        monkeypatch.setattr(_seam, name, lambda *a, _o=original, _n=name, **k: described.append(_n) or _o(*a, **k))
    got = pa.Table.from_batches(list(stream(Statement(cur, TEXT), 100)))
    assert got.equals(want) and max(b.num_rows for b in stream(Statement(cur, TEXT), 100)) <= 100
    assert described == []
    cur.sql(TEXT)  # the relation, for contrast, is described first
    assert described


def test_a_statement_that_fails_fails_when_its_rows_are_read() -> None:
    cur = duckdb.connect().cursor()
    statement = Statement(cur, "SELECT no_such_column FROM range(3)")  # nothing runs yet
    with pytest.raises(ENGINE_ERRORS, match="no_such_column"):
        list(stream(statement, 100))
