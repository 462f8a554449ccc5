"""What a worker remembers across a query's runs (``flight.compute.expressions``, ``flight.engine.duck.sql``):
the same bytes give the same answer, other column types another, and a refused expression is refused every time."""

from __future__ import annotations

import pyarrow as pa
import pytest

from flight.compute.expressions import bind, to_pyarrow
from flight.engine.duck.sql import expression_sql
from flight.errors import ProtocolError
from flight.plan.expr import col, lit
from flight.wire._proto import plan_pb2


def test_the_same_bytes_decode_once_and_a_malformed_expression_is_refused_each_time() -> None:
    msg = ((col("a") + lit(1)) * col("b")).to_proto()
    assert to_pyarrow(msg, "e") is to_pyarrow(plan_pb2.Expression.FromString(msg.SerializeToString()), "e")
    bad = plan_pb2.Expression()
    bad.nodes.add().call.function = "add"  # a call with no arguments
    for _ in range(2):
        with pytest.raises(ProtocolError):
            to_pyarrow(bad, "e")


@pytest.mark.parametrize("t", [pa.int32(), pa.int64(), pa.decimal128(7, 2), pa.float64()])
def test_bound_types_and_text_follow_the_columns_types(t: pa.DataType) -> None:
    """One expression over columns of each type, in turn: each answer is that type's (Acero's own), and so is its
    DuckDB text, whichever was remembered first."""
    msg = (col("a") + col("b")).to_proto()
    schema = pa.schema([("a", t), ("b", t), ("other", pa.string())])
    want = pa.table({"a": pa.array([1], t), "b": pa.array([2], t)}).column("a").type
    got = bind(msg, to_pyarrow(msg, "e"), schema, "e")
    assert got == pa.compute.add(pa.scalar(1, want), pa.scalar(2, want)).type
    text = expression_sql(msg, schema, "e")
    assert ("DECIMAL" in text) == pa.types.is_decimal(t), text
    assert expression_sql(msg, schema, "e", "j0") != text  # the qualifier is part of what is remembered
