"""The relational operators on real workers, each checked against DuckDB running the same SQL.

Every case reads Parquet files (several per table, so leaf stages have several
tasks) and runs on a module-scoped three-worker ``LocalCluster``: with one
worker (the whole query is one stage) and with three workers and
``rows_per_task=1`` (every upper stage has three tasks); joins also run with
both strategies (``broadcast_bytes=0`` forces a shuffle join, ``1 << 30`` a
broadcast join where the join type allows one). Results are compared with
DuckDB over the same Arrow tables: as sorted row lists, unless the query sorts,
and floats with a tolerance.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator, Sequence
from decimal import Decimal
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.acero as ac
import pyarrow.parquet as pq
import pytest
from support import Data, table_rows
from support import run_setup as run
from support import write_parts as _write

import flight
from flight import agg, col, if_else, lit

UNREACHABLE = ["grpc://127.0.0.1:1"]

# (id, workers, DistributedExec options); the data is small, and would run as one task otherwise (small_query_bytes)
ONE = ("1w", 1, {})
THREE = ("3w", 3, {"rows_per_task": 1, "small_query_bytes": 0})
SHUFFLE = ("3w-shuffle", 3, {"rows_per_task": 1, "broadcast_bytes": 0, "small_query_bytes": 0})
BROADCAST = ("3w-broadcast", 3, {"rows_per_task": 1, "broadcast_bytes": 1 << 30, "replicate_rows": 0, "small_query_bytes": 0})  # a stage
SETUPS = [pytest.param(s, id=s[0]) for s in (ONE, THREE)]
JOIN_SETUPS = [pytest.param(s, id=s[0]) for s in (ONE, SHUFFLE, BROADCAST)]


# --------------------------------------------------------------------------- data


def _left(n: int = 600) -> pa.Table:
    """Join keys with nulls and duplicates (each key ~4 times); ``s`` and ``x`` also exist on the right."""
    return pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "k": pa.array([None if i % 11 == 0 else (i * 7) % 150 for i in range(n)], pa.int64()),
            "s": pa.array([None if i % 9 == 0 else f"s{i % 5}" for i in range(n)], pa.string()),
            "x": pa.array([f"l{i}" for i in range(n)], pa.string()),
            "v": pa.array([None if i % 10 == 3 else i * 3 - 500 for i in range(n)], pa.int64()),
        }
    )


def _right(n: int = 400) -> pa.Table:
    """Keys 75..224 (half overlap the left's 0..149), each ~2.7 times, some null."""
    return pa.table(
        {
            "rid": pa.array(range(n), pa.int64()),
            "rk": pa.array([None if i % 13 == 0 else 75 + (i * 11) % 150 for i in range(n)], pa.int64()),
            "s": pa.array([None if i % 7 == 0 else f"s{i % 4}" for i in range(n)], pa.string()),
            "x": pa.array([f"r{i}" for i in range(n)], pa.string()),
            "w": pa.array([None if i % 6 == 0 else i / 8 for i in range(n)], pa.float64()),
        }
    )


def _groups(n: int = 12_000) -> pa.Table:
    """Group-by data: small, single-valued, string-heavy and decimal keys; all-null columns."""
    rng = random.Random(7)
    dec = pa.decimal128(12, 2)
    return pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "g": pa.array([None if i % 19 == 0 else i % 7 for i in range(n)], pa.int64()),
            "const": pa.array(["only"] * n, pa.string()),
            "name": pa.array([None if i % 97 == 0 else f"name-{(i * 7919) % 5000:05d}" for i in range(n)], pa.string()),
            "tag": pa.array([None if i % 23 == 0 else f"t{rng.randrange(40)}" for i in range(n)], pa.string()),
            "n": pa.array([None if i % 8 == 0 else (i * 37) % 1000 - 300 for i in range(n)], pa.int64()),
            "f": pa.array([None if i % 17 == 0 else rng.uniform(-100, 100) for i in range(n)], pa.float64()),
            "dec": pa.array(
                [None if i % 15 == 0 else Decimal(rng.randrange(-4_000_000, 9_000_000)).scaleb(-2) for i in range(n)], dec
            ),
            "dkey": pa.array([None if i % 29 == 0 else Decimal(i % 9).scaleb(0) / 2 for i in range(n)], pa.decimal128(6, 1)),
            "null_i": pa.nulls(n, pa.int64()),
            "null_f": pa.nulls(n, pa.float64()),
            "null_s": pa.nulls(n, pa.string()),
            "null_d": pa.nulls(n, dec),
        }
    )



@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Data]:
    root = tmp_path_factory.mktemp("relational")
    paths = {
        "L": _write(_left(), root, "L", 4),
        "R": _write(_right(), root, "R", 3),
        "G": _write(_groups(), root, "G", 5),
    }
    con = duckdb.connect()
    for name, files in paths.items():
        # The oracle sees exactly what the workers read: the files, read back.
        con.register(name, pa.concat_tables(pq.read_table(p) for p in files))
    yield Data(paths, con)
    con.close()


@pytest.fixture(scope="module")
def cluster3(data_roots: list[Path]) -> Iterator[flight.LocalCluster]:
    with flight.LocalCluster(3, data_roots=data_roots) as c:
        yield c


# ------------------------------------------------------------------------ helpers




