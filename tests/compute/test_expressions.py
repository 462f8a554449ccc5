"""Expressions: builder → protobuf bytes → worker decoder → pyarrow, checked against pyarrow.compute."""

from __future__ import annotations

import datetime as dt
import functools
import math
import operator
import random
import subprocess
import sys
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from google.protobuf.message import DecodeError
from pyarrow import acero

from flight.compute.expressions import MAX_DEPTH, MAX_NODES, MAX_ROUND_DIGITS, referenced_fields, to_pyarrow
from flight.errors import PlanError, ProtocolError
from flight.plan.expr import Expr, call, coalesce, col, if_else, lit
from flight.plan.typecheck import output_type
from flight.wire._proto import plan_pb2
from flight.wire.functions import FUNCTIONS, NARY_FUNCTIONS, FunctionSpec, lookup

TABLE = pa.table(
    {
        "i": pa.array([1, 2, None, 4, -5], pa.int64()),
        "j": pa.array([3, 2, 7, None, 5], pa.int32()),
        "f": pa.array([1.5, None, float("nan"), -2.25, 10.0], pa.float64()),
        "s": pa.array(["apple", "Banana", None, "cherry pie", "  date "], pa.string()),
        "t": pa.array(["x", "y", "z", None, "w"], pa.string()),
        "bin": pa.array([b"ab", b"", None, b"\x00\x01\x02", b"z"], pa.binary()),
        "b": pa.array([True, False, None, True, False], pa.bool_()),
        "c": pa.array([True, True, False, None, False], pa.bool_()),
        "d": pa.array([dt.date(2024, 1, 15), dt.date(2023, 12, 31), None, dt.date(2020, 2, 29), dt.date(1999, 7, 4)]),
        "ts": pa.array(
            [dt.datetime(2024, 1, 15, 13, 45, 30), None, dt.datetime(2000, 6, 1, 0, 0, 1),
             dt.datetime(2021, 3, 7, 23, 59, 59), dt.datetime(1970, 1, 1)],
            pa.timestamp("us"),
        ),
        "dec": pa.array(
            [Decimal("1.25"), Decimal("-3.50"), None, Decimal("100.00"), Decimal("0.01")], pa.decimal128(10, 2)
        ),
        "st": pa.array([{"a": 1, "b": "x"}, None, {"a": None, "b": "y"}, {"a": 4, "b": None}, {"a": 5, "b": "z"}]),
        "l": pa.array([[1, 2], [], None, [None, 7, 8], [9]], pa.list_(pa.int64())),
    }
)


def roundtrip(expr: Expr) -> Expr:
    """Through the wire format and back, checking nothing changed."""
    data = expr.to_proto().SerializeToString()
    back = Expr.from_proto(plan_pb2.Expression.FromString(data))
    assert back.equals(expr)
    assert repr(back) == repr(expr)
    return back


def evaluate(expr: Expr, table: pa.Table = TABLE) -> pa.Array:
    """What a worker computes: decode the bytes and project with Acero."""
    expression = to_pyarrow(roundtrip(expr).to_proto())
    source = acero.Declaration("table_source", acero.TableSourceNodeOptions(table))
    project = acero.Declaration("project", acero.ProjectNodeOptions([expression], ["out"]))
    return acero.Declaration.from_sequence([source, project]).to_table().column("out").combine_chunks()


def _values(array: pa.Array | pa.ChunkedArray) -> list[object]:
    return ["NaN" if isinstance(v, float) and math.isnan(v) else v for v in array.to_pylist()]


def assert_same(expr: Expr, want: pa.Array | pa.ChunkedArray | pa.Scalar) -> None:
    got = evaluate(expr)
    if isinstance(want, pa.Scalar):
        want = pa.array([want.as_py()] * TABLE.num_rows, want.type)
    assert got.type == want.type
    assert _values(got) == _values(want)
    assert output_type(expr, TABLE.schema) == want.type


T = TABLE
Case = tuple[str, Expr, Callable[[], object]]

COMPARISONS: list[Case] = [
    ("eq", col("i") == 2, lambda: pc.equal(T["i"], 2)),
    ("ne", col("i") != 2, lambda: pc.not_equal(T["i"], 2)),
    ("lt", col("i") < col("j"), lambda: pc.less(T["i"], T["j"])),
    ("le", col("i") <= 2, lambda: pc.less_equal(T["i"], 2)),
    ("gt", col("f") > 1.0, lambda: pc.greater(T["f"], 1.0)),
    ("ge", col("s") >= "b", lambda: pc.greater_equal(T["s"], "b")),
    ("reflected", 2 < col("i"), lambda: pc.greater(T["i"], 2)),
    ("date", col("d") > lit(dt.date(2021, 1, 1)), lambda: pc.greater(T["d"], pa.scalar(dt.date(2021, 1, 1)))),
    ("decimal", col("dec") > lit(Decimal("1.00")), lambda: pc.greater(T["dec"], pa.scalar(Decimal("1.00")))),
    ("between", col("i").between(1, 3), lambda: pc.and_kleene(pc.greater_equal(T["i"], 1), pc.less_equal(T["i"], 3))),
]

BOOLEANS: list[Case] = [
    ("and", col("b") & col("c"), lambda: pc.and_kleene(T["b"], T["c"])),
    ("or", col("b") | col("c"), lambda: pc.or_kleene(T["b"], T["c"])),
    ("not", ~col("b"), lambda: pc.invert(T["b"])),
    ("rand", True & col("c"), lambda: pc.and_kleene(pa.scalar(True), T["c"])),
    ("ror", False | col("c"), lambda: pc.or_kleene(pa.scalar(False), T["c"])),
    ("xor", call("xor", col("b"), col("c")), lambda: pc.xor(T["b"], T["c"])),
    ("and_plain", call("and", col("b"), col("c")), lambda: pc.and_(T["b"], T["c"])),
    ("or_plain", call("or", col("b"), col("c")), lambda: pc.or_(T["b"], T["c"])),
    ("and_not", call("and_not", col("b"), col("c")), lambda: pc.and_not(T["b"], T["c"])),
    ("and_not_kleene", call("and_not_kleene", col("b"), col("c")), lambda: pc.and_not_kleene(T["b"], T["c"])),
    ("nested", (col("i") > 0) & ~(col("s") == "apple"),
     lambda: pc.and_kleene(pc.greater(T["i"], 0), pc.invert(pc.equal(T["s"], "apple")))),
]

