"""``dialect="spark"``: a Spark user's spellings, each compared with DuckDB running its own spelling.

Every function ``flight.sql.spark.FUNCTIONS`` names appears in at least one case here (checked),
over the corpus's tables; the answers must be equal (semantics are DuckDB's, docs/sql.md).
"""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from corpus import tables
from test_sql_corpus import same

import flight
from flight.errors import PlanError
from flight.sql.spark import FUNCTIONS

CASES = [
    ("select `id`, `x` from t", "select id, x from t"),
    ("select id, date_add(dt, 3) as v from t", "select id, dt + 3 as v from t"),
    ("select id, date_sub(dt, 3) as v from t", "select id, dt - 3 as v from t"),
    ("select id, datediff(dt, date '1995-01-01') as v from t", "select id, dt - date '1995-01-01' as v from t"),
    ("select id, nvl(x, 0) as a, ifnull(x, 1) as b, nvl2(x, 1, 2) as c from t",
     "select id, coalesce(x, 0) as a, coalesce(x, 1) as b, case when x is not null then 1 else 2 end as c from t"),
    ("select id, concat(s, '!') as v from t", "select id, s || '!' as v from t"),  # Spark's concat: null with a null
    ("select id from t where s rlike '^app'", "select id from t where regexp_matches(s, '^app')"),
    ("select id, year(dt) as y, month(dt) as m, dayofmonth(dt) as d, quarter(dt) as q from t",
     "select id, year(dt) as y, month(dt) as m, day(dt) as d, quarter(dt) as q from t"),
    ("select id, dayofweek(dt) as v from t", "select id, dayofweek(dt) + 1 as v from t"),
    ("select id, extract(year from dt) as v from t", "select id, extract(year from dt) as v from t"),
    ("select id, hour(cast(dt as timestamp)) as h, minute(cast(dt as timestamp)) as m, second(cast(dt as timestamp)) as s from t",
     "select id, 0::bigint as h, 0::bigint as m, 0::bigint as s from t"),
    ("select id, lcase(s) as a, ucase(s) as b, lower(s) as c, upper(s) as d from t",
     "select id, lower(s) as a, upper(s) as b, lower(s) as c, upper(s) as d from t"),
    ("select id, length(s) as a, char_length(s) as b from t", "select id, length(s) as a, length(s) as b from t"),
    ("select id, if(x > 3, 'big', 'small') as v from t", "select id, case when x > 3 then 'big' else 'small' end as v from t"),
    ("select id, substr(s, 2, 3) as a, substring(s, 1, 2) as b from t", "select id, substring(s, 2, 3) as a, substring(s, 1, 2) as b from t"),
    ("select id, left(s, 2) as a from t", "select id, left(s, 2) as a from t"),
    ("select id from t where startswith(s, 'ap')", "select id from t where starts_with(s, 'ap')"),
    ("select id, trim(concat(' ', s, ' ')) as v from t", "select id, trim(' ' || s || ' ') as v from t"),
    ("select id, cast(x as string) as v from t", "select id, cast(x as varchar) as v from t"),
    ("select id, to_date('2020-02-29') as v from t", "select id, date '2020-02-29' as v from t"),
    ("select id, to_timestamp('2020-02-29 10:00:00') as v from t", "select id, timestamp '2020-02-29 10:00:00' as v from t"),
    ("select id, nullif(x, 4) as a, sqrt(abs(f)) as b, pow(x, 2) as c from t",
     "select id, nullif(x, 4) as a, sqrt(abs(f)) as b, pow(x, 2) as c from t"),
    ("select id, current_date() = current_date() as v from t", "select id, true as v from t"),
    ("select id, abs(x) as a, floor(f) as b, ceil(f) as c, round(d, 1) as r from t",
     "select id, abs(x) as a, floor(f) as b, ceil(f) as c, round(d, 1) as r from t"),
    ("select g, count(*) as n, sum(x) as s, avg(x) as a, min(x) as lo, max(x) as hi from t group by g",
     "select g, count(*) as n, sum(x) as s, avg(x) as a, min(x) as lo, max(x) as hi from t group by g"),
    ("select id, coalesce(x, 0) as v from t", "select id, coalesce(x, 0) as v from t"),
]


def test_every_named_function_is_tested() -> None:
    used = set(re.findall(r"([a-z_0-9]+)\s*\(", " ".join(spark for spark, _ in CASES).lower()))
    missing = [f for f in FUNCTIONS if f not in used and f not in ("extract", "cast", "rlike")]
    assert not missing, missing
    assert len(FUNCTIONS) >= 40


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[flight.Catalog, duckdb.DuckDBPyConnection]:
    root: Path = tmp_path_factory.mktemp("spark-sql")
    con = duckdb.connect()
    paths = {}
    for name, table in tables().items():
        paths[name] = str(root / f"{name}.parquet")
        pq.write_table(table, paths[name])
        con.execute(f"create view {name} as select * from read_parquet('{paths[name]}')")
    return flight.Catalog(paths), con


@pytest.mark.parametrize(("spark", "duck"), CASES, ids=[c[0][:50] for c in CASES])
def test_spark_spelling_matches_duckdb(spark: str, duck: str, setup: tuple[flight.Catalog, duckdb.DuckDBPyConnection]) -> None:
    catalog, con = setup
    want = con.sql(duck).to_arrow_table()
    got = flight.run_local(flight.sql(spark, catalog, dialect="spark")).read_all()
    difference = same(got, want, ordered=False)
    assert difference is None, f"{spark}\n{difference}"


def test_spark_strings_escape_with_a_backslash_where_statements_are_split() -> None:
    """In Spark's text a backslash escapes a quote, so ``;`` inside such a string splits nothing (DuckDB's
    text doubles the quote instead); an unclosed string is a syntax error naming the dialect."""
    t = pa.table({"s": ["it's; x", "a\\b"]})
    got = flight.run_local(flight.sql("select s from t where s = 'it\\'s; x' or s = 'a\\\\b'", {"t": t}, dialect="spark")).read_all()
    assert sorted(got.column("s").to_pylist()) == ["a\\b", "it's; x"]
    got = flight.run_local(flight.sql("select s from t where s = 'it''s; x'", {"t": t})).read_all()
    assert got.column("s").to_pylist() == ["it's; x"]
    with pytest.raises(PlanError, match="Spark dialect"):
        flight.sql("select 'open", {"t": t}, dialect="spark")


def test_a_list_index_past_the_end_is_null_in_duckdb_and_an_error_in_spark() -> None:
    """DuckDB's ``l[i]`` past the end is NULL; Spark's (ANSI) fails naming the index, as Spark SQL does."""
    t = pa.table({"l": pa.array([[1, 2], [], None], pa.list_(pa.int64()))})
    got = flight.run_local(flight.sql("select l[2] as x from t", {"t": t})).read_all()
    assert got.column("x").to_pylist() == [2, None, None]
    got = flight.run_local(flight.sql("select l[1] as x from t where size(l) = 2", {"t": t}, dialect="spark")).read_all()
    assert got.column("x").to_pylist() == [2]
    with pytest.raises(Exception, match="INVALID_ARRAY_INDEX"):
        flight.run_local(flight.sql("select l[1] as x from t", {"t": t}, dialect="spark")).read_all()
