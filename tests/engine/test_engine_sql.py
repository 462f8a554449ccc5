"""The DuckDB translation of expressions: every case of test_expressions, run in DuckDB, against pyarrow.compute.

pyarrow.compute is the oracle (the IR's meaning is pyarrow's); DuckDB is the engine under test.
A case the translation declines (``Untranslatable``) runs on Acero on a worker; the set of such
cases is pinned here, so a translation that quietly stops working is noticed.
"""

from __future__ import annotations

import datetime as dt
import math
import sys
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from flight.engine.duck.sql import Untranslatable, expression_sql, ident, literal
from flight.plan.expr import Expr, call, col, if_else, lit

# The expression cases live with the translation's own tests (tests/compute).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compute"))
from test_expressions import FAMILIES, TABLE, evaluate, roundtrip

DECLINED = {
    "set_string-substr_step",
    "set_string-trim",
    "cast_date_conditional-cast_unsafe",
    "cast_date_conditional-cast_dict",
    "literal-none",  # the null type has no DuckDB column type
}
"""Cases expected to stay on Acero."""


def duckdb_evaluate(expr: Expr, table: pa.Table = TABLE) -> pa.Array:
    msg = roundtrip(expr).to_proto()
    text = expression_sql(msg, table.schema, "expr")
    con = duckdb.connect()
    con.register("t", table)
    return con.sql(f"SELECT {text} AS out FROM t").to_arrow_table().column("out").combine_chunks()


def _values(array: pa.Array, want_type: pa.DataType) -> list[object]:
    if array.type != want_type:
        array = array.cast(want_type)
    return ["NaN" if isinstance(v, float) and math.isnan(v) else v for v in array.to_pylist()]


CASES = [(f"{family}-{case[0]}", case[1], case[2]) for family, cases in FAMILIES.items() for case in cases]


@pytest.mark.parametrize(("name", "expr", "oracle"), CASES, ids=[c[0] for c in CASES])
def test_duckdb_matches_pyarrow_compute(name: str, expr: Expr, oracle: Callable[[], object]) -> None:
    want = oracle()
    if isinstance(want, pa.Scalar):
        want = pa.array([want.as_py()] * TABLE.num_rows, want.type)
    try:
        got = duckdb_evaluate(expr)
    except Untranslatable:
        assert name in DECLINED, f"{name} is no longer translated"
        return
    assert name not in DECLINED, f"{name} is translated now: take it off DECLINED"
    assert isinstance(want, (pa.Array, pa.ChunkedArray))
    assert _values(got, want.type) == _values(want, want.type), name


@pytest.mark.parametrize(
    "name",
    ['plain', 'it"s', "semi;colon", "new\nline", "ünïcode", "'quote'", ""],
)
def test_identifiers_are_quoted(name: str) -> None:
    table = pa.table({name or " ": [1, 2]})
    con = duckdb.connect()
    con.register("t", table)
    got = con.sql(f"SELECT {ident(name or ' ')} AS out FROM t").fetchall()
    assert got == [(1,), (2,)]


@pytest.mark.parametrize(
    "value",
    [
        pa.scalar("it's; DROP TABLE t; --"),
        pa.scalar("back\\slash ' and \" quotes"),
        pa.scalar("ünïcødé ✓"),
        pa.scalar(b"\x00\xff'"),
        pa.scalar(Decimal("-12345.6789"), pa.decimal128(12, 4)),
        pa.scalar(dt.date(1, 1, 1)),
        pa.scalar(dt.datetime(2024, 2, 29, 12, 30, 15, 123456), pa.timestamp("us")),
        pa.scalar(float("nan")),
        pa.scalar(float("-inf")),
        pa.scalar(1e-310),
        pa.scalar(2**63 - 1),
        pa.scalar(None, pa.int32()),
    ],
    ids=repr,
)
def test_literals_round_trip_exactly(value: pa.Scalar) -> None:
    con = duckdb.connect()
    got = con.sql(f"SELECT {literal(value)} AS v").to_arrow_table().column("v")[0]
    if value.type == pa.float64() and math.isnan(value.as_py()):
        assert math.isnan(got.as_py())
        return
    assert got.cast(value.type).equals(value)


