"""The baseline of ``transport.py``: a plain pyarrow Flight server, nothing of flight-exec.

Usage: ``python benchmarks/micro/_raw_server.py [--tls CERT KEY] FILE.arrow...``. It memory-maps
the Arrow IPC files (as flight-exec's workers do), prints
``raw-server listening on grpc://HOST:PORT`` once it accepts calls, and serves
``DoGet`` with a JSON ticket ``{"shard": i, "shards": n, "compression": c}``:
the batches of files ``i, i+n, i+2n, ...`` (the round-robin that flight-exec's
``FileListProvider`` uses), IPC-compressed with ``c``. The stream is written by
pyarrow's C++ ``RecordBatchStream``, so this is the transport at its fastest.
It stops when its stdin closes, so it never outlives the benchmark. With ``--tls`` it serves
``grpc+tls://`` with that certificate and key (PEM files): TLS at pyarrow's own cost, the
baseline of a secured flight-exec.
"""

from __future__ import annotations

import json
import sys

import pyarrow as pa
import pyarrow.flight as fl


class RawServer(fl.FlightServerBase):
    """Serves shards of a fixed list of memory-mapped Arrow IPC files."""

    def __init__(self, files: list[str], tls: tuple[bytes, bytes] | None = None) -> None:
        if tls is None:
            super().__init__("grpc://127.0.0.1:0")
        else:
            super().__init__("grpc+tls://127.0.0.1:0", tls_certificates=[fl.CertKeyPair(*tls)])
        self.scheme = "grpc" if tls is None else "grpc+tls"
        self.tables = [pa.ipc.open_file(pa.memory_map(f)).read_all() for f in files]

    def do_get(self, context: fl.ServerCallContext, ticket: fl.Ticket) -> fl.FlightDataStream:
        spec = json.loads(ticket.ticket)
        shard = self.tables[spec["shard"]::spec["shards"]]
        table = pa.concat_tables(shard) if shard else self.tables[0].schema.empty_table()
        codec = None if spec.get("compression", "none") == "none" else spec["compression"]
        return fl.RecordBatchStream(table, options=pa.ipc.IpcWriteOptions(compression=codec))


def main(args: list[str]) -> None:
    tls = None
    if args[:1] == ["--tls"]:
        with open(args[1], "rb") as cert, open(args[2], "rb") as key:
            tls = (cert.read(), key.read())
        args = args[3:]
    server = RawServer(args, tls)
    print(f"raw-server listening on {server.scheme}://127.0.0.1:{server.port}", flush=True)
    try:
        sys.stdin.read()  # EOF: the benchmark is done (or died)
    finally:
        server.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
