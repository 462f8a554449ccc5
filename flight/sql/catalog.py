"""Named tables for SQL: ``flight.Catalog``, and what a name may stand for.

A source is a ``Query`` (``read_parquet``, ``from_feed``, ``read_iceberg``, ``read_delta``), a
``pyarrow.Table`` (shipped inside the plan), or a path or URI of Parquet files: a file, a
directory or prefix (``s3://bucket/events/``, listed while the query runs), or a glob
(``data/*.parquet``). A path is opened once, for its schema, when a statement first names it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Union

import pyarrow as pa

from flight.errors import PlanError
from flight.plan.query import Query, from_arrow, read_parquet

__all__ = ["Catalog", "Source"]

Source = Union[Query, pa.Table, pa.RecordBatch, str, "os.PathLike[str]"]


class Catalog(Mapping[str, Query]):
    """Tables by name, for ``flight.sql(text, catalog)``; the Flight SQL service serves one.

    ``Catalog({"lineitem": "data/lineitem/", "nation": nation_table})``; ``register`` adds or
    replaces one, ``drop`` removes one. Names are matched as SQL matches them: an unquoted name
    in a query is lower case, so register lower-case names (or quote them in the query).
    """

    def __init__(self, tables: Mapping[str, Source] | None = None) -> None:
        self._sources: dict[str, Source] = {}
        self._queries: dict[str, Query] = {}
        for name, source in (tables or {}).items():
            self.register(name, source)

    def register(self, name: str, source: Source) -> None:
        if not isinstance(name, str) or not name or "." in name:
            raise PlanError(f"Catalog: a table name must be a non-empty name without dots, not {name!r}")
        if not isinstance(source, (Query, pa.Table, pa.RecordBatch, str, os.PathLike)):
            raise PlanError(
                f"Catalog: table {name!r} must be a flight.Query, a pyarrow.Table or a Parquet path, not {type(source).__name__}"
            )
        self._sources[name] = source
        self._queries.pop(name, None)

    def drop(self, name: str) -> None:
        self._sources.pop(name, None)
        self._queries.pop(name, None)

    def __getitem__(self, name: str) -> Query:
        """The query that reads table ``name`` (a path's schema is read the first time)."""
        query = self._queries.get(name)
        if query is None:
            query = self._queries[name] = _as_query(name, self._sources[name])
        return query

    def __iter__(self) -> Iterator[str]:
        return iter(self._sources)

    def __len__(self) -> int:
        return len(self._sources)

    def __repr__(self) -> str:
        return f"Catalog({', '.join(self._sources)})"


def _as_query(name: str, source: Source) -> Query:
    if isinstance(source, Query):
        return source
    if isinstance(source, (pa.Table, pa.RecordBatch)):
        return from_arrow(source)
    path = os.fspath(source)
    if any(c in path for c in "*?["):
        folder, pattern = path.rsplit("/", 1) if "/" in path else (".", path)
        if any(c in folder for c in "*?["):
            raise PlanError(f"table {name!r}: a glob may only match file names, not folders ({path!r})")
        return read_parquet(folder + "/", pattern=pattern)
    return read_parquet(path)