def test_nul_in_a_string_literal_is_declined() -> None:
    with pytest.raises(Untranslatable):
        literal(pa.scalar("a\x00b"))


def test_a_string_literal_cannot_end_the_query() -> None:
    table = pa.table({"s": ["x", "a' OR '1'='1"]})
    got = duckdb_evaluate(col("s") == lit("a' OR '1'='1"), table)
    assert got.to_pylist() == [False, True]


def _kept_by_duckdb(expr: Expr, table: pa.Table = TABLE) -> list[int]:
    msg = roundtrip(expr).to_proto()
    text = expression_sql(msg, table.schema, "predicate", predicate=True)
    con = duckdb.connect()
    con.register("t", table.append_column("__row", pa.array(range(table.num_rows), pa.int64())))
    return sorted(r for (r,) in con.sql(f"SELECT __row FROM t WHERE {text}").fetchall())


def _kept(mask: object) -> list[int]:
    """The rows a filter keeps: those where the mask (pyarrow.compute's result) is true."""
    if isinstance(mask, pa.Scalar):
        mask = pa.array([mask.as_py()] * TABLE.num_rows, pa.bool_())
    return [i for i, v in enumerate(mask.to_pylist()) if v is True]  # type: ignore[attr-defined]


BOOLEAN_CASES = [c for c in CASES if c[0] not in DECLINED and pa.types.is_boolean(duckdb_evaluate(c[1]).type)]


@pytest.mark.parametrize(("name", "expr", "oracle"), BOOLEAN_CASES, ids=[c[0] for c in BOOLEAN_CASES])
def test_a_predicate_keeps_the_rows_pyarrow_keeps(name: str, expr: Expr, oracle: Callable[[], object]) -> None:
    assert _kept_by_duckdb(expr) == _kept(oracle()), name


_S, _B, _T = TABLE.column("s"), TABLE.column("b"), TABLE.column("t")


def _isin(values: list[object], column: pa.ChunkedArray = _S, skip_nulls: bool = False) -> pa.ChunkedArray:
    return pc.is_in(column, value_set=pa.array(values, pa.string()), skip_nulls=skip_nulls)


@pytest.mark.parametrize(
    ("expr", "oracle"),
    [
        (col("s").isin(["apple", "cherry pie"]), lambda: _isin(["apple", "cherry pie"])),
        (col("s").isin(["apple", None]), lambda: _isin(["apple", None])),
        (col("s").isin(["apple", None], skip_nulls=True), lambda: _isin(["apple", None], skip_nulls=True)),
        (~col("s").isin(["apple", "cherry pie"]), lambda: pc.invert(_isin(["apple", "cherry pie"]))),
        (col("s").isin(["apple"]) | col("b"), lambda: pc.or_kleene(_isin(["apple"]), _B)),
        (col("s").isin(["apple"]) & col("b"), lambda: pc.and_kleene(_isin(["apple"]), _B)),
        (
            (col("s").isin(["apple"]) & col("b")) | ~col("t").isin(["x"]),
            lambda: pc.or_kleene(pc.and_kleene(_isin(["apple"]), _B), pc.invert(_isin(["x"], _T))),
        ),
        (col("s").isin(["apple"]) == col("b"), lambda: pc.equal(_isin(["apple"]), _B)),
    ],
    ids=["plain", "null_in_set", "skip_nulls", "negated", "or", "and", "nested", "compared"],
)
def test_is_in_in_a_predicate_keeps_the_rows_pyarrow_keeps(expr: Expr, oracle: Callable[[], pa.ChunkedArray]) -> None:
    """Where a predicate's null and false both drop the row, ``is_in`` may be DuckDB's plain IN
    (pushed into Parquet scans); under NOT or a comparison it keeps pyarrow's never-null meaning."""
    assert _kept_by_duckdb(expr) == _kept(oracle())


