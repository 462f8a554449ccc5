"""Data confinement: workers read files only under their ``--data-root`` directories.

Real workers: a path outside the roots (absolute, ``..``, a symlink inside a root
leading out, a relative path) is refused with one message that does not depend on
whether the file exists; files inside a root read as before; read errors never
quote the file (an IPC file's first bytes, a CSV row); an extension reader that
uses ``ctx.open_path`` gets the same check.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from pyarrow import feather
from support import make_table, running_tasks, sorted_table, wait_until

import flight
from flight.engine.confine import (
    ANY_PATH,
    NO_ROOTS,
    REFUSED,
    REFUSED_RELATIVE,
    DataRoots,
)
from flight.engine.readers import PathRefused, ReaderContext, UnitReadError
from flight.errors import WorkerError

PARQUET_SCHEMA = make_table(1).schema
TEXT_SCHEMA = pa.schema([("line", pa.string())])
GARBAGE = b"SECRETBYTES-0123456789-not-an-arrow-file\n" * 4

EXTENSION = '''
"""A test extension: ``confine.lines`` reads a text file, one row per line, through ctx.open_path."""
import pyarrow as pa
from flight.engine.readers import UnitReadError, register_reader
from flight.sources.feed import file_unit  # noqa: F401 - units are FileUnits
from flight.wire._proto import plan_pb2


def read_lines(body, ctx):
    unit = plan_pb2.FileUnit()
    unit.ParseFromString(body)
    path = ctx.open_path(unit.path)  # the one check: PathRefused outside the roots
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        raise UnitReadError(f"cannot read {unit.path!r}") from None
    yield pa.record_batch([pa.array(lines, pa.string())], names=["line"])


register_reader("confine.lines", read_lines)
'''


class Units(flight.WorkUnitFeedProvider):
    """One FileUnit per path, as given: the coordinator never looks at the files."""

    def __init__(self, *paths: str | os.PathLike[str]) -> None:
        self.paths = [os.fspath(p) for p in paths]

    def partitions(self) -> int:
        return 1

    def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[object]:
        for p in self.paths:
            yield flight.file_unit(p)


class Bodies(flight.WorkUnitFeedProvider):
    def __init__(self, *bodies: bytes) -> None:
        self.bodies = bodies

    def partitions(self) -> int:
        return 1

    def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[bytes]:
        yield from self.bodies


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``root/`` (the data root) beside ``outside/``, with links from one into the other."""
    base = tmp_path_factory.mktemp("confine")
    root, outside, ext = base / "root", base / "outside", base / "ext"
    for d in (root, outside, ext):
        d.mkdir()
    table = make_table(300)
    pq.write_table(table, root / "in.parquet")
    pacsv.write_csv(table.select(["id", "qty"]), root / "in.csv")
    feather.write_feather(table, root / "in.arrow", compression="uncompressed")
    (root / "garbage.arrow").write_bytes(GARBAGE)
    (root / "bad.csv").write_text("id,qty\n1,2.0\nSECRET-ROW-hunter2\n")
    (root / "bad-value.csv").write_text("id,qty\n1,2.0\nSECRET-VALUE,3.0\n")
    (root / "notes.txt").write_text("first\nsecond\n")
    pq.write_table(table, outside / "secret.parquet")
    (outside / "secret.txt").write_text("the secret\n")
    key = outside / "id_ed25519"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    key.chmod(0o600)
    (root / "link-out.parquet").symlink_to(outside / "secret.parquet")
    (root / "link-out.txt").symlink_to(outside / "secret.txt")
    (root / "dangling.parquet").symlink_to(outside / "no-such.parquet")
    (root / "dir-out").symlink_to(outside, target_is_directory=True)
    (root / "link-in.parquet").symlink_to(root / "in.parquet")  # a symlink that stays inside is fine
    (base / "root-sibling").mkdir()  # shares a string prefix with root, is not inside it
    pq.write_table(table, base / "root-sibling" / "x.parquet")
    (ext / "confine_ext.py").write_text(textwrap.dedent(EXTENSION))
    return {"base": base, "root": root, "outside": outside, "ext": ext}


@pytest.fixture(scope="module")
def confined(layout: dict[str, Path]) -> Iterator[flight.LocalCluster]:
    """One worker reading under ``root`` only, with the ``confine.lines`` extension reader."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(layout["ext"]), os.environ.get("PYTHONPATH")])))
        cluster = flight.LocalCluster(1, extensions=["confine_ext"], data_roots=[layout["root"]]).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def run(cluster: flight.LocalCluster, reader: str, schema: pa.Schema, *paths: str | os.PathLike[str]) -> pa.Table:
    return flight.DistributedExec(flight.from_feed(Units(*paths), reader, schema), cluster.urls).to_table()


def failure(cluster: flight.LocalCluster, reader: str, schema: pa.Schema, path: str | os.PathLike[str]) -> WorkerError:
    with pytest.raises(WorkerError) as raised:
        run(cluster, reader, schema, path)
    wait_until(lambda: running_tasks(cluster.urls) == 0, 5.0, "the failed task to be freed")
    return raised.value


def refusal(err: WorkerError) -> str:
    """The worker's message from the unit on, with the (random) feed id masked."""
    text = err.cause
    assert "work unit 0" in text, text
    return re.sub(r"feed '[^']*'", "feed 'F'", text[text.index("work unit 0"):])


