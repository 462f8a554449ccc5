"""Iceberg tables, discovered by the coordinator with ``pyiceberg`` (the ``iceberg`` extra).

``read_iceberg(table, ...)`` plans the scan with the table's catalog on the coordinator, as
Trino's split manager does: partition and column-statistics pruning from the filter
(``pyiceberg``'s ``plan_files``), then one work unit per data file, streamed to the tasks
as a shared queue (size hints from the file's record count and size). The workers read
each data file with the built-in ``iceberg`` reader (``engine/readers.py``): columns are
matched by Iceberg field id, not by name, so renamed columns read correctly, and a column
added after a file was written reads as nulls. The filter also runs on the rows (the
files' statistics only prune).

What is refused, with a clear error: data files with delete files (position or equality
deletes, which other engines write; ``pyiceberg`` itself deletes by rewriting files, which
reads fine), files without Parquet field ids (a name mapping), and non-Parquet data files.
Streaming the plan: ``pyiceberg``'s ``plan_files`` reads every surviving manifest before it
returns, so here each data manifest is planned on its own (with the snapshot's delete
manifests, so delete files are still found), and its files go out before the next manifest
is read: the first rows arrive after one manifest, not all of them (``stream_manifests``;
``benchmarks/micro/iceberg.py``). See docs/storage.md, "Iceberg".
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from flight.errors import PlanError
from flight.plan.expr import Expr
from flight.plan.query import Query, from_feed
from flight.plan.terms import comparison, field_name, set_values
from flight.sources.feed import FeedContext, Unit, WorkUnitFeedProvider, file_unit
from flight.wire.arrow_types import normalize_schema

__all__ = ["ICEBERG_READER", "IcebergProvider", "iceberg_filter", "read_iceberg"]

ICEBERG_READER = "iceberg"


def read_iceberg(
    table: Any,
    identifier: str | None = None,
    *,
    filter: Expr | None = None,
    snapshot_id: int | None = None,
    columns: Sequence[str] | None = None,
) -> Query:
    """Rows of an Iceberg table: ``table`` is a ``pyiceberg`` table, or a catalog and ``identifier``.

    ``filter`` prunes data files with the table's partition values and column statistics,
    and then filters the rows; ``snapshot_id`` reads the table as of that snapshot (its
    schema then); ``columns`` selects columns.
    """
    try:
        from pyiceberg.io.pyarrow import schema_to_pyarrow
    except ImportError as exc:
        raise PlanError("read_iceberg needs pyiceberg: pip install 'flight-exec[iceberg]'") from exc
    if identifier is not None:
        table = table.load_table(identifier)
    provider = IcebergProvider(table, filter=filter, snapshot_id=snapshot_id)
    projection = provider.scan().projection()
    arrow = normalize_schema(_plain(schema_to_pyarrow(projection, include_field_ids=False)))
    ids = {f.name: f.field_id for f in projection.fields}
    query = from_feed(provider, ICEBERG_READER, arrow, options={"field_ids": json.dumps(ids)})
    if filter is not None:
        query = query.filter(filter)
    if columns is not None:
        query = query.select(*columns)
    return query


def _plain(schema: pa.Schema) -> pa.Schema:
    """Large strings and binaries as their plain forms (what the engines expect), no field metadata."""
    fields = []
    for f in schema:
        t = f.type
        if t == pa.large_string():
            t = pa.string()
        elif t == pa.large_binary():
            t = pa.binary()
        fields.append(pa.field(f.name, t, f.nullable))
    return pa.schema(fields)


class IcebergProvider(WorkUnitFeedProvider):
    """The data files of an Iceberg scan, planned on the coordinator, as a shared queue."""

    shared = True

    def __init__(
        self, table: Any, *, filter: Expr | None = None, snapshot_id: int | None = None, stream_manifests: bool = True
    ) -> None:
        self.table = table
        self.filter = filter
        self.snapshot_id = snapshot_id
        self.stream_manifests = stream_manifests

    def scan(self) -> Any:
        from pyiceberg.expressions import AlwaysTrue

        row_filter = iceberg_filter(self.filter) if self.filter is not None else AlwaysTrue()
        return self.table.scan(row_filter=row_filter, snapshot_id=self.snapshot_id)

    def estimated_rows(self) -> float | None:
        snapshot = self.table.snapshot_by_id(self.snapshot_id) if self.snapshot_id is not None else self.table.current_snapshot()
        if snapshot is None or snapshot.summary is None:
            return None
        total = snapshot.summary.get("total-records")
        return float(total) if total is not None else None

    def tasks(self) -> Iterator[Any]:
        """The scan's ``FileScanTask``s, a data manifest at a time (or all planned first)."""
        scan = self.scan()
        snapshot = scan.snapshot()
        if not self.stream_manifests or snapshot is None:
            yield from scan.plan_files()
            return
        from pyiceberg.manifest import ManifestContent
        from pyiceberg.table import ManifestGroupPlanner

        planner = ManifestGroupPlanner(scan.table_metadata, scan.io, scan.row_filter, scan.case_sensitive, scan.options)
        manifests = snapshot.manifests(scan.io)
        deletes = [m for m in manifests if m.content == ManifestContent.DELETES]
        for manifest in manifests:
            if manifest.content == ManifestContent.DATA:
                yield from planner.plan_files([manifest, *deletes])

    def feed(self, partition: int, ctx: FeedContext) -> Iterator[Unit]:
        for task in self.tasks():
            if ctx.is_cancelled():
                return
            data = task.file
            if task.delete_files:
                raise PlanError(
                    f"data file {data.file_path!r} has {len(task.delete_files)} delete file(s): tables with position or "
                    "equality deletes are not read yet (docs/storage.md, Iceberg)"
                )
            if str(data.file_format).upper().rsplit(".", 1)[-1] != "PARQUET":
                raise PlanError(f"data file {data.file_path!r} is {data.file_format}: only Parquet data files are read")
            yield Unit(file_unit(data.file_path), rows=data.record_count, bytes=data.file_size_in_bytes)


