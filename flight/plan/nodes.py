"""Logical operators of a stage: each knows its output schema and its protobuf.

Schemas are computed as the plan is built, so a wrong column or a type that
does not fit is a ``PlanError`` on the coordinator, naming the column and the
operator, before any worker is contacted.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Self, TypeVar

import pyarrow as pa

from flight.errors import PlanError
from flight.plan.expr import Expr
from flight.plan.typecheck import output_type
from flight.sources.feed import WorkUnitFeed
from flight.wire._proto import plan_pb2
from flight.wire.arrow_types import UNITS_READER, normalize_schema
from flight.wire.protocol import encode_schema

T = TypeVar("T")

__all__ = [
    "OWN_KEY",
    "ExchangeInputNode",
    "FeedScanNode",
    "FilterNode",
    "InputCallNode",
    "LimitNode",
    "Node",
    "ProjectNode",
    "UnnestNode",
    "ValuesNode",
]

OWN_KEY = "_own_key"
"""Where a node keeps the hash of its own operator, its inputs left out (``flight.planner.reuse.subtree_keys``):
a copy over other inputs of the same schemas (``Node.with_inputs``) keeps it, so a rewrite that copies a plan does
not serialize its operators again (serializing them was a third of planning TPC-DS q14)."""
_INPUT_FIELDS = frozenset({"input", "left", "right", "inputs"})
"""The fields that hold a node's inputs: ``with_inputs`` over these alone keeps ``OWN_KEY``."""


def _same_provider(name: str, value: object, node: Node) -> bool:
    """Whether ``value`` for field ``name`` is a scan's feed for another read of the same provider (``feed.again``):
    a scan's ``OWN_KEY`` names its provider, not its feed id."""
    return name == "feed" and isinstance(node, FeedScanNode) and isinstance(value, WorkUnitFeed) and value.inner() is node.feed.inner()


class Node:
    """A logical operator.

    Not an ``abc.ABC``: ``isinstance`` against a class of ``ABCMeta`` runs Python code
    (``ABCMeta.__instancecheck__``) and the planner asks it some 10,000 times a query, a tenth of
    planning TPC-H. The abstract methods stay marked, for mypy and the reader."""

    @property
    @abc.abstractmethod
    def schema(self) -> pa.Schema: ...

    @abc.abstractmethod
    def fill_proto(self, op: plan_pb2.Operator) -> Sequence[plan_pb2.Operator]:
        """Write this operator, without its inputs, into the empty ``op``; return the (empty) places
        its ``children()`` go, in their order."""

    def to_proto(self) -> plan_pb2.Operator:
        """This operator and every one below it as one message tree.

        Built top down, each operator written in its place: no recursion (a plan may be deeper
        than Python's 1,000 frames), and no subtree handed to a message's constructor, which
        protobuf (upb) copies by serializing and parsing it again, refusing more than 100
        levels of nesting (a plan 50 operators deep).
        """
        root = plan_pb2.Operator()
        stack: list[tuple[Node, plan_pb2.Operator]] = [(self, root)]
        while stack:
            node, op = stack.pop()
            places = node.fill_proto(op)
            stack.extend(zip(node.children(), places, strict=True))
        return root

    def with_inputs(self, **inputs: object) -> Self:
        """This operator over other inputs with the same schemas (``input=``, ``left=``, ``inputs=``...; or other
        fields its caller keeps its output's types for): its own fields as they are, its output's types not
        worked out again. For rewrites that change what an input holds, never its columns (a filter pushed down,
        a semi join moved, a copy): typing every projection again was most of pushing TPC-DS q14's filters. What
        was kept about the old subtree (its key) is not kept: the inputs differ. Its own operator's key
        (``OWN_KEY``) is, when only inputs change: its fields are the same objects."""
        out = object.__new__(type(self))
        for f in fields(self):  # type: ignore[arg-type]  # every node is a dataclass
            setattr(out, f.name, inputs[f.name] if f.name in inputs else getattr(self, f.name))
        if OWN_KEY in self.__dict__ and all(k in _INPUT_FIELDS or _same_provider(k, v, self) for k, v in inputs.items()):
            out.__dict__[OWN_KEY] = self.__dict__[OWN_KEY]
        return out

    def remembered(self, name: str, make: Callable[[], T]) -> T:
        """What ``make()`` works out about this node, made once and kept on it under ``name``: a node never changes
        once made (each rewrite makes new ones, and ``with_inputs`` copies only its fields), and the planner asks
        some questions of one plan several times (its size, its pruning, its repeated subtrees)."""
        if name in self.__dict__:
            return self.__dict__[name]
        made = self.__dict__[name] = make()
        return made

    @abc.abstractmethod
    def label(self) -> str:
        """One line for explain()."""

    def children(self) -> Sequence[Node]:
        return ()

    def walk(self) -> Iterator[Node]:
        """This node and every one below it, each before its inputs, inputs in order (an explicit stack:
        nested generators cost a frame per level per node, 1.9 million calls planning TPC-DS q14)."""
        stack: list[Node] = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children()))

    def explain_lines(self, indent: int = 0) -> list[str]:
        lines = ["  " * indent + self.label()]
        for child in self.children():
            lines.extend(child.explain_lines(indent + 1))
        return lines


