"""Delta Lake tables, discovered by the coordinator with ``deltalake`` (the ``delta`` extra).

``read_delta(uri, ...)`` reads the table's log on the coordinator (``DeltaTable`` at its
latest or a given version), prunes the files by their partition values with the filter's
conjuncts that name only partition columns, and streams one work unit per data file, a
shared queue with the file's record count and size as hints. The partition columns are not
in Delta's files: each unit carries its file's values (``FileUnit.partition_values``) and
the built-in ``parquet`` reader adds them as constant columns. The filter then runs on the
rows (docs/storage.md, "Delta Lake").

Refused, with a clear error: tables whose protocol needs reader features this path does not
apply — deletion vectors (rows deleted without rewriting files), column mapping (renamed
columns) and any other feature ``deltalake`` names — since reading their files as they are
would be wrong.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from flight.compute.expressions import to_pyarrow
from flight.errors import PlanError
from flight.plan.expr import Expr
from flight.plan.query import Query, from_feed
from flight.plan.terms import comparison, conjuncts
from flight.sources.feed import FeedContext, Unit, WorkUnitFeedProvider
from flight.wire._proto import plan_pb2
from flight.wire.arrow_types import normalize_schema

__all__ = ["DeltaProvider", "read_delta"]


def read_delta(
    uri: str,
    *,
    filter: Expr | None = None,
    version: int | None = None,
    columns: Sequence[str] | None = None,
) -> Query:
    """Rows of the Delta table at ``uri`` (a directory or a store's prefix), at ``version`` or its latest.

    ``filter`` prunes files by their partition values and then filters the rows. The coordinator
    reads the log with its own store configuration (``flight.configure_storage``'s options are
    not passed to ``deltalake``: it reads its environment, ``AWS_*`` and the like).
    """
    provider = DeltaProvider(uri, filter=filter, version=version)
    query = from_feed(provider, "parquet", provider.schema)
    if filter is not None:
        query = query.filter(filter)
    if columns is not None:
        query = query.select(*columns)
    return query


class DeltaProvider(WorkUnitFeedProvider):
    """The data files of a Delta table version, with their partition values, as a shared queue."""

    shared = True

    def __init__(self, uri: str, *, filter: Expr | None = None, version: int | None = None) -> None:
        try:
            from deltalake import DeltaTable
        except ImportError as exc:
            raise PlanError("read_delta needs deltalake: pip install 'flight-exec[delta]'") from exc
        self.uri = uri
        self.filter = filter
        try:
            self.table = DeltaTable(uri, version=version)
        except Exception as exc:  # noqa: BLE001 - deltalake's own error types: one clear error here
            raise PlanError(f"cannot open the Delta table {uri!r}: {type(exc).__name__}: {str(exc)[:300]}") from None
        protocol = self.table.protocol()
        features = sorted(protocol.reader_features or [])
        unknown = [f for f in features if f not in _READABLE_FEATURES]
        if unknown:
            raise PlanError(
                f"the Delta table {uri!r} needs reader features {unknown}, which are not applied yet "
                "(deletion vectors, column mapping): it is refused rather than read wrong"
            )
        self.version = self.table.version()
        self.partition_columns = list(self.table.metadata().partition_columns)
        self.schema = normalize_schema(pa.schema(self.table.schema().to_arrow()))  # type: ignore[arg-type]  # an arro3 schema (PyCapsule)

    def estimated_rows(self) -> float | None:
        actions = self._actions()
        if "num_records" not in actions.column_names:
            return None
        return float(sum(int(n or 0) for n in actions.column("num_records").to_pylist()))

    def _actions(self) -> pa.Table:
        return pa.table(self.table.get_add_actions(flatten=True))

    def _kept(self, actions: pa.Table) -> list[bool]:
        """Which files may hold a row passing the filter: its conjuncts over partition columns, on the
        files' partition values; its comparisons of other columns with constants, on their statistics."""
        keep = [True] * actions.num_rows
        if self.filter is None:
            return keep
        values = pa.table(
            {
                p: pa.array([None if v is None else str(v) for v in actions.column(f"partition.{p}").to_pylist()]).cast(
                    self.schema.field(p).type
                )
                for p in self.partition_columns
            }
        )
        for conjunct in conjuncts(self.filter):
            if not conjunct.referenced_fields():
                continue  # a constant: the rows' filter decides
            if not conjunct.referenced_fields() <= set(self.partition_columns):
                keep = [k and m for k, m in zip(keep, _by_statistics(conjunct, actions), strict=True)]
                continue
            try:
                mask = _evaluate(conjunct, values)
            except (pa.ArrowException, ValueError, TypeError):
                continue  # not decidable here: the workers filter the rows
            keep = [k and m is not False for k, m in zip(keep, mask, strict=True)]
        return keep

    def feed(self, partition: int, ctx: FeedContext) -> Iterator[Unit]:
        actions = self._actions()
        uris = self.table.file_uris()
        paths: list[str] = [str(p) for p in actions.column("path").to_pylist()]
        sizes = actions.column("size_bytes").to_pylist()
        rows = actions.column("num_records").to_pylist() if "num_records" in actions.column_names else [None] * len(paths)
        parts = {p: actions.column(f"partition.{p}").to_pylist() for p in self.partition_columns}
        for i, keep in enumerate(self._kept(actions)):
            if ctx.is_cancelled():
                return
            if not keep:
                continue
            unit = plan_pb2.FileUnit(path=_file_uri(self.uri, paths[i], uris))
            for p, values in parts.items():
                if values[i] is None:
                    unit.null_partitions.append(p)
                else:
                    unit.partition_values[p] = str(values[i])
            yield Unit(unit, rows=rows[i], bytes=sizes[i])


_READABLE_FEATURES = frozenset({"timestampNtz", "v2Checkpoint", "vacuumProtocolCheck"})
"""Reader features that change nothing about how a data file's rows are read."""


def _file_uri(table: str, path: str, uris: list[str]) -> str:
    """A data file's absolute path or URI, from the table's location and the log's relative path."""
    if "://" in path or os.path.isabs(path):
        return path
    relative = urllib.parse.unquote(path)
    for uri in uris:  # deltalake's own resolution, when it has one for this file
        if uri.endswith(relative) or uri.endswith(path):
            return uri
    return table.rstrip("/") + "/" + relative


def _by_statistics(conjunct: Expr, actions: pa.Table) -> list[bool]:
    """Which files may hold a row passing ``conjunct`` (a column compared with a constant), by the
    log's per-file ``min.*``/``max.*``; every file for any other conjunct, or missing statistics."""
    found = comparison(conjunct.to_proto().nodes, len(conjunct.to_proto().nodes) - 1)
    everything = [True] * actions.num_rows
    if found is None:
        return everything
    name, op, value = found
    if f"min.{name}" not in actions.column_names or f"max.{name}" not in actions.column_names:
        return everything
    lows, highs = actions.column(f"min.{name}").to_pylist(), actions.column(f"max.{name}").to_pylist()
    out = []
    for low, high in zip(lows, highs, strict=True):
        try:
            out.append(_may_hold(op, value, low, high))
        except TypeError:  # a constant of another type than the statistics: no pruning
            out.append(True)
    return out


def _may_hold(op: str, value: Any, low: Any, high: Any) -> bool:
    if low is None or high is None:
        return True
    if op == "equal":
        return bool(low <= value <= high)
    if op in ("greater", "greater_equal"):
        return bool(high > value if op == "greater" else high >= value)
    if op in ("less", "less_equal"):
        return bool(low < value if op == "less" else low <= value)
    return True  # not_equal: any file may hold another value


def _evaluate(expr: Expr, table: pa.Table) -> list[Any]:
    """``expr`` over ``table``'s rows with Arrow (the IR's own meaning): True, False or None per row."""
    import pyarrow.acero as ac

    projected = ac.Declaration.from_sequence(
        [
            ac.Declaration("table_source", ac.TableSourceNodeOptions(table)),
            ac.Declaration("project", ac.ProjectNodeOptions([to_pyarrow(expr.to_proto(), "filter")], ["keep"])),
        ]
    ).to_table()
    return projected.column("keep").to_pylist()