ARITHMETIC: list[Case] = [
    ("add", col("i") + col("j"), lambda: pc.add_checked(T["i"], T["j"])),
    ("radd", 1 + col("i"), lambda: pc.add_checked(1, T["i"])),
    ("sub", col("i") - 1, lambda: pc.subtract_checked(T["i"], 1)),
    ("rsub", 10 - col("i"), lambda: pc.subtract_checked(10, T["i"])),
    ("mul", col("f") * 2.0, lambda: pc.multiply_checked(T["f"], 2.0)),
    ("rmul", 3 * col("i"), lambda: pc.multiply_checked(3, T["i"])),
    ("div", col("i") / 2, lambda: pc.divide_checked(T["i"], 2)),
    ("rdiv", 100.0 / col("f"), lambda: pc.divide_checked(100.0, T["f"])),
    ("neg", -col("i"), lambda: pc.negate_checked(T["i"])),
    ("unchecked", call("add", col("i"), 1), lambda: pc.add(T["i"], 1)),
    ("decimal", col("dec") + lit(Decimal("1.10")), lambda: pc.add_checked(T["dec"], pa.scalar(Decimal("1.10")))),
    ("abs", call("abs", col("i")), lambda: pc.abs(T["i"])),
    ("power", call("power", col("f"), 2), lambda: pc.power(T["f"], 2)),
    ("sqrt", call("sqrt", col("f")), lambda: pc.sqrt(T["f"])),
    ("floor", call("floor", col("f")), lambda: pc.floor(T["f"])),
    ("ceil", call("ceil", col("f")), lambda: pc.ceil(T["f"])),
    ("round", col("f").round(), lambda: pc.round(T["f"])),
    ("round1", (col("f") / 3.0).round(1), lambda: pc.round(pc.divide_checked(T["f"], 3.0), 1)),
    ("round_dec", col("dec").round(1), lambda: pc.round(T["dec"], 1)),
]

SETS_AND_STRINGS: list[Case] = [
    ("isin", col("s").isin(["apple", "cherry pie", None]),
     lambda: pc.is_in(T["s"], value_set=pa.array(["apple", "cherry pie", None]))),
    ("isin_skip", col("s").isin(["apple", None], skip_nulls=True),
     lambda: pc.is_in(T["s"], value_set=pa.array(["apple", None]), skip_nulls=True)),
    ("isin_int", col("i").isin(pa.array([1, 4], pa.int64())), lambda: pc.is_in(T["i"], value_set=pa.array([1, 4]))),
    ("isin_date", col("d").isin([dt.date(2020, 2, 29)]),
     lambda: pc.is_in(T["d"], value_set=pa.array([dt.date(2020, 2, 29)]))),
    ("like", col("s").like("%a%e"), lambda: pc.match_like(T["s"], "%a%e")),
    ("like_case", col("s").like("b_n%", ignore_case=True), lambda: pc.match_like(T["s"], "b_n%", ignore_case=True)),
    ("contains", col("s").contains("an"), lambda: pc.match_substring(T["s"], "an")),
    ("startswith", col("s").startswith("ch"), lambda: pc.starts_with(T["s"], "ch")),
    ("endswith", col("s").endswith("pie"), lambda: pc.ends_with(T["s"], "pie")),
    ("regex", call("match_substring_regex", col("s"), pattern="^[a-c]"),
     lambda: pc.match_substring_regex(T["s"], "^[a-c]")),
    ("substr", col("s").substr(1, 3), lambda: pc.utf8_slice_codeunits(T["s"], 1, 3)),
    ("substr_open", col("s").substr(2), lambda: pc.utf8_slice_codeunits(T["s"], 2)),
    ("substr_step", call("utf8_slice_codeunits", col("s"), start=0, stop=5, step=2),
     lambda: pc.utf8_slice_codeunits(T["s"], 0, 5, 2)),
    ("upper", col("s").upper(), lambda: pc.utf8_upper(T["s"])),
    ("lower", col("s").lower(), lambda: pc.utf8_lower(T["s"])),
    ("length", col("s").length(), lambda: pc.utf8_length(T["s"])),
    ("binary_length", call("binary_length", col("bin")), lambda: pc.binary_length(T["bin"])),
    ("trim", call("utf8_trim_whitespace", col("s")), lambda: pc.utf8_trim_whitespace(T["s"])),
    ("join", call("binary_join_element_wise", col("s"), col("t"), "-"),
     lambda: pc.binary_join_element_wise(T["s"], T["t"], "-")),
]

CASTS_DATES_CONDITIONALS: list[Case] = [
    ("cast_int", col("i").cast(pa.float32()), lambda: pc.cast(T["i"], pa.float32())),
    ("cast_dec", col("dec").cast(pa.float64()), lambda: pc.cast(T["dec"], pa.float64())),
    ("cast_unsafe", col("dec").cast(pa.int64(), safe=False), lambda: pc.cast(T["dec"], pa.int64(), safe=False)),
    ("cast_date", col("d").cast(pa.timestamp("s")), lambda: pc.cast(T["d"], pa.timestamp("s"))),
    ("cast_date_days", col("d").cast(pa.int32()), lambda: pc.cast(T["d"], pa.int32())),
    ("cast_days_date", (col("d").cast(pa.int32()) + lit(5, pa.int32())).cast(pa.date32()),
     lambda: pc.cast(pc.add_checked(pc.cast(T["d"], pa.int32()), pa.scalar(5, pa.int32())), pa.date32())),
    ("cast_int_date", col("j").cast(pa.date32()), lambda: pc.cast(T["j"], pa.date32())),
    ("cast_str", col("i").cast(pa.string()), lambda: pc.cast(T["i"], pa.string())),
    ("cast_dict", col("s").cast(pa.dictionary(pa.int32(), pa.string())),
     lambda: pc.cast(T["s"], pa.dictionary(pa.int32(), pa.string()))),
    *[(part, getattr(col("d"), part)(), (lambda p=part: getattr(pc, p)(T["d"])))
      for part in ("year", "month", "day", "day_of_week", "day_of_year", "quarter")],
    *[(part, getattr(col("ts"), part)(), (lambda p=part: getattr(pc, p)(T["ts"])))
      for part in ("hour", "minute", "second")],
    ("iso_year", call("iso_year", col("d")), lambda: pc.iso_year(T["d"])),
    ("if_else", if_else(col("b"), col("i"), 0), lambda: pc.if_else(T["b"], T["i"], 0)),
    ("if_else_str", if_else(col("i") > 1, "big", col("s")), lambda: pc.if_else(pc.greater(T["i"], 1), "big", T["s"])),
    ("coalesce", coalesce(col("i"), col("j").cast(pa.int64()), -1),
     lambda: pc.coalesce(T["i"], pc.cast(T["j"], pa.int64()), -1)),
    ("is_null", col("f").is_null(), lambda: pc.is_null(T["f"])),
    ("is_null_nan", col("f").is_null(nan_is_null=True), lambda: pc.is_null(T["f"], nan_is_null=True)),
    ("is_null_no_options", call("is_null", col("s")), lambda: pc.is_null(T["s"])),
    ("is_not_null", col("s").is_not_null(), lambda: pc.is_valid(T["s"])),
    ("is_nan", call("is_nan", col("f")), lambda: pc.is_nan(T["f"])),
    ("true_unless_null", call("true_unless_null", col("i")), lambda: pc.true_unless_null(T["i"])),
]

