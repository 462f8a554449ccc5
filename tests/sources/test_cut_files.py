"""Few large Parquet files cut into runs of row groups, one per task (``ExecOptions.cut_file_rows``,
``FileListProvider.may_cut``, ``runs``).

Without sockets: which lists may be cut, into which runs a feed of more partitions than files cuts them, and
when a list is left whole. The workers' side (DuckDB reading a run as a range of row numbers) and the planner's
(a task per worker) are in tests/engine/test_duck_runs.py.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import flight
from flight import FeedContext, FileListProvider
from flight.sources.providers import runs

CUT_ROWS = 1_000_000


def _write(path: Path, rows: int, group_rows: int) -> Path:
    pq.write_table(pa.table({"x": pa.array(range(rows), pa.int64())}), path, row_group_size=group_rows)
    return path


def _units(provider: FileListProvider, parts: int) -> list[list[tuple[str, list[int]]]]:
    """Each partition's units as (file name, row groups)."""
    out = []
    for p in range(parts):
        ctx = FeedContext(query_id="q", feed_id="f", partition=p, partitions=parts)
        out.append([(Path(u.path).name, list(u.row_groups)) for u in provider.feed(p, ctx)])
    return out


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A table of CUT_ROWS rows in 10 row groups, one file."""
    return _write(tmp_path_factory.mktemp("cut") / "big.parquet", CUT_ROWS, CUT_ROWS // 10)


def test_one_large_file_is_cut_into_one_run_per_partition(big: Path) -> None:
    provider = FileListProvider([big])
    assert provider.may_cut(CUT_ROWS) and provider.partitions() == 1  # the planner may give it a partition per task
    assert _units(provider, 2) == [[("big.parquet", [0, 1, 2, 3, 4])], [("big.parquet", [5, 6, 7, 8, 9])]]
    three = _units(provider, 3)
    assert [len(groups) for part in three for _, groups in part] == [4, 3, 3]
    assert sorted(g for part in three for _, groups in part for g in groups) == list(range(10))  # each group once
    assert _units(provider, 1) == [[("big.parquet", [])]]  # one task: the file whole


def test_runs_are_even_in_rows_not_in_row_groups(tmp_path: Path) -> None:
    path = tmp_path / "uneven.parquet"
    with pq.ParquetWriter(path, pa.schema([("x", pa.int64())])) as w:
        for n in (600_000, 100_000, 100_000, 100_000, 100_000, 100_000):  # the first group holds half the rows
            w.write_table(pa.table({"x": pa.array(range(n), pa.int64())}), row_group_size=n)
    assert [list(u.row_groups) for u in runs(str(path), 2)] == [[0], [1, 2, 3, 4, 5]]
    assert [list(u.row_groups) for u in runs(str(path), 20)] == [[g] for g in range(6)]  # at most one run a group


def test_files_are_cut_only_when_fewer_than_the_partitions(big: Path, tmp_path: Path) -> None:
    other = _write(tmp_path / "other.parquet", CUT_ROWS, CUT_ROWS // 10)
    provider = FileListProvider([big, other])
    assert _units(provider, 2) == [[("big.parquet", [])], [("other.parquet", [])]]  # a file a task: whole files
    four = _units(provider, 4)
    assert all(len(part) == 2 for part in four)  # each file in four runs, dealt round-robin
    assert sorted((name, g) for part in four for name, groups in part for g in groups) == sorted(
        (name, g) for name in ("big.parquet", "other.parquet") for g in range(10))


def test_small_tables_and_one_row_group_files_may_not_be_cut(tmp_path: Path) -> None:
    small = FileListProvider([_write(tmp_path / "small.parquet", CUT_ROWS - 1, 1000)])
    one_group = FileListProvider([_write(tmp_path / "one.parquet", CUT_ROWS, CUT_ROWS)])
    assert not small.may_cut(CUT_ROWS) and small.may_cut(CUT_ROWS - 1)
    assert not one_group.may_cut(CUT_ROWS) and not one_group.may_cut(1)
    assert _units(one_group, 4) == [[("one.parquet", [])], [], [], []]  # one row group: one unit whatever the partitions


def test_an_explicit_choice_turns_the_cut_off(big: Path) -> None:
    assert not FileListProvider([big]).may_cut(0)  # the option's default
    for provider in (FileListProvider([big], split_row_groups=False), FileListProvider([big], partitions=1)):
        assert not provider.may_cut(CUT_ROWS)
        assert all(groups == [] for part in _units(provider, 3) for _, groups in part)  # whole, whatever the partitions
    assert flight.read_parquet([big], split_row_groups=False).node.feed.inner().may_cut(CUT_ROWS) is False  # type: ignore[attr-defined]


def test_a_file_that_cannot_be_read_is_not_cut_here(tmp_path: Path) -> None:
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet")
    assert not FileListProvider([bad]).may_cut(1)  # the task that reads it says what is wrong, with its name