ODD = pa.table({"s": pa.array(["100%", "100", "a_b", "axb", "back\\slash", "back/slash", "%_\\", "", None], pa.string())})


@pytest.mark.parametrize(
    "pattern",
    ["%0\\%", "%\\_%", "a_b", "%\\\\%", "back\\\\slash", "%a%b%", "\\%%", "%", "_"],
)
@pytest.mark.parametrize("ignore_case", [False, True])
def test_like_escapes_as_pyarrow_does(pattern: str, ignore_case: bool) -> None:
    # A backslash escapes the next character in pyarrow's patterns; DuckDB's LIKE is told so only
    # when the pattern has one (its plain LIKE is faster): both forms must keep pyarrow's rows.
    got = duckdb_evaluate(col("s").like(pattern, ignore_case=ignore_case), ODD)
    want = pc.match_like(ODD["s"], pattern, ignore_case=ignore_case)
    assert got.to_pylist() == want.to_pylist(), pattern


def test_an_expression_that_reuses_its_nodes_too_deeply_stays_on_acero_rather_than_grow_as_text() -> None:
    # A DAG: each level combines the previous level with itself. As text every use is written out:
    # 2**15 copies of the leaf's 100-character name (within the decoder's bound of 100,000 nodes
    # counted per use). Rendering such a plan held a worker's GIL for minutes (a fuzz case).
    from flight.compute.expressions import to_pyarrow_nodes
    from flight.wire._proto import plan_pb2

    name = "b" * 100
    nodes = [plan_pb2.ExprNode(field=plan_pb2.FieldRef(name=name))]
    for _ in range(15):
        prev = len(nodes) - 1
        nodes.append(plan_pb2.ExprNode(call=plan_pb2.Call(function="and_not_kleene", args=[prev, prev])))
    schema = pa.schema([(name, pa.bool_())])
    with pytest.raises(Untranslatable, match="KiB as SQL text"):
        expression_sql(plan_pb2.Expression(nodes=nodes), schema, "predicate", predicate=True)
    shallow = plan_pb2.Expression(nodes=nodes[:4])  # 8 copies: fine as SQL, and DuckDB agrees with pyarrow
    table = pa.table({name: [True, False, None]})
    con = duckdb.connect()
    con.register("t", table)
    got = [r[0] for r in con.execute(f"SELECT {expression_sql(shallow, schema, 'e')} FROM t").fetchall()]
    assert got == _pyarrow_values(table, to_pyarrow_nodes(shallow, "e")[-1])


def _pyarrow_values(table: pa.Table, expr: pc.Expression) -> list[object]:
    import pyarrow.dataset as ds

    return ds.dataset(table).to_table(columns={"r": expr}).column("r").to_pylist()



def _sql_in(x: Expr, values: list[object], t: pa.DataType, skip_nulls: bool = True) -> Expr:
    """SQL's ``x IN (values)`` as the SQL front end writes it: null for a null ``x``, else pyarrow's is_in."""
    return if_else(x.is_null(), lit(None, pa.bool_()), x.isin(pa.array(values, t), skip_nulls=skip_nulls))


