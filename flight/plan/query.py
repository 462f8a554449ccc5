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

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from flight.errors import FlightExecError, PlanError
from flight.plan.agg import NUMERIC, OF_NUMBERS, Agg
from flight.plan.decimals import with_decimal_literals
from flight.plan.expr import Expr, coalesce, col
from flight.plan.nodes import ExchangeInputNode, FeedScanNode, FilterNode, LimitNode, Node, ProjectNode, UnnestNode, ValuesNode
from flight.plan.relnodes import AggCall, AggregateNode, JoinNode, SortNode, UnionNode
from flight.plan.typecheck import output_type
from flight.sources.feed import WorkUnitFeed, WorkUnitFeedProvider
from flight.sources.footers import footer_derived
from flight.sources.providers import FileListProvider, ListingProvider
from flight.sources.storage import open_input
from flight.wire._proto import plan_pb2
from flight.wire.arrow_types import UNITS_READER
from flight.wire.protocol import encode_schema

__all__ = ["Query", "from_arrow", "from_feed", "map_input", "read_ipc", "read_parquet", "units"]


class Query:
    """An immutable plan under construction; each method returns a new Query."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.logical_plan: str | None = None
        """The SQL front end's optimized logical plan, for a query ``flight.sql`` made (explain shows it)."""

    @property
    def schema(self) -> pa.Schema:
        return self.node.schema

    # ----------------------------------------------------------- transforms

    def filter(self, predicate: Expr) -> Query:
        return Query(FilterNode(self.node, with_decimal_literals(_expr(predicate, "filter"), self.schema)))

    def select(self, *columns: str | Expr, **named: Expr | object) -> Query:
        """Keep ``columns`` (names or field expressions) and add ``named`` expressions, in that order.

        A string value names a column (``select(k="id")`` renames); write ``lit("text")`` for text.
        """
        exprs: list[tuple[str, Expr]] = []
        for c in columns:
            if isinstance(c, str):
                exprs.append((c, col(c)))
            elif isinstance(c, Expr) and (name := c.column_name()) is not None:
                exprs.append((name, c))
            else:
                raise PlanError(f"select: {c!r} needs a name; pass it as a keyword, e.g. select(total={c!r})")
        exprs += [(name, with_decimal_literals(_expr(e, f"select {name}"), self.schema)) for name, e in named.items()]
        if not exprs:
            raise PlanError("select: no columns given")
        return Query(ProjectNode(self.node, exprs))

    def with_columns(self, **named: Expr | object) -> Query:
        """All current columns, with ``named`` ones added or replaced."""
        exprs = {name: col(name) for name in self.schema.names}
        exprs.update({name: with_decimal_literals(_expr(e, f"with_columns {name}"), self.schema) for name, e in named.items()})
        return Query(ProjectNode(self.node, list(exprs.items())))

    def unnest(self, column: str, name: str | None = None) -> Query:
        """One row per element of list column ``column`` (the element in ``name``, by default ``column``'s name
        with ``_element``), the other columns repeated; a row whose list is empty or null gives none. DuckDB engine."""
        return Query(UnnestNode(self.node, column, name or f"{column}_element"))

    def limit(self, n: int, offset: int = 0) -> Query:
        return Query(LimitNode(self.node, n, offset))

    def aggregate(self, keys: str | Sequence[str] = (), aggs: Mapping[str, Agg] | None = None, **named: Agg) -> Query:
        """Group by ``keys`` (none: one global row) and compute ``aggs`` / ``named`` aggregates.

        ``q.aggregate(["k"], total=agg.sum(col("x") * 2), n=agg.count_all())``
        """
        key_list = [keys] if isinstance(keys, str) else list(keys)
        items = {**(aggs or {}), **named}
        calls = []
        for name, a in items.items():
            if not isinstance(a, Agg):
                raise PlanError(f"aggregate {name!r}: {a!r} is not an aggregate; use flight.agg.sum(...) and friends")
            expr = None if a.expr is None else with_decimal_literals(a.expr, self.schema)
            if a.function in OF_NUMBERS and expr is not None:
                t = output_type(expr, self.schema)
                if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)):
                    used = ", ".join(sorted(expr.referenced_fields()))
                    raise PlanError(f"aggregate {name}: {a.function} needs a number, but {expr!r} ({used}) is {t}")
                if a.function in NUMERIC:
                    expr = expr if t == pa.float64() else expr.cast(pa.float64())
            if a.function == "string_agg" and expr is not None and output_type(expr, self.schema) not in (pa.string(), pa.large_string()):
                raise PlanError(f"aggregate {name}: string_agg joins text, but {expr!r} is {output_type(expr, self.schema)}")
            order = tuple((with_decimal_literals(e, self.schema), d, n) for e, d, n in a.order)
            where = None if a.where is None else with_decimal_literals(a.where, self.schema)
            calls.append(AggCall(name, a.function, expr, a.fraction, a.separator, order, where))
        return Query(AggregateNode(self.node, key_list, calls))

    def distinct(self) -> Query:
        """Each distinct row once."""
        return Query(AggregateNode(self.node, list(self.schema.names), [], label_text="Distinct"))

    def join(
        self,
        other: Query,
        on: str | Sequence[str] | None = None,
        *,
        left_on: str | Sequence[str] | None = None,
        right_on: str | Sequence[str] | None = None,
        how: str = "inner",
        suffix: str = "_right",
        filter: Expr | None = None,
    ) -> Query:
        """Hash join with ``other`` (the build side). ``how``: inner, left, right, full, semi, anti.

        With ``on`` the key columns appear once (coalesced for right and full
        joins); with ``left_on`` / ``right_on`` both sides' keys are kept. ``filter`` is a
        further condition on the joined row (both sides' columns; their names must differ):
        a left row matches only right rows where it holds.
        """
        if how not in _JOIN_TYPES:
            raise PlanError(f"join: how={how!r} is not one of {', '.join(_JOIN_TYPES)}")
        if (on is None) == (left_on is None or right_on is None):
            raise PlanError("join: give either on=, or both left_on= and right_on=")
        lk = _names(on if on is not None else left_on)
        rk = _names(on if on is not None else right_on)
        left, right = _widen_int_keys(self, lk, other, rk)
        node: Node = JoinNode(left.node, right.node, lk, rk, _JOIN_TYPES[how], suffix, filter=filter)
        if on is None or how in ("semi", "anti"):
            return Query(node)
        # One column per key: the left one, or the non-null of both where the right side may lead.
        exprs: list[tuple[str, Expr]] = []
        dropped = {k + suffix for k in rk}
        for name in node.schema.names:
            if name in dropped:
                continue
            if name in lk and how in ("right", "full"):
                exprs.append((name, coalesce(col(name), col(name + suffix))))
            else:
                exprs.append((name, col(name)))
        return Query(ProjectNode(node, exprs))

    def sort(
        self, by: str | Sequence[str], descending: bool | Sequence[bool] = False, nulls: str = "last"
    ) -> Query:
        keys = _names(by)
        desc = [descending] * len(keys) if isinstance(descending, bool) else list(descending)
        if len(desc) != len(keys):
            raise PlanError(f"sort: {len(keys)} keys but {len(desc)} descending flags")
        if nulls not in ("first", "last"):
            raise PlanError(f"sort: nulls must be 'first' or 'last', not {nulls!r}")
        return Query(SortNode(self.node, list(zip(keys, desc)), nulls_first=nulls == "first"))

    def union(self, *others: Query) -> Query:
        """All rows of this query and ``others`` (same schema), like SQL's UNION ALL."""
        return Query(UnionNode([self.node, *(o.node for o in others)]))

    # -------------------------------------------------------------- outputs

    def explain(self) -> str:
        lines = self.node.explain_lines()
        if self.logical_plan:
            lines = ["SQL logical plan (DataFusion, optimized):", *("  " + x for x in self.logical_plan.splitlines()), "Plan:", *lines]
        return "\n".join(lines)

    def stage_plan(self) -> plan_pb2.StagePlan:
        """The plan a worker runs (one stage), as a tree (``root``); ``flight.wire.plan_codec.encode_plan``
        makes the bytes a worker takes."""
        plan = plan_pb2.StagePlan(output=plan_pb2.OutputSpec(partitions=1), output_schema=encode_schema(self.schema))
        plan.root.CopyFrom(self.node.to_proto())  # not root=...: protobuf would copy a deep tree by parsing it again
        return plan

    def __repr__(self) -> str:
        return f"Query(\n{self.explain()}\n)"


