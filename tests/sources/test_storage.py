"""Object storage: work units that name s3:// URIs, read by real workers from a real S3 server.

The server is moto's standalone server on loopback (``benchmarks/local_s3.py``); the
workers reach it through their own configuration (``--fs-option``, credentials in their
environment), the coordinator through ``flight.configure_storage``. Answers are
compared with DuckDB's over the local copies of the same files.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from support import tpch_test_files, wait_until

import flight
from benchmarks.local_s3 import SECRET_KEY, LocalS3, local_s3
from benchmarks.tpch_queries import ORDERED, TABLES, compare, duckdb_answer, query
from flight.engine.confine import DataRoots
from flight.errors import PermissionDeniedError, TaskFailedError, UnitReadError
from flight.sources.feed import FeedContext, file_unit
from flight.sources.providers import FileListProvider
from flight.sources.storage import FileSystems, Location, configure_storage, load_options, parse_location, set_filesystems

pytest.importorskip("moto", reason="the object-storage tests need moto (the dev extra)")

BUCKET = "flight-storage-tests"
SF = 0.05


@pytest.fixture(scope="module")
def s3() -> Iterator[LocalS3]:
    with local_s3() as server:
        server.bucket(BUCKET)
        # This process (the coordinator) reaches the store with options of its own.
        configure_storage({**server.fs_options, "s3.access_key": "flight-test-access", "s3.secret_key": SECRET_KEY})
        try:
            yield server
        finally:
            set_filesystems(FileSystems())


@pytest.fixture(scope="module")
def local_files() -> dict[str, list[Path]]:
    return tpch_test_files(SF)


@pytest.fixture(scope="module")
def s3_files(s3: LocalS3, local_files: dict[str, list[Path]]) -> dict[str, list[str]]:
    return {t: s3.upload(local_files[t], f"{BUCKET}/tpch/{t}") for t in TABLES}


@pytest.fixture(scope="module")
def s3_cluster(s3: LocalS3) -> Iterator[flight.LocalCluster]:
    roots = [f"s3://{BUCKET}/tpch", f"s3://{BUCKET}/misc", "s3://flight-no-such-bucket"]
    with flight.LocalCluster(2, data_roots=roots, fs_options=s3.fs_options, env=s3.env) as cluster:
        yield cluster


@pytest.mark.parametrize("n", [1, 3, 6], ids=lambda n: f"q{n}")
def test_tpch_queries_read_from_s3_match_duckdb_over_the_local_copies(
    n: int, s3_files: dict[str, list[str]], local_files: dict[str, list[Path]], s3_cluster: flight.LocalCluster
) -> None:
    got = flight.DistributedExec(query(n, s3_files), s3_cluster.urls).to_table()  # type: ignore[arg-type]
    difference = compare(got, duckdb_answer(n, local_files), ORDERED.get(n))
    assert difference is None, f"TPC-H Q{n} from S3 differs from DuckDB over the local files: {difference}"


def test_ipc_and_csv_units_are_read_from_s3(s3: LocalS3, s3_cluster: flight.LocalCluster, tmp_path: Path) -> None:
    table = pa.table({"id": pa.array(range(1000), pa.int64()), "name": pa.array([f"n{i % 7}" for i in range(1000)])})
    with pa.OSFile(str(tmp_path / "t.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=300)
    pacsv.write_csv(table, tmp_path / "t.csv")
    ipc_uri, csv_uri = s3.upload([tmp_path / "t.arrow", tmp_path / "t.csv"], f"{BUCKET}/misc")
    got = flight.DistributedExec(flight.read_ipc([ipc_uri]), s3_cluster.urls).to_table()
    assert got.sort_by("id").equals(table)
    csv = flight.from_feed(FileListProvider([csv_uri]), "csv", table.schema)
    assert flight.DistributedExec(csv, s3_cluster.urls).to_table().sort_by("id").equals(table)


@pytest.mark.parametrize(
    "uri",
    [f"s3://{BUCKET}/elsewhere/x.parquet", f"s3://{BUCKET}/tpch2/x.parquet", "s3://another-bucket/tpch/x.parquet", "/etc/passwd"],
    ids=["other-prefix", "sibling-prefix", "other-bucket", "local-path"],
)
def test_a_file_outside_the_store_roots_is_refused(uri: str, s3_cluster: flight.LocalCluster) -> None:
    scan = flight.read_parquet([uri], schema=pa.schema([("a", pa.int64())]))
    with pytest.raises(PermissionDeniedError, match="rule: data roots"):
        flight.DistributedExec(scan, s3_cluster.urls).to_table()


@pytest.mark.parametrize(
    "uri, why",
    [
        (f"s3://AKIDLEAK:{SECRET_KEY}@{BUCKET}/tpch/x.parquet", "may not carry credentials"),
        (f"s3://{BUCKET}/tpch/x.parquet?endpoint_override=127.0.0.1:1", "may not carry options"),
        (f"s3://{BUCKET}/tpch/../misc/x.parquet", "'..' are not allowed"),
        ("ftp://host/tpch/x.parquet", "not one this worker reads"),
    ],
    ids=["credentials", "options", "dot-dot", "scheme"],
)
def test_a_uri_a_worker_will_not_open_is_refused_without_echoing_secrets(uri: str, why: str, s3_cluster: flight.LocalCluster) -> None:
    scan = flight.from_feed(FileListProvider([uri]), "parquet", pa.schema([("a", pa.int64())]))
    with pytest.raises(TaskFailedError, match=why) as info:
        flight.DistributedExec(scan, s3_cluster.urls).to_table()
    assert SECRET_KEY not in str(info.value)


@pytest.mark.parametrize(
    "uri, why",
    [(f"s3://{BUCKET}/tpch/missing.parquet", "no such object"), ("s3://flight-no-such-bucket/x.parquet", "no such object")],
    ids=["object", "bucket"],
)
def test_a_missing_object_or_bucket_is_named(uri: str, why: str, s3_cluster: flight.LocalCluster) -> None:
    scan = flight.read_parquet([uri], schema=pa.schema([("a", pa.int64())]))
    with pytest.raises(TaskFailedError, match=why) as info:
        flight.DistributedExec(scan, s3_cluster.urls).to_table()
    assert uri in str(info.value) and SECRET_KEY not in str(info.value)


def test_an_unreachable_store_is_a_clear_error_and_says_what_to_check(s3: LocalS3, s3_files: dict[str, list[str]]) -> None:
    closed = {**s3.fs_options, "s3.endpoint_override": "127.0.0.1:9", "s3.max_attempts": "1"}  # the discard port: nothing listens
    with flight.LocalCluster(1, data_roots=[f"s3://{BUCKET}/tpch"], fs_options=closed, env=s3.env) as cluster:
        scan = flight.read_parquet(s3_files["nation"])
        with pytest.raises(TaskFailedError, match="did not answer: check the worker's endpoint") as info:
            flight.DistributedExec(scan, cluster.urls).to_table()
    assert SECRET_KEY not in str(info.value)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def s3_with_auth() -> Iterator[str]:
    """moto's server in its own process, checking credentials (none are valid): its ``host:port``."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "0"}
    cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: _listening(port), timeout=30.0, what="moto's server to listen")
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize(
    "env, why",
    [
        ({"AWS_EC2_METADATA_DISABLED": "true"}, "this worker has no S3 credentials: set AWS_ACCESS_KEY_ID"),
        ({"AWS_ACCESS_KEY_ID": "nobody", "AWS_SECRET_ACCESS_KEY": "wrong-secret-never-shown"}, "access denied: check the worker's credentials"),
    ],
    ids=["missing", "wrong"],
)
def test_missing_or_wrong_credentials_are_named_as_such(env: dict[str, str], why: str, tmp_path: Path) -> None:
    env = {**env, "HOME": str(tmp_path)}  # no ~/.aws/credentials of the machine's
    with s3_with_auth() as endpoint:
        options = {"s3.endpoint_override": endpoint, "s3.scheme": "http", "s3.region": "us-east-1", "s3.max_attempts": "1"}
        with flight.LocalCluster(1, data_roots=["s3://locked/data"], fs_options=options, env=env) as cluster:
            scan = flight.read_parquet(["s3://locked/data/x.parquet"], schema=pa.schema([("a", pa.int64())]))
            with pytest.raises(TaskFailedError, match=why) as info:
                flight.DistributedExec(scan, cluster.urls).to_table()
    assert "s3://locked/data/x.parquet" in str(info.value) and "wrong-secret" not in str(info.value)