def _order(row: tuple) -> tuple:
    """A sort key for rows with nulls and NaNs (nulls first, NaN after every number)."""
    def key(v: object) -> tuple:
        if v is None:
            return (0, 0)
        if isinstance(v, float):
            return (2, 0) if math.isnan(v) else (1, round(v, 6))
        return (1, v)

    return tuple(key(v) for v in row)


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            return False
        if math.isnan(float(a)) or math.isnan(float(b)):  # type: ignore[arg-type]
            return math.isnan(float(a)) and math.isnan(float(b))  # type: ignore[arg-type]
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-9)  # type: ignore[arg-type]
    return a == b and (a is None) == (b is None)


def assert_rows(got: pa.Table | list[tuple], expected: list[tuple], *, ordered: bool = False) -> None:
    rows = table_rows(got) if isinstance(got, pa.Table) else list(got)
    expected = list(expected)
    if not ordered:
        rows, expected = sorted(rows, key=_order), sorted(expected, key=_order)
    assert len(rows) == len(expected), f"{len(rows)} rows, DuckDB has {len(expected)}"
    for i, (r, e) in enumerate(zip(rows, expected)):
        assert len(r) == len(e) and all(_same(a, b) for a, b in zip(r, e)), f"row {i}: got {r}, DuckDB {e}"


def stage_modes(ex: flight.DistributedExec) -> list[str]:
    return [s.output_mode for s in ex.stages]


def check_strategy(ex: flight.DistributedExec, setup: tuple, how: str, broadcast: bool = True, tasks: int = 3) -> None:
    """The options really forced the strategy the case is named after.

    ``broadcast=False``: the planner may still shuffle (it does not broadcast a right side
    estimated larger than the left, e.g. when a filter shrinks the left's estimate).
    ``tasks``: how many tasks a shuffled join runs in (fewer when both sides are estimated empty).
    """
    name = setup[0]
    if name == "1w":
        assert len(ex.stages) == 1
    elif name == "3w-shuffle" or how in ("right", "full") or (not broadcast and "broadcast" not in stage_modes(ex)):
        assert "hash" in stage_modes(ex) and "broadcast" not in stage_modes(ex)
        assert ex.stage.task_count == tasks  # the join itself runs in three tasks
    else:
        assert "broadcast" in stage_modes(ex)


# ---------------------------------------------------------------------------- joins

HOWS = ["inner", "left", "right", "full", "semi", "anti"]
_SQL_JOIN = {"inner": "JOIN", "left": "LEFT JOIN", "right": "RIGHT JOIN", "full": "FULL OUTER JOIN"}


def _join_query(how: str, style: str, left: flight.Query, right: flight.Query) -> flight.Query:
    """L join R on k = rk: with ``on=`` (R's key renamed to k) or with ``left_on`` / ``right_on``."""
    if style == "on":
        return left.join(right.select("rid", "s", "x", "w", k=col("rk")), on="k", how=how)
    return left.join(right, left_on="k", right_on="rk", how=how)


def _join_sql(how: str, style: str, left: str = "L", right: str = "R", suffix: str = "_right") -> tuple[list[str], str]:
    """Expected column names and the SQL computing them."""
    if how in ("semi", "anti"):
        exists = "EXISTS" if how == "semi" else "NOT EXISTS"
        sql = f"SELECT l.id, l.k, l.s, l.x, l.v FROM {left} l WHERE {exists} (SELECT 1 FROM {right} r WHERE r.rk = l.k)"
        return ["id", "k", "s", "x", "v"], sql
    if style == "on":
        key = "coalesce(l.k, r.rk)" if how in ("right", "full") else "l.k"
        names = ["id", "k", "s", "x", "v", "rid", "s" + suffix, "x" + suffix, "w"]
        select = f"l.id, {key}, l.s, l.x, l.v, r.rid, r.s, r.x, r.w"
    else:
        names = ["id", "k", "s", "x", "v", "rid", "rk", "s" + suffix, "x" + suffix, "w"]
        select = "l.id, l.k, l.s, l.x, l.v, r.rid, r.rk, r.s, r.x, r.w"
    return names, f"SELECT {select} FROM {left} l {_SQL_JOIN[how]} {right} r ON l.k = r.rk"


@pytest.mark.parametrize("setup", JOIN_SETUPS)
@pytest.mark.parametrize("style", ["on", "left_on"])
@pytest.mark.parametrize("how", HOWS)
def test_join_with_null_and_duplicate_keys(cluster3: flight.LocalCluster, data: Data, how: str, style: str, setup: tuple) -> None:
    q = _join_query(how, style, data.read("L"), data.read("R"))
    got, ex = run(cluster3, setup, q)
    names, sql = _join_sql(how, style)
    assert got.column_names == names  # the right side's ``s`` and ``x`` got the suffix
    expected = data.sql(sql)
    assert len(expected) > 100
    assert_rows(got, expected)
    check_strategy(ex, setup, how)


@pytest.mark.parametrize("setup", [pytest.param(SHUFFLE, id="3w-shuffle"), pytest.param(BROADCAST, id="3w-broadcast")])
@pytest.mark.parametrize("how", ["inner", "left", "full"])
def test_join_with_custom_suffix_and_two_keys(cluster3: flight.LocalCluster, data: Data, how: str, setup: tuple) -> None:
    """Both sides have ``s`` and ``x``; joining on (k, s) with string and integer keys, suffix ``_r``."""
    q = data.read("L").join(data.read("R"), left_on=["k", "s"], right_on=["rk", "s"], how=how, suffix="_r")
    got, ex = run(cluster3, setup, q)
    assert got.column_names == ["id", "k", "s", "x", "v", "rid", "rk", "s_r", "x_r", "w"]
    expected = data.sql(
        "SELECT l.id, l.k, l.s, l.x, l.v, r.rid, r.rk, r.s, r.x, r.w "
        f"FROM L l {_SQL_JOIN[how]} R r ON l.k = r.rk AND l.s = r.s"
    )
    assert any(r[5] is not None for r in expected)
    assert_rows(got, expected)
    check_strategy(ex, setup, how)


