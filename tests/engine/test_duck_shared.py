"""A subquery a stage's DuckDB query repeats is computed once (``flight.engine.duck.shared``).

The rewrite is a function of the text alone: each case checks what it hoists, and that DuckDB gives the
rewritten text's rows and the original's alike (the original, run by DuckDB, is the oracle)."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest

from flight.engine.duck.shared import reducing, selective_scans, share_repeated_subqueries, shared_text

AGG = 'SELECT "g" AS "g", sum("v") AS "s" FROM (SELECT * FROM facts WHERE "v" > 1) AS t GROUP BY "g"'
"""A subquery that aggregates: worth computing once."""

SCAN = 'SELECT "g" AS "g", "v" AS "v" FROM facts'
"""A plain scan: left where it is, for DuckDB to push each use's filters into."""


@pytest.fixture(scope="module")
def con() -> duckdb.DuckDBPyConnection:
    c = duckdb.connect()
    c.register("facts", pa.table({"g": [1, 1, 2, 3, None], "v": [1, 2, 3, 4, 5]}))
    c.register("dims", pa.table({"g": [1, 2, 3], "name": ["a", "(SELECT x)", "c'd"]}))
    return c


def rows(con: duckdb.DuckDBPyConnection, text: str) -> list[tuple[object, ...]]:
    return sorted(con.sql(text).fetchall(), key=repr)


def test_a_repeated_aggregate_is_computed_once(con: duckdb.DuckDBPyConnection) -> None:
    """Each input of a union (a rollup's sets), through projections, filters and aggregates above it."""
    text = (f'SELECT "g", max("s") AS "m" FROM ({AGG}) AS t GROUP BY "g" UNION ALL SELECT * FROM (SELECT "g", "s" FROM ({AGG}) AS t) AS t'
            f' UNION ALL SELECT * FROM (SELECT * FROM ({AGG}) AS t WHERE "s" > 2) AS t')
    shared = share_repeated_subqueries(text)
    assert shared.startswith("WITH __flight_shared_0 AS MATERIALIZED (") and shared.count(AGG) == 1, shared
    assert shared.count("(SELECT * FROM __flight_shared_0)") == 3
    assert rows(con, shared) == rows(con, text)


def test_the_sides_of_joins_are_left_to_their_join_filters() -> None:
    """DuckDB filters a join's side by the other side's keys as it runs; a subquery computed first cannot be.
    Here the uses meet in a union (TPC-DS q23's frequent items, joined with each channel's sales)."""
    text = (f'SELECT * FROM (SELECT a."g", a."s" FROM ({AGG}) AS a JOIN (SELECT "g", "s" FROM ({AGG}) AS t) AS b ON a."g" = b."g") AS t'
            f' UNION ALL SELECT * FROM (SELECT j0."g", j0."s" FROM (SELECT "g", max("s") AS "s" FROM ({AGG}) AS t GROUP BY "g") AS j0,'
            f' (SELECT * FROM dims) AS j1 WHERE j0."g" = j1."g") AS t')
    assert share_repeated_subqueries(text) == text


def test_a_repeat_joined_with_itself_is_computed_once(con: duckdb.DuckDBPyConnection) -> None:
    """Its uses meet in the join (TPC-DS q02's weeks joined with the next year's): no other side filters either."""
    for text in (
        f'SELECT a."g", a."s", b."s" AS "t" FROM ({AGG}) AS a JOIN (SELECT "g", "s" FROM ({AGG}) AS t WHERE "s" > 2) AS b ON a."g" = b."g"',
        f'SELECT j0."g", j1."s" FROM ({AGG}) AS j0, ({AGG}) AS j1, (SELECT * FROM dims) AS j2 WHERE j0."g" = j1."g" AND j1."g" = j2."g"',
    ):
        shared = share_repeated_subqueries(text)
        assert shared.startswith("WITH __flight_shared_0 AS MATERIALIZED (") and shared.count(AGG) == 1, shared
        assert rows(con, shared) == rows(con, text) and rows(con, text)


def test_the_largest_repeat_is_hoisted_not_its_parts(con: duckdb.DuckDBPyConnection) -> None:
    outer = f'SELECT "g", max("s") AS "m" FROM ({AGG}) AS t GROUP BY "g"'
    text = f"SELECT * FROM ({outer}) AS t UNION ALL SELECT * FROM ({outer}) AS t"
    shared = share_repeated_subqueries(text)
    assert shared.count(" AS MATERIALIZED (") == 1 and shared.count(outer) == 1, shared
    assert rows(con, shared) == rows(con, text)