def test_credentials_reach_no_plan_unit_or_explain(s3_files: dict[str, list[str]], s3_cluster: flight.LocalCluster) -> None:
    ex = flight.DistributedExec(query(6, s3_files), s3_cluster.urls)  # type: ignore[arg-type]
    ex.to_table()
    assert SECRET_KEY not in ex.explain(analyze=True)
    for stage in ex.plan.stages:
        assert SECRET_KEY.encode() not in stage.root.to_proto().SerializeToString()
    units = [file_unit(u).SerializeToString() for u in s3_files["lineitem"]]
    assert all(SECRET_KEY.encode() not in u for u in units)


def test_a_workers_log_never_shows_its_store_secret(s3: LocalS3, s3_files: dict[str, list[str]]) -> None:
    """The secret on the worker's own command line (the least safe place) still reaches no log line."""
    options = [f"--fs-option={k}={v}" for k, v in s3.fs_options.items()]
    cmd = [sys.executable, "-m", "flight.worker", "--port", "0", "--log-level", "DEBUG", "--data-root", f"s3://{BUCKET}/tpch",
           *options, "--fs-option", "s3.access_key=flight-test-access", "--fs-option", f"s3.secret_key={SECRET_KEY}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split(" on ")[-1].strip()
        assert flight.DistributedExec(flight.read_parquet(s3_files["nation"]), [url]).to_table().num_rows == 25
        with pytest.raises(TaskFailedError):
            missing = flight.read_parquet([f"s3://{BUCKET}/tpch/gone.parquet"], schema=pa.schema([("a", pa.int64())]))
            flight.DistributedExec(missing, [url]).to_table()
    finally:
        proc.terminate()
        _, log = proc.communicate(timeout=30)
    assert "s3.secret_key=***" in log and SECRET_KEY not in log


def test_a_worker_configuration_is_described_with_its_secrets_masked() -> None:
    shown = FileSystems({"s3.region": "eu-west-1", "s3.secret_key": SECRET_KEY, "s3.access_key": "AKID"}).describe()
    assert "s3.region=eu-west-1" in shown and SECRET_KEY not in shown and "AKID" not in shown


# ---------------------------------------------------------------- listing a prefix as the query runs

LISTED = 200


@pytest.fixture(scope="module")
def listed_prefix(s3: LocalS3, tmp_path_factory: pytest.TempPathFactory) -> str:
    """200 small Parquet objects under one prefix (ids 10*i .. 10*i+9), and one that is not Parquet."""
    local = tmp_path_factory.mktemp("listed")
    for i in range(LISTED):
        pq.write_table(pa.table({"id": pa.array(range(10 * i, 10 * i + 10), pa.int64())}), local / f"part-{i:04d}.parquet")
    (local / "_SUCCESS").write_bytes(b"")
    s3.upload(sorted(local.iterdir()), f"{BUCKET}/misc/listed")
    return f"s3://{BUCKET}/misc/listed/"


class PausedListing(flight.ListingProvider):
    """Lists as ``ListingProvider`` does, but waits after its first page until ``go`` is set."""

    def __init__(self, prefix: str, go: threading.Event) -> None:
        super().__init__(prefix, "*.parquet", page_size=20)
        self.go = go
        self.pages_when_rows_arrived: int | None = None

    def files(self) -> Iterator[tuple[str, int]]:
        for path, size in super().files():
            if self.pages > 1:
                self.go.wait(60)
            yield path, size


@pytest.mark.slow
def test_a_prefix_is_listed_page_by_page_and_rows_arrive_before_the_listing_ends(
    listed_prefix: str, s3_cluster: flight.LocalCluster
) -> None:
    go = threading.Event()
    listing = PausedListing(listed_prefix, go)
    scan = flight.read_parquet(listing, schema=pa.schema([("id", pa.int64())]))
    reader = flight.DistributedExec(scan, s3_cluster.urls).execute()
    first = reader.read_next_batch()  # the listing is held after its first page of 20 keys
    assert first.num_rows > 0 and listing.pages == 2, "rows arrived only after the listing went on"
    go.set()
    ids = pa.Table.from_batches([first, *reader])["id"]
    assert sorted(ids.to_pylist()) == list(range(10 * LISTED))  # every object once; _SUCCESS left out
    assert listing.pages == 11  # 201 keys in pages of 20


@pytest.mark.slow
def test_read_parquet_of_a_prefix_lists_it_and_reads_the_first_file_for_its_schema(
    listed_prefix: str, s3_cluster: flight.LocalCluster
) -> None:
    scan = flight.read_parquet(listed_prefix)
    assert scan.schema.names == ["id"]
    got = flight.DistributedExec(scan.filter(flight.col("id") < 25), s3_cluster.urls).to_table()
    assert sorted(got["id"].to_pylist()) == list(range(25))
    with pytest.raises(flight.PlanError, match="no file under"):
        flight.read_parquet(f"s3://{BUCKET}/misc/nothing-here/")


class VanishingListing(flight.ListingProvider):
    """Lists as ``ListingProvider`` does, and deletes one object from the store just after listing it."""

    def __init__(self, prefix: str, victim: str, fs: pafs.FileSystem) -> None:
        super().__init__(prefix, "*.parquet")
        self.victim, self.fs = victim, fs

    def files(self) -> Iterator[tuple[str, int]]:
        for path, size in super().files():
            if path == self.victim:
                self.fs.delete_file(path.removeprefix("s3://"))
            yield path, size


def test_an_object_that_vanished_after_it_was_listed_is_named(s3: LocalS3, s3_cluster: flight.LocalCluster, tmp_path: Path) -> None:
    for i in range(3):
        pq.write_table(pa.table({"id": [i]}), tmp_path / f"v{i}.parquet")
    uris = s3.upload(sorted(tmp_path.iterdir()), f"{BUCKET}/misc/vanishing")
    listing = VanishingListing(f"s3://{BUCKET}/misc/vanishing/", uris[1], s3.fs)
    scan = flight.read_parquet(listing, schema=pa.schema([("id", pa.int64())]))
    with pytest.raises(TaskFailedError, match="no such object") as info:
        flight.DistributedExec(scan, s3_cluster.urls).to_table()
    assert uris[1] in str(info.value) and SECRET_KEY not in str(info.value)


def test_a_local_directory_is_listed_the_same_way(tmp_path: Path) -> None:
    for i in range(3):
        (tmp_path / f"d{i}").mkdir()
        pq.write_table(pa.table({"x": [i]}), tmp_path / f"d{i}" / "f.parquet")
    listing = flight.ListingProvider(str(tmp_path), "*.parquet")
    assert [p for p, _ in listing.files()] == [str(tmp_path / f"d{i}" / "f.parquet") for i in range(3)]
    assert sorted(flight.run_local(flight.read_parquet(str(tmp_path))).read_all().column("x").to_pylist()) == [0, 1, 2]


def test_only_files_larger_than_a_size_are_split_into_row_group_units(tmp_path: Path) -> None:
    small, large = tmp_path / "small.parquet", tmp_path / "large.parquet"
    pq.write_table(pa.table({"x": list(range(100))}), small, row_group_size=10)
    pq.write_table(pa.table({"x": list(range(100, 100_100))}), large, row_group_size=10_000)
    threshold = (small.stat().st_size + large.stat().st_size) // 2
    ctx = FeedContext(query_id="q", feed_id="f", partition=0, partitions=1)

    def units(provider: flight.WorkUnitFeedProvider) -> list[tuple[str, list[int]]]:
        return [(u.path, list(u.row_groups)) for u in (getattr(x, "body", x) for x in provider.feed(0, ctx))]

    want = [(str(large), [g]) for g in range(10)] + [(str(small), [])]
    assert units(flight.ListingProvider(str(tmp_path), "*.parquet", split_row_groups=threshold)) == want
    assert units(FileListProvider([large, small], split_row_groups=threshold)) == want
    got = flight.run_local(flight.read_parquet(str(tmp_path), split_row_groups=threshold)).read_all()
    assert sorted(got["x"].to_pylist()) == sorted(pq.read_table(small)["x"].to_pylist() + pq.read_table(large)["x"].to_pylist())


# ---------------------------------------------------------------- without a server


@pytest.mark.parametrize(
    "text, expected",
    [
        ("s3://b/k/x.parquet", Location("s3", "b", "k/x.parquet")),
        ("s3://b//k/./x", None),
        ("gs://b/k", Location("gcs", "b", "k")),
        ("abfss://c@acct.dfs.core.windows.net/k", Location("abfs", "c@acct.dfs.core.windows.net", "k")),
        ("hdfs://nn:8020/data/x", Location("hdfs", "nn:8020", "data/x")),
        ("file:///tmp/x.parquet", "/tmp/x.parquet"),
        ("/tmp/x.parquet", "/tmp/x.parquet"),
    ],
)
def test_locations_are_parsed_and_normalized(text: str, expected: Location | str | None) -> None:
    if expected is None:
        with pytest.raises(UnitReadError, match="not allowed"):
            parse_location(text)
    else:
        assert parse_location(text) == expected


def test_a_store_root_admits_keys_under_it_by_components() -> None:
    roots = DataRoots.of(["s3://b/data", "s3://whole"])
    assert roots.locate("s3://b/data/x.parquet") == Location("s3", "b", "data/x.parquet")
    assert roots.locate("s3://whole/any/thing") == Location("s3", "whole", "any/thing")
    for refused in ("s3://b/data2/x", "s3://b/dat", "s3://c/data/x", "gs://b/data/x"):
        with pytest.raises(flight.UnitReadError, match="rule: data roots"):
            roots.locate(refused)


def test_filesystem_options_are_checked_when_the_worker_starts(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown filesystem option 's3\.endpoint'"):
        load_options(["s3.endpoint=x"])
    with pytest.raises(ValueError, match="must be true or false"):
        FileSystems({"s3.anonymous": "maybe"})
    config = tmp_path / "fs.json"
    config.write_text('{"s3.region": "eu-west-1", "s3.anonymous": true}')
    assert load_options(["s3.region=us-east-2"], config) == {"s3.region": "us-east-2", "s3.anonymous": "true"}
    bad = subprocess.run(
        [sys.executable, "-m", "flight.worker", "--port", "0", "--data-root", "s3://b/../x"], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "--data-root" in bad.stderr and "'..' are not allowed" in bad.stderr


def test_a_parquet_footer_is_read_through_the_coordinators_store(s3: LocalS3, s3_files: dict[str, list[str]]) -> None:
    """Planning reads schemas and row counts itself: through ``configure_storage``, not the workers."""
    scan = flight.read_parquet(s3_files["orders"])
    local = pq.read_schema(tpch_test_files(SF)["orders"][0])
    assert scan.schema.names == local.names
    assert FileListProvider(s3_files["orders"]).estimated_rows() == sum(
        pq.ParquetFile(f).metadata.num_rows for f in tpch_test_files(SF)["orders"]
    )
