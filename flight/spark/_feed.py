"""A work-unit feed whose units are the rows of a Spark DataFrame.

Step one of a two-step job runs in Spark (list files, page through an API,
query a catalog); step two runs on the workers. ``toLocalIterator`` brings the
DataFrame's rows to the driver one Spark partition at a time, so the first
units reach the workers while Spark still computes the later partitions, and
the driver never holds the whole DataFrame.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from flight.errors import PlanError
from flight.sources.feed import FeedContext, WorkUnit, WorkUnitFeedProvider

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["DataFrameFeed", "feed_from_dataframe"]


def _default_unit(value: Any) -> WorkUnit:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    raise TypeError(
        f"a work unit from a DataFrame column must be binary or string, not {type(value).__name__}; "
        "pass unit= to turn the value into bytes or a protobuf message"
    )


class DataFrameFeed(WorkUnitFeedProvider):
    """Units from one column of a DataFrame, streamed with ``toLocalIterator``.

    ``shared`` (default): one discovery stream whose units go to whichever
    task has credit. Null values are skipped.
    """

    def __init__(
        self,
        df: DataFrame,
        column: str,
        *,
        unit: Callable[[Any], WorkUnit] | None = None,
        shared: bool = True,
        prefetch: bool = True,
    ) -> None:
        if column not in df.columns:
            raise PlanError(f"feed_from_dataframe: the DataFrame has no column {column!r} (it has {df.columns})")
        self.df = df.select(column)
        self.column = column
        self.unit = unit or _default_unit
        self.shared = shared
        self.prefetch = prefetch

    def partitions(self) -> int | None:
        return None if self.shared else 1

    def feed(self, partition: int, ctx: FeedContext) -> Iterator[WorkUnit]:
        rows = self.df.toLocalIterator(prefetchPartitions=self.prefetch)
        try:
            for row in rows:
                if ctx.is_cancelled():
                    return
                value = row[0]
                if value is not None:
                    yield self.unit(value)
        finally:
            close = getattr(rows, "close", None)
            if close is not None:
                close()


def feed_from_dataframe(
    df: DataFrame,
    column: str,
    *,
    unit: Callable[[Any], WorkUnit] | None = None,
    shared: bool = True,
    prefetch: bool = True,
) -> DataFrameFeed:
    """A ``WorkUnitFeedProvider`` whose units are ``df[column]``'s values.

    ``unit`` turns a value into a work unit (default: bytes as they are, strings
    UTF-8 encoded); e.g. ``unit=flight.file_unit`` for a column of Parquet paths.
    ``shared``: one discovery stream for the whole leaf (units go to whichever
    task has credit); ``prefetch``: Spark computes the next partition while the
    current one is being fed.
    """
    return DataFrameFeed(df, column, unit=unit, shared=shared, prefetch=prefetch)
