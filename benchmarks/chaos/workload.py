"""The chaos run's queries: TPC-H and TPC-DS at a small scale, each with DuckDB's answer made once up front.

The data and texts are the benchmarks' own (``benchmarks.workload.tpch_workload``: ``tpchgen-cli``'s
Parquet; ``benchmarks.tpcds_bench.tpcds_workload``: DuckDB's ``tpcds`` extension), and so is the check
(``Workload.check``: rows as a multiset, in order along the query's ORDER BY, floats within 1e-9
relative or 1e-6 absolute, the rows tied at a LIMIT on their key only). DuckDB over the same files is
the oracle.

The mix: each request picks a query at random, with a weight (``MIX``'s fast queries count more, so
that answers come many and often) and a way (``api``: ``DistributedExec``; ``sql``: the Flight SQL
service), and, for ``api``, one of ``OPTIONS``'s plan shapes (the default plan; every plan forced into
stages; every join shuffled).
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from benchmarks.progress import Progress
from benchmarks.tpcds_bench import tpcds_workload
from benchmarks.tpch_queries import decimals_as_numbers, duckdb_connection, duckdb_table
from benchmarks.tpch_sql import ALL_QUERIES
from benchmarks.workload import Workload, tpch_workload

__all__ = ["OPTIONS", "Mix", "Pick", "parse_queries"]

OPTIONS: Mapping[str, Mapping[str, Any]] = {
    "default": {},
    "staged": {"one_host_query_bytes": 0, "small_query_bytes": 0},
    "shuffled": {"one_host_query_bytes": 0, "small_query_bytes": 0, "broadcast_bytes": 0, "rows_per_task": 1},
    "spilling": {"one_host_query_bytes": 0, "small_query_bytes": 0, "output_buffer_bytes": 64 << 10},
}
"""The ``ExecOptions`` of the ``api`` way: the default plan (small queries as one task), every plan forced into
stages (scans split by file, joins shuffled or broadcast), every join shuffled (the most traffic between workers),
and stages whose outputs spill: a stage below the head keeps its output until the query ends (stage recovery), and
past a 64 KiB buffer a worker writes it to its ``--spill-dir`` (where the ``spill-full`` fault bites).
Losses are found within seconds in all (``heartbeat`` 0.5 s, ``peer_timeout`` 5 s: ``LOSS``)."""
LOSS = {"heartbeat": 0.5, "peer_timeout": 5.0}

DEFAULT_QUERIES = {
    "tpch": tuple(ALL_QUERIES),
    "tpcds": (1, 3, 6, 7, 12, 13, 15, 19, 20, 21, 25, 26, 27, 29, 32, 33, 37, 40, 42, 43, 45, 46, 48, 50, 52, 55, 56, 60, 61,
              62, 65, 68, 69, 71, 73, 76, 79, 82, 84, 85, 88, 90, 91, 92, 93, 96, 97, 98, 99),
}
"""The default mix: all 22 TPC-H queries, and a spread of TPC-DS's (every one of the 99 runs with ``--queries tpcds:all``)."""
FAST = {"tpch": (1, 3, 4, 5, 6, 10, 12, 14, 19), "tpcds": (3, 7, 19, 42, 43, 52, 55, 96, 98)}
"""Small, fast queries, picked ``FAST_WEIGHT`` times as often as the others."""
FAST_WEIGHT = 3


@dataclass(frozen=True)
class Pick:
    """One request's query: its suite, number, way and (``api``) plan shape."""

    suite: str
    n: int
    via: str
    shape: str

    @property
    def name(self) -> str:
        return f"{self.suite}:{self.n}"

    @property
    def options(self) -> dict[str, Any]:
        return {**OPTIONS[self.shape], **LOSS} if self.via == "api" else {}


def parse_queries(text: str | None) -> dict[str, tuple[int, ...]]:
    """``tpch:1,3,14;tpcds:3,7`` (``all`` for every query of a suite; a suite left out is not run); None: the default."""
    if not text:
        return dict(DEFAULT_QUERIES)
    out: dict[str, tuple[int, ...]] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        suite, _, numbers = part.partition(":")
        if suite not in DEFAULT_QUERIES:
            raise ValueError(f"no suite {suite!r} in --queries (suites: tpch, tpcds)")
        if numbers.strip() == "all":
            out[suite] = tuple(ALL_QUERIES) if suite == "tpch" else tuple(range(1, 100))
        else:
            out[suite] = tuple(int(n) for n in re.split(r"[,\s]+", numbers.strip()) if n)
    return out


class Mix:
    """The suites' data, texts, DuckDB's answers and checks; ``pick`` draws a request's query."""

    def __init__(self, queries: Mapping[str, Sequence[int]], *, tpch_sf: float, tpcds_sf: float, ways: Sequence[str],
                 progress: Progress, cache_dir: Path | None = None) -> None:
        self.workloads: dict[str, Workload] = {}
        if queries.get("tpch"):
            self.workloads["tpch"] = tpch_workload(tpch_sf, tuple(ALL_QUERIES), cache_dir, progress)
        if queries.get("tpcds"):
            self.workloads["tpcds"] = tpcds_workload(tpcds_sf, cache_dir, progress)
        self.queries = {s: tuple(queries[s]) for s in self.workloads}
        self.ways = tuple(ways)
        self.expected: dict[tuple[str, int], pa.Table] = {}
        for suite, numbers in self.queries.items():
            w = self.workloads[suite]
            con = duckdb_connection(w.files)
            try:
                for n in numbers:
                    answer = duckdb_table(con, w.texts["duckdb"][n])
                    self.expected[suite, n] = decimals_as_numbers(answer) if suite == "tpch" else answer
            finally:
                con.close()
            progress.log(f"{w.title} SF {w.sf:g}: DuckDB's answers to {len(numbers)} queries made")
        self._choices = [(s, n) for s, numbers in self.queries.items() for n in numbers]
        self._weights = [FAST_WEIGHT if n in FAST[s] else 1 for s, n in self._choices]

    @property
    def data_dirs(self) -> list[Path]:
        return [w.data_dir for w in self.workloads.values()]

    def client_suites(self) -> dict[str, Any]:
        """What the client process needs of each suite: files and the texts of the queries in the mix."""
        return {s: {"files": {t: [str(p) for p in paths] for t, paths in w.files.items()},
                    "texts": {str(n): w.texts["duckdb"][n] for n in self.queries[s]}}
                for s, w in self.workloads.items()}

    def pick(self, rng: random.Random) -> Pick:
        (suite, n), = rng.choices(self._choices, self._weights)
        via = rng.choice(self.ways)
        return Pick(suite, n, via, rng.choice(sorted(OPTIONS)) if via == "api" else "service")

    def check(self, pick: Pick, got: pa.Table) -> str | None:
        """None when ``got`` is DuckDB's answer to ``pick``'s query, else the first difference."""
        try:
            return self.workloads[pick.suite].check(pick.n, got, self.expected[pick.suite, pick.n])
        except (duckdb.Error, pa.ArrowException, ValueError, TypeError) as exc:  # a check that cannot compare is a difference
            return f"the answer could not be compared: {type(exc).__name__}: {exc}"

    def text(self, pick: Pick) -> str:
        return self.workloads[pick.suite].texts["duckdb"][pick.n]