def test_a_repeat_meeting_its_own_aggregate_in_a_semi_join_is_computed_once(con: duckdb.DuckDBPyConnection) -> None:
    """TPC-DS q01's shape: each row of the CTE kept where it passes 1.2 times its group's average, the average's
    aggregate reading the CTE whole."""
    avg = f'SELECT "g" AS "h", avg("s") * 0.6 AS "a" FROM ({AGG}) AS t GROUP BY "g"'
    text = f'SELECT l."g", l."s" FROM ({AGG}) AS l SEMI JOIN ({avg}) AS r ON l."g" = r."h" AND l."s" > r."a"'
    shared = share_repeated_subqueries(text)
    assert shared.startswith("WITH __flight_shared_0 AS MATERIALIZED (") and shared.count(AGG) == 1, shared
    assert rows(con, shared) == rows(con, text) and rows(con, text)


def test_a_repeat_inside_a_kept_one_and_outside_it_is_computed_once(con: duckdb.DuckDBPyConnection) -> None:
    """TPC-DS q47's shape: the CTE read whole by one use and, projected, by two more that meet in a join. The
    projection is kept for its two uses, and the CTE inside it for it and the whole use: one computation."""
    part = f'SELECT "g", "s" FROM ({AGG}) AS t WHERE "g" IS NOT NULL'
    text = (f'SELECT a."g", a."s", b."s" AS "p", c."s" AS "n" FROM (SELECT * FROM ({AGG}) AS t WHERE "s" > 1) AS a '
            f'JOIN ({part}) AS b ON a."g" = b."g" + 1 JOIN ({part}) AS c ON a."g" = c."g" - 1')
    shared = share_repeated_subqueries(text)
    assert shared.count(AGG) == 1 and shared.count(part) == 0, shared
    assert shared.startswith("WITH __flight_shared_1 AS MATERIALIZED (") and ", __flight_shared_0 AS MATERIALIZED (" in shared, shared
    assert rows(con, shared) == rows(con, text) and rows(con, text)


def test_a_repeated_scan_stays_in_place() -> None:
    text = f'SELECT * FROM ({SCAN}) AS t WHERE "v" > 2 UNION ALL SELECT * FROM ({SCAN}) AS t WHERE "v" < 2'
    assert share_repeated_subqueries(text) == text


def test_a_subquery_the_engine_says_does_not_reduce_stays() -> None:
    text = f"SELECT * FROM ({AGG}) AS t UNION ALL SELECT * FROM ({AGG}) AS t"
    asked: list[str] = []
    assert share_repeated_subqueries(text, lambda body: asked.append(body) is not None) == text
    assert asked == [AGG]


def test_duckdbs_estimates_keep_an_aggregate_not_a_scan_sized_join(con: duckdb.DuckDBPyConnection) -> None:
    keep = reducing(con)
    con.execute("create or replace table big as select range % 10 as g, range as v from range(100000)")
    assert keep('SELECT "g", sum("v") AS "s" FROM big GROUP BY "g"')
    assert not keep('SELECT b."g", b."v" FROM big AS b JOIN (SELECT DISTINCT "g" FROM big) AS d ON b."g" = d."g"')
    assert not keep("SELECT * FROM no_such_table")


def test_a_subquery_used_once_stays(con: duckdb.DuckDBPyConnection) -> None:
    text = f"SELECT * FROM ({AGG}) AS t"
    assert share_repeated_subqueries(text) == text


def test_quoted_text_is_not_read_as_sql(con: duckdb.DuckDBPyConnection) -> None:
    """A string or a name holding parentheses, quotes or SELECT is text: the repeats are found around it."""
    odd = ('SELECT "g", count(*) AS "n" FROM (SELECT * FROM dims WHERE "name" <> \'(SELECT x)\' AND "name" <> \'c\'\'d)\') '
           'AS t GROUP BY "g"')
    text = f'SELECT * FROM ({odd}) AS t UNION ALL SELECT * FROM ({odd}) AS t'
    shared = share_repeated_subqueries(text)
    assert shared.count(" AS MATERIALIZED (") == 1, shared
    assert rows(con, shared) == rows(con, text)


def test_a_volatile_function_leaves_the_text_alone() -> None:
    body = 'SELECT "g", sum("v") + random() AS "s" FROM facts GROUP BY "g"'
    text = f"SELECT * FROM ({body}) AS t UNION ALL SELECT * FROM ({body}) AS t"
    assert share_repeated_subqueries(text) == text


