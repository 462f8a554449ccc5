"""The Python API that builds plans: sources, then chained transformations.

Close to what PySpark / Polars users write::

    q = (flight.read_parquet(paths)
           .filter(col("l_quantity") > 10)
           .select("l_orderkey", revenue=col("l_extendedprice") * (1 - col("l_discount")))
           .limit(100))

Every step checks its input's schema at once, so mistakes are ``PlanError``s
here, not failures on a worker.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from flight._proto import plan_pb2
from flight.arrow_types import UNITS_READER
from flight.errors import PlanError
from flight.feed import WorkUnitFeed, WorkUnitFeedProvider
from flight.plan.expr import Expr, col
from flight.plan.nodes import ExchangeInputNode, FeedScanNode, FilterNode, LimitNode, Node, ProjectNode, ValuesNode
from flight.protocol import encode_schema
from flight.providers import FileListProvider

__all__ = ["Query", "from_arrow", "from_feed", "map_input", "read_ipc", "read_parquet", "units"]


class Query:
    """An immutable plan under construction; each method returns a new Query."""

    def __init__(self, node: Node) -> None:
        self.node = node

    @property
    def schema(self) -> pa.Schema:
        return self.node.schema

    # ----------------------------------------------------------- transforms

    def filter(self, predicate: Expr) -> Query:
        return Query(FilterNode(self.node, _expr(predicate, "filter")))

    def select(self, *columns: str | Expr, **named: Expr | object) -> Query:
        """Keep ``columns`` (names or field expressions) and add ``named`` expressions, in that order."""
        exprs: list[tuple[str, Expr]] = []
        for c in columns:
            if isinstance(c, str):
                exprs.append((c, col(c)))
            elif isinstance(c, Expr) and c.to_proto().WhichOneof("kind") == "field":
                exprs.append((c.to_proto().field.name, c))
            else:
                raise PlanError(f"select: {c!r} needs a name; pass it as a keyword, e.g. select(total={c!r})")
        exprs += [(name, _expr(e, f"select {name}")) for name, e in named.items()]
        if not exprs:
            raise PlanError("select: no columns given")
        return Query(ProjectNode(self.node, exprs))

    def with_columns(self, **named: Expr | object) -> Query:
        """All current columns, with ``named`` ones added or replaced."""
        exprs = {name: col(name) for name in self.schema.names}
        exprs.update({name: _expr(e, f"with_columns {name}") for name, e in named.items()})
        return Query(ProjectNode(self.node, list(exprs.items())))

    def limit(self, n: int, offset: int = 0) -> Query:
        return Query(LimitNode(self.node, n, offset))

    # -------------------------------------------------------------- outputs

    def explain(self) -> str:
        return "\n".join(self.node.explain_lines())

    def stage_plan(self) -> plan_pb2.StagePlan:
        """The serialized form a worker runs (one stage)."""
        return plan_pb2.StagePlan(
            root=self.node.to_proto(),
            output=plan_pb2.OutputSpec(partitions=1),
            output_schema=encode_schema(self.schema),
        )

    def __repr__(self) -> str:
        return f"Query(\n{self.explain()}\n)"


def _expr(value: object, where: str) -> Expr:
    if isinstance(value, Expr):
        return value
    from flight.plan.expr import lit

    try:
        return lit(value)
    except (TypeError, ValueError, pa.ArrowException) as exc:
        raise PlanError(f"{where}: {value!r} is neither an expression nor a literal") from exc


# ------------------------------------------------------------------ sources


def from_feed(
    provider: WorkUnitFeedProvider | WorkUnitFeed,
    reader: str,
    schema: pa.Schema,
    *,
    columns: Sequence[str] | None = None,
    options: Mapping[str, str] | None = None,
) -> Query:
    """Rows from work units a provider discovers at run time, read by ``reader`` on the workers."""
    feed = provider if isinstance(provider, WorkUnitFeed) else WorkUnitFeed(provider)
    if not feed.is_local:
        raise PlanError(f"feed {feed.feed_id!r} is remote; plans are built on the coordinator with a local provider")
    return Query(FeedScanNode(feed, reader, schema, list(columns) if columns is not None else None, dict(options or {})))


def units(provider: WorkUnitFeedProvider | WorkUnitFeed) -> Query:
    """The work units themselves as rows (one binary column ``unit``): for tests and plumbing."""
    return from_feed(provider, UNITS_READER, pa.schema([pa.field("unit", pa.binary())]))


def _files(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[str]:
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not items:
        raise PlanError("no files given")
    return [os.fspath(p) for p in items]


def read_parquet(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | WorkUnitFeedProvider,
    *,
    schema: pa.Schema | None = None,
    columns: Sequence[str] | None = None,
    split_row_groups: bool = False,
) -> Query:
    """Parquet files: a list of paths, or a provider yielding ``file_unit``s (then ``schema`` is needed)."""
    if isinstance(paths, WorkUnitFeedProvider):
        if schema is None:
            raise PlanError("read_parquet(provider) needs schema=: files are only discovered at run time")
        return from_feed(paths, "parquet", schema, columns=columns)
    files = _files(paths)
    if schema is None:
        try:
            schema = pq.read_schema(files[0])
        except (OSError, pa.ArrowException) as exc:
            raise PlanError(f"cannot read the schema of {files[0]!r}: {exc}") from exc
    return from_feed(FileListProvider(files, split_row_groups=split_row_groups), "parquet", schema, columns=columns)


def read_ipc(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *, columns: Sequence[str] | None = None) -> Query:
    """Arrow IPC (Feather v2) files, memory-mapped on the workers."""
    files = _files(paths)
    try:
        with pa.memory_map(files[0]) as source:
            schema = pa.ipc.open_file(source).schema
    except (OSError, pa.ArrowException) as exc:
        raise PlanError(f"cannot read the schema of {files[0]!r}: {exc}") from exc
    return from_feed(FileListProvider(files), "ipc", schema, columns=columns)


def from_arrow(table: pa.Table | pa.RecordBatch) -> Query:
    """Constant rows shipped inside the plan (emitted by one task)."""
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    return Query(ValuesNode(table))


def map_input(schema: pa.Schema) -> Query:
    """The input of a map stage: batches a client streams to the worker (see ``map_batches``)."""
    return Query(ExchangeInputNode(schema))