@dataclass(eq=False)
class FeedScanNode(Node):
    feed: WorkUnitFeed
    reader: str
    declared_schema: pa.Schema
    columns: list[str] | None = None
    reader_options: dict[str, str] = field(default_factory=dict)
    _schema: pa.Schema = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.declared_schema = normalize_schema(self.declared_schema)
        if self.reader == UNITS_READER and self.declared_schema.names != ["unit"]:
            raise PlanError("the 'units' reader produces one binary column named 'unit'")
        self._schema = self.declared_schema
        if self.columns is not None:
            names = set(self.declared_schema.names)
            missing = [c for c in self.columns if c not in names]
            if missing:
                raise PlanError(f"scan of feed {self.feed.feed_id!r}: columns {missing} are not in {self.declared_schema.names}")
            self._schema = pa.schema([self.declared_schema.field(c) for c in self.columns])

    @property
    def schema(self) -> pa.Schema:
        """The columns read (made once: the planner asks for every node's schema many times)."""
        return self._schema

    def reading(self, columns: list[str]) -> FeedScanNode:
        """This scan reading only ``columns``, some of those it reads, in its order: nothing normalized or checked
        again (pruning made a third of TPC-DS q14's scans anew, and checking each was a sixth of its planning)."""
        out = self.with_inputs(columns=columns)
        at = {n: i for i, n in enumerate(self._schema.names)}  # names, not fields: a pyarrow field is made per access
        out._schema = pa.schema([self._schema.field(at[c]) for c in columns])
        return out

    def fill_proto(self, op: plan_pb2.Operator) -> Sequence[plan_pb2.Operator]:
        op.feed_scan.CopyFrom(
            plan_pb2.FeedScan(
                feed=self.feed.to_proto(),
                reader=self.reader,
                schema=encode_schema(self.declared_schema),
                columns=self.columns or [],
                reader_options=self.reader_options,
            )
        )
        return ()

    def label(self) -> str:
        cols = f", columns={self.columns}" if self.columns is not None else ""
        provider = type(self.feed.inner()).__name__
        return f"FeedScan[{self.feed.feed_id} ({provider}), reader={self.reader}{cols}]"


@dataclass(eq=False)
class ExchangeInputNode(Node):
    """A map stage's input: batches the client streams up the DoExchange."""

    input_schema: pa.Schema

    @property
    def schema(self) -> pa.Schema:
        return normalize_schema(self.input_schema)

    def fill_proto(self, op: plan_pb2.Operator) -> Sequence[plan_pb2.Operator]:
        op.exchange_input.CopyFrom(plan_pb2.ExchangeInput(schema=encode_schema(self.schema)))
        return ()

    def label(self) -> str:
        return f"ExchangeInput[{', '.join(self.schema.names)}]"


