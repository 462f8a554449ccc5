"""Decoding a Parquet unit's row groups on several threads (``flight.engine.decode``).

The oracle is pyarrow's own ``read_table`` of the same row groups: the batches must come in the
file's order, exactly, whatever the number of threads, and a reader closed early must not leave
its decoding threads behind.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from flight.engine import decode
from flight.engine.decode import row_group_batches

ROWS, GROUPS = 50_000, 25


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("decode") / "f.parquet"
    k = pa.array(range(ROWS), pa.int64())
    pq.write_table(pa.table({"k": k, "s": pc.cast(k, pa.string()), "x": pc.multiply(k, 2)}), p, row_group_size=ROWS // GROUPS)
    return p


def batches(path: Path, groups: list[int], threads: int, columns: list[str] | None, chunk: int, rows: int = 700) -> list[pa.RecordBatch]:
    pf = pq.ParquetFile(path)
    return list(row_group_batches(pf, lambda: pq.ParquetFile(path, metadata=pf.metadata), groups, columns, rows, threads, chunk))


def oracle(path: Path, groups: list[int], columns: list[str] | None = None) -> pa.Table:
    return pq.ParquetFile(path).read_row_groups(groups, columns=columns)


def three_groups(path: Path) -> int:
    """A chunk size of about 3 of the file's row groups."""
    return 3 * pq.ParquetFile(path).metadata.row_group(0).total_byte_size


def test_chunks_are_runs_of_consecutive_sizes_under_the_limit() -> None:
    assert decode.chunks([], 10) == []
    assert decode.chunks([4, 4, 4, 4, 4], 10) == [(0, 2), (2, 4), (4, 5)]
    assert decode.chunks([30, 1, 1, 30], 10) == [(0, 1), (1, 3), (3, 4)]  # a larger one alone
    assert decode.chunks([5, 5], 10) == [(0, 2)]


@pytest.mark.parametrize("chunked", [False, True], ids=["row-groups", "chunks"])
@pytest.mark.parametrize("threads", [1, 2, 4, 64])
@pytest.mark.parametrize("groups", [list(range(GROUPS)), [3], [20, 2, 11, 5], []], ids=["all", "one", "unordered", "none"])
def test_row_groups_come_in_the_order_asked_whatever_the_threads(path: Path, threads: int, groups: list[int], chunked: bool) -> None:
    got = batches(path, groups, threads, ["k", "s"], three_groups(path) if chunked else 0)
    assert all(b.num_rows <= 700 for b in got)
    want = oracle(path, groups, ["k", "s"])
    assert pa.Table.from_batches(got, schema=want.schema).equals(want)


def test_large_row_groups_are_decoded_one_at_a_time(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decode, "MAX_PARALLEL_GROUP_BYTES", 1)
    opened: list[int] = []
    pf = pq.ParquetFile(path)
    got = list(row_group_batches(pf, lambda: opened.append(1) or pf, list(range(GROUPS)), None, 10_000, 4))
    assert not opened  # no decoding thread opened the file
    assert pa.Table.from_batches(got).equals(oracle(path, list(range(GROUPS))))


def test_a_reader_closed_early_leaves_no_decoding_thread(path: Path) -> None:
    pf = pq.ParquetFile(path)
    it = row_group_batches(pf, lambda: pq.ParquetFile(path, metadata=pf.metadata), list(range(GROUPS)), None, 100, 4)
    first = next(it)
    assert first.equals(oracle(path, [0]).to_batches(max_chunksize=100)[0])
    it.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("parquet-decode")]


def test_each_decoding_thread_opens_its_own_reader(path: Path) -> None:
    pf = pq.ParquetFile(path)
    opened: list[pq.ParquetFile] = []

    def reopen() -> pq.ParquetFile:
        opened.append(pq.ParquetFile(path, metadata=pf.metadata))
        return opened[-1]

    got = list(row_group_batches(pf, reopen, list(range(GROUPS)), None, 10_000, 2))
    assert pa.Table.from_batches(got).equals(oracle(path, list(range(GROUPS))))
    assert 1 <= len(opened) <= 2 and all(f is not pf for f in opened)


def test_a_failing_row_group_fails_the_reader(path: Path) -> None:
    pf = pq.ParquetFile(path)

    def broken() -> pq.ParquetFile:
        raise OSError("the store went away")

    with pytest.raises(OSError, match="went away"):
        list(row_group_batches(pf, broken, list(range(GROUPS)), None, 100, 2))
    assert not [t for t in threading.enumerate() if t.name.startswith("parquet-decode")]