@pytest.mark.parametrize("setup", [pytest.param(ONE, id="1w"), pytest.param(SHUFFLE, id="3w-shuffle")])
@pytest.mark.parametrize("how", ["inner", "left", "right", "full"])
def test_join_on_two_keys_coalesces_both(cluster3: flight.LocalCluster, data: Data, how: str, setup: tuple) -> None:
    """``on=[k, s]``: one column per key, the non-null of both sides for right and full joins."""
    right = data.read("R").select("rid", "s", "x", k=col("rk"))
    got, _ = run(cluster3, setup, data.read("L").select("id", "k", "s", "v").join(right, on=["k", "s"], how=how))
    assert got.column_names == ["id", "k", "s", "v", "rid", "x"]
    k, s = ("coalesce(l.k, r.rk)", "coalesce(l.s, r.s)") if how in ("right", "full") else ("l.k", "l.s")
    expected = data.sql(f"SELECT l.id, {k}, {s}, l.v, r.rid, r.x FROM L l {_SQL_JOIN[how]} R r ON l.k = r.rk AND l.s = r.s")
    assert_rows(got, expected)


@pytest.mark.parametrize("setup", [pytest.param(ONE, id="1w"), pytest.param(SHUFFLE, id="3w-shuffle")])
@pytest.mark.parametrize("key", ["s", "dkey"], ids=["string-key", "decimal-key"])
@pytest.mark.parametrize("how", HOWS)
def test_join_on_string_and_decimal_keys(cluster3: flight.LocalCluster, data: Data, how: str, key: str, setup: tuple) -> None:
    """Shuffled on a CRC of the strings / the decimals' integer part; nulls in both sides' keys."""
    table = "L" if key == "s" else "G"
    left = data.read(table).filter(col("id") < 60).select("id", key)
    right = data.read(table).filter((col("id") >= 60) & (col("id") < 100)).select(key, rid=col("id"))
    got, ex = run(cluster3, setup, left.join(right, on=key, how=how))
    if setup[1] == 3:
        assert "hash" in stage_modes(ex) and ex.stage.task_count == 3
    lsub, rsub = f"(SELECT * FROM {table} WHERE id < 60)", f"(SELECT * FROM {table} WHERE id >= 60 AND id < 100)"
    if how in ("semi", "anti"):
        exists = "EXISTS" if how == "semi" else "NOT EXISTS"
        sql = f"SELECT l.id, l.{key} FROM {lsub} l WHERE {exists} (SELECT 1 FROM {rsub} r WHERE r.{key} = l.{key})"
    else:
        k = f"coalesce(l.{key}, r.{key})" if how in ("right", "full") else f"l.{key}"
        sql = f"SELECT l.id, {k}, r.id FROM {lsub} l {_SQL_JOIN[how]} {rsub} r ON l.{key} = r.{key}"
    expected = data.sql(sql)
    assert expected
    assert_rows(got, expected)


@pytest.mark.parametrize("how", ["inner", "full"])
def test_join_widens_integer_keys_of_different_widths(cluster3: flight.LocalCluster, data: Data, how: str) -> None:
    right = data.read("R").select("rid", "w", k=col("rk").cast(pa.int32()))
    q = data.read("L").select("id", "k").join(right, on="k", how=how)
    got, _ = run(cluster3, SHUFFLE, q)
    assert got.schema.field("k").type == pa.int64()
    key = "coalesce(l.k, r.rk)" if how == "full" else "l.k"
    assert_rows(got, data.sql(f"SELECT l.id, {key}, r.rid, r.w FROM L l {_SQL_JOIN[how]} R r ON l.k = r.rk"))


@pytest.mark.parametrize("setup", [pytest.param(SHUFFLE, id="3w-shuffle"), pytest.param(BROADCAST, id="3w-broadcast")])
@pytest.mark.parametrize("empty", ["left", "right", "both"])
@pytest.mark.parametrize("how", HOWS)
def test_join_with_an_empty_side(cluster3: flight.LocalCluster, data: Data, how: str, empty: str, setup: tuple) -> None:
    left, right = data.read("L"), data.read("R")
    lpred, rpred = "true", "true"
    if empty in ("left", "both"):
        left, lpred = left.filter(col("id") < 0), "id < 0"
    if empty in ("right", "both"):
        right, rpred = right.filter(col("rid") < 0), "rid < 0"
    got, ex = run(cluster3, setup, _join_query(how, "on", left, right))
    names, sql = _join_sql(how, "on", "Lf", "Rf")
    assert got.column_names == names
    expected = data.sql(f"WITH Lf AS (SELECT * FROM L WHERE {lpred}), Rf AS (SELECT * FROM R WHERE {rpred}) {sql}")
    assert_rows(got, expected)
    # Both sides filtered on ids below their least (the footers say so): estimated empty, one task joins.
    check_strategy(ex, setup, how, broadcast=empty == "right", tasks=1 if empty == "both" else 3)