@dataclass(eq=False)
class InputCallNode(Node):
    """Rows another process sends each task of its stage on an input call, one task per partition
    (a Spark DataFrame's partitions: ``flight.spark.table``). The stage is opened by its coordinator
    like any other; only its batches come from elsewhere (docs/protocol.md, section 16).

    ``source`` stays in this process (the DataFrame): only the schema and ``input_id`` are sent."""

    input_schema: pa.Schema
    partitions: int
    input_id: str
    source: object = None
    columns: list[str] | None = None
    """The columns the query uses (column pruning): only those are sent."""

    def __post_init__(self) -> None:
        if self.partitions < 1:
            raise PlanError(f"input {self.input_id!r} has {self.partitions} partitions; it needs at least one")

    @property
    def schema(self) -> pa.Schema:
        schema = normalize_schema(self.input_schema)
        return schema if self.columns is None else pa.schema([schema.field(c) for c in self.columns])

    def fill_proto(self, op: plan_pb2.Operator) -> Sequence[plan_pb2.Operator]:
        op.exchange_input.CopyFrom(plan_pb2.ExchangeInput(schema=encode_schema(self.schema), separate_input=True, input_id=self.input_id))
        return ()

    def label(self) -> str:
        return f"InputCall[{self.input_id}: {self.partitions} partitions, {', '.join(self.schema.names)}]"


@dataclass(eq=False)
class ValuesNode(Node):
    table: pa.Table
    every_task: bool = False
    """Every task of its stage emits the rows (literal rows a join builds in each task); else task 0 alone."""

    @property
    def schema(self) -> pa.Schema:
        return self.table.schema

    def fill_proto(self, op: plan_pb2.Operator) -> Sequence[plan_pb2.Operator]:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, self.table.schema) as writer:
            writer.write_table(self.table)
        op.values.CopyFrom(plan_pb2.Values(ipc_stream=sink.getvalue().to_pybytes(), every_task=self.every_task))
        return ()

    def label(self) -> str:
        return f"Values[{self.table.num_rows} rows{', in every task' if self.every_task else ''}]"


@dataclass(eq=False)
class FilterNode(Node):
    input: Node
    predicate: Expr
    origins: tuple[str, ...] = ()
    """Set by the optimizer on a filter it moved or derived: one entry per conjunct of the predicate,
    why that conjunct is here ("" where the query wrote it); explain() shows them."""

    def __post_init__(self) -> None:
        t = _typed(self.predicate, self.input.schema, "filter")
        if t != pa.bool_():
            raise PlanError(f"filter: the predicate {self.predicate!r} is of type {t}, not bool")

    @property
    def schema(self) -> pa.Schema:
        return self.input.schema

    def children(self) -> Sequence[Node]:
        return (self.input,)

    def fill_proto(self, op: plan_pb2.Operator) -> Sequence[plan_pb2.Operator]:
        op.filter.predicate.CopyFrom(self.predicate.to_proto())
        return (op.filter.input,)

    def label(self) -> str:
        return f"Filter[{self.predicate!r}]" + self.origin_note()

    def origin_note(self) -> str:
        """``  <- conjunct 2 pushed below ...`` for the conjuncts the optimizer moved here ("" when none)."""
        if not any(self.origins):
            return ""
        if len(self.origins) == 1:
            return f"  <- {self.origins[0]}"
        by_origin: dict[str, list[str]] = {}
        for i, origin in enumerate(self.origins, 1):
            if origin:
                by_origin.setdefault(origin, []).append(str(i))
        parts = [f"conjunct{'s' if len(ix) > 1 else ''} {', '.join(ix)} {origin}" for origin, ix in by_origin.items()]
        return "  <- " + "; ".join(parts)