def test_a_column_named_like_a_function_is_no_volatile_call(con: duckdb.DuckDBPyConnection) -> None:
    """``c_current_addr_sk``, ``"now"``: names, not calls."""
    body = 'SELECT "g" AS "now", sum("v") AS "c_current_addr_sk" FROM facts GROUP BY "g"'
    text = f"SELECT * FROM ({body}) AS t UNION ALL SELECT * FROM ({body}) AS t"
    shared = share_repeated_subqueries(text)
    assert shared != text and rows(con, shared) == rows(con, text)


def test_an_unclosed_quote_is_not_rewritten() -> None:
    text = f"SELECT * FROM ({AGG}) AS t UNION ALL SELECT * FROM ({AGG}) AS t WHERE 'x"
    assert share_repeated_subqueries(text) == text


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Parquet files as a task's scans read them: ``big`` has 200,000 rows (TPC-H's ``part`` at SF 1), ``small`` 1,000."""
    import pyarrow.parquet as pq

    where = tmp_path_factory.mktemp("scans")
    files = {}
    for name, n in (("big", 200_000), ("small", 1_000)):
        path = where / f"{name}.parquet"
        pq.write_table(pa.table({"k": pa.array(range(n), pa.int64()), "kind": [f"T{i % 150}" for i in range(n)],
                                 "size": pa.array([i % 50 for i in range(n)], pa.int32())}), path, row_group_size=50_000)
        files[name] = f"read_parquet(['{path}'])"
    return files


def _scan(source: str, where: str = "\"kind\" LIKE '%5' AND \"size\" = 15") -> str:
    return f'SELECT "k", "size" FROM (SELECT * FROM (SELECT "k", "kind", "size" FROM {source}) AS t WHERE ({where})) AS t'


def _self_joined(scan: str) -> str:
    """TPC-H Q2's shape: the filtered scan joined in the query, and again under the subquery its semi join reads."""
    return (f'SELECT l."k", l."size" FROM ({scan}) AS l SEMI JOIN (SELECT "k", max("size") AS "m" FROM ({scan}) AS t '
            f'GROUP BY "k") AS r ON l."k" = r."k" AND l."size" = r."m"')


def test_a_selective_scan_of_many_rows_is_computed_once(con: duckdb.DuckDBPyConnection, parts: dict[str, str]) -> None:
    """Its uses meet in a join and DuckDB estimates it to keep few of the 200,000 rows: read once, not twice."""
    scan = _scan(parts["big"])
    text = _self_joined(scan)
    shared = share_repeated_subqueries(text, reducing(con), keep_scan=selective_scans(con))
    assert shared.startswith("WITH __flight_shared_0 AS MATERIALIZED (") and shared.count(scan) == 1, shared
    assert rows(con, shared) == rows(con, text) and rows(con, text)
    assert share_repeated_subqueries(text, reducing(con)) == text  # without the judge of scans, they stay in place


def test_scans_that_read_few_rows_or_keep_many_stay(con: duckdb.DuckDBPyConnection, parts: dict[str, str]) -> None:
    keep = selective_scans(con)
    assert keep(_scan(parts["big"]))
    assert not keep(_scan(parts["small"]))  # 1,000 rows: a second read costs less than a CTE
    assert not keep(_scan(parts["big"], '"size" >= 0'))  # DuckDB estimates it keeps most of them
    assert not keep(_scan("read_parquet(['/no/such/file.parquet'])"))
    assert not keep(_scan("facts"))  # no file list to count
    text = _self_joined(_scan(parts["small"]))
    assert share_repeated_subqueries(text, reducing(con), keep_scan=keep) == text


class _Counting:
    """A DuckDB cursor that counts what it is asked (to see an answer remembered)."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con, self.asked = con, 0

    def execute(self, sql: str) -> duckdb.DuckDBPyConnection:
        self.asked += 1
        return self.con.execute(sql)


def test_a_texts_sharing_is_remembered_by_its_text(con: duckdb.DuckDBPyConnection, parts: dict[str, str]) -> None:
    text = _self_joined(_scan(parts["big"], "\"kind\" LIKE '%5' AND \"size\" = 15 AND \"k\" > 7"))  # a text no other test shares
    cursor = _Counting(con)
    first = shared_text(text, cursor)
    assert first == share_repeated_subqueries(text, reducing(con), keep_scan=selective_scans(con)) != text
    asked = cursor.asked
    assert asked > 0 and shared_text(text, cursor) == first and cursor.asked == asked  # the second run asks DuckDB nothing
    assert rows(con, first) == rows(con, text) and rows(con, text)