@pytest.mark.parametrize("setup", JOIN_SETUPS)
def test_join_then_aggregate_then_sort(cluster3: flight.LocalCluster, data: Data, setup: tuple) -> None:
    """Stage after stage: join on k, group by the right side's s (with count_distinct), sort the groups."""
    q = (
        data.read("L")
        .join(data.read("R"), left_on="k", right_on="rk", how="left")
        .aggregate("s_right", n=agg.count_all(), total=agg.sum("v"), xs=agg.count_distinct("x"), wmean=agg.mean("w"))
        .sort("s_right", nulls="first")
    )
    got, _ = run(cluster3, setup, q)
    expected = data.sql(
        "SELECT r.s, count(*), sum(l.v), count(DISTINCT l.x), avg(r.w) FROM L l LEFT JOIN R r ON l.k = r.rk "
        "GROUP BY r.s ORDER BY r.s NULLS FIRST"
    )
    assert_rows(got, expected, ordered=True)


# ----------------------------------------------------------------------- aggregates

_ALL_AGGS = {
    "n": agg.count_all(),
    "c": agg.count("n"),
    "total": agg.sum("n"),
    "lo": agg.min("n"),
    "hi": agg.max("n"),
    "avg": agg.mean("n"),
    "dsum": agg.sum("dec"),
    "first": agg.min("name"),
}
_ALL_SQL = "count(*), count(n), sum(n), min(n), max(n), avg(n), sum(dec), min(name)"


@pytest.mark.parametrize("setup", SETUPS)
@pytest.mark.parametrize("distinct", [False, True], ids=["partial-final", "with-count-distinct"])
def test_global_aggregate_of_empty_input(cluster3: flight.LocalCluster, data: Data, distinct: bool, setup: tuple) -> None:
    """One row: count_all 0, count 0, sum / min / max / mean NULL (count_distinct moves rows instead of partials)."""
    extra = {"tags": agg.count_distinct("tag")} if distinct else {}
    q = data.read("G").filter(col("id") < 0).aggregate(**_ALL_AGGS, **extra)
    got, _ = run(cluster3, setup, q)
    sql = _ALL_SQL + (", count(DISTINCT tag)" if distinct else "")
    expected = data.sql(f"SELECT {sql} FROM G WHERE id < 0")
    assert expected[0][:3] == (0, 0, None)
    assert_rows(got, expected)


@pytest.mark.parametrize("setup", SETUPS)
@pytest.mark.parametrize("distinct", [False, True], ids=["partial-final", "with-count-distinct"])
def test_grouped_aggregate_of_empty_input(cluster3: flight.LocalCluster, data: Data, distinct: bool, setup: tuple) -> None:
    extra = {"tags": agg.count_distinct("tag")} if distinct else {}
    q = data.read("G").filter(col("id") < 0).aggregate(["g", "name"], **_ALL_AGGS, **extra)
    got, _ = run(cluster3, setup, q)
    assert got.num_rows == 0
    assert got.column_names == ["g", "name", *_ALL_AGGS, *extra]


@pytest.mark.parametrize("setup", SETUPS)
@pytest.mark.parametrize("empty", [False, True], ids=["rows", "empty"])
def test_global_count_all_alone(cluster3: flight.LocalCluster, data: Data, empty: bool, setup: tuple) -> None:
    q = data.read("G").filter(col("id") < (0 if empty else 1_000_000)).aggregate(n=agg.count_all())
    got, _ = run(cluster3, setup, q)
    assert table_rows(got) == [(0,) if empty else (12_000,)]


@pytest.mark.parametrize("setup", SETUPS)
def test_count_all_alone_with_group_keys(cluster3: flight.LocalCluster, data: Data, setup: tuple) -> None:
    got, _ = run(cluster3, setup, data.read("G").aggregate("g", n=agg.count_all()))
    assert_rows(got, data.sql("SELECT g, count(*) FROM G GROUP BY g"))


def test_leaf_task_without_files(cluster3: flight.LocalCluster, data: Data) -> None:
    """Two files dealt over three tasks: one leaf task reads nothing, yet takes part in every exchange."""
    two = flight.read_parquet(flight.FileListProvider(data.paths["L"][:2], partitions=3), schema=data.read("L").schema)
    sub = "(SELECT * FROM L WHERE id < 300)"
    got, ex = run(cluster3, THREE, two.aggregate(n=agg.count_all(), total=agg.sum("v"), lo=agg.min("s"), avg=agg.mean("v")))
    assert ex.stages[0].task_count == 3
    assert_rows(got, data.sql(f"SELECT count(*), sum(v), min(s), avg(v) FROM {sub}"))
    got, _ = run(cluster3, THREE, two.aggregate("s", n=agg.count_all(), ks=agg.count_distinct("k")))
    assert_rows(got, data.sql(f"SELECT s, count(*), count(DISTINCT k) FROM {sub} GROUP BY s"))
    got, _ = run(cluster3, THREE, two.select("id", "k").sort(["k", "id"], descending=[True, True]).limit(7, offset=2))
    assert_rows(got, data.sql(f"SELECT id, k FROM {sub} ORDER BY k DESC NULLS LAST, id DESC LIMIT 7 OFFSET 2"), ordered=True)
    got, _ = run(cluster3, SHUFFLE, two.join(data.read("R"), left_on="k", right_on="rk", how="full").select("id", "rid"))
    assert_rows(got, data.sql(f"SELECT l.id, r.rid FROM {sub} l FULL JOIN R r ON l.k = r.rk"))