LITERALS: list[Case] = [
    ("bool", lit(True), lambda: pa.scalar(True)),
    ("int", lit(7), lambda: pa.scalar(7)),
    ("float", lit(0.5), lambda: pa.scalar(0.5)),
    ("str", lit("héllo"), lambda: pa.scalar("héllo")),
    ("bytes", lit(b"\x00\xff"), lambda: pa.scalar(b"\x00\xff")),
    ("none", lit(None), lambda: pa.scalar(None)),
    ("typed_none", lit(None, pa.int32()), lambda: pa.scalar(None, pa.int32())),
    ("typed_int", lit(5, pa.int8()), lambda: pa.scalar(5, pa.int8())),
    ("date", lit(dt.date(2024, 2, 29)), lambda: pa.scalar(dt.date(2024, 2, 29))),
    ("datetime", lit(dt.datetime(2024, 2, 29, 12, 30)), lambda: pa.scalar(dt.datetime(2024, 2, 29, 12, 30))),
    ("decimal", lit(Decimal("-12.345")), lambda: pa.scalar(Decimal("-12.345"))),
    ("big_int", lit(2**63), lambda: pa.scalar(2**63, pa.uint64())),
    ("pa_scalar", lit(pa.scalar(3, pa.int16())), lambda: pa.scalar(3, pa.int16())),
]


LIBRARY: list[Case] = [  # what flight.sql's function library builds on (flight/sql/functions.py)
    ("greatest", call("max_element_wise", col("i"), col("j").cast(pa.int64())), lambda: pc.max_element_wise(T["i"], T["j"].cast(pa.int64()))),
    ("least_float", call("min_element_wise", col("f"), lit(1.0)), lambda: pc.min_element_wise(T["f"], pa.scalar(1.0))),
    ("ln", call("ln", col("f")), lambda: pc.ln(T["f"])),
    ("log10", call("log10", col("f")), lambda: pc.log10(T["f"])),
    ("log2", call("log2", col("f")), lambda: pc.log2(T["f"])),
    ("logb", call("logb", col("f"), lit(3.0)), lambda: pc.logb(T["f"], pa.scalar(3.0))),
    ("exp", call("exp", col("f")), lambda: pc.exp(T["f"])),
    ("sign", call("sign", col("f")), lambda: pc.sign(T["f"])),
    ("sign_int", call("sign", col("i")), lambda: pc.sign(T["i"])),
    ("trunc", call("trunc", col("f")), lambda: pc.trunc(T["f"])),
    ("reverse", call("utf8_reverse", col("s")), lambda: pc.utf8_reverse(T["s"])),
    ("repeat", call("binary_repeat", col("s"), lit(2)), lambda: pc.binary_repeat(T["s"], 2)),
    ("right", col("s").substr(-3), lambda: pc.utf8_slice_codeunits(T["s"], -3)),
    ("lpad", call("utf8_lpad", col("s"), width=7, padding="*"), lambda: pc.utf8_lpad(T["s"], width=7, padding="*")),
    ("rpad", call("utf8_rpad", col("s"), width=4), lambda: pc.utf8_rpad(T["s"], width=4)),
    ("replace", call("replace_substring", col("s"), pattern="an", replacement="AN"),
     lambda: pc.replace_substring(T["s"], pattern="an", replacement="AN")),
    ("regexp_replace", call("replace_substring_regex", col("s"), pattern="([aeiou])", replacement="<\\1>"),
     lambda: pc.replace_substring_regex(T["s"], pattern="([aeiou])", replacement="<\\1>")),
    ("regexp_replace_first", call("replace_substring_regex", col("s"), pattern="[aeiou]", replacement="_", max_replacements=1),
     lambda: pc.replace_substring_regex(T["s"], pattern="[aeiou]", replacement="_", max_replacements=1)),
    ("trim_chars", call("utf8_trim", col("s"), characters=" ae"), lambda: pc.utf8_trim(T["s"], characters=" ae")),
    ("ltrim_chars", call("utf8_ltrim", col("s"), characters="aB"), lambda: pc.utf8_ltrim(T["s"], characters="aB")),
    ("rtrim_chars", call("utf8_rtrim", col("s"), characters="e "), lambda: pc.utf8_rtrim(T["s"], characters="e ")),
    ("join_replace", call("binary_join_element_wise", col("s"), col("t"), lit("-"), null_handling="replace", null_replacement="?"),
     lambda: pc.binary_join_element_wise(T["s"], T["t"], "-", null_handling="replace", null_replacement="?")),
    ("date_trunc_month", call("floor_temporal", col("d"), unit="month"), lambda: pc.floor_temporal(T["d"], unit="month")),
    ("date_trunc_week", call("floor_temporal", col("ts"), unit="week"), lambda: pc.floor_temporal(T["ts"], unit="week")),
    ("date_trunc_hour", call("floor_temporal", col("ts"), unit="hour"), lambda: pc.floor_temporal(T["ts"], unit="hour")),
    ("strftime", call("strftime", col("ts"), format="%Y-%m-%d %H:%M"), lambda: pc.strftime(T["ts"], format="%Y-%m-%d %H:%M")),
    ("strftime_date", call("strftime", col("d"), format="%d/%m/%Y"), lambda: pc.strftime(T["d"], format="%d/%m/%Y")),
    ("strptime", call("strptime", lit("2021-03-04 05:06"), format="%Y-%m-%d %H:%M", unit="us"),
     lambda: pc.strptime(pa.array(["2021-03-04 05:06"] * 5), format="%Y-%m-%d %H:%M", unit="us")),
    ("regexp_count", call("count_substring_regex", col("s"), pattern="[aeiou]"), lambda: pc.count_substring_regex(T["s"], "[aeiou]")),
    ("struct_field", call("struct_field", col("st"), indices=[1]), lambda: pc.struct_field(T["st"], [1])),
    ("list_element", call("list_element", call("list_slice", col("l"), start=1, stop=2), lit(0)),
     lambda: pc.list_element(pc.list_slice(T["l"], 1, 2, return_fixed_size_list=True), 0)),
    ("list_length", call("list_value_length", col("l")), lambda: pc.list_value_length(T["l"])),
    ("truncate", col("f").round(0, "towards_zero"), lambda: pc.round(T["f"], 0, round_mode="towards_zero")),
    ("truncate_decimal", col("dec").round(1, "towards_zero"), lambda: pc.round(T["dec"], 1, round_mode="towards_zero")),
    ("decimal_quotient", call("divide_checked", col("dec"), lit(Decimal("3.00"), pa.decimal128(5, 2))),
     lambda: pc.divide_checked(T["dec"], pa.scalar(Decimal("3.00"), pa.decimal128(5, 2)))),
    ("decimal_quotient_wide", call("divide_checked", col("dec").cast(pa.decimal128(20, 6)), col("dec")),
     lambda: pc.divide_checked(T["dec"].cast(pa.decimal128(20, 6)), T["dec"])),
    ("decimal_quotient_negative", call("divide", lit(Decimal("-7.5"), pa.decimal128(3, 1)), col("dec")),
     lambda: pc.divide(pa.scalar(Decimal("-7.5"), pa.decimal128(3, 1)), T["dec"])),
]