# ------------------------------------------------------------------ the filter, for pruning

_COMPARE = {
    "equal": "EqualTo",
    "not_equal": "NotEqualTo",
    "less": "LessThan",
    "less_equal": "LessThanOrEqual",
    "greater": "GreaterThan",
    "greater_equal": "GreaterThanOrEqual",
}


def iceberg_filter(expr: Expr) -> Any:
    """``expr`` as a ``pyiceberg`` expression that keeps at least every row ``expr`` keeps.

    For pruning only: the parts it cannot express (functions, column-to-column comparisons)
    become "any row", so a file is never pruned wrongly; the rows are filtered by ``expr``.
    """
    from pyiceberg import expressions

    ice: Any = expressions  # built by name below; their typed constructors want pyiceberg's own terms
    nodes = expr.to_proto().nodes

    def convert(i: int) -> tuple[Any, bool]:
        """(a pyiceberg expression or None for "unknown", whether it is exact)."""
        node = nodes[i]
        if node.WhichOneof("kind") != "call":
            return None, False
        call = node.call
        fn, args = call.function, list(call.args)
        if fn in ("and", "and_kleene") and len(args) == 2:
            (a, ea), (b, eb) = convert(args[0]), convert(args[1])
            if a is None or b is None:
                return (a if b is None else b), False
            return ice.And(a, b), ea and eb
        if fn in ("or", "or_kleene") and len(args) == 2:
            (a, ea), (b, eb) = convert(args[0]), convert(args[1])
            return (ice.Or(a, b), ea and eb) if a is not None and b is not None else (None, False)
        if fn == "invert" and len(args) == 1:
            a, exact = convert(args[0])
            return (ice.Not(a), True) if a is not None and exact else (None, False)
        if fn in ("is_null", "is_valid") and len(args) == 1 and (name := field_name(nodes, args[0])) is not None:
            return (ice.IsNull(name) if fn == "is_null" else ice.NotNull(name)), True
        if fn == "is_in" and len(args) == 1 and (name := field_name(nodes, args[0])) is not None:
            values = set_values(call.options)
            return (ice.In(name, values), True) if values else (None, False)
        if (found := comparison(nodes, i)) is not None:
            name, op, value = found
            return getattr(ice, _COMPARE[op])(name, value), True
        return None, False

    converted, _ = convert(len(nodes) - 1)
    return converted if converted is not None else ice.AlwaysTrue()