_NULL_AGGS = {
    "isum": agg.sum("null_i"), "imin": agg.min("null_i"), "imax": agg.max("null_i"),
    "imean": agg.mean("null_i"), "icount": agg.count("null_i"),
    "fsum": agg.sum("null_f"), "fmean": agg.mean("null_f"), "fmax": agg.max("null_f"),
    "dsum": agg.sum("null_d"), "dmin": agg.min("null_d"), "dmean": agg.mean("null_d"),
    "smin": agg.min("null_s"), "smax": agg.max("null_s"), "scount": agg.count("null_s"),
    "n": agg.count_all(),
}  # fmt: skip
_NULL_SQL = (
    "sum(null_i), min(null_i), max(null_i), avg(null_i), count(null_i), sum(null_f), avg(null_f), max(null_f), "
    "sum(null_d), min(null_d), avg(null_d), min(null_s), max(null_s), count(null_s), count(*)"
)


@pytest.mark.parametrize("setup", SETUPS)
@pytest.mark.parametrize("distinct", [False, True], ids=["partial-final", "with-count-distinct"])
@pytest.mark.parametrize("keys", [[], ["g"]], ids=["global", "by-g"])
def test_aggregates_of_all_null_columns(cluster3: flight.LocalCluster, data: Data, keys: list[str], distinct: bool, setup: tuple) -> None:
    extra = {"dn": agg.count_distinct("null_s")} if distinct else {}
    got, _ = run(cluster3, setup, data.read("G").aggregate(keys, **_NULL_AGGS, **extra))
    select = ", ".join([*keys, _NULL_SQL] + (["count(DISTINCT null_s)"] if distinct else []))
    group = f" GROUP BY {', '.join(keys)}" if keys else ""
    expected = data.sql(f"SELECT {select} FROM G{group}")
    assert_rows(got, expected)
    assert got.schema.field("dsum").type.id == pa.decimal128(1, 0).id  # a decimal sum stays decimal


@pytest.mark.parametrize("distinct", [False, True], ids=["partial-final", "with-count-distinct"])
def test_shuffle_with_empty_partitions(cluster3: flight.LocalCluster, data: Data, distinct: bool) -> None:
    """One distinct key on three final tasks: two of them get nothing and must emit nothing."""
    extra = {"tags": agg.count_distinct("tag")} if distinct else {}
    q = data.read("G").aggregate("const", n=agg.count_all(), total=agg.sum("n"), avg=agg.mean("n"), first=agg.min("name"), **extra)
    got, ex = run(cluster3, THREE, q)
    assert ex.stage.task_count == 3 and stage_modes(ex)[0] == "hash"
    sql = "count(*), sum(n), avg(n), min(name)" + (", count(DISTINCT tag)" if distinct else "")
    assert_rows(got, data.sql(f"SELECT const, {sql} FROM G GROUP BY const"))


def test_shuffle_join_with_a_single_key_value(cluster3: flight.LocalCluster, data: Data) -> None:
    """Every row hashes to one of three join tasks; the others see empty inputs on both sides."""
    left = data.read("G").filter(col("id") < 300).select("id", "const")
    right = data.read("G").filter(col("id") < 4).select("const", rid=col("id"))
    for how in ("inner", "full", "anti"):
        got, ex = run(cluster3, SHUFFLE, left.join(right, on="const", how=how))
        assert ex.stage.task_count == 3
        if how == "anti":
            assert got.num_rows == 0
            continue
        sql = (
            f"SELECT l.id, coalesce(l.const, r.const), r.id FROM (SELECT * FROM G WHERE id < 300) l "
            f"{_SQL_JOIN[how]} (SELECT * FROM G WHERE id < 4) r ON l.const = r.const"
        )
        assert_rows(got, data.sql(sql))


@pytest.mark.parametrize("setup", SETUPS)
def test_string_heavy_group_by(cluster3: flight.LocalCluster, data: Data, setup: tuple) -> None:
    q = data.read("G").aggregate(
        "name", n=agg.count_all(), tags=agg.count("tag"), distinct_tags=agg.count_distinct("tag"), last=agg.max("tag")
    )
    got, _ = run(cluster3, setup, q)
    expected = data.sql("SELECT name, count(*), count(tag), count(DISTINCT tag), max(tag) FROM G GROUP BY name")
    assert len(expected) > 5000
    assert_rows(got, expected)


@pytest.mark.parametrize("setup", SETUPS)
def test_string_heavy_group_by_without_count_distinct(cluster3: flight.LocalCluster, data: Data, setup: tuple) -> None:
    q = data.read("G").aggregate(["name", "tag"], n=agg.count_all(), ids=agg.count("id"), lo=agg.min("id"))
    got, _ = run(cluster3, setup, q)
    assert_rows(got, data.sql("SELECT name, tag, count(*), count(id), min(id) FROM G GROUP BY name, tag"))


@pytest.mark.parametrize("setup", SETUPS)
@pytest.mark.parametrize("keys", [[], ["dkey"], ["g"]], ids=["global", "by-decimal-key", "by-g"])
def test_decimal_aggregates(cluster3: flight.LocalCluster, data: Data, keys: list[str], setup: tuple) -> None:
    q = data.read("G").aggregate(keys, total=agg.sum("dec"), lo=agg.min("dec"), hi=agg.max("dec"), c=agg.count("dec"), avg=agg.mean("dec"))
    got, _ = run(cluster3, setup, q)
    for name in ("total", "lo", "hi"):
        assert pa.types.is_decimal(got.schema.field(name).type)
    select = ", ".join([*keys, "sum(dec), min(dec), max(dec), count(dec), avg(dec)"])
    group = f" GROUP BY {', '.join(keys)}" if keys else ""
    expected = data.sql(f"SELECT {select} FROM G{group}")
    assert all(isinstance(r[len(keys)], Decimal) for r in expected)
    assert_rows(got, expected)


