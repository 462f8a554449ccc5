"""A real two-step source: an HTTP catalog lists pages of files slowly; workers read them.

The shape of an object-store listing or a catalog API: step one (listing) runs on
the coordinator as a shared-queue feed and streams into execution; step two
(reading Parquet) runs on the workers while later pages are still being listed.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from support import make_table, sorted_table

import flight
from flight import col

PAGE_SIZE = 3
PAGE_DELAY_S = 0.05


class Catalog:
    """What the HTTP service serves: ``GET /list?page=N`` → ``{"files": [...], "next": N+1 | null}``."""

    def __init__(self, files: list[str]) -> None:
        self.files = files
        self.requests = 0
        self.pause = threading.Event()  # never set: its wait() is the service's slowness


def make_handler(catalog: Catalog) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlparse(self.path)
            if url.path != "/list":
                self.send_error(404, "no such endpoint")
                return
            page = int(parse_qs(url.query).get("page", ["0"])[0])
            catalog.requests += 1
            catalog.pause.wait(PAGE_DELAY_S)  # a slow listing API
            start = page * PAGE_SIZE
            files = catalog.files[start : start + PAGE_SIZE]
            nxt = page + 1 if start + PAGE_SIZE < len(catalog.files) else None
            body = json.dumps({"files": files, "next": nxt}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # keep test output clean

    return Handler


@pytest.fixture(scope="module")
def catalog_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("catalog")
    paths = []
    for i in range(14):
        path = root / f"events-{i:02d}.parquet"
        pq.write_table(make_table(400 + 37 * i, i * 1000), path)
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def service(catalog_files: list[Path]) -> Iterator[tuple[str, Catalog]]:
    catalog = Catalog([str(p) for p in catalog_files])
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(catalog))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", catalog
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


class HttpListing(flight.WorkUnitFeedProvider):
    """Step one: page through the catalog; every listed file becomes a unit as soon as it is seen."""

    shared = True

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.finished_at: float | None = None

    def feed(self, partition: int, ctx: flight.FeedContext) -> Iterator[flight.WorkUnit]:
        page: int | None = 0
        while page is not None and not ctx.is_cancelled():
            with urllib.request.urlopen(f"{self.base_url}/list?page={page}", timeout=10) as resp:
                listing = json.load(resp)
            for path in listing["files"]:
                yield flight.file_unit(path)
            page = listing["next"]
        self.finished_at = time.monotonic()


def test_two_step_http_source_end_to_end(cluster: flight.LocalCluster, service: tuple[str, Catalog], catalog_files: list[Path]) -> None:
    base_url, catalog = service
    listing = HttpListing(base_url)
    schema = pq.read_schema(catalog_files[0])
    q = flight.read_parquet(listing, schema=schema).filter(col("qty") < 10).select("id", "name")
    ex = flight.DistributedExec(q, cluster.resolver())
    reader = ex.execute()
    first = reader.read_next_batch()
    first_at = time.monotonic()
    rest = reader.read_all()
    got = pa.concat_tables([pa.Table.from_batches([first]), rest])

    src = pa.concat_tables(pq.read_table(p) for p in catalog_files)
    expected = src.filter(pc.less(src["qty"], 10)).select(["id", "name"])
    assert sorted_table(got).equals(sorted_table(expected))
    assert listing.finished_at is not None and first_at < listing.finished_at, "step two waited for step one"
    assert catalog.requests >= len(catalog_files) // PAGE_SIZE
    assert ex.metrics is not None and ex.metrics.units == len(catalog_files)


def test_catalog_outage_fails_the_query_with_the_http_error(cluster: flight.LocalCluster, catalog_files: list[Path]) -> None:
    listing = HttpListing("http://127.0.0.1:9")  # nothing listens on the discard port
    q = flight.read_parquet(listing, schema=pq.read_schema(catalog_files[0]))
    with pytest.raises(OSError) as info:
        flight.DistributedExec(q, cluster.resolver()).to_table()
    assert any("shared discovery" in n for n in info.value.__notes__)
