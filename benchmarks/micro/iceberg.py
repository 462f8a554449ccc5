"""Iceberg discovery: a scan whose plan is streamed a manifest at a time ÷ planned up front.

Why: ``read_iceberg`` plans each data manifest on its own and sends its files before the
next manifest is read (docs/storage.md, "Iceberg"); ``pyiceberg``'s ``plan_files`` reads
every manifest first. This measures what the first rows wait for, in one run.

Setup: a table in ``pyiceberg``'s SQL catalog (SQLite) with its warehouse in moto's S3
server on loopback (``--local``: a directory), written in ``--appends`` appends of
``--partitions`` identity partitions each (one data file per partition and append, one
manifest per append: ``--appends`` × ``--partitions`` files); two workers. Each mode runs
``--runs`` times, alternating, after a warm-up; the row count is checked against
``pyiceberg``'s. Prints the medians of time to first batch and total time, and the last
line ``iceberg_first_batch_ratio: X`` (streamed ÷ up front; below 1 is better).

    python -m benchmarks.micro.iceberg [--appends 50] [--partitions 10] [--runs 3] [--local]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __name__ == "__main__" and not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pyarrow as pa

import flight
from benchmarks.local_s3 import ACCESS_KEY, SECRET_KEY, local_s3
from flight.tables.iceberg import ICEBERG_READER, IcebergProvider

BUCKET = "flight-bench-iceberg"


def _table(warehouse: str, root: Path, props: dict[str, str], appends: int, partitions: int) -> object:
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import IdentityTransform
    from pyiceberg.types import LongType, NestedField, StringType

    catalog = SqlCatalog("bench", uri=f"sqlite:///{root}/catalog.db", warehouse=warehouse, **props)
    catalog.create_namespace("db")
    schema = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "part", StringType(), required=False))
    spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="part"))
    table = catalog.create_table("db.t", schema=schema, partition_spec=spec)
    for a in range(appends):
        ids = list(range(a * 1000, a * 1000 + 1000))
        table.append(pa.table({"id": pa.array(ids, pa.int64()), "part": pa.array([f"p{i % partitions}" for i in ids])}))
    return table


def _run(table: object, stream: bool, urls: list[str], schema: pa.Schema) -> tuple[float, float, int]:
    provider = IcebergProvider(table, stream_manifests=stream)
    ids = {"id": 1, "part": 2}
    query = flight.from_feed(provider, ICEBERG_READER, schema, options={"field_ids": json.dumps(ids)})
    started = time.perf_counter()
    reader = flight.DistributedExec(query, urls).execute()
    first = reader.read_next_batch()
    first_s = time.perf_counter() - started
    rows = first.num_rows + sum(b.num_rows for b in reader)
    return first_s, time.perf_counter() - started, rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--appends", type=int, default=50)
    p.add_argument("--partitions", type=int, default=10)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--local", action="store_true", help="the warehouse in a local directory, not the S3 server")
    args = p.parse_args(argv)
    schema = pa.schema([("id", pa.int64()), ("part", pa.string())])
    with tempfile.TemporaryDirectory(prefix="flight-iceberg-") as tmp, local_s3() as s3:
        root = Path(tmp)
        if args.local:
            warehouse, props, roots, cluster_kw = f"file://{root}/wh", {}, [str(root / "wh")], {}
            (root / "wh").mkdir()
        else:
            s3.bucket(BUCKET)
            warehouse = f"s3://{BUCKET}/wh"
            props = {"s3.endpoint": f"http://{s3.endpoint}", "s3.access-key-id": ACCESS_KEY,
                     "s3.secret-access-key": SECRET_KEY, "s3.region": "us-east-1"}
            roots, cluster_kw = [warehouse], {"fs_options": s3.fs_options, "env": s3.env}
        started = time.perf_counter()
        table = _table(warehouse, root, props, args.appends, args.partitions)
        expected = args.appends * 1000
        print(f"{args.appends * args.partitions} data files in {args.appends} manifests "
              f"({'local' if args.local else 'S3 on loopback'}), written in {time.perf_counter() - started:.1f}s; 2 workers")
        with flight.LocalCluster(2, data_roots=roots, **cluster_kw) as cluster:  # type: ignore[arg-type]
            firsts: dict[bool, list[float]] = {True: [], False: []}
            totals: dict[bool, list[float]] = {True: [], False: []}
            ok = True
            for stream in (True, False):
                _run(table, stream, cluster.urls, schema)
            for _ in range(args.runs):
                for stream in (True, False):
                    first, total, rows = _run(table, stream, cluster.urls, schema)
                    firsts[stream].append(first)
                    totals[stream].append(total)
                    ok &= rows == expected
            print(f"{'plan':>9} {'first batch s':>14} {'total s':>8}")
            for stream, name in ((True, "streamed"), (False, "up front")):
                print(f"{name:>9} {statistics.median(firsts[stream]):>14.3f} {statistics.median(totals[stream]):>8.3f}")
    print(f"rows: {'all ' + str(expected) if ok else 'WRONG'}")
    print(f"iceberg_first_batch_ratio: {statistics.median(firsts[True]) / statistics.median(firsts[False]):.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