@pytest.mark.parametrize("setup", SETUPS)
@pytest.mark.parametrize("keys", [[], ["g"]], ids=["global", "by-g"])
def test_mean_of_ints(cluster3: flight.LocalCluster, data: Data, keys: list[str], setup: tuple) -> None:
    q = data.read("G").aggregate(keys, avg=agg.mean("n"), twice=agg.mean(col("n") * 2 + 1), ids=agg.mean("id"))
    got, _ = run(cluster3, setup, q)
    assert got.schema.field("avg").type == pa.float64()
    select = ", ".join([*keys, "avg(n), avg(n * 2 + 1), avg(id)"])
    group = f" GROUP BY {', '.join(keys)}" if keys else ""
    assert_rows(got, data.sql(f"SELECT {select} FROM G{group}"))


@pytest.mark.parametrize("setup", SETUPS)
@pytest.mark.parametrize("keys", [[], ["g"], ["g", "dkey"]], ids=["global", "by-g", "by-g-dkey"])
def test_count_distinct(cluster3: flight.LocalCluster, data: Data, keys: list[str], setup: tuple) -> None:
    q = data.read("G").aggregate(
        keys, tags=agg.count_distinct("tag"), names=agg.count_distinct("name"), nd=agg.count_distinct("n"),
        total=agg.sum("n"), avg=agg.mean("f"), rows=agg.count_all(),
    )  # fmt: skip
    got, _ = run(cluster3, setup, q)
    select = ", ".join([*keys, "count(DISTINCT tag), count(DISTINCT name), count(DISTINCT n), sum(n), avg(f), count(*)"])
    group = f" GROUP BY {', '.join(keys)}" if keys else ""
    assert_rows(got, data.sql(f"SELECT {select} FROM G{group}"))


# ------------------------------------------------------------ distinct and union


@pytest.mark.parametrize("setup", SETUPS)
@pytest.mark.parametrize(
    "columns", [["g", "tag"], ["k", "s"], ["dkey", "const"]], ids=["int-string", "join-keys", "decimal-string"]
)
def test_distinct(cluster3: flight.LocalCluster, data: Data, columns: list[str], setup: tuple) -> None:
    table = "L" if "k" in columns else "G"
    got, _ = run(cluster3, setup, data.read(table).select(*columns).distinct())
    assert got.column_names == columns
    assert_rows(got, data.sql(f"SELECT DISTINCT {', '.join(columns)} FROM {table}"))


@pytest.mark.parametrize("setup", SETUPS)
def test_aggregate_with_keys_only(cluster3: flight.LocalCluster, data: Data, setup: tuple) -> None:
    got, _ = run(cluster3, setup, data.read("G").aggregate(["g", "dkey"]))
    assert_rows(got, data.sql("SELECT g, dkey FROM G GROUP BY g, dkey"))


@pytest.mark.parametrize("setup", SETUPS)
def test_float_keys_with_nan_and_nulls(cluster3: flight.LocalCluster, data: Data, setup: tuple) -> None:
    """NaN is one group (as in DuckDB); no -0.0 here: Acero keeps -0.0 and 0.0 apart, DuckDB does not."""
    fk = if_else(col("n").is_null(), lit(float("nan")), col("f").round(0) + 0.5)  # x.5: never a zero
    q = data.read("G").select("id", "f", fk=fk)
    got, _ = run(cluster3, setup, q.aggregate("fk", n=agg.count_all(), total=agg.sum("f"), ids=agg.count_distinct("id")))
    sub = "(SELECT id, f, CASE WHEN n IS NULL THEN 'nan'::DOUBLE ELSE round(f, 0) + 0.5 END AS fk FROM G)"
    expected = data.sql(f"SELECT fk, count(*), sum(f), count(DISTINCT id) FROM {sub} GROUP BY fk")
    assert any(r[0] is None for r in expected) and any(r[0] is not None and math.isnan(r[0]) for r in expected)
    assert_rows(got, expected)
    got, _ = run(cluster3, setup, q.select("fk").distinct())
    assert_rows(got, data.sql(f"SELECT DISTINCT fk FROM {sub}"))


def _union(data: Data) -> flight.Query:
    return data.read("L").select("id", "k", "s").union(data.read("R").select("s", id=col("rid"), k=col("rk")).select("id", "k", "s"))


_UNION_SQL = "(SELECT id, k, s FROM L UNION ALL SELECT rid, rk, s FROM R)"


@pytest.mark.parametrize("setup", SETUPS)
def test_union_of_two_reads(cluster3: flight.LocalCluster, data: Data, setup: tuple) -> None:
    got, _ = run(cluster3, setup, _union(data))
    assert_rows(got, data.sql(f"SELECT * FROM {_UNION_SQL}"))


@pytest.mark.parametrize("setup", SETUPS)
def test_union_then_aggregate_and_distinct(cluster3: flight.LocalCluster, data: Data, setup: tuple) -> None:
    got, _ = run(cluster3, setup, _union(data).aggregate("s", n=agg.count_all(), ks=agg.count_distinct("k"), top=agg.max("id")))
    assert_rows(got, data.sql(f"SELECT s, count(*), count(DISTINCT k), max(id) FROM {_UNION_SQL} GROUP BY s"))
    got, _ = run(cluster3, setup, _union(data).select("k", "s").distinct())
    assert_rows(got, data.sql(f"SELECT DISTINCT k, s FROM {_UNION_SQL}"))


