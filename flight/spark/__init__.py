"""PySpark integration: flight-exec stages inside Spark jobs, and query results as DataFrames.

* ``flight_map(stage, workers)``: the function for ``df.mapInArrow`` that runs a
  map stage on the workers, one DoExchange per Spark task (``map_in_arrow``
  does both steps with the schema given once).
* ``read(spark, query, resolver)``: a query's result as a DataFrame whose
  partitions are the head stage's outputs, read in parallel with DoGet
  (``register(spark)`` adds the ``flight`` data source; ``plan_options(query)``
  builds the options of its coordinator-less one-stage form).
* ``sql(spark, text, tables, workers)``: SQL planned in this process, its result as a DataFrame;
  ``spark.read.format("flight").option("coordinator", URL).option("sql", TEXT)`` asks a
  ``flight-coordinator`` instead (filters pushed into the statement on PySpark 4.1+).
* ``feed_from_dataframe(df, column)``: a DataFrame of work units as a feed.
* ``table(df)``: a DataFrame as a table of a query run by ``read`` or ``sql`` (its partitions streamed
  by Spark's tasks into the flight tasks that read them).
* ``start_workers(spark, n)``: ``n`` flight workers as long-lived Spark tasks on the executors,
  with a ``resolver()`` that follows them.

pyspark is imported only when a function needs it; see docs/spark.md.
"""

from flight.spark._feed import DataFrameFeed, feed_from_dataframe
from flight.spark._fleet import SparkWorkers, start_workers
from flight.spark._map import FlightMap, flight_map, map_in_arrow
from flight.spark._read import FlightRead, plan_options, read, register, sql, start_read
from flight.spark._schema import ddl, input_schema, spark_schema
from flight.spark._table import table

__all__ = [
    "DataFrameFeed",
    "FlightMap",
    "FlightRead",
    "SparkWorkers",
    "ddl",
    "feed_from_dataframe",
    "flight_map",
    "input_schema",
    "map_in_arrow",
    "plan_options",
    "read",
    "register",
    "spark_schema",
    "sql",
    "start_read",
    "start_workers",
    "table",
]
