"""Window functions (SQL's ``OVER``): ``WindowNode`` and the types its calls produce.

A window keeps every input row and adds one column per call, computed over the row's
partition (rows with equal ``partition_by`` values) in ``order_by`` order. The planner moves
rows by the partition keys, so each partition is whole in one task; the engine is DuckDB
(docs/sql.md); ``flight.compute.window`` says the types its calls produce.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from flight.compute.window import FUNCTIONS, window_type
from flight.errors import PlanError
from flight.plan.nodes import Node
from flight.wire._proto import plan_pb2

__all__ = ["WindowCall", "WindowNode"]

def _numeric(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t))


@dataclass(frozen=True)
class WindowCall:
    function: str
    column: str  # "" for the ranks and count_all
    name: str
    offset: int = 0  # lag / lead
    frame: tuple[int | None, int | None] | None = None
    """ROWS BETWEEN start AND end as offsets from the current row (None: unbounded); None: SQL's default frame."""
    range_frame: bool = False
    """The frame is RANGE BETWEEN: its offsets are distances in the one order key's values (a number), not rows."""


@dataclass(eq=False)
class WindowNode(Node):
    input: Node
    partition_by: list[str]
    order_by: list[tuple[str, bool]]  # (column, descending); nulls last
    calls: list[WindowCall]
    _schema: pa.Schema = field(init=False, repr=False)

    def __post_init__(self) -> None:
        schema = self.input.schema
        for name in [*self.partition_by, *(k for k, _ in self.order_by), *(c.column for c in self.calls if c.column)]:
            if name not in schema.names:
                raise PlanError(f"window: {name!r} is not a column of its input; available: {', '.join(schema.names)}")
        fields = list(schema)
        for c in self.calls:
            if c.function not in FUNCTIONS:
                raise PlanError(f"window: unknown function {c.function!r}; known: {', '.join(FUNCTIONS)}")
            if c.name in schema.names or c.name in [f.name for f in fields[len(schema):]]:
                raise PlanError(f"window: output {c.name!r} is already a column")
            if c.range_frame and (len(self.order_by) != 1 or not _numeric(schema.field(self.order_by[0][0]).type)):
                raise PlanError(f"window {c.name}: a RANGE frame with offsets needs one order key, a number")
            arg = schema.field(c.column).type if c.column else None
            try:
                fields.append(pa.field(c.name, window_type(c.function, arg)))
            except ValueError as exc:
                raise PlanError(f"window {c.name}: {exc}") from None
        self._schema = pa.schema(fields)

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    def children(self) -> Sequence[Node]:
        return (self.input,)

    def fill_proto(self, op: plan_pb2.Operator) -> Sequence[plan_pb2.Operator]:
        calls = []
        for c in self.calls:
            call = plan_pb2.WindowCall(function=c.function, column=c.column, name=c.name, offset=c.offset)
            if c.frame is not None:
                start, end = c.frame
                call.frame.CopyFrom(plan_pb2.WindowFrame(
                    start_unbounded=start is None, start=start or 0, end_unbounded=end is None, end=end or 0, range=c.range_frame
                ))
            calls.append(call)
        op.window.CopyFrom(plan_pb2.Window(
            partition_by=self.partition_by,
            order_by=[plan_pb2.SortKey(column=k, descending=d) for k, d in self.order_by],
            calls=calls,
        ))
        return (op.window.input,)

    def label(self) -> str:
        order = ", ".join(f"{k} {'desc' if d else 'asc'}" for k, d in self.order_by)
        calls = ", ".join(f"{c.name}={c.function}({c.column})" for c in self.calls)
        return f"Window[partition by {self.partition_by}; order by [{order}]; {calls}]"
