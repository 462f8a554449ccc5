"""``flight-sql`` without a URL: a ``flight-coordinator`` in the shell's own process, over workers it starts.

The same service a URL would reach (``CoordinatorServer`` over ``Queries``, direct endpoints, no
credentials: it listens on 127.0.0.1 only), so the shell talks to it over ADBC exactly as it talks to
a remote one, and ``EXPLAIN``, progress and cancel behave the same. The workers are a
``LocalCluster``: real ``flight-worker`` processes that go with the shell even when it is killed,
in a process group of their own (a Ctrl-C is the shell's), their logs in a file rather than on the
shell's screen.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

from flight.dev.cluster import LocalCluster
from flight.service.admission import Admission
from flight.service.queries import Queries
from flight.service.server import CoordinatorServer
from flight.service.web import Metrics, WebView
from flight.sql.catalog import Catalog

__all__ = ["LocalService"]

RESULT_TTL_S = 300.0


class LocalService:
    """``workers`` local workers reading under ``roots``, and a Flight SQL service over them at ``url``."""

    def __init__(self, catalog: Catalog, workers: int, roots: list[str], *, http_port: int | None = None,
                 log_file: Path | None = None) -> None:
        self.log_file = log_file or Path(tempfile.gettempdir()) / f"flight-sql-{os.getpid()}.log"
        handler = logging.FileHandler(self.log_file)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger("flight").addHandler(handler)
        logging.getLogger("flight").propagate = False  # the service's lines go to the file, not the shell's screen
        self.cluster = LocalCluster(workers, data_roots=roots, log_file=self.log_file).start()
        self.queries: Queries | None = None
        self.server: CoordinatorServer | None = None
        self.web: WebView | None = None
        try:
            metrics = Metrics()
            self.queries = Queries(catalog, self.cluster.resolver(), None, RESULT_TTL_S, admission=Admission(16, 16, 60.0),
                                   on_end=metrics.ended)
            self.server = CoordinatorServer("grpc://127.0.0.1:0", self.queries, endpoints="direct")
            self.url = self.server.url
            self.page = None
            if http_port is not None:
                self.web = WebView(self.queries, metrics, "127.0.0.1", http_port)
                self.page = self.web.start()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.queries is not None:
            self.queries.close()
        if self.server is not None:
            self.server.shutdown()
        if self.web is not None:
            self.web.stop()
        self.cluster.stop()