@dataclass(eq=False)
class ProjectNode(Node):
    input: Node
    exprs: list[tuple[str, Expr]]
    _schema: pa.Schema = field(init=False, repr=False)

    def __post_init__(self) -> None:
        names = [n for n, _ in self.exprs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise PlanError(f"select: column names {dupes} appear more than once")
        self._schema = pa.schema([pa.field(n, _typed(e, self.input.schema, "select")) for n, e in self.exprs])

    def selects(self) -> bool:
        """Whether it only selects columns of its input, each under its own name (no expression, no rename)."""
        return all(e.column_name() == n for n, e in self.exprs)

    def keeping(self, child: Node, kept: list[tuple[str, Expr]]) -> ProjectNode:
        """This projection with only ``kept`` (some of its expressions), over ``child``: this input pruned, whose
        columns the kept expressions read have their types still. Their types are then known, not checked again:
        pruning rebuilt every projection of a plan, a fifth of planning TPC-DS's queries spent typing them."""
        out = object.__new__(ProjectNode)
        out.input, out.exprs = child, kept
        out._schema = pa.schema([self._schema.field(n) for n, _ in kept])
        return out

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    def children(self) -> Sequence[Node]:
        return (self.input,)

    def fill_proto(self, op: plan_pb2.Operator) -> Sequence[plan_pb2.Operator]:
        op.project.SetInParent()  # set even without expressions (the worker refuses those, saying so)
        op.project.exprs.extend(plan_pb2.NamedExpression(name=n, expr=e.to_proto()) for n, e in self.exprs)
        return (op.project.input,)

    def label(self) -> str:
        return "Project[" + ", ".join(n if _is_col(e, n) else f"{n}={e!r}" for n, e in self.exprs) + "]"


@dataclass(eq=False)
class LimitNode(Node):
    input: Node
    count: int
    offset: int = 0

    def __post_init__(self) -> None:
        if self.count < 0 or self.offset < 0:
            raise PlanError(f"limit: count ({self.count}) and offset ({self.offset}) must not be negative")

    @property
    def schema(self) -> pa.Schema:
        return self.input.schema

    def children(self) -> Sequence[Node]:
        return (self.input,)

    def fill_proto(self, op: plan_pb2.Operator) -> Sequence[plan_pb2.Operator]:
        op.limit.CopyFrom(plan_pb2.Limit(count=self.count, offset=self.offset))
        return (op.limit.input,)

    def label(self) -> str:
        return f"Limit[{self.count}" + (f", offset={self.offset}]" if self.offset else "]")


def _typed(expr: Expr, schema: pa.Schema, operator: str) -> pa.DataType:
    try:
        return output_type(expr, schema)
    except PlanError as exc:
        used = sorted(n for n in expr.referenced_fields() if n in schema.names)
        columns = ", ".join(f"{n!r} ({schema.field(n).type})" for n in used)
        raise PlanError(f"{operator}: {exc}" + (f" [columns: {columns}]" if columns else "")) from exc


def _is_col(expr: Expr, name: str) -> bool:
    return expr.column_name() == name


@dataclass(eq=False)
class UnnestNode(Node):
    """One row per element of a list column (SQL's ``UNNEST``, Spark's ``explode``): the input's columns, then the
    element as ``name``; a row whose list is empty or null gives none. Row by row, so the planner keeps it in its
    input's stage; the engine is DuckDB (Acero has no such node: ``flight.engine.select.duckdb_only``)."""

    input: Node
    column: str
    name: str
    _schema: pa.Schema = field(init=False, repr=False)

    def __post_init__(self) -> None:
        schema = self.input.schema
        if self.column not in schema.names:
            raise PlanError(f"unnest: {self.column!r} is not a column of its input; available: {', '.join(schema.names)}")
        t = schema.field(self.column).type
        if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
            raise PlanError(f"unnest: {self.column!r} is a {t}, not a list")
        if not self.name or self.name in schema.names:
            raise PlanError(f"unnest: the element's name {self.name!r} is empty or already a column")
        self._schema = schema.append(pa.field(self.name, t.value_type))

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    def children(self) -> Sequence[Node]:
        return (self.input,)

    def fill_proto(self, op: plan_pb2.Operator) -> Sequence[plan_pb2.Operator]:
        op.unnest.CopyFrom(plan_pb2.Unnest(column=self.column, name=self.name))
        return (op.unnest.input,)

    def label(self) -> str:
        return f"Unnest[{self.column} as {self.name}]"
