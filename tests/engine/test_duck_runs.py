"""Runs of row groups read by DuckDB as ranges of a file's row numbers (``flight.engine.duck.pieces``).

Without sockets: which units DuckDB reads and the rows its source text reads, against pyarrow reading the same
row groups. With real workers: a table written as one file is cut into a run per task with ``cut_file_rows``
(two tasks, one unit each; one task without it), and a split of more files than one query reads as ranges goes
to pyarrow; answers against DuckDB's over the whole file.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import flight
from flight.engine.confine import DataRoots
from flight.engine.duck.pieces import MAX_RUN_FILES, Plain, duck_source, plain_file
from flight.engine.readers import PathRefused, ReaderContext

CUT_ROWS = 1_000_000
GROUP_ROWS = CUT_ROWS // 8


@pytest.fixture(scope="module")
def one_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """CUT_ROWS rows in 8 row groups: ``k`` 0.., ``g`` k % 7, one file."""
    path = tmp_path_factory.mktemp("runs") / "one.parquet"
    k = pa.array(range(CUT_ROWS), pa.int64())
    pq.write_table(pa.table({"k": k, "g": pa.array([i % 7 for i in range(CUT_ROWS)], pa.int64())}), path, row_group_size=GROUP_ROWS)
    return path


def _ctx(root: Path) -> ReaderContext:
    return ReaderContext(schema=pa.schema([("k", pa.int64()), ("g", pa.int64())]), roots=DataRoots.of([str(root)]))


def _unit(path: Path, groups: list[int]) -> bytes:
    return flight.file_unit(str(path), groups).SerializeToString()


def test_a_run_of_row_groups_is_its_range_of_row_numbers(one_file: Path) -> None:
    ctx = _ctx(one_file.parent)
    real = str(one_file.resolve())
    assert plain_file(_unit(one_file, []), ctx) == (str(one_file), real, None)  # the whole file
    assert plain_file(_unit(one_file, [2, 3, 4]), ctx) == (str(one_file), real, (2 * GROUP_ROWS, 5 * GROUP_ROWS))
    assert plain_file(_unit(one_file, [7]), ctx) == (str(one_file), real, (7 * GROUP_ROWS, CUT_ROWS))
    hostile = ([2**32 - 1], [2**32 - 2, 2**32 - 1], list(range(100_000)), [0] * 3)  # a peer's indexes, checked first
    for groups in ([1, 3], [3, 2], [7, 8], [9], *hostile):  # not one run, or not the file's: pyarrow reads it and says so
        assert plain_file(_unit(one_file, groups), ctx) == (str(one_file), "", None), groups[:3]
    with pytest.raises(PathRefused):
        plain_file(_unit(Path("/etc/passwd"), [0]), ctx)


def test_duckdb_reads_the_rows_of_the_runs_once(one_file: Path) -> None:
    real = str(one_file.resolve())
    pieces = [Plain("u0", str(one_file), real, (0, GROUP_ROWS)), Plain("u1", str(one_file), real, (5 * GROUP_ROWS, 7 * GROUP_ROWS)),
              Plain("u2", str(one_file), real, (GROUP_ROWS, 2 * GROUP_ROWS))]
    source = duck_source(pieces)
    assert source is not None and source.count("read_parquet") == 1  # one read of the file, its runs OR'd
    got = duckdb.sql(f"SELECT k, g FROM {source} ORDER BY k").to_arrow_table()
    want = pq.ParquetFile(one_file).read_row_groups([0, 1, 5, 6])
    assert got.equals(want)
    both = duck_source([*pieces, Plain("u3", "w", real)])  # with a whole file beside them
    assert both is not None and duckdb.sql(f"SELECT count(*) FROM {both}").fetchall() == [(4 * GROUP_ROWS + CUT_ROWS,)]


def test_runs_of_too_many_files_are_left_to_pyarrow(tmp_path: Path) -> None:
    pieces = [Plain(f"u{i}", f"f{i}", str(tmp_path / f"f{i}.parquet"), (0, 1)) for i in range(MAX_RUN_FILES + 1)]
    assert duck_source(pieces) is None
    assert duck_source(pieces[:-1]) is not None


def test_a_table_in_one_file_is_read_by_every_task(one_file: Path, cluster: flight.LocalCluster) -> None:
    text = "SELECT g, count(*) AS n, sum(k) AS total FROM t WHERE k % 3 = 0 GROUP BY g ORDER BY g"
    q = flight.sql(text, flight.Catalog({"t": flight.read_parquet([one_file])}))
    ex = flight.DistributedExec(q, cluster.urls, one_host_query_bytes=0, small_query_bytes=0, cut_file_rows=CUT_ROWS)
    got = ex.to_table()
    want = duckdb.sql(text.replace(" t ", f" '{one_file}' ")).fetchall()
    assert [tuple(r.values()) for r in got.to_pylist()] == want
    assert "1 Parquet file(s) cut into runs of row groups, one per task" in ex.explain()
    assert ex.metrics is not None
    leaves = [t for t in ex.metrics.tasks if t.feeds]
    assert len(leaves) == 2 and all(sum(f.units for f in t.feeds) == 1 and t.engine == "duckdb" for t in leaves)  # a run each
    whole = flight.DistributedExec(q, cluster.urls, one_host_query_bytes=0, small_query_bytes=0)  # the default: no cut
    assert whole.to_table().equals(got) and "cut into runs" not in whole.explain()
    assert whole.metrics is not None and len([t for t in whole.metrics.tasks if t.feeds]) == 1


def test_a_split_of_many_files_is_read_whatever_reads_it(tmp_path: Path, cluster: flight.LocalCluster) -> None:
    paths = []
    for i in range(MAX_RUN_FILES + 3):  # more files of runs than one DuckDB query reads as ranges: pyarrow reads them
        paths.append(tmp_path / f"p{i}.parquet")
        pq.write_table(pa.table({"k": pa.array(range(i * 100, i * 100 + 100), pa.int64())}), paths[-1], row_group_size=50)
    q = flight.read_parquet(paths, split_row_groups=True).aggregate([], n=flight.agg.count_all(), total=flight.agg.sum("k"))
    ex = flight.DistributedExec(q, cluster.urls)  # one task, every unit in one query
    assert ex.to_table().to_pylist() == [{"n": len(paths) * 100, "total": sum(range(len(paths) * 100))}]
    assert ex.metrics is not None and sum(t.row_groups_read for t in ex.metrics.tasks) == 2 * len(paths)  # pyarrow's count
