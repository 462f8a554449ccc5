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
server): the cost of TLS + auth on transport. The raw server runs a second time
with TLS beside it, so that TLS's own price on these cores shows apart from
flight-exec's: ``transport_ratio_raw_tls`` (raw with TLS / raw plaintext: the most a
secured flight-exec could reach) and ``transport_ratio_secure_vs_raw_tls``.

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
def raw_server(files: list[Path], timeout: float = 30.0, tls: tuple[Path, Path] | None = None) -> Iterator[str]:
    """Start ``_raw_server.py`` on ``files`` (with ``tls``: its certificate and key files); yield its URL;
    closing its stdin stops it."""
    tls_args = ["--tls", str(tls[0]), str(tls[1])] if tls else []
    proc = subprocess.Popen([sys.executable, str(RAW_SERVER), *tls_args, *map(str, files)],
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


def run_raw(url: str, streams: int, compression: str, ca: bytes | None = None) -> tuple[int, int]:
    """(rows, Arrow bytes) of ``streams`` concurrent DoGets, one shard each, from one client (``ca``: the TLS root)."""
    client = fl.FlightClient(url, tls_root_certs=ca) if ca else fl.FlightClient(url)
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

    log(f"starting LocalCluster({args.workers}){' twice (plain and secure)' if args.secure else ''} and the raw server")
    data_roots = sorted({str(f.parent) for f in files})
    times: dict[str, list[float]] = {}
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(flight.LocalCluster(args.workers, data_roots=data_roots))
        raw_url = stack.enter_context(raw_server(files))
        sides: dict[str, Callable[[], tuple[int, int]]] = {
            "flight-exec": lambda: run_flight_exec(cluster.urls, files, args.compression),
            "raw": lambda: run_raw(raw_url, args.workers, args.compression),
        }
        if args.secure:
            secure = stack.enter_context(flight.LocalCluster(args.workers, data_roots=data_roots, secure=True))
            tls_url, ca = stack.enter_context(raw_tls_server(files))
            sides["secure"] = lambda: run_flight_exec(secure.urls, files, args.compression, secure.security)
            sides["raw tls"] = lambda: run_raw(tls_url, args.workers, args.compression, ca)
        if args.no_checksum_too:
            sides["without checksum"] = lambda: run_flight_exec(cluster.urls, files, args.compression, checksums=False)
        for name, side in sides.items():
            timed(side, rows, name)  # warm-up: page cache, connections, imports
        for i in range(args.runs):
            for name, side in sides.items():
                times.setdefault(name, []).append(timed(side, rows, name)[0])
            log(f"run {i + 1}/{args.runs}: " + ", ".join(f"{name} {t[-1]:.3f}s" for name, t in times.items()))
    report(times, size, args.runs)
    return 0


def report(times: dict[str, list[float]], size: int, runs: int) -> None:
    """Throughputs, then the ratios (``transport_ratio`` first: the line the runner reads)."""
    mbs = {name: size / 1e6 / statistics.median(t) for name, t in times.items()}
    notes = {"secure": "; TLS + token", "raw tls": "; pyarrow alone, TLS"}
    for name, t in times.items():
        print(f"{name + ':':17s} {mbs[name]:8.0f} MB/s  (median {statistics.median(t):.3f}s of {runs}{notes.get(name, '')})")
    print(f"transport_ratio: {mbs['flight-exec'] / mbs['raw']:.2f}")
    if "secure" in mbs:
        print(f"transport_ratio_secure: {mbs['secure'] / mbs['raw']:.2f}")
        # TLS's own price on these cores: the most a secured flight-exec could reach against plaintext.
        print(f"transport_ratio_raw_tls: {mbs['raw tls'] / mbs['raw']:.2f}")
        print(f"transport_ratio_secure_vs_raw_tls: {mbs['secure'] / mbs['raw tls']:.2f}")
    if "without checksum" in mbs:
        print(f"transport_ratio_no_checksum: {mbs['without checksum'] / mbs['raw']:.2f}")


@contextmanager
def raw_tls_server(files: list[Path]) -> Iterator[tuple[str, bytes]]:
    """The raw server with TLS, a throw-away certificate for 127.0.0.1 (``trustme``, as ``LocalCluster(secure=True)``);
    yields its URL and the CA to trust."""
    import tempfile

    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    with tempfile.TemporaryDirectory() as d:
        cert_file, key_file = Path(d) / "cert.pem", Path(d) / "key.pem"
        cert_file.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
        key_file.write_bytes(cert.private_key_pem.bytes())
        with raw_server(files, tls=(cert_file, key_file)) as url:
            yield url, ca.cert_pem.bytes()


if __name__ == "__main__":
    sys.exit(main())
