"""Transport overhead: flight-exec streaming a table vs a plain pyarrow Flight server.

Both sides serve the same Arrow IPC files (TPC-H lineitem columns, ~300 MB in
Arrow memory at the default scale factor), memory-mapped, with no filter, to
the same client process:

* flight-exec: ``DistributedExec(read_ipc(files))`` on a ``LocalCluster`` of
  2 workers; each task reads half the files and the coordinator reads both
  tasks' ``DoGet`` streams;
* raw: ``_raw_server.py``, a tiny ``FlightServerBase`` in its own process,
  read with as many concurrent ``DoGet`` streams as there are workers, each
  serving the same round-robin half of the files.

Runs alternate (after one warm-up each) and the median counts. Throughput is
Arrow bytes received per second, from the first call to the last batch, so
flight-exec's task set-up is part of what it pays. The last line is
``transport_ratio: X`` = flight-exec throughput / raw throughput.

With ``--secure`` a second cluster runs beside the first, with TLS and a bearer
token (``LocalCluster(secure=True)``), in the same alternation; it adds the line
``transport_ratio_secure: X`` (secured flight-exec / the same plaintext raw
server): the cost of TLS + auth on transport.

With ``--no-checksum-too`` a third side runs the same cluster with the stream trailers' checksum
off (``ExecOptions.stream_checksums=False``, docs/protocol.md section 17), interleaved with the
others: ``transport_ratio_no_checksum: X`` beside ``transport_ratio`` is the checksum's cost.

    python benchmarks/micro/transport.py [--sf 0.5] [--runs 5] [--compression none|lz4|zstd] [--secure] [--no-checksum-too]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import selectors
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as fl
import pyarrow.parquet as pq

if __name__ == "__main__" and not __package__:
    # Run as `python benchmarks/micro/transport.py`: Python puts benchmarks/micro on sys.path, not
    # the repo root, and benchmarks/ is not an installed package; the root is needed for benchmarks.tpch.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import flight
from benchmarks.tpch import ensure_tpch, sf_dir, table_files

COLUMNS = ["l_orderkey", "l_linenumber", "l_quantity", "l_extendedprice", "l_discount", "l_shipdate", "l_shipmode", "l_comment"]
"""~103 bytes a row in Arrow memory: SF 0.5 (3M rows) makes ~310 MB."""
N_FILES = 8
BATCH_ROWS = 64 * 1024  # what the workers' own readers aim for
RAW_SERVER = Path(__file__).with_name("_raw_server.py")


def log(msg: str) -> None:
    print(f"[transport] {msg}", file=sys.stderr, flush=True)


def ipc_files(sf: float) -> list[Path]:
    """The lineitem columns as ``N_FILES`` Arrow IPC files with plain ``string``s, written once.

    ``string_view`` becomes ``string`` here so neither side pays a cast while streaming.
    """
    out = sf_dir(sf) / "transport-ipc"
    marker = out / ".complete"
    want = {"columns": COLUMNS, "files": N_FILES, "batch_rows": BATCH_ROWS}
    files = [out / f"part-{i}.arrow" for i in range(N_FILES)]
    if marker.exists() and json.loads(marker.read_text()) == want and all(f.exists() for f in files):
        return files
    root = ensure_tpch(sf, ("lineitem",))
    log(f"writing {N_FILES} Arrow IPC files to {out}")
    table = pa.concat_tables(pq.read_table(f, columns=COLUMNS) for f in table_files(root, "lineitem"))
    table = table.cast(pa.schema([f.with_type(pa.string()) if f.type == pa.string_view() else f for f in table.schema]))
    out.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)
    per_file = -(-table.num_rows // N_FILES)
    for i, path in enumerate(files):
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table.slice(i * per_file, per_file), max_chunksize=BATCH_ROWS)
    marker.write_text(json.dumps(want))
    return files


@contextmanager
def raw_server(files: list[Path], timeout: float = 30.0) -> Iterator[str]:
    """Start ``_raw_server.py`` on ``files``; yield its URL; closing its stdin stops it."""
    proc = subprocess.Popen([sys.executable, str(RAW_SERVER), *map(str, files)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            line = ""
            while time.monotonic() < deadline and proc.poll() is None:
                if sel.select(timeout=0.1):
                    line = proc.stdout.readline()
                    break
        if not line.startswith("raw-server listening on "):
            raise RuntimeError(f"the raw server did not start within {timeout:g}s (exit code {proc.poll()})")
        yield line.split()[-1]
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_flight_exec(
    urls: list[str], files: list[Path], compression: str, security: flight.Security | None = None, checksums: bool = True
) -> tuple[int, int]:
    """(rows, Arrow bytes) of one full scan through DistributedExec."""
    ex = flight.DistributedExec(flight.read_ipc(files), urls, compression=compression, security=security, stream_checksums=checksums)
    rows = nbytes = 0
    for batch in ex.execute():
        rows += batch.num_rows
        nbytes += batch.nbytes
    return rows, nbytes


def run_raw(url: str, streams: int, compression: str) -> tuple[int, int]:
    """(rows, Arrow bytes) of ``streams`` concurrent DoGets, one shard each, from one client."""
    client = fl.FlightClient(url)
    totals = [(0, 0)] * streams
    errors: list[BaseException] = []

    def read(shard: int) -> None:
        try:
            ticket = fl.Ticket(json.dumps({"shard": shard, "shards": streams, "compression": compression}))
            rows = nbytes = 0
            for chunk in client.do_get(ticket):
                rows += chunk.data.num_rows
                nbytes += chunk.data.nbytes
            totals[shard] = (rows, nbytes)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=read, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    client.close()
    if errors:
        raise errors[0]
    return sum(r for r, _ in totals), sum(b for _, b in totals)


def timed(fn: Callable[[], tuple[int, int]], expect_rows: int, label: str) -> tuple[float, int]:
    started = time.perf_counter()
    rows, nbytes = fn()
    elapsed = time.perf_counter() - started
    if rows != expect_rows:
        raise RuntimeError(f"{label} returned {rows} rows, not {expect_rows}")
    return elapsed, nbytes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sf", type=float, default=0.5, help="TPC-H scale factor (0.5: ~310 MB of Arrow data)")
    p.add_argument("--runs", type=int, default=7, help="timed runs of each side (median reported)")
    p.add_argument("--workers", type=int, default=2, help="flight-exec workers = raw concurrent streams")
    p.add_argument("--compression", choices=["none", "lz4", "zstd"], default="none")
    p.add_argument("--secure", action="store_true", help="also measure a cluster with TLS and a bearer token")
    p.add_argument("--no-checksum-too", action="store_true", help="also measure with the trailers' checksum off (stream_checksums=False)")
    args = p.parse_args(argv)

    files = ipc_files(args.sf)
    tables = [pa.ipc.open_file(pa.memory_map(str(f))).read_all() for f in files]
    rows, size = sum(t.num_rows for t in tables), sum(t.nbytes for t in tables)
    del tables
    print(f"data: lineitem SF {args.sf:g}, {len(COLUMNS)} columns, {rows:,} rows, "
          f"{size / 1e6:.0f} MB in Arrow memory, {len(files)} IPC files; compression {args.compression}")

    fe_times: list[float] = []
    sec_times: list[float] = []
    off_times: list[float] = []
    raw_times: list[float] = []
    log(f"starting LocalCluster({args.workers}){' twice (plain and secure)' if args.secure else ''} and the raw server")
    data_roots = sorted({str(f.parent) for f in files})
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(flight.LocalCluster(args.workers, data_roots=data_roots))
        secure = stack.enter_context(flight.LocalCluster(args.workers, data_roots=data_roots, secure=True)) if args.secure else None
        raw_url = stack.enter_context(raw_server(files))
        fe = lambda: run_flight_exec(cluster.urls, files, args.compression)  # noqa: E731
        raw = lambda: run_raw(raw_url, args.workers, args.compression)  # noqa: E731
        sec = (lambda: run_flight_exec(secure.urls, files, args.compression, secure.security)) if secure else None
        off = (lambda: run_flight_exec(cluster.urls, files, args.compression, checksums=False)) if args.no_checksum_too else None
        timed(fe, rows, "flight-exec")  # warm-up: page cache, connections, imports
        timed(raw, rows, "raw")
        if sec is not None:
            timed(sec, rows, "flight-exec secure")
        for i in range(args.runs):
            t_fe, _ = timed(fe, rows, "flight-exec")
            t_raw, _ = timed(raw, rows, "raw")
            fe_times.append(t_fe)
            raw_times.append(t_raw)
            extra = ""
            if sec is not None:
                t_sec, _ = timed(sec, rows, "flight-exec secure")
                sec_times.append(t_sec)
                extra = f", secure {t_sec:.3f}s"
            if off is not None:
                t_off, _ = timed(off, rows, "flight-exec without checksum")
                off_times.append(t_off)
                extra += f", without checksum {t_off:.3f}s"
            log(f"run {i + 1}/{args.runs}: flight-exec {t_fe:.3f}s, raw {t_raw:.3f}s{extra}")

    fe_mbs = size / 1e6 / statistics.median(fe_times)
    raw_mbs = size / 1e6 / statistics.median(raw_times)
    print(f"flight-exec: {fe_mbs:8.0f} MB/s  (median {statistics.median(fe_times):.3f}s of {args.runs})")
    if sec_times:
        sec_mbs = size / 1e6 / statistics.median(sec_times)
        print(f"secure:      {sec_mbs:8.0f} MB/s  (median {statistics.median(sec_times):.3f}s of {args.runs}; TLS + token)")
    print(f"raw flight:  {raw_mbs:8.0f} MB/s  (median {statistics.median(raw_times):.3f}s of {args.runs})")
    print(f"transport_ratio: {fe_mbs / raw_mbs:.2f}")
    if sec_times:
        print(f"transport_ratio_secure: {sec_mbs / raw_mbs:.2f}")
    if off_times:
        off_mbs = size / 1e6 / statistics.median(off_times)
        print(f"transport_ratio_no_checksum: {off_mbs / raw_mbs:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