@pytest.mark.parametrize("setup", SETUPS)
def test_union_with_an_empty_input(cluster3: flight.LocalCluster, data: Data, setup: tuple) -> None:
    empty = data.read("R").filter(col("rid") < 0).select("s", id=col("rid"), k=col("rk")).select("id", "k", "s")
    got, _ = run(cluster3, setup, data.read("L").select("id", "k", "s").union(empty))
    assert_rows(got, data.sql("SELECT id, k, s FROM L"))


# -------------------------------------------------------------------- sort and limit


def _order_sql(keys: Sequence[str], descending: Sequence[bool], nulls: str) -> str:
    return ", ".join(f"{k} {'DESC' if d else 'ASC'} NULLS {nulls.upper()}" for k, d in zip(keys, descending))


SORTS = [
    (["g", "tag", "id"], [False, True, False]),
    (["tag", "n", "id"], [True, False, True]),
    (["dkey", "name", "id"], [True, True, False]),
]


@pytest.mark.parametrize("setup", SETUPS)
@pytest.mark.parametrize("nulls", ["first", "last"])
@pytest.mark.parametrize("keys,descending", SORTS, ids=["g-tag", "tag-n", "dkey-name"])
def test_sort_with_nulls_and_mixed_directions(
    cluster3: flight.LocalCluster, data: Data, keys: list[str], descending: list[bool], nulls: str, setup: tuple
) -> None:
    q = data.read("G").select(*keys).sort(keys, descending=descending, nulls=nulls)
    got, _ = run(cluster3, setup, q)
    expected = data.sql(f"SELECT {', '.join(keys)} FROM G ORDER BY {_order_sql(keys, descending, nulls)}")
    assert_rows(got, expected, ordered=True)


@pytest.mark.parametrize("setup", SETUPS)
@pytest.mark.parametrize("nulls", ["first", "last"])
@pytest.mark.parametrize("count,offset", [(25, 10), (10, 0), (7, 1495), (5, 11_998), (3, 20_000), (0, 5)])
def test_top_k_and_limit_with_offset(
    cluster3: flight.LocalCluster, data: Data, count: int, offset: int, nulls: str, setup: tuple
) -> None:
    """Sort + limit over five files; ``n`` has 1,500 nulls, so some windows straddle the null boundary."""
    keys, descending = ["n", "id"], [True, False]
    q = data.read("G").select("id", "n", "tag").sort(keys, descending=descending, nulls=nulls).limit(count, offset=offset)
    got, ex = run(cluster3, setup, q)
    if setup[1] == 3:
        assert ex.stages[0].task_count == 3 and stage_modes(ex)[0] == "gather"
    expected = data.sql(f"SELECT id, n, tag FROM G ORDER BY {_order_sql(keys, descending, nulls)} LIMIT {count} OFFSET {offset}")
    assert_rows(got, expected, ordered=True)


@pytest.mark.parametrize("setup", SETUPS)
def test_top_k_of_an_aggregate(cluster3: flight.LocalCluster, data: Data, setup: tuple) -> None:
    q = data.read("G").aggregate("name", n=agg.count_all()).sort(["n", "name"], descending=[True, False]).limit(20, offset=3)
    got, _ = run(cluster3, setup, q)
    expected = data.sql("SELECT name, count(*) AS n FROM G GROUP BY name ORDER BY n DESC, name ASC NULLS LAST LIMIT 20 OFFSET 3")
    assert_rows(got, expected, ordered=True)


@pytest.mark.parametrize("setup", SETUPS)
def test_limit_with_offset_without_sort(cluster3: flight.LocalCluster, data: Data, setup: tuple) -> None:
    """Without an order the rows are any ``count`` distinct rows of the input."""
    all_ids = {r[0] for r in data.sql("SELECT id FROM G")}
    for count, offset, rows in [(100, 50, 100), (40, 11_980, 20), (10, 12_000, 0)]:
        got, _ = run(cluster3, setup, data.read("G").select("id").limit(count, offset=offset))
        ids = got["id"].to_pylist()
        assert len(ids) == rows and len(set(ids)) == rows and set(ids) <= all_ids


# ------------------------------------------------------------------- planning errors


def _plan_error(build: Callable[[], flight.Query]) -> str:
    """The PlanError raised while building or planning; a contacted worker would fail otherwise."""
    with pytest.raises(flight.PlanError) as info:
        flight.DistributedExec(build(), UNREACHABLE, connect_timeout=2).to_table()
    return str(info.value)


def test_unreachable_worker_is_not_a_plan_error(data: Data) -> None:
    """The control: a valid plan does reach for the (unreachable) worker, and fails differently."""
    with pytest.raises(flight.WorkerUnavailableError):
        flight.DistributedExec(data.read("G").filter(col("n") > 1), UNREACHABLE, connect_timeout=2).to_table()


BAD_COLUMNS = {
    "filter": lambda q, r: q.filter(col("nope") > 1),
    "select": lambda q, r: q.select("id", "nope"),
    "select-expr": lambda q, r: q.select(y=col("nope") + 1),
    "aggregate-key": lambda q, r: q.aggregate("nope", n=agg.count_all()),
    "aggregate-arg": lambda q, r: q.aggregate("g", total=agg.sum("nope")),
    "sort": lambda q, r: q.sort(["g", "nope"]),
    "join-on": lambda q, r: q.join(r, on="nope"),
    "join-left-key": lambda q, r: q.join(r, left_on="nope", right_on="rk"),
    "join-right-key": lambda q, r: q.join(r, left_on="id", right_on="nope"),
}
_OPERATOR = {"select-expr": "select", "aggregate-key": "aggregate", "aggregate-arg": "aggregate"}


