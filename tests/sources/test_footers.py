"""The coordinator's Parquet footers (``flight.sources.footers``): remembered while a file is unchanged.

The oracle is pyarrow's own ``read_metadata`` of the file as it is now.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flight.sources import footers


def test_an_unchanged_file_is_read_once_and_a_rewritten_one_again(tmp_path: Path) -> None:
    path = tmp_path / "f.parquet"
    pq.write_table(pa.table({"x": list(range(10))}), path)
    first = footers.parquet_metadata(str(path))
    assert first.equals(pq.read_metadata(path))
    assert footers.parquet_metadata(str(path)) is first  # remembered
    pq.write_table(pa.table({"x": list(range(25)), "y": ["a"] * 25}), path)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # a rewrite within the clock's tick
    again = footers.parquet_metadata(str(path))
    assert again.num_rows == 25 and again.equals(pq.read_metadata(path))


def test_large_footers_are_not_kept_and_the_cache_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(footers, "ENTRIES", 3)
    paths = []
    for i in range(5):
        paths.append(tmp_path / f"f{i}.parquet")
        pq.write_table(pa.table({"x": [i]}), paths[-1])
        footers.parquet_metadata(str(paths[-1]))
    assert len(footers._cache) <= 3
    monkeypatch.setattr(footers, "MAX_BYTES", 1)
    big = tmp_path / "big.parquet"
    pq.write_table(pa.table({"x": [1]}), big)
    assert footers.parquet_metadata(str(big)).num_rows == 1
    assert not [k for k in footers._cache if k[0] == str(big)]


def test_a_missing_file_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nothing\.parquet"):
        footers.parquet_metadata(str(tmp_path / "nothing.parquet"))


def test_what_is_derived_from_a_footer_is_remembered_with_it_and_read_again_after_a_rewrite(tmp_path: Path) -> None:
    path = tmp_path / "f.parquet"
    pq.write_table(pa.table({"x": list(range(10))}), path)
    calls: list[int] = []

    def rows(meta: pq.FileMetaData) -> int:
        calls.append(meta.num_rows)
        return meta.num_rows

    assert footers.footer_derived(str(path), "rows", rows) == 10 == pq.read_metadata(path).num_rows
    assert footers.footer_derived(str(path), "rows", rows) == 10 and calls == [10]  # remembered
    with pytest.raises(ZeroDivisionError):  # a failure is not remembered
        footers.footer_derived(str(path), "broken", lambda meta: 1 // 0)
    assert footers.footer_derived(str(path), "broken", lambda meta: 7) == 7
    pq.write_table(pa.table({"x": list(range(25))}), path)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert footers.footer_derived(str(path), "rows", rows) == 25 == pq.read_metadata(path).num_rows
    assert calls == [10, 25]