@pytest.mark.parametrize(
    ("expr", "in_text"),
    [
        (_sql_in(col("s"), ["apple", "cherry pie"], pa.string()), True),
        (_sql_in(call("utf8_slice_codeunits", col("s"), start=0, stop=2), ["ap", "Ba"], pa.string()), True),
        (_sql_in(col("i"), [1, 4, 9], pa.int64()), True),
        (_sql_in(col("s"), ["apple", None], pa.string(), skip_nulls=False), False),  # a null matches a null: not SQL's IN
        (if_else(col("i").is_null(), lit(None, pa.bool_()), col("j").isin(pa.array([2, 5], pa.int32()))), False),  # another x
    ],
    ids=["strings", "substring", "integers", "null_in_set", "other_operand"],
)
def test_sql_in_is_rendered_as_duckdbs_in_with_pyarrows_values(expr: Expr, in_text: bool) -> None:
    """``if_else(is_null(x), null, is_in(x, …))`` is SQL's ``x IN (…)`` (x computed once, not four times)
    exactly when the set holds no null that could match; every value, nulls too, is pyarrow's."""
    text = expression_sql(roundtrip(expr).to_proto(), TABLE.schema, "expr")
    assert ("CASE" not in text) == in_text, text
    assert duckdb_evaluate(expr).to_pylist() == evaluate(expr).to_pylist()  # Acero's (pyarrow's) values


def test_a_case_whose_condition_cannot_be_null_is_a_plain_case_with_pyarrows_values() -> None:
    """SQL's CASE, as the front end writes it (``if_else(coalesce(c, FALSE), a, b)``), is a plain CASE: the
    condition is evaluated once; a condition that can be null keeps pyarrow's null for a null condition."""
    from flight.compute.expressions import to_pyarrow
    from flight.plan.expr import coalesce

    table = pa.table({"s": pa.array(["PROMO x", "other", None, "PROMO"]), "v": pa.array([1, 2, 3, None], pa.int64())})
    schema = table.schema
    cond = call("match_like", col("s"), pattern="PROMO%")
    con = duckdb.connect()
    con.register("t", table)
    for expr, plain in ((if_else(coalesce(cond, lit(False)), col("v"), lit(0)), True), (if_else(cond, col("v"), lit(0)), False)):
        text = expression_sql(expr.to_proto(), schema, "e")
        assert ("IS NULL THEN NULL" not in text) == plain, text
        got = [r[0] for r in con.execute(f"SELECT {text} FROM t").fetchall()]
        assert got == _pyarrow_values(table, to_pyarrow(expr.to_proto())), text


@pytest.mark.parametrize("inner", ["round", "round_half_up", "floor", "ceil", "trunc"])
def test_a_whole_float_cast_to_an_integer_is_duckdbs_cast_with_pyarrows_values(inner: str) -> None:
    """A float that is a whole number already (rounded to no digits, floored, ...) casts to an integer in DuckDB
    as in pyarrow (a fraction would not: pyarrow refuses it, DuckDB rounds it, so that cast stays on Acero);
    both refuse a value out of range."""
    from flight.compute.expressions import to_pyarrow

    table = pa.table({"x": pa.array([2.5, -2.5, 3.49, -0.5, None, 1e6 + 0.5], pa.float64())})
    arg = {
        "round": call("round", col("x"), ndigits=0),
        "round_half_up": call("round", col("x"), ndigits=0, round_mode="half_towards_infinity"),
        "floor": call("floor", col("x")),
        "ceil": call("ceil", col("x")),
        "trunc": call("trunc", col("x")),
    }[inner]
    expr = arg.cast(pa.int32())
    text = expression_sql(expr.to_proto(), table.schema, "e")
    con = duckdb.connect()
    con.register("t", table)
    got = [r[0] for r in con.execute(f"SELECT {text} FROM t").fetchall()]
    assert got == _pyarrow_values(table, to_pyarrow(expr.to_proto())), text
    big = pa.table({"x": pa.array([1e12], pa.float64())})
    con.register("big", big)
    with pytest.raises(duckdb.Error):
        con.execute(f"SELECT {expression_sql(expr.to_proto(), big.schema, 'e')} FROM big").fetchall()
    with pytest.raises(pa.ArrowInvalid):
        _pyarrow_values(big, to_pyarrow(expr.to_proto()))


def test_a_fraction_cast_to_an_integer_stays_on_acero() -> None:
    with pytest.raises(Untranslatable):
        expression_sql(col("f").cast(pa.int32()).to_proto(), TABLE.schema, "e")