FAMILIES = {
    "comparison": COMPARISONS,
    "boolean": BOOLEANS,
    "arithmetic": ARITHMETIC,
    "set_string": SETS_AND_STRINGS,
    "cast_date_conditional": CASTS_DATES_CONDITIONALS,
    "literal": LITERALS,
    "library": LIBRARY,
}


@pytest.mark.parametrize(
    ("expr", "oracle"),
    [case[1:] for cases in FAMILIES.values() for case in cases],
    ids=[f"{family}-{case[0]}" for family, cases in FAMILIES.items() for case in cases],
)
def test_matches_pyarrow_compute(expr: Expr, oracle: Callable[[], pa.Array | pa.Scalar]) -> None:
    assert_same(expr, oracle())


def test_checked_arithmetic_overflow_fails_on_the_worker() -> None:
    with pytest.raises(pa.ArrowInvalid, match="overflow"):
        evaluate(col("i") + lit(2**63 - 1))


# ------------------------------------------------------------------ the builder


def root(expr: Expr) -> plan_pb2.ExprNode:
    """The root node of ``expr``'s wire form (the last of its flat nodes)."""
    return expr.to_proto().nodes[-1]


def test_literal_wire_fields() -> None:
    assert root(lit(True)).literal.WhichOneof("value") == "bool_value"
    assert root(lit(3)).literal.WhichOneof("value") == "int_value"
    assert root(lit(3.0)).literal.WhichOneof("value") == "float_value"
    assert root(lit("x")).literal.WhichOneof("value") == "string_value"
    assert root(lit(b"x")).literal.WhichOneof("value") == "binary_value"
    for value in (None, dt.date(2020, 1, 1), Decimal("1.5"), 2**64 - 1):
        assert root(lit(value)).literal.WhichOneof("value") == "arrow"
    assert root(lit(3, pa.int64())).literal.WhichOneof("value") == "arrow"


def test_operands_are_wrapped_and_operators_match_pyarrow() -> None:
    msg = (col("a") + 1).to_proto()
    assert msg.nodes[-1].call.function == "add_checked"
    assert msg.nodes[msg.nodes[-1].call.args[1]].literal.int_value == 1
    assert root(col("a") & col("b")).call.function == "and_kleene"
    assert root(col("a") | col("b")).call.function == "or_kleene"
    assert root(~col("a")).call.function == "invert"
    assert root(-col("a")).call.function == "negate_checked"
    assert root(col("a") / 2).call.function == "divide_checked"


def test_wire_form_is_flat_post_order() -> None:
    msg = ((col("a") > 5) & ~col("b")).to_proto()
    kinds = [n.WhichOneof("kind") for n in msg.nodes]
    assert kinds == ["field", "literal", "call", "field", "call", "call"]
    assert [list(n.call.args) for n in msg.nodes] == [[], [], [0, 1], [], [3], [2, 4]]


def test_shared_subexpression_is_sent_once() -> None:
    x = col("i") + 1
    expr = x * x
    msg = expr.to_proto()
    assert len(msg.nodes) == 4
    assert list(msg.nodes[-1].call.args) == [2, 2]
    assert repr(expr) == '((col("i") + 1) * (col("i") + 1))'
    assert expr.equals((col("i") + 1) * (col("i") + 1))  # structure, not sharing, decides equality
    assert evaluate(expr).to_pylist() == [None if v is None else (v + 1) ** 2 for v in TABLE["i"].to_pylist()]


def test_and_or_are_n_ary() -> None:
    a, b, c, d = (col(n) for n in "abcd")
    assert list(root(a & b & c).call.args) == [0, 1, 2]
    assert len(root((a | b) | (c | d)).call.args) == 4
    assert ((a & b) & c).equals(a & (b & c))
    assert not (a & (b | c)).equals((a & b) | c)
    assert len(root(a & (b | c)).call.args) == 2  # only the same function is spliced
    assert repr(a & b & c) == '(col("a") & col("b") & col("c"))'
    assert repr(a & (b | c)) == '(col("a") & (col("b") | col("c")))'
    assert len(root(call("or_kleene", a, b, c | d)).call.args) == 4
    base = a | b
    left, right = base | c, base | d  # extending one n-ary call never changes another
    assert repr(left) == '(col("a") | col("b") | col("c"))'
    assert repr(right) == '(col("a") | col("b") | col("d"))'
    assert repr(base) == '(col("a") | col("b"))'
    with pytest.raises(PlanError, match="at least 2"):
        call("and_kleene", a)
    with pytest.raises(PlanError, match="exactly 2"):
        call("and", a, b, c)


def test_column_name() -> None:
    assert col("a").column_name() == "a"
    assert (col("a") + 1).column_name() is None
    assert lit("a").column_name() is None


def test_cast_and_value_set_travel_as_arrow_ipc() -> None:
    options = root(col("a").cast(pa.decimal128(12, 3))).call.options.cast
    assert pa.ipc.read_schema(pa.py_buffer(options.target_type)) == pa.schema([pa.field("t", pa.decimal128(12, 3))])
    assert options.safe
    value_set = root(col("a").isin([1, 2])).call.options.set_lookup.value_set
    assert pa.ipc.open_stream(value_set).read_all().column(0).to_pylist() == [1, 2]