_JOIN_TYPES = {
    "inner": "inner",
    "left": "left outer",
    "right": "right outer",
    "full": "full outer",
    "semi": "left semi",
    "anti": "left anti",
}


def _names(value: str | Sequence[str] | None) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def _widen_int_keys(left: Query, lk: list[str], right: Query, rk: list[str]) -> tuple[Query, Query]:
    """Integer keys of different widths join as int64 (a user should not have to cast them)."""
    lcast: dict[str, Expr] = {}
    rcast: dict[str, Expr] = {}
    for a, b in zip(lk, rk):
        if a not in left.schema.names or b not in right.schema.names:
            continue  # JoinNode names the missing key
        ta, tb = left.schema.field(a).type, right.schema.field(b).type
        if ta != tb and pa.types.is_integer(ta) and pa.types.is_integer(tb):
            lcast[a] = col(a).cast(pa.int64())
            rcast[b] = col(b).cast(pa.int64())
    return (left.with_columns(**lcast) if lcast else left, right.with_columns(**rcast) if rcast else right)


def _expr(value: object, where: str) -> Expr:
    """An expression from what a user passed: an Expr, a column name (as in Polars), or a literal."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, str):
        return col(value)  # a string literal is lit("...")
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
    return Query(FeedScanNode(feed, reader, schema, list(columns) if columns is not None else None, dict(options or {})))


def units(provider: WorkUnitFeedProvider | WorkUnitFeed) -> Query:
    """The work units themselves as rows (one binary column ``unit``): for tests and plumbing."""
    return from_feed(provider, UNITS_READER, pa.schema([pa.field("unit", pa.binary())]))


def _files(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[str]:
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not items:
        raise PlanError("no files given")
    return [os.fspath(p) for p in items]


def _is_prefix(path: str) -> bool:
    """A prefix to list: a URI or path ending in ``/``, or a local directory."""
    return path.endswith("/") or ("://" not in path and os.path.isdir(path))


@contextlib.contextmanager
def _opened(path: str) -> Iterator[pa.NativeFile]:
    """A file the coordinator reads for planning (a schema): local, or in a store this process
    reaches (``flight.configure_storage``, its environment)."""
    try:
        source = open_input(path)
    except (OSError, pa.ArrowException, FlightExecError) as exc:
        raise PlanError(f"cannot read the schema of {path!r}: {exc}") from None
    with source:
        yield source


def read_parquet(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | WorkUnitFeedProvider,
    *,
    schema: pa.Schema | None = None,
    columns: Sequence[str] | None = None,
    split_row_groups: bool | int | None = None,
    pattern: str = "*.parquet",
) -> Query:
    """Parquet files: a list of paths or URIs; a prefix (``s3://bucket/events/``, a directory),
    listed while the query runs (``ListingProvider``, files matching ``pattern``); or a provider
    yielding ``file_unit``s (then ``schema`` is needed).

    ``split_row_groups``: one unit per row group (from each file's footer, read by the
    coordinator) rather than per file; a number of bytes splits only the larger files
    (``split_row_groups=256 << 20``); ``False``: every file whole. By default a list of files
    fewer than the query's tasks (a table written as one file) is cut into runs of row groups,
    one per task, when ``ExecOptions.cut_file_rows`` allows (off by default); a prefix's files
    stay whole."""
    if isinstance(paths, WorkUnitFeedProvider):
        if schema is None:
            raise PlanError("read_parquet(provider) needs schema=: files are only discovered at run time")
        return from_feed(paths, "parquet", schema, columns=columns)
    if isinstance(paths, (str, os.PathLike)) and _is_prefix(os.fspath(paths)):
        listing = ListingProvider(os.fspath(paths), pattern, split_row_groups=split_row_groups or False)
        if schema is None:
            first = listing.first()
            if first is None:
                raise PlanError(f"no file under {os.fspath(paths)!r} matches {pattern!r}: give schema= to read it anyway")
            with _opened(first) as source:
                schema = pq.read_schema(source)
        return from_feed(listing, "parquet", schema, columns=columns)
    files = _files(paths)
    if schema is None:
        try:
            schema = footer_derived(files[0], "arrow schema", lambda meta: meta.schema.to_arrow_schema())
        except (OSError, pa.ArrowException, FlightExecError) as exc:
            raise PlanError(f"cannot read the schema of {files[0]!r}: {exc}") from None
    return from_feed(FileListProvider(files, split_row_groups=split_row_groups), "parquet", schema, columns=columns)


def read_ipc(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *, columns: Sequence[str] | None = None) -> Query:
    """Arrow IPC (Feather v2) files, memory-mapped on the workers."""
    files = _files(paths)
    try:
        with _opened(files[0]) as source:
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
