"""Relational operators: aggregate, join, sort, union, and the read of another stage.

Output schemas come from running the engine's own Acero declarations over
empty inputs, so they are exactly what workers will produce; a key that does
not exist or types that do not fit are ``PlanError``s naming the operator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from flight.compute.relational import aggregate_schema, join_schema
from flight.errors import PlanError
from flight.plan.agg import call_text
from flight.plan.expr import Expr
from flight.plan.nodes import Node
from flight.plan.typecheck import output_type
from flight.wire._proto import plan_pb2
from flight.wire.protocol import encode_schema

__all__ = ["AggCall", "AggregateNode", "JoinNode", "ShuffleReadNode", "SortNode", "UnionNode"]


@dataclass(frozen=True, eq=False)
class AggCall:
    name: str
    function: str
    expr: Expr | None  # None for count_all
    fraction: float | None = None  # a quantile's (flight.plan.agg.QUANTILES)
    separator: str | None = None  # string_agg's
    order: tuple[tuple[Expr, bool, bool], ...] = ()  # string_agg's and array_agg's (expression, descending, nulls first)
    where: Expr | None = None  # array_agg's FILTER

    def expressions(self) -> list[Expr]:
        return [e for e in (self.expr, *(o[0] for o in self.order), self.where) if e is not None]


def _require(names: Sequence[str], schema: pa.Schema, operator: str, what: str) -> None:
    for n in names:
        if n not in schema.names:
            raise PlanError(f"{operator}: {what} {n!r} is not a column of its input; available: {', '.join(schema.names)}")


@dataclass(eq=False)
class AggregateNode(Node):
    input: Node
    keys: list[str]
    calls: list[AggCall]
    label_text: str = ""
    partial: bool = False
    """Set by the planner on the pre-aggregate a final aggregate merges: workers may compute it per work unit."""
    _schema: pa.Schema = field(init=False, repr=False)
    _cols: list[tuple[str, list[str], str]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        schema = self.input.schema
        _require(self.keys, schema, "aggregate", "group key")
        names = [*self.keys, *(c.name for c in self.calls)]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise PlanError(f"aggregate: output names {dupes} appear more than once")
        types: dict[int, pa.DataType] = {}  # by the expression's id: each is typed once
        for c in self.calls:
            for e in c.expressions():
                try:
                    t = types[id(e)] = output_type(e, schema)
                except PlanError as exc:
                    raise PlanError(f"aggregate {c.name}: {exc}") from exc
                if e is c.where and t != pa.bool_():
                    raise PlanError(f"aggregate {c.name}: its filter {e!r} is of type {t}, not bool")
        self._cols = self._columns()  # the calls are fixed once made: their columns are worked out once
        exprs, names_in = self._arguments()
        # What Acero's project makes of the arguments (nullable fields, no metadata), each type
        # bound once per process (output_type), then the aggregate's own answer, remembered too.
        projected = pa.schema([pa.field(n, types.get(id(e)) or output_type(e, schema)) for e, n in zip(exprs, names_in)])
        try:
            self._schema = aggregate_schema(projected, self.keys, self._calls())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise PlanError(f"aggregate: {exc}") from exc

    def _columns(self) -> list[tuple[str, list[str], str]]:
        """Each call's argument column, its order keys' columns and its filter's column ("" for none); equal
        expressions share one (Acero does not spot them)."""
        seen: dict[bytes, str] = {}

        def column(e: Expr | None, stem: str) -> str:
            return "" if e is None else seen.setdefault(e.wire(), stem)

        return [
            (column(c.expr, f"__arg{i}"), [column(e, f"__ord{i}_{k}") for k, (e, _, _) in enumerate(c.order)], column(c.where, f"__where{i}"))
            for i, c in enumerate(self.calls)
        ]

    def _argument_columns(self) -> list[str]:
        return [arg for arg, _, _ in self._cols]

    def _arguments(self) -> tuple[list[Expr], list[str]]:
        from flight.plan.expr import col

        exprs = [col(k) for k in self.keys]
        names = list(self.keys)
        for c, (arg, orders, where) in zip(self.calls, self._cols):
            pairs = [(c.expr, arg), *((o[0], n) for o, n in zip(c.order, orders)), (c.where, where)]
            for e, name in pairs:
                if e is not None and name not in names:
                    exprs.append(e)
                    names.append(name)
        return exprs, names

    def _calls(self) -> list[tuple[str, str, str]]:
        return [(c.function, column, c.name) for c, column in zip(self.calls, self._argument_columns())]

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    def children(self) -> Sequence[Node]:
        return (self.input,)

    def fill_proto(self, op: plan_pb2.Operator) -> Sequence[plan_pb2.Operator]:
        exprs, names = self._arguments()
        op.aggregate.CopyFrom(
            plan_pb2.Aggregate(
                keys=self.keys,
                aggregates=[
                    plan_pb2.AggregateCall(
                        function=call.function, column=arg, name=call.name, fraction=call.fraction or 0.0, separator=call.separator or "",
                        order=[plan_pb2.AggregateOrder(column=o, descending=d, nulls_first=nf) for o, (_, d, nf) in zip(orders, call.order)],
                        filter=where,
                    )
                    for call, (arg, orders, where) in zip(self.calls, self._cols)
                ],
                partial=self.partial,
            )
        )
        if not exprs:  # e.g. a global count(*): nothing to compute, the rows are enough
            return (op.aggregate.input,)
        project = op.aggregate.input.project  # the arguments, computed below the aggregate
        project.exprs.extend(plan_pb2.NamedExpression(name=n, expr=e.to_proto()) for n, e in zip(names, exprs))
        return (project.input,)

    def label(self) -> str:
        what = self.label_text or "Aggregate"
        calls = ", ".join(f"{c.name}={call_text(c)}" for c in self.calls)
        return f"{what}[keys={self.keys}; {calls}]" if calls else f"{what}[keys={self.keys}]"


@dataclass(eq=False)
class JoinNode(Node):
    left: Node
    right: Node
    left_keys: list[str]
    right_keys: list[str]
    join_type: str
    right_suffix: str = "_right"
    strategy: str = ""  # set by the planner: "broadcast" or "shuffle", shown by explain()
    filter: Expr | None = None
    """A condition on the joined row beside the key equalities (SQL's ``ON a = b AND x <> y``)."""
    _schema: pa.Schema = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if len(self.left_keys) != len(self.right_keys) or not self.left_keys:
            raise PlanError("join: give as many left keys as right keys, at least one")
        ls, rs = self.left.schema, self.right.schema
        _require(self.left_keys, ls, "join", "left key")
        _require(self.right_keys, rs, "join", "right key")
        for lk, rk in zip(self.left_keys, self.right_keys):
            lt, rt = ls.field(lk).type, rs.field(rk).type
            if lt != rt:
                raise PlanError(
                    f"join: key {lk!r} ({lt}) and {rk!r} ({rt}) have different types; cast one side first"
                )
        try:
            self._schema = join_schema(ls, rs, self.join_type, self.left_keys, self.right_keys, self.right_suffix)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise PlanError(f"join on {self.left_keys} = {self.right_keys}: {exc}") from exc
        if self.filter is not None:
            shared = sorted(set(ls.names) & set(rs.names))
            if shared:
                raise PlanError(f"join filter: both sides have columns named {shared}; rename one side first")
            t = output_type(self.filter, pa.schema([*ls, *rs]))
            if not pa.types.is_boolean(t):
                raise PlanError(f"join filter: {self.filter!r} is {t}, not a boolean")

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    def children(self) -> Sequence[Node]:
        return (self.left, self.right)

    def fill_proto(self, op: plan_pb2.Operator) -> Sequence[plan_pb2.Operator]:
        op.hash_join.CopyFrom(
            plan_pb2.HashJoin(
                left_keys=self.left_keys,
                right_keys=self.right_keys,
                join_type=self.join_type,
                right_suffix=self.right_suffix,
                filter=self.filter.to_proto() if self.filter is not None else None,
            )
        )
        return (op.hash_join.left, op.hash_join.right)

    def label(self) -> str:
        how = f", {self.strategy}" if self.strategy else ""
        keys = ", ".join(f"{a}={b}" for a, b in zip(self.left_keys, self.right_keys))
        where = f", filter={self.filter!r}" if self.filter is not None else ""
        return f"HashJoin[{self.join_type}, {keys}{where}{how}]"


@dataclass(eq=False)
class SortNode(Node):
    input: Node
    keys: list[tuple[str, bool]]
    nulls_first: bool = False
    fetch: int = 0

    def __post_init__(self) -> None:
        if not self.keys:
            raise PlanError("sort: no sort keys given")
        _require([k for k, _ in self.keys], self.input.schema, "sort", "key")

    @property
    def schema(self) -> pa.Schema:
        return self.input.schema

    def children(self) -> Sequence[Node]:
        return (self.input,)

    def fill_proto(self, op: plan_pb2.Operator) -> Sequence[plan_pb2.Operator]:
        op.sort.CopyFrom(
            plan_pb2.Sort(
                keys=[plan_pb2.SortKey(column=k, descending=d) for k, d in self.keys],
                nulls_first=self.nulls_first,
                fetch=self.fetch,
            )
        )
        return (op.sort.input,)

    def label(self) -> str:
        keys = ", ".join(f"{k} {'desc' if d else 'asc'}" for k, d in self.keys)
        return f"Sort[{keys}" + (f", fetch={self.fetch}]" if self.fetch else "]")


@dataclass(eq=False)
class UnionNode(Node):
    inputs: list[Node]

    def __post_init__(self) -> None:
        first = self.inputs[0].schema
        for i, node in enumerate(self.inputs[1:], 1):
            if not node.schema.equals(first):
                raise PlanError(f"union: input {i} has schema {node.schema}, not {first}; select and cast to match")

    @property
    def schema(self) -> pa.Schema:
        return self.inputs[0].schema

    def children(self) -> Sequence[Node]:
        return tuple(self.inputs)

    def fill_proto(self, op: plan_pb2.Operator) -> Sequence[plan_pb2.Operator]:
        return [op.union.inputs.add() for _ in self.inputs]

    def label(self) -> str:
        return f"Union[{len(self.inputs)} inputs]"


@dataclass(eq=False)
class ShuffleReadNode(Node):
    """Rows of stage ``stage_id``, crossing a network boundary.

    ``mode``: "hash" (task t reads partition t of every producer), "gather" (the
    one consumer task reads every producer's only partition) or "broadcast"
    (every consumer task reads every producer's only partition). The producers'
    URLs and keys are bound at execution, right before serialization.
    """

    stage_id: int
    input_schema: pa.Schema
    mode: str
    producers: list[tuple[str, bytes]] = field(default_factory=list)
    partition: int = 0

    @property
    def schema(self) -> pa.Schema:
        return self.input_schema

    def fill_proto(self, op: plan_pb2.Operator) -> Sequence[plan_pb2.Operator]:
        start = self.partition if self.mode == "hash" else 0
        op.shuffle_read.CopyFrom(
            plan_pb2.ShuffleRead(
                stage_id=self.stage_id,
                producers=[plan_pb2.ProducerTask(url=u, stage_key=k) for u, k in self.producers],
                partition_start=start,
                partition_end=start + 1,
                schema=encode_schema(self.input_schema),
            )
        )
        return ()

    def label(self) -> str:
        return f"{self.mode.capitalize()}Read[stage {self.stage_id}]"
