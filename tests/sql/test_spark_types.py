"""Spark's DECIMAL result types (``flight.sql.spark_types``), against the types PySpark 4 gives the same
expressions (read off ``spark.sql(...).toArrow().schema`` once; the Spark corpus checks them end to end)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from flight.sql import spark_types as st

D = pa.decimal128


@pytest.mark.parametrize(
    ("got", "spark"),
    [
        (st.avg_type(D(15, 2)), D(19, 6)),  # avg(l_discount): TPC-H Q1
        (st.sum_type(D(15, 2)), D(25, 2)),
        (st.divide_type(D(15, 2), D(15, 2)), D(33, 18)),
        (st.divide_type(D(25, 2), D(25, 2)), D(38, 13)),  # sum(x) / sum(y): 53 digits adjusted to 38, scale 13
        (st.divide_type(D(25, 2), D(1, 0)), D(29, 6)),  # sum(x) / 3: an integer literal is a DECIMAL of its digits
        (st.divide_type(D(25, 2), D(10, 0)), D(36, 13)),  # sum(x) / i, an INT column
        (st.multiply_type(st.multiply_type(D(15, 2), D(15, 2)), D(2, 1)), D(34, 5)),
        (st.multiply_type(D(25, 2), D(15, 2)), D(38, 4)),  # sum(x * q): past 38 digits, the scale kept
        (st.add_type(D(15, 2), D(10, 0)), D(16, 2)),  # x + 1
        (st.add_type(D(25, 2), D(25, 2)), D(26, 2)),  # sum(q - x)
    ],
)
def test_spark_decimal_types(got: pa.DataType, spark: pa.DataType) -> None:
    assert got == spark


def test_integers_count_as_the_decimal_that_holds_them() -> None:
    assert st.as_decimal(pa.int32()) == D(10, 0)
    assert st.as_decimal(pa.int64()) == D(20, 0)
    assert st.as_decimal(pa.float64()) is None


def test_a_result_past_38_digits_keeps_at_least_six_after_the_point() -> None:
    assert st.divide_type(D(38, 0), D(38, 0)) == D(38, 6)
    assert st.avg_type(D(38, 36)) == D(38, 38)
