"""The SQL corpus in Spark's dialect, each answer compared with Spark SQL's own (PySpark as the oracle).

The statements are the corpus's (tests/corpus.py), over the same tables written to Parquet; Spark
reads the files as temporary views, flight-exec as a catalog with ``dialect="spark"``. The answers must
be Spark's: its result types (a DECIMAL average and quotient, to Spark's precision and scale, digit for
digit), its null order (NULLS FIRST for ASC), its errors. Statements Spark SQL does not take, or whose
Spark answer flight-exec does not give yet, are listed by name with the reason (``NOT_SPARK``, ``NOT_YET``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from corpus import CORPUS, SPARK_CORPUS, tables
from tpcds_support import difference

import flight
from flight.sql.frontend import split_statements

pytest.importorskip("pyspark", reason="the Spark tests need the spark extra: pip install -e '.[dev,spark]'")

pytestmark = [pytest.mark.spark, pytest.mark.slow]

CASES = [(group, i, text) for group, texts in {**CORPUS, **SPARK_CORPUS}.items() for i, text in enumerate(texts)]

NOT_SPARK: dict[str, str] = {
    "projection-10": 'a "double-quoted" identifier (Spark quotes with backticks)',
    "grouping-3": "GROUPING() of two columns (Spark's takes one; grouping_id takes several)",
    **{f"ordered-{i}": "an aggregate's ORDER BY inside its arguments is DuckDB's (Spark's collect_list has no order)" for i in range(10)},
    "nested-4": "a list's [i] counts from 0 in Spark, from 1 in DuckDB (Spark's spellings are in 'spark functions')",
    "nested-5": "array_length is DuckDB's (Spark's: size, cardinality)",
    "nested-6": "a list's [i] counts from 0 in Spark, from 1 in DuckDB",
    "nested-7": "array_length and [i] are DuckDB's",
    **{f"nested-{i}": "unnest is DuckDB's (Spark's: explode, in 'spark functions')" for i in range(9, 13)},
    "medians-1": "quantile_cont is DuckDB's name (Spark's: percentile, percentile_cont WITHIN GROUP)",
    "medians-2": "quantile_cont is DuckDB's name (Spark's: percentile, percentile_cont WITHIN GROUP)",
    "medians-7": "quantile_cont is DuckDB's name (Spark's: percentile, percentile_cont WITHIN GROUP)",
    "medians-5": "quantile_disc is DuckDB's (Spark's percentile_disc is written WITHIN GROUP)",
    "medians-10": "quantile and quantile_disc are DuckDB's names",
    "text-8": "split_part of field 0 (an error in Spark, '' in DuckDB)",
    "text-9": "regexp_matches, regexp_full_match and strpos are DuckDB's names (Spark: rlike, regexp_like, instr)",
    "text-10": "~ and !~ are DuckDB's regular-expression operators (Spark's ~ is a bitwise NOT)",
    "functions-6": "trunc(x) of a number (Spark's trunc truncates a date to a unit)",
    "strings-16": "starts_with (Spark spells it startswith)",
    "strings-17": "CAST(... AS VARCHAR) without a length",
    "strings-18": "CAST(... AS VARCHAR) without a length",
    "functions-14": "regexp_replace's fourth argument is a position in Spark, not flags",
    "functions-15": "regexp_replace's fourth argument is a position in Spark, not flags",
    "functions-16": "trim(s, chars) (Spark writes trim(BOTH chars FROM s))",
    "functions-18": "CAST(... AS VARCHAR) without a length",
    "functions-21": "strftime is DuckDB's (Spark's is date_format, with Java's patterns)",
    "functions-22": "strptime is DuckDB's (Spark's is to_timestamp, with Java's patterns)",
    "functions-26": "an interval literal of two units in one string (Spark writes interval 1 month 3 days)",
    "m.window-2": "a ROWS frame on a ranking function (Spark refuses it)",
    "m.window-5": "a ROWS frame on a ranking function (Spark refuses it)",
    "m.window-8": "a ROWS frame on a ranking function (Spark refuses it)",
    "m.window-26": "a ROWS frame on lag (Spark refuses it)",
    "m.window-29": "a ROWS frame on lead (Spark refuses it)",
    "ctes-4": "CREATE VIEW over a temporary view (Spark needs CREATE TEMPORARY VIEW)",
    "ctes-5": "CREATE VIEW over a temporary view (Spark needs CREATE TEMPORARY VIEW)",
}
"""Statements that are not Spark SQL (DuckDB's own spellings), by id: Spark refuses them."""

_RANGE_NULLS_FIRST = "a RANGE frame over an ASC order: Spark's nulls come first, a second order key here, and RANGE takes one"
NOT_YET: dict[str, str] = {
    "windows-22": _RANGE_NULLS_FIRST,
    "windows-23": _RANGE_NULLS_FIRST,
    "windows-24": _RANGE_NULLS_FIRST,
    "functions-4": "ln(0.0) of a constant: DataFusion folds it to -inf while planning, where Spark's is NULL",
    "functions-19": "Spark's TIMESTAMP has the session's time zone (UTC here); date_trunc's result here has none",
    "functions-20": "Spark's TIMESTAMP has the session's time zone (UTC here); date_trunc's result here has none",
    "functions-23": "Spark's TIMESTAMP has the session's time zone (UTC here); date_trunc's result here has none",
    "functions-28": "Spark's TIMESTAMP has the session's time zone (UTC here); the result here has none",
}
"""Statements whose Spark answer flight-exec does not give yet, by id, and why (expected to fail: strict)."""


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("spark-corpus")
    out = {}
    for name, table in tables().items():
        out[name] = root / f"{name}.parquet"
        pq.write_table(table, out[name])
    return out


@pytest.fixture(scope="module")
def views(spark: Any, paths: dict[str, Path]) -> Iterator[Any]:
    for name, path in paths.items():
        spark.read.parquet(str(path)).createOrReplaceTempView(name)
    yield spark
    for name in paths:
        spark.catalog.dropTempView(name)


def _id(group: str, i: int) -> str:
    return f"{group.split()[0]}-{i}"


@pytest.mark.parametrize(
    ("group", "i", "text"),
    [pytest.param(g, i, t, id=_id(g, i), marks=[pytest.mark.xfail(reason=NOT_YET[_id(g, i)], strict=True)] if _id(g, i) in NOT_YET else [])
     for g, i, t in CASES if _id(g, i) not in NOT_SPARK],
)
def test_statement_matches_spark(group: str, i: int, text: str, views: Any, paths: dict[str, Path]) -> None:
    want = _spark_answer(views, text)
    got = flight.run_local(flight.sql(text, {n: str(p) for n, p in paths.items()}, dialect="spark")).read_all()
    last = split_statements(text)[-1].text.lower()
    why = difference(got, want, re.search(r"order by [^)]*$", last) is not None)
    assert why is None, f"{text}\n{why}"


def _spark_answer(spark: Any, text: str) -> pa.Table:
    result: pa.Table | None = None
    for statement in split_statements(text):
        df = spark.sql(statement.text)
        if statement.text.lower().lstrip().startswith(("select", "with", "(")):
            result = df.toArrow()
    assert result is not None
    return result
