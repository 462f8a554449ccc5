"""The 99 TPC-DS queries in Spark SQL's dialect, and PySpark's answers to them: the oracle of ``dialect="spark"``.

Why: ``flight.sql(text, tables, dialect="spark")`` is to give Spark SQL's semantics (its result types above
all: a decimal ``/`` or ``avg`` is a DECIMAL in Spark, a DOUBLE in DuckDB), so its answers are checked
against Spark itself, not against DuckDB (tests/sql/test_tpcds_spark_dialect.py).

The texts are made at run time from DuckDB's (``tpcds_support.texts``) by
``sqlglot.transpile(text, read="duckdb", write="spark")``, never pasted from elsewhere. sqlglot keeps the
DuckDB text's meaning in Spark's spelling: each ORDER BY key gets the null order DuckDB gives it (``NULLS
LAST`` written on an ASC key, an explicit ``NULLS FIRST`` dropped, Spark's ASC default), DuckDB's
``CONCAT`` (which skips a NULL) becomes ``CONCAT`` of ``COALESCE(x, '')``, quoted aliases take backticks.

Rewrites of sqlglot's output: none. Every one of the 99 transpiled texts runs in PySpark 4.3 (sqlglot
30.31), and its answer equals DuckDB's answer to the original text at SF 0.01 (rows, order where the text
orders, values), apart from Spark's own result types: a DECIMAL rounded to its scale where DuckDB has a
DOUBLE (``avg``, ``/``), and q66's sum of 6-digit quotients; so do the 12 of the 27 queries empty at SF 0.01
that have rows at SF 0.1 (checked once, by hand). Should a later sqlglot change that, a rewrite of its
output goes here, by query number, with its reason.

The oracle: the session's ``spark`` fixture (tests/conftest.py) gives the SparkContext; the queries run in a
``newSession()`` of it (its own temporary views and SQL settings, so other Spark tests can neither see nor
clobber the 24 views). Spark's defaults hold, ANSI mode included (``spark.sql.ansi.enabled`` is ``true`` by
default in PySpark 4: ``DEFAULTS``, checked by the test), except ``spark.sql.session.timeZone=UTC``, fixed
so no answer depends on the machine's zone. Answers are ``DataFrame.toArrow()``: Spark's DECIMAL(p, s)
arrives as Arrow's decimal128(p, s), its values ``Decimal``, never floats.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import pyarrow as pa
import sqlglot
import tpcds_support

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SETTINGS = {"spark.sql.session.timeZone": "UTC"}
"""What the oracle's session sets: only what makes an answer deterministic."""
DEFAULTS = {"spark.sql.ansi.enabled": "true", "spark.sql.decimalOperations.allowPrecisionLoss": "true"}
"""Spark's defaults the answers rely on (the semantics ``dialect="spark"`` is to give); a PySpark that changes one fails the test."""


@functools.cache
def texts() -> dict[int, str]:
    """``{1: text, ..., 99: text}``: each DuckDB text in Spark SQL's spelling."""
    out = {}
    for n, text in tpcds_support.texts().items():
        (spark_text,) = sqlglot.transpile(text, read="duckdb", write="spark")
        out[n] = spark_text
    return out


@functools.cache
def session(spark: SparkSession) -> SparkSession:
    """A session of ``spark``'s context with the 24 tables as temporary views, and ``SETTINGS``."""
    own = spark.newSession()
    for key, value in SETTINGS.items():
        own.conf.set(key, value)
    for name, path in tpcds_support.tables().items():
        own.read.parquet(str(path)).createOrReplaceTempView(name)
    return own


@functools.cache
def answer(spark: SparkSession, n: int) -> pa.Table:
    """PySpark's answer to query ``n`` (once per session)."""
    return session(spark).sql(texts()[n]).toArrow()