def test_repr_is_readable() -> None:
    assert repr(col("a") > 5) == '(col("a") > 5)'
    assert repr((col("a") > 5) & ~col("b")) == '((col("a") > 5) & ~col("b"))'
    assert repr(1 + col("a")) == '(1 + col("a"))'
    assert repr(col("s") == "x") == '(col("s") == "x")'
    assert repr(col("s").like("a%")) == 'match_like(col("s"), pattern=\'a%\', ignore_case=False)'
    assert repr(col("a").cast(pa.int32())) == 'cast(col("a"), target_type=int32, safe=True)'
    assert repr(col("a").isin([1, 2])) == 'is_in(col("a"), value_set=[1, 2], skip_nulls=False)'
    assert repr(lit(Decimal("1.5"))) == "lit(Decimal('1.5'), decimal128(2, 1))"
    assert repr(col("s").substr(1)) == 'utf8_slice_codeunits(col("s"), start=1, step=1)'


def test_referenced_fields() -> None:
    expr = if_else(col("a") > col("b"), col("c").upper(), coalesce(col("a"), "x"))
    assert expr.referenced_fields() == {"a", "b", "c"}
    assert lit(1).referenced_fields() == set()


def test_expr_is_immutable_and_unhashable() -> None:
    expr = col("a") > 1
    msg = expr.to_proto()
    msg.nodes[-1].call.function = "less"
    assert root(expr).call.function == "greater"
    with pytest.raises(AttributeError):
        expr._node = msg  # type: ignore[misc]
    with pytest.raises(TypeError):
        hash(expr)


def test_from_proto_copies() -> None:
    msg = (col("a") > 1).to_proto()
    expr = Expr.from_proto(msg)
    msg.nodes[-1].call.function = "less"
    msg.nodes[1].literal.int_value = 2
    assert root(expr).call.function == "greater"
    assert repr(expr) == '(col("a") > 1)'


def test_bool_of_expr_raises() -> None:
    with pytest.raises(TypeError, match=r"& \| ~"):
        bool(col("a") > 1)
    with pytest.raises(TypeError):
        _ = (col("a") > 1) and (col("b") < 2)


# --------------------------------------------------------------- PlanError cases


def test_unknown_column_is_named_with_available_ones() -> None:
    with pytest.raises(PlanError, match="'nope'") as err:
        output_type(col("nope") > 1, TABLE.schema)
    assert "available columns" in str(err.value)
    assert "'dec'" in str(err.value)


def test_type_mismatch_names_function_and_types() -> None:
    with pytest.raises(PlanError, match=r"'greater'.*\(string, int64\)") as err:
        output_type((col("s") > 1) & col("b"), TABLE.schema)
    assert isinstance(err.value.__cause__, pa.ArrowNotImplementedError)


def test_bad_cast_and_value_set_types_are_plan_errors() -> None:
    with pytest.raises(PlanError, match="'cast'"):
        output_type(col("i").cast(pa.date32()), TABLE.schema)
    with pytest.raises(PlanError, match="'is_in'"):
        output_type(col("i").isin(["x"]), TABLE.schema)


def test_output_type() -> None:
    schema = TABLE.schema
    assert output_type(col("i") > 1, schema) == pa.bool_()
    assert output_type(col("f") / 2, schema) == pa.float64()
    assert output_type(col("s").length(), schema) == pa.int32()
    assert output_type(col("d").year(), schema) == pa.int64()
    assert output_type(lit(1), pa.schema([])) == pa.int64()


def test_non_whitelisted_function() -> None:
    with pytest.raises(PlanError, match="function 'system' is not an allowed function"):
        call("system", "rm -rf /")


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: call("add", col("a")), "exactly 2"),
        (lambda: call("if_else", col("a"), 1), "exactly 3"),
        (lambda: coalesce(), "at least 1"),
        (lambda: call("add", col("a"), 1, ndigits=2), "takes no options"),
        (lambda: call("round", col("a"), digits=2), "does not take the option"),
        (lambda: call("is_in", col("a")), "requires the option value_set"),
        (lambda: call("cast", col("a")), "requires the option target_type"),
        (lambda: call("cast", col("a"), target_type="int32"), "must be DataType"),
        (lambda: call("round", col("a"), ndigits=True), "must be int"),
        (lambda: col("a").isin("abc"), "collection of values"),
        (lambda: col("a").isin([col("b")]), "cannot be made an Arrow array"),
        (lambda: col(""), "non-empty string"),
        (lambda: lit(object()), "Cannot make a literal"),
        (lambda: lit("x", pa.int32()), "of type int32"),
        (lambda: lit(col("a")), "not an Expr"),
    ],
)
def test_builder_mistakes(build: Callable[[], Expr], message: str) -> None:
    with pytest.raises(PlanError, match=message):
        build()


# ------------------------------------------------------------ ProtocolError cases


def _node_msg(**kind: object) -> plan_pb2.Expression:
    """A one-node expression (no kind set when ``kind`` is empty)."""
    return plan_pb2.Expression(nodes=[plan_pb2.ExprNode(**kind)])


def _call_msg(function: str, *args: plan_pb2.Expression) -> plan_pb2.Expression:
    """A call of ``function`` over flat ``args``: their nodes one after the other, then the call."""
    msg = plan_pb2.Expression()
    refs = []
    for arg in args:
        base = len(msg.nodes)
        for node in arg.nodes:
            copy = msg.nodes.add()
            copy.CopyFrom(node)
            if copy.WhichOneof("kind") == "call":
                copy.call.args[:] = [base + ref for ref in copy.call.args]
        refs.append(len(msg.nodes) - 1)
    msg.nodes.add().call.CopyFrom(plan_pb2.Call(function=function, args=refs))
    return msg


def _protocol_error(msg: plan_pb2.Expression, field: str = "plan.root.filter.predicate") -> ProtocolError:
    with pytest.raises(ProtocolError) as err:
        to_pyarrow(plan_pb2.Expression.FromString(msg.SerializeToString()), field)
    return err.value


def test_unset_expression_oneof() -> None:
    assert _protocol_error(_node_msg(), "expr").field == "expr.nodes[0]"
    forged = _call_msg("add", col("a").to_proto(), _node_msg())
    assert _protocol_error(forged).field == "plan.root.filter.predicate.nodes[1]"


def test_unset_literal_oneof() -> None:
    forged = _call_msg("add", col("a").to_proto(), _node_msg(literal=plan_pb2.Literal()))
    assert _protocol_error(forged).field == "plan.root.filter.predicate.nodes[1].literal"


def test_unknown_function_forged_in_protobuf() -> None:
    err = _protocol_error(_call_msg("os_system", lit("boom").to_proto()))
    assert err.field == "plan.root.filter.predicate.nodes[1].call.function"
    assert "function 'os_system' is not an allowed function" in str(err)


def test_wrong_arity() -> None:
    err = _protocol_error(_call_msg("equal", col("a").to_proto()))
    assert err.field == "plan.root.filter.predicate.nodes[1].call.args"
    assert "'equal'" in str(err)
    err = _protocol_error(_call_msg("or_kleene", col("a").to_proto()))
    assert err.field == "plan.root.filter.predicate.nodes[1].call.args"
    assert "at least 2" in str(err)


