"""Expressions: builder → protobuf bytes → worker decoder → pyarrow, checked against pyarrow.compute."""

from __future__ import annotations

import datetime as dt
import math
import random
from collections.abc import Callable
from decimal import Decimal

import pyarrow as pa
import pyarrow.acero as acero
import pyarrow.compute as pc
import pytest

from google.protobuf.message import DecodeError

from flight._proto import plan_pb2
from flight.engine.expressions import MAX_DEPTH, to_pyarrow
from flight.errors import PlanError, ProtocolError
from flight.plan.expr import Expr, call, coalesce, col, if_else, lit, output_type
from flight.plan.functions import FUNCTIONS, FunctionSpec, lookup

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


FAMILIES = {
    "comparison": COMPARISONS,
    "boolean": BOOLEANS,
    "arithmetic": ARITHMETIC,
    "set_string": SETS_AND_STRINGS,
    "cast_date_conditional": CASTS_DATES_CONDITIONALS,
    "literal": LITERALS,
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


def test_literal_wire_fields() -> None:
    assert lit(True).to_proto().literal.WhichOneof("value") == "bool_value"
    assert lit(3).to_proto().literal.WhichOneof("value") == "int_value"
    assert lit(3.0).to_proto().literal.WhichOneof("value") == "float_value"
    assert lit("x").to_proto().literal.WhichOneof("value") == "string_value"
    assert lit(b"x").to_proto().literal.WhichOneof("value") == "binary_value"
    for value in (None, dt.date(2020, 1, 1), Decimal("1.5"), 2**64 - 1):
        assert lit(value).to_proto().literal.WhichOneof("value") == "arrow"
    assert lit(3, pa.int64()).to_proto().literal.WhichOneof("value") == "arrow"


def test_operands_are_wrapped_and_operators_match_pyarrow() -> None:
    msg = (col("a") + 1).to_proto()
    assert msg.call.function == "add_checked"
    assert msg.call.args[1].literal.int_value == 1
    assert (col("a") & col("b")).to_proto().call.function == "and_kleene"
    assert (col("a") | col("b")).to_proto().call.function == "or_kleene"
    assert (~col("a")).to_proto().call.function == "invert"
    assert (-col("a")).to_proto().call.function == "negate_checked"
    assert (col("a") / 2).to_proto().call.function == "divide_checked"


def test_cast_and_value_set_travel_as_arrow_ipc() -> None:
    options = col("a").cast(pa.decimal128(12, 3)).to_proto().call.options.cast
    assert pa.ipc.read_schema(pa.py_buffer(options.target_type)) == pa.schema([pa.field("t", pa.decimal128(12, 3))])
    assert options.safe
    value_set = col("a").isin([1, 2]).to_proto().call.options.set_lookup.value_set
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
    msg.call.function = "less"
    assert expr.to_proto().call.function == "greater"
    with pytest.raises(AttributeError):
        expr._msg = msg  # type: ignore[misc]
    with pytest.raises(TypeError):
        hash(expr)


def test_from_proto_copies() -> None:
    msg = (col("a") > 1).to_proto()
    expr = Expr.from_proto(msg)
    msg.call.function = "less"
    assert expr.to_proto().call.function == "greater"


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


def _call_msg(function: str, *args: plan_pb2.Expression) -> plan_pb2.Expression:
    msg = plan_pb2.Expression()
    msg.call.function = function
    for arg in args:
        msg.call.args.add().CopyFrom(arg)
    return msg


def _protocol_error(msg: plan_pb2.Expression, field: str = "plan.root.filter.predicate") -> ProtocolError:
    with pytest.raises(ProtocolError) as err:
        to_pyarrow(plan_pb2.Expression.FromString(msg.SerializeToString()), field)
    return err.value


def test_unset_expression_oneof() -> None:
    assert _protocol_error(plan_pb2.Expression(), "expr").field == "expr"
    forged = _call_msg("add", col("a").to_proto(), plan_pb2.Expression())
    assert _protocol_error(forged).field == "plan.root.filter.predicate.call.args[1]"


def test_unset_literal_oneof() -> None:
    empty_literal = plan_pb2.Expression()
    empty_literal.literal.SetInParent()
    forged = _call_msg("add", col("a").to_proto(), empty_literal)
    assert _protocol_error(forged).field == "plan.root.filter.predicate.call.args[1].literal"


def test_unknown_function_forged_in_protobuf() -> None:
    err = _protocol_error(_call_msg("os_system", lit("boom").to_proto()))
    assert err.field == "plan.root.filter.predicate.call.function"
    assert "function 'os_system' is not an allowed function" in str(err)


def test_wrong_arity() -> None:
    err = _protocol_error(_call_msg("equal", col("a").to_proto()))
    assert err.field == "plan.root.filter.predicate.call.args"
    assert "'equal'" in str(err)


def test_bad_ipc_bytes_in_literal() -> None:
    bad = plan_pb2.Expression()
    bad.literal.arrow = b"not arrow at all"
    err = _protocol_error(_call_msg("equal", col("a").to_proto(), bad))
    assert err.field == "plan.root.filter.predicate.call.args[1].literal.arrow"


def test_arrow_literal_with_two_rows() -> None:
    batch = pa.record_batch([pa.array([1, 2])], names=["v"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    bad = plan_pb2.Expression()
    bad.literal.arrow = sink.getvalue().to_pybytes()
    assert _protocol_error(bad, "expr").field == "expr.literal.arrow"


def test_bad_ipc_bytes_in_options() -> None:
    cast = col("a").cast(pa.int32()).to_proto()
    cast.call.options.cast.target_type = b"\x00\x01garbage"
    assert _protocol_error(cast).field == "plan.root.filter.predicate.call.options.cast.target_type"
    isin = col("a").isin([1]).to_proto()
    isin.call.options.set_lookup.value_set = b""
    assert _protocol_error(isin).field == "plan.root.filter.predicate.call.options.set_lookup.value_set"


def test_options_kind_not_accepted() -> None:
    forged = (col("a") + 1).to_proto()
    forged.call.options.round.ndigits = 2
    err = _protocol_error(forged)
    assert err.field == "plan.root.filter.predicate.call.options"
    assert "round" in str(err)


def test_required_options_missing_or_empty() -> None:
    forged = col("s").like("a%").to_proto()
    forged.call.ClearField("options")
    assert _protocol_error(forged).field == "plan.root.filter.predicate.call.options"
    forged.call.options.SetInParent()
    assert _protocol_error(forged).field == "plan.root.filter.predicate.call.options"


def test_empty_field_name() -> None:
    forged = plan_pb2.Expression()
    forged.field.SetInParent()
    assert _protocol_error(forged, "expr").field == "expr.field.name"


def test_nesting_depth_is_bounded() -> None:
    msg = col("a").to_proto()
    for _ in range(MAX_DEPTH + 1):
        outer = plan_pb2.Expression()
        outer.call.function = "negate"
        outer.call.args.add().CopyFrom(msg)
        msg = outer
    with pytest.raises(ProtocolError, match="nested"):
        to_pyarrow(msg)


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