@pytest.mark.parametrize("case", list(BAD_COLUMNS))
def test_unknown_column_is_a_plan_error(data: Data, case: str) -> None:
    message = _plan_error(lambda: BAD_COLUMNS[case](data.read("G"), data.read("R")))
    operator = _OPERATOR.get(case, case.split("-")[0])
    assert "'nope'" in message and operator in message, message


def test_string_compared_with_int_names_operator_and_types(data: Data) -> None:
    message = _plan_error(lambda: data.read("G").filter(col("tag") > 1))
    assert "filter" in message and "string" in message, message


def test_string_compared_with_int_names_the_column(data: Data) -> None:
    message = _plan_error(lambda: data.read("G").filter(col("tag") > 1))
    assert "'tag'" in message, message


@pytest.mark.parametrize("style", ["on", "left_on"])
def test_join_on_incompatible_key_types(data: Data, style: str) -> None:
    def build() -> flight.Query:
        left = data.read("G").select("id", "tag")
        if style == "on":
            return left.join(data.read("R").select(tag=col("rk")), on="tag")
        return left.join(data.read("R"), left_on="tag", right_on="rk")

    message = _plan_error(build)
    assert "join" in message and "'tag'" in message and "string" in message and "int64" in message, message


def test_sum_of_a_string_column_is_a_plan_error(data: Data) -> None:
    message = _plan_error(lambda: data.read("G").aggregate("g", total=agg.sum("tag")))
    assert "aggregate" in message, message


def test_mean_of_a_string_column_is_a_plan_error(data: Data) -> None:
    message = _plan_error(lambda: data.read("G").aggregate("g", avg=agg.mean("tag")))
    assert "aggregate" in message and "tag" in message, message


def test_join_and_aggregate_schemas_are_acero_s_and_remembered() -> None:
    from flight.compute import relational as rel

    ls = pa.schema([("k", pa.int64()), ("v", pa.float64())])
    rs = pa.schema([("k", pa.int64()), ("v", pa.string()), ("d", pa.date32())])
    acero = ac.Declaration(
        "hashjoin",
        ac.HashJoinNodeOptions("left outer", ["k"], ["k"], output_suffix_for_right="_r"),
        inputs=[ac.Declaration("table_source", ac.TableSourceNodeOptions(ls.empty_table())),
                ac.Declaration("table_source", ac.TableSourceNodeOptions(rs.empty_table()))],
    ).to_table().schema
    before = rel._join_schema.cache_info().hits
    assert rel.join_schema(ls, rs, "left outer", ["k"], ["k"], "_r") == acero
    assert rel.join_schema(ls, rs, "left outer", ["k"], ["k"], "_r") == acero
    assert rel._join_schema.cache_info().hits == before + 1
    assert rel.join_schema(ls, rs, "left semi", ["k"], ["k"], "_r") == ls  # another question, another answer
    agg = rel.aggregate_schema(ls, ["k"], [("sum", "v", "s"), ("count_all", "", "n")])
    assert agg == pa.schema([("k", pa.int64()), ("s", pa.float64()), ("n", pa.int64())])  # Acero puts keys first
    wide = pa.schema([(f"c{i:05d}", pa.int64()) for i in range(3000)])  # too large to be remembered
    size = rel._aggregate_schema.cache_info().currsize
    assert rel.aggregate_schema(wide, ["c00000"], [("count_all", "", "n")]).names == ["c00000", "n"]
    assert rel._aggregate_schema.cache_info().currsize == size


def test_an_aggregate_s_schema_is_what_acero_makes_of_the_same_plan() -> None:
    """The planner types an aggregate from its arguments' types (remembered binds) and the remembered
    aggregate schema; the oracle is Acero running the project and the aggregate over no rows."""
    import pyarrow.compute as pc

    schema = pa.schema([
        pa.field("k", pa.string(), nullable=False), ("d", pa.decimal128(12, 2)), ("i", pa.int32()), ("f", pa.float32()),
        ("t", pa.date32()),
    ], metadata={b"origin": b"test"})
    q = flight.from_arrow(schema.empty_table()).aggregate(
        ["k"], s=agg.sum(col("d") * col("d")), m=agg.mean(col("i")), n=agg.count_all(),
        c=agg.count(col("f")), lo=agg.min(col("t")), hi=agg.max(col("i") + col("f")), cd=agg.count_distinct(col("k")),
    )
    oracle = ac.Declaration.from_sequence([
        ac.Declaration("table_source", ac.TableSourceNodeOptions(schema.empty_table())),
        ac.Declaration("project", ac.ProjectNodeOptions(
            [pc.field("k"), pc.multiply_checked(pc.field("d"), pc.field("d")), pc.field("i"),
             pc.field("f"), pc.field("t"), pc.add_checked(pc.field("i"), pc.field("f"))],
            ["k", "a1", "a2", "a3", "a4", "a5"])),
        ac.Declaration("aggregate", ac.AggregateNodeOptions(
            [("a1", "hash_sum", None, "s"), ("a2", "hash_mean", None, "m"), ([], "hash_count_all", None, "n"),
             ("a3", "hash_count", pc.CountOptions("only_valid"), "c"), ("a4", "hash_min", None, "lo"),
             ("a5", "hash_max", None, "hi"), ("k", "hash_count_distinct", pc.CountOptions("only_valid"), "cd")],
            keys=["k"])),
    ]).to_table().schema
    assert q.schema == oracle and not q.schema.metadata
    assert flight.from_arrow(schema.empty_table()).aggregate([], n=agg.count_all()).schema == pa.schema([("n", pa.int64())])