def test_bad_ipc_bytes_in_literal() -> None:
    bad = _node_msg(literal=plan_pb2.Literal(arrow=b"not arrow at all"))
    err = _protocol_error(_call_msg("equal", col("a").to_proto(), bad))
    assert err.field == "plan.root.filter.predicate.nodes[1].literal.arrow"


def test_arrow_literal_with_two_rows() -> None:
    batch = pa.record_batch([pa.array([1, 2])], names=["v"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    bad = _node_msg(literal=plan_pb2.Literal(arrow=sink.getvalue().to_pybytes()))
    assert _protocol_error(bad, "expr").field == "expr.nodes[0].literal.arrow"


def test_bad_ipc_bytes_in_options() -> None:
    cast = col("a").cast(pa.int32()).to_proto()
    cast.nodes[-1].call.options.cast.target_type = b"\x00\x01garbage"
    assert _protocol_error(cast).field == "plan.root.filter.predicate.nodes[1].call.options.cast.target_type"
    isin = col("a").isin([1]).to_proto()
    isin.nodes[-1].call.options.set_lookup.value_set = b""
    assert _protocol_error(isin).field == "plan.root.filter.predicate.nodes[1].call.options.set_lookup.value_set"


def test_options_kind_not_accepted() -> None:
    forged = (col("a") + 1).to_proto()
    forged.nodes[-1].call.options.round.ndigits = 2
    err = _protocol_error(forged)
    assert err.field == "plan.root.filter.predicate.nodes[2].call.options"
    assert "round" in str(err)


def test_rounding_to_absurdly_many_places_is_refused() -> None:
    # 4,294,967,296 places took Arrow 8.6 s (the fuzzer's case 7625 of seed 2); 400 already changes nothing.
    for digits in (-4_294_967_296, MAX_ROUND_DIGITS + 1):
        forged = col("f").round(2).to_proto()
        forged.nodes[-1].call.options.round.ndigits = digits
        err = _protocol_error(forged)
        assert err.field == "plan.root.filter.predicate.nodes[1].call.options.round.ndigits", err.field
        assert f"round to {digits} digits" in str(err)
    ok = col("f").round(2).to_proto()
    ok.nodes[-1].call.options.round.ndigits = -MAX_ROUND_DIGITS
    to_pyarrow(ok, "expr")


def test_required_options_missing_or_empty() -> None:
    forged = col("s").like("a%").to_proto()
    forged.nodes[-1].call.ClearField("options")
    assert _protocol_error(forged).field == "plan.root.filter.predicate.nodes[1].call.options"
    forged.nodes[-1].call.options.SetInParent()
    assert _protocol_error(forged).field == "plan.root.filter.predicate.nodes[1].call.options"


def test_empty_field_name() -> None:
    forged = _node_msg(field=plan_pb2.FieldRef())
    assert _protocol_error(forged, "expr").field == "expr.nodes[0].field.name"


def test_empty_node_list() -> None:
    err = _protocol_error(plan_pb2.Expression())
    assert err.field == "plan.root.filter.predicate.nodes"
    assert "no nodes" in str(err)
    with pytest.raises(ProtocolError, match="no nodes") as raised:
        Expr.from_proto(plan_pb2.Expression())
    assert raised.value.field == "expr.nodes"


@pytest.mark.parametrize(("refs", "bad"), [([0, 2], 2), ([3, 0], 3), ([0, 99], 99), ([2**32 - 1, 0], 2**32 - 1)],
                         ids=["self", "forward", "out-of-range", "uint32-max"])
def test_argument_must_be_an_earlier_node(refs: list[int], bad: int) -> None:
    forged = plan_pb2.Expression(
        nodes=[
            plan_pb2.ExprNode(field=plan_pb2.FieldRef(name="a")),
            plan_pb2.ExprNode(literal=plan_pb2.Literal(int_value=1)),
            plan_pb2.ExprNode(call=plan_pb2.Call(function="add", args=refs)),
            plan_pb2.ExprNode(call=plan_pb2.Call(function="negate", args=[2])),
        ]
    )
    err = _protocol_error(forged)
    assert err.field == "plan.root.filter.predicate.nodes[2].call.args"
    assert f"names node {bad}" in str(err)
    with pytest.raises(ProtocolError) as raised:
        Expr.from_proto(forged)
    assert raised.value.field == "expr.nodes[2].call.args"


def _negations(levels: int) -> plan_pb2.Expression:
    """A column under ``levels - 1`` nested negations: ``levels`` levels, built flat by hand."""
    msg = plan_pb2.Expression()
    msg.nodes.add().field.name = "i"
    for i in range(1, levels):
        msg.nodes.add().call.CopyFrom(plan_pb2.Call(function="negate", args=[i - 1]))
    return msg


def test_nesting_depth_is_bounded() -> None:
    to_pyarrow(_negations(MAX_DEPTH))  # the limit itself is fine
    err = _protocol_error(_negations(MAX_DEPTH + 1))
    assert err.field == f"plan.root.filter.predicate.nodes[{MAX_DEPTH}]"
    assert f"nested more than {MAX_DEPTH} levels" in str(err)


def _balanced_msg(function: str, leaves: int) -> plan_pb2.Expression:
    """A balanced tree of binary ``function`` calls over ``leaves`` references to column i, built flat by hand."""
    msg = _negations(1)
    level = [0] * leaves
    while len(level) > 1:
        paired = []
        for k in range(0, len(level) - 1, 2):
            msg.nodes.add().call.CopyFrom(plan_pb2.Call(function=function, args=level[k : k + 2]))
            paired.append(len(msg.nodes) - 1)
        level = paired + level[len(level) - len(level) % 2 :]
    return msg


def test_associative_chains_count_as_acero_folds_them() -> None:
    """Acero re-folds nested calls of an associative function left-deep: m operands are m - 1 levels."""
    msg = _negations(MAX_DEPTH - 3)
    leaf = len(msg.nodes) - 1
    for count, ok in ((4, True), (5, False)):
        forged = plan_pb2.Expression()
        forged.CopyFrom(msg)
        forged.nodes.add().call.CopyFrom(plan_pb2.Call(function="or_kleene", args=[leaf] * count))
        if ok:
            to_pyarrow(forged)
        else:
            assert _protocol_error(forged).field == f"plan.root.filter.predicate.nodes[{leaf + 1}]"
    for function in ("add_checked", "or_kleene", "xor"):  # 12 levels as sent, 2047 once Acero folds them
        err = _protocol_error(_balanced_msg(function, 2048))
        assert f"nested more than {MAX_DEPTH} levels" in str(err), function
    to_pyarrow(_balanced_msg("add_checked", MAX_DEPTH))
    to_pyarrow(_balanced_msg("less", 2048))  # not associative: 12 levels


def test_largest_or_evaluates_without_crashing_the_process() -> None:
    """A MAX_NODES-node OR (a third of that many comparisons) binds and runs in Acero.

    In a subprocess: should Acero ever fold it into one deep chain again, that crashes a process.
    """
    script = """
import functools, operator, sys
import pyarrow as pa, pyarrow.acero as ac
from flight.compute.expressions import MAX_NODES, to_pyarrow
from flight.plan.expr import col
terms = (MAX_NODES - 1) // 3
expr = functools.reduce(operator.or_, [col("a") == 3 * i for i in range(terms)])
msg = expr.to_proto()
assert len(msg.nodes) == 3 * terms + 1 <= MAX_NODES, len(msg.nodes)
table = pa.table({"a": pa.array([0, 1, None, 3 * (terms - 1), 3 * terms], pa.int64())})
source = ac.Declaration("table_source", ac.TableSourceNodeOptions(table))
out = ac.Declaration.from_sequence([source, ac.Declaration("filter", ac.FilterNodeOptions(to_pyarrow(msg)))]).to_table()
print(out.column("a").to_pylist())
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert proc.stdout.split() == ["[0,", f"{3 * ((MAX_NODES - 1) // 3 - 1)}]"]


def test_node_count_is_bounded() -> None:
    forged = plan_pb2.Expression()
    for _ in range(MAX_NODES + 1):
        forged.nodes.add().field.name = "a"
    err = _protocol_error(forged)
    assert err.field == "plan.root.filter.predicate.nodes"
    assert f"more than the {MAX_NODES} allowed" in str(err)


def test_shared_nodes_cannot_expand_exponentially() -> None:
    """Each node used twice by the next: 40 nodes on the wire, 2**40 in the tree pyarrow would build."""
    msg = _negations(1)
    for i in range(1, 40):
        msg.nodes.add().call.CopyFrom(plan_pb2.Call(function="subtract", args=[i - 1, i - 1]))
    err = _protocol_error(msg)
    assert "expands to more than" in str(err)
    assert err.field.startswith("plan.root.filter.predicate.nodes[")
    x = col("i")
    for _ in range(40):  # the builder makes the same DAG cheaply; the type check refuses it
        x = x - x
    assert len(x.to_proto().nodes) == 41
    with pytest.raises(PlanError, match="expands to more than"):
        output_type(x, TABLE.schema)


def test_mutated_bytes_only_raise_protocol_errors() -> None:
    """Random byte flips in real messages: a decode error or a ProtocolError, never anything else."""
    seeds = [
        (col("a").isin(["xy", "z"]) & col("s").like("x%")).to_proto().SerializeToString(),
        (col("a").cast(pa.int32()) > lit(dt.date(2020, 1, 1))).to_proto().SerializeToString(),
        col("s").substr(1, 2).round(2).is_null().to_proto().SerializeToString(),
        (lit("héllo", pa.string()) == lit(Decimal("1.5"))).to_proto().SerializeToString(),
    ]
    rng = random.Random(20240601)
    for _ in range(3000):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        try:
            msg = plan_pb2.Expression.FromString(bytes(data))
        except DecodeError:
            continue
        try:
            to_pyarrow(msg)
        except ProtocolError:
            pass


# ------------------------------------------------------------ deep and wide expressions


def _kleene(values: list[bool | None], is_and: bool) -> bool | None:
    """SQL's three-valued AND / OR, the oracle for and_kleene / or_kleene."""
    decisive = not is_and  # False decides an AND, True an OR
    if decisive in values:
        return decisive
    return None if None in values else not decisive


def _rows(table: pa.Table) -> list[dict[str, object]]:
    return table.to_pylist()


WIDE = pa.table(
    {
        "a": pa.array([None if r % 7 == 3 else (r * 37) % 20011 for r in range(64)], pa.int64()),
        "b": pa.array([None if r % 5 == 1 else -((r * 101) % 6007) for r in range(64)], pa.int64()),
    }
)


def test_200_levels_of_nesting_evaluate_like_python() -> None:
    table = pa.table({"i": pa.array([1, None, -7, 2**40, 0], pa.int64())})
    plus = col("i")
    neg = col("i")
    for _ in range(200):
        plus = plus + 1
        neg = -neg
    mixed = col("i")
    for level in range(200):
        mixed = _mixed_step(mixed, level)
    for expr, oracle in (
        (plus, lambda v: v + 200),
        (neg, lambda v: v),
        (mixed, lambda v: _mixed_oracle(v)),
    ):
        assert output_type(expr, table.schema) == pa.int64()
        want = [None if row["i"] is None else oracle(row["i"]) for row in _rows(table)]
        assert evaluate(expr, table).to_pylist() == want


def _mixed_step(v: Any, level: int) -> Any:
    """One level of the mixed nesting, for an ``Expr`` or a Python int alike."""
    return -v if level % 3 == 0 else (v + level) if level % 3 == 1 else (v * 1 - 2 * level)


def _mixed_oracle(v: int) -> int:
    for level in range(200):
        v = _mixed_step(v, level)
    return v


def test_max_depth_levels_evaluate() -> None:
    """MAX_DEPTH levels: the decoder accepts them and pyarrow (C++, recursive) binds and runs them."""
    table = pa.table({"i": pa.array([5, None, -2], pa.int64())})
    expr = col("i")
    for _ in range(MAX_DEPTH - 1):
        expr = expr + 1
    assert output_type(expr, table.schema) == pa.int64()
    assert evaluate(expr, table).to_pylist() == [5 + MAX_DEPTH - 1, None, -2 + MAX_DEPTH - 1]
    with pytest.raises(PlanError, match=f"nested more than {MAX_DEPTH} levels"):
        output_type(expr + 1, table.schema)


@pytest.mark.parametrize("is_and", [False, True], ids=["or", "and"])
def test_5000_term_and_or_evaluate_like_python(is_and: bool) -> None:
    rng = random.Random(5000 + is_and)
    terms, checks = [], []
    for j in range(5000):
        if j % 2:
            value = rng.randrange(20011)
            terms.append(col("a") != value if is_and else col("a") == value)
            checks.append(("a", (lambda x, v=value: x != v) if is_and else (lambda x, v=value: x == v)))
        else:
            bound = -rng.randrange(6007 * (4 if is_and else 1)) - (0 if is_and else 5000)
            terms.append(col("b") > bound if is_and else col("b") < bound)
            checks.append(("b", (lambda x, v=bound: x > v) if is_and else (lambda x, v=bound: x < v)))
    expr = functools.reduce(operator.and_ if is_and else operator.or_, terms)
    msg = expr.to_proto()
    assert msg.nodes[-1].call.function == ("and_kleene" if is_and else "or_kleene")
    assert len(msg.nodes[-1].call.args) == 5000
    assert output_type(expr, WIDE.schema) == pa.bool_()
    want = [
        _kleene([None if row[c] is None else check(row[c]) for c, check in checks], is_and) for row in _rows(WIDE)
    ]
    assert len(set(want)) == 3, want  # the table exercises true, false and null results
    assert evaluate(expr, WIDE).to_pylist() == want


def test_2000_levels_round_trip_without_recursion() -> None:
    assert sys.getrecursionlimit() < 2000 * 2  # a recursive walk would fail here
    deep = col("i")
    for level in range(2000):
        deep = (deep + level) if level % 3 else ~(deep > 0) if level % 2 else -deep
    data = deep.to_proto().SerializeToString()
    back = Expr.from_proto(plan_pb2.Expression.FromString(data))
    assert back.equals(deep)
    assert not back.equals(deep + 1)
    text = repr(back)
    assert text == repr(deep)
    assert text.count('col("i")') == 1 and text.count("(") > 1000
    assert back.referenced_fields() == {"i"}
    assert referenced_fields(back.to_proto()) == {"i"}
    with pytest.raises(PlanError, match="nested more than"):
        output_type(back, pa.schema([("i", pa.int64())]))
    with pytest.raises(ProtocolError, match="nested more than"):
        to_pyarrow(back.to_proto())


# ------------------------------------------------------------------- whitelist


def test_whitelisted_names_are_pyarrow_functions_with_matching_arity() -> None:
    registered = set(pc.list_functions())
    option_kinds = {f.name for f in plan_pb2.FunctionOptions.DESCRIPTOR.oneofs_by_name["kind"].fields}
    for name, spec in FUNCTIONS.items():
        assert spec.name == name
        assert name in registered, name
        assert spec.options is None or spec.options in option_kinds, name
        assert not spec.options_required or spec.options is not None, name
        arity = pc.get_function(name).arity
        if arity is Ellipsis:
            assert spec.max_args is None, name
        elif name in NARY_FUNCTIONS:  # associative binary functions, n-ary in the plan
            assert spec.min_args == arity == 2 and spec.max_args is None, name
        else:
            assert spec.min_args == spec.max_args == arity, name


def test_required_families_are_whitelisted() -> None:
    required = """equal not_equal less less_equal greater greater_equal and and_kleene or or_kleene xor invert
        and_not and_not_kleene add add_checked subtract subtract_checked multiply multiply_checked divide
        divide_checked negate negate_checked abs power sqrt floor ceil round is_in match_like match_substring
        starts_with ends_with match_substring_regex utf8_slice_codeunits utf8_upper utf8_lower utf8_length
        binary_length utf8_trim_whitespace binary_join_element_wise cast year month day day_of_week day_of_year
        quarter hour minute second iso_year if_else coalesce is_null is_valid is_nan true_unless_null""".split()
    assert set(required) <= set(FUNCTIONS)


def test_lookup() -> None:
    assert lookup("round") == FunctionSpec("round", "round", 1, 1, False)
    with pytest.raises(ValueError, match="'eval' is not an allowed function"):
        lookup("eval")


def test_bound_types_are_acero_s_remembered_and_bounded_and_errors_are_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """``bound_types`` answers as an Acero project over no rows does (the oracle), decodes a
    message once per schema, never remembers a failure, and keeps at most as many answers as its bound."""
    from flight.compute import expressions as ex

    monkeypatch.setattr(ex, "_BOUND", type(ex._BOUND)(2))
    expr = (col("a") + lit(1.5)).to_proto()
    decoded = []

    def decode() -> list[pc.Expression]:
        decoded.append(1)
        return [to_pyarrow(expr)]

    ints, strings = pa.schema([("a", pa.int32())]), pa.schema([("a", pa.string())])
    oracle = acero.Declaration.from_sequence([
        acero.Declaration("table_source", acero.TableSourceNodeOptions(ints.empty_table())),
        acero.Declaration("project", acero.ProjectNodeOptions([to_pyarrow(expr)], ["x"])),
    ]).to_table().schema.field(0).type
    assert ex.bound_types("root", expr, ints, decode) == [oracle]
    assert ex.bound_types("root", expr, ints, decode) == [oracle] and len(decoded) == 1  # remembered
    for _ in range(2):  # over strings it does not bind, and the refusal is not remembered
        with pytest.raises(pa.ArrowNotImplementedError):
            ex.bound_types("root", expr, strings, decode)
    assert len(decoded) == 3
    ex.bound_types("nodes", expr, ints, lambda: to_pyarrow_nodes_of(expr))
    ex.bound_types("root", expr, pa.schema([("a", pa.int64())]), decode)
    assert len(ex._BOUND) == 2


def to_pyarrow_nodes_of(msg: plan_pb2.Expression) -> list[pc.Expression]:
    from flight.compute.expressions import to_pyarrow_nodes

    return to_pyarrow_nodes(msg)


def test_referenced_fields_are_walked_once_and_handed_out_as_a_fresh_set() -> None:
    e = col("a") + col("b") * col("a")
    first = e.referenced_fields()
    first.add("zzz")
    assert e.referenced_fields() == {"a", "b"} == referenced_fields(e.to_proto())


def test_a_peers_list_slice_and_struct_path_are_clamped() -> None:
    """A fixed-size slice allocates its width for every row, and a struct path is walked step by step: a peer's
    wide slice, empty or long path is refused by field before pyarrow sees it."""
    wide = call("list_slice", col("l"), start=0, stop=1).to_proto()
    wide.nodes[-1].call.options.list_slice.stop = 1 << 40
    assert _protocol_error(wide).field == "plan.root.filter.predicate.nodes[1].call.options.list_slice.stop"
    backwards = call("list_slice", col("l"), start=0, stop=1).to_proto()
    backwards.nodes[-1].call.options.list_slice.start = 5
    assert _protocol_error(backwards).field == "plan.root.filter.predicate.nodes[1].call.options.list_slice.stop"
    for indices in ([], [0] * 65):
        path = call("struct_field", col("st"), indices=[0]).to_proto()
        del path.nodes[-1].call.options.struct_field.indices[:]
        path.nodes[-1].call.options.struct_field.indices.extend(indices)
        assert _protocol_error(path).field == "plan.root.filter.predicate.nodes[1].call.options.struct_field.indices"