# ----------------------------------------------------------------- on real workers


def test_files_inside_a_root_read_as_before(confined: flight.LocalCluster, layout: dict[str, Path]) -> None:
    root = layout["root"]
    expected = make_table(300)
    assert sorted_table(run(confined, "parquet", PARQUET_SCHEMA, root / "in.parquet")).equals(sorted_table(expected))
    assert run(confined, "parquet", PARQUET_SCHEMA, root / "link-in.parquet").num_rows == 300
    assert run(confined, "parquet", PARQUET_SCHEMA, root / "sub" / ".." / "in.parquet").num_rows == 300  # '..' that stays inside
    assert run(confined, "ipc", PARQUET_SCHEMA, root / "in.arrow").num_rows == 300
    csv_schema = pa.schema([("id", pa.int64()), ("qty", pa.float64())])
    assert run(confined, "csv", csv_schema, root / "in.csv").num_rows == 300
    assert run(confined, "confine.lines", TEXT_SCHEMA, root / "notes.txt").column("line").to_pylist() == ["first", "second"]


def test_paths_outside_the_roots_are_refused_alike_whether_or_not_they_exist(
    confined: flight.LocalCluster, layout: dict[str, Path]
) -> None:
    root, outside, base = layout["root"], layout["outside"], layout["base"]
    cases = {
        "absolute, exists": outside / "secret.parquet",
        "absolute, missing": outside / "no-such.parquet",
        "missing directory": base / "nowhere" / "x.parquet",
        "mode 0600 key file": outside / "id_ed25519",
        "'..' escaping, exists": f"{root}/../outside/secret.parquet",
        "'..' escaping, missing": f"{root}/../outside/no-such.parquet",
        "symlink leading out": root / "link-out.parquet",
        "dangling symlink leading out": root / "dangling.parquet",
        "through a symlinked directory": root / "dir-out" / "secret.parquet",
        "string prefix of the root": base / "root-sibling" / "x.parquet",
        "the root's parent": base,
    }
    messages = {}
    for name, path in cases.items():
        err = failure(confined, "parquet", PARQUET_SCHEMA, path)
        messages[name] = refusal(err)
        text = str(err)
        assert str(outside) not in text and "secret" not in text and "no-such" not in text, (name, text)
        assert "No such file" not in text and "no such file" not in text, (name, text)
    assert set(messages.values()) == {f"work unit 0 of feed 'F' partition 0: {REFUSED}"}, messages


def test_etc_passwd_through_the_csv_reader_is_refused(confined: flight.LocalCluster) -> None:
    err = failure(confined, "csv", pa.schema([("root:x:0:0:root:/root:/bin/bash", pa.string())]), "/etc/passwd")
    assert refusal(err) == f"work unit 0 of feed 'F' partition 0: {REFUSED}"
    assert "/bin/bash" not in err.cause and "root:x" not in err.cause


def test_a_relative_path_is_refused(confined: flight.LocalCluster) -> None:
    err = failure(confined, "parquet", PARQUET_SCHEMA, "in.parquet")
    assert refusal(err) == f"work unit 0 of feed 'F' partition 0: {REFUSED_RELATIVE}"


def test_an_extension_reader_using_the_helper_is_refused_the_same_way(
    confined: flight.LocalCluster, layout: dict[str, Path]
) -> None:
    root, outside = layout["root"], layout["outside"]
    for path in (outside / "secret.txt", outside / "missing.txt", root / "link-out.txt", f"{root}/../outside/secret.txt"):
        err = failure(confined, "confine.lines", TEXT_SCHEMA, path)
        assert refusal(err) == f"work unit 0 of feed 'F' partition 0: {REFUSED}", path
        assert "the secret" not in str(err)


def test_a_garbage_ipc_file_fails_without_quoting_its_bytes(confined: flight.LocalCluster, layout: dict[str, Path]) -> None:
    err = failure(confined, "ipc", PARQUET_SCHEMA, layout["root"] / "garbage.arrow")
    text = str(err)
    assert "work unit 0" in text and "garbage.arrow" in text and "not a valid Arrow IPC file" in text, text
    assert "SECRET" not in text
    # pyarrow's own message reads the first bytes as a length: "Expected to read 1380140371 metadata bytes".
    for n in (int.from_bytes(GARBAGE[i : i + 4], "little") for i in range(0, 16, 4)):
        assert str(n) not in text, text


def test_csv_errors_do_not_quote_the_row_or_value(confined: flight.LocalCluster, layout: dict[str, Path]) -> None:
    schema = pa.schema([("id", pa.int64()), ("qty", pa.float64())])
    for name, why in (("bad.csv", "a row does not parse"), ("bad-value.csv", "a value in column #0 does not convert")):
        err = failure(confined, "csv", schema, layout["root"] / name)
        assert why in str(err) and "SECRET" not in str(err), str(err)


def test_a_missing_file_inside_a_root_is_named(confined: flight.LocalCluster, layout: dict[str, Path]) -> None:
    err = failure(confined, "parquet", PARQUET_SCHEMA, layout["root"] / "gone.parquet")
    assert "gone.parquet" in err.cause and "no such file" in err.cause and "path refused" not in err.cause


def test_a_worker_without_roots_refuses_every_path(layout: dict[str, Path]) -> None:
    with flight.LocalCluster(1) as bare:
        err = failure(bare, "parquet", PARQUET_SCHEMA, layout["root"] / "in.parquet")
        assert refusal(err) == f"work unit 0 of feed 'F' partition 0: {REFUSED}"
        # Readers that open no files still work.
        assert flight.DistributedExec(flight.units(Bodies(b"a", b"b")), bare.urls).to_table().num_rows == 2


def test_a_data_root_that_is_not_a_directory_stops_the_worker_at_start(tmp_path: Path) -> None:
    (tmp_path / "file.txt").write_text("x")
    bads = (tmp_path / "missing", tmp_path / "file.txt")
    # Both workers start at once: each spends its seconds importing before it parses its flags.
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "flight.worker", "--port", "0", "--data-root", str(tmp_path), "--data-root", str(bad)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for bad in bads
    ]
    try:
        outputs = [proc.communicate(timeout=60) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    for bad, proc, (stdout, stderr) in zip(bads, procs, outputs):
        assert proc.returncode == 2 and stdout == "", (proc.returncode, stdout)
        assert f"--data-root: data root {str(bad)!r} is not an existing directory" in stderr, stderr


# ----------------------------------------------------------------- the helper itself


def test_data_roots_resolve_and_compare_by_component(layout: dict[str, Path]) -> None:
    root, base = layout["root"], layout["base"]
    roots = DataRoots.of([root, f"{root}/../root", root / "dir-out"])  # duplicates and symlinks resolved
    assert roots.paths == (os.path.realpath(root), os.path.realpath(layout["outside"]))
    only = DataRoots.of([root])
    assert only.check(root / "in.parquet") == os.path.realpath(root / "in.parquet")
    assert only.check(root / "link-in.parquet") == os.path.realpath(root / "in.parquet")
    assert only.check(root / "not-yet.parquet") == os.path.realpath(root / "not-yet.parquet")
    for path in (base / "root-sibling" / "x.parquet", root / "link-out.parquet", f"{root}/../outside/x", "/etc/passwd", f"{root}/a\0b"):
        with pytest.raises(PathRefused) as raised:
            only.check(path)
        assert str(raised.value) == REFUSED
    for path in ("in.parquet", "./in.parquet", "", "\0", b"/etc/passwd"):
        with pytest.raises(PathRefused, match=re.escape("path refused")):
            only.check(path)  # type: ignore[arg-type]
    assert DataRoots.of(["/"]).check("/etc/passwd") == "/etc/passwd"
    assert issubclass(PathRefused, UnitReadError)  # fails a task cleanly wherever UnitReadError is handled


def test_no_roots_refuse_and_any_path_checks_nothing(layout: dict[str, Path]) -> None:
    with pytest.raises(PathRefused, match=re.escape(REFUSED)):
        NO_ROOTS.check(layout["root"] / "in.parquet")
    assert not NO_ROOTS and ANY_PATH and DataRoots.of([layout["root"]])
    assert ANY_PATH.check("relative/x") == "relative/x"
    ctx = ReaderContext(schema=PARQUET_SCHEMA)
    assert ctx.roots is NO_ROOTS
    with pytest.raises(PathRefused):
        ctx.open_path("/etc/passwd")
    with pytest.raises(ValueError, match="is not an existing directory"):
        DataRoots.of([layout["root"] / "in.parquet"])


def test_run_local_reads_anywhere_unless_given_roots(layout: dict[str, Path]) -> None:
    secret = layout["outside"] / "secret.parquet"
    q = flight.from_feed(Units(secret), "parquet", PARQUET_SCHEMA)
    assert flight.run_local(q).read_all().num_rows == 300  # the caller's own process and permissions
    with pytest.raises(PathRefused, match=re.escape(REFUSED)):
        flight.run_local(q, data_roots=[layout["root"]]).read_all()
    inside = flight.from_feed(Units(layout["root"] / "in.parquet"), "parquet", PARQUET_SCHEMA).filter(flight.col("id") < 10)
    assert flight.run_local(inside, data_roots=[layout["root"]]).read_all().num_rows == 10
