"""Arrow ↔ Spark schemas, and making a batch exactly what Spark expects.

Spark takes a ``mapInArrow`` result's columns **by position** and reads each
Arrow vector with the accessor of the declared Spark type: a batch whose
columns are in another order, or of another Arrow type, fails deep in the JVM
(``Cannot call the method "getLong" of ... ArrowVectorAccessor``). A Python
data source must yield a first batch whose Arrow schema *equals* Spark's
expectation (nullability, ``string`` vs ``large_string``). ``Conformer`` does
both: it picks the declared columns by name, casts each to the declared type,
and says which column is wrong when it cannot.

pyspark is imported lazily: this module loads without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

from flight.errors import PlanError

if TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructType

__all__ = [
    "Conformer",
    "arrow_schema",
    "check_conformable",
    "ddl",
    "input_schema",
    "spark_schema",
    "spark_type",
    "to_struct",
]


def _types() -> Any:
    try:
        import pyspark.sql.types as T
    except ImportError as exc:  # pragma: no cover - the spark extra is missing
        raise ImportError("flight.spark needs PySpark: pip install 'flight-exec[spark]'") from exc
    return T


def spark_type(t: pa.DataType, where: str = "") -> DataType:
    """The Spark type that holds Arrow type ``t`` (``where`` names the column for errors)."""
    T = _types()
    if pa.types.is_dictionary(t):
        return spark_type(t.value_type, where)
    simple = {
        pa.null(): T.NullType(),
        pa.bool_(): T.BooleanType(),
        pa.int8(): T.ByteType(),
        pa.int16(): T.ShortType(),
        pa.int32(): T.IntegerType(),
        pa.int64(): T.LongType(),
        pa.uint8(): T.ShortType(),
        pa.uint16(): T.IntegerType(),
        pa.uint32(): T.LongType(),
        pa.uint64(): T.DecimalType(20, 0),
        pa.float16(): T.FloatType(),
        pa.float32(): T.FloatType(),
        pa.float64(): T.DoubleType(),
        pa.date32(): T.DateType(),
        pa.date64(): T.DateType(),
    }
    if t in simple:
        return simple[t]
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return T.StringType()
    if (
        pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_binary_view(t)
        or pa.types.is_fixed_size_binary(t)
    ):
        return T.BinaryType()
    if pa.types.is_decimal(t):
        if t.precision > 38:
            raise PlanError(f"column {where!r}: {t} has more digits than Spark's decimal (38); cast it in the query")
        return T.DecimalType(t.precision, t.scale)
    if pa.types.is_timestamp(t):
        return T.TimestampType() if t.tz is not None else T.TimestampNTZType()
    if pa.types.is_duration(t):
        return T.DayTimeIntervalType()
    if (
        pa.types.is_list(t)
        or pa.types.is_large_list(t)
        or pa.types.is_fixed_size_list(t)
        or pa.types.is_list_view(t)
        or pa.types.is_large_list_view(t)
    ):
        return T.ArrayType(spark_type(t.value_type, f"{where}[]"), True)
    if pa.types.is_map(t):
        return T.MapType(spark_type(t.key_type, f"{where}.key"), spark_type(t.item_type, f"{where}.value"), True)
    if pa.types.is_struct(t):
        return T.StructType([T.StructField(f.name, spark_type(f.type, f"{where}.{f.name}"), True) for f in t])
    raise PlanError(f"column {where!r}: Arrow type {t} has no Spark equivalent; cast it in the query")


def spark_schema(schema: pa.Schema) -> StructType:
    """The Spark schema of ``schema``'s columns, in order, every field nullable."""
    T = _types()
    return T.StructType([T.StructField(f.name, spark_type(f.type, f.name), True) for f in schema])


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _ddl_type(dt: DataType) -> str:
    T = _types()
    if isinstance(dt, T.StructType):
        return "struct<" + ",".join(f"{_quote(f.name)}:{_ddl_type(f.dataType)}" for f in dt.fields) + ">"
    if isinstance(dt, T.ArrayType):
        return f"array<{_ddl_type(dt.elementType)}>"
    if isinstance(dt, T.MapType):
        return f"map<{_ddl_type(dt.keyType)},{_ddl_type(dt.valueType)}>"
    return str(dt.simpleString())


def ddl(schema: StructType | pa.Schema) -> str:
    """A DDL string (``"`a` bigint, `b` string"``) that ``mapInArrow`` and ``spark.read.schema`` accept."""
    struct = spark_schema(schema) if isinstance(schema, pa.Schema) else schema
    return ", ".join(
        f"{_quote(f.name)} {_ddl_type(f.dataType)}" + ("" if f.nullable else " NOT NULL") for f in struct.fields
    )


def to_struct(schema: StructType | pa.Schema | str) -> StructType:
    """A Spark ``StructType`` from a StructType, an Arrow schema, or a DDL string (needs a SparkContext)."""
    T = _types()
    if isinstance(schema, T.StructType):
        return schema
    if isinstance(schema, pa.Schema):
        return spark_schema(schema)
    if isinstance(schema, str):
        try:
            parsed = T.DataType.fromDDL(schema)
        except Exception as exc:
            raise PlanError(f"cannot parse the Spark schema {schema!r}: {exc}") from exc
        if not isinstance(parsed, T.StructType):
            raise PlanError(f"the Spark schema {schema!r} is a {parsed.simpleString()}, not a list of columns")
        return parsed
    raise TypeError(f"a schema is a DDL string, a pyspark StructType or a pyarrow Schema, not {type(schema).__name__}")


def arrow_schema(struct: StructType) -> pa.Schema:
    """The Arrow schema Spark expects for ``struct`` (what its Python workers and data sources check)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(struct, timezone="UTC")


def input_schema(df: Any) -> pa.Schema:
    """The Arrow schema of the batches ``df.mapInArrow`` hands its function: build ``map_input`` from it."""
    return arrow_schema(df.schema)


def _find(names: list[str], name: str) -> int | None:
    """Index of column ``name``: exact match first, then (as Spark resolves names) case-insensitive."""
    if name in names:
        return names.index(name)
    folded = [i for i, n in enumerate(names) if n.lower() == name.lower()]
    return folded[0] if len(folded) == 1 else None


def _castable(source: pa.DataType, target: pa.DataType) -> str | None:
    """Why ``source`` cannot be cast to ``target`` (None: it can, at least for some values)."""
    if source == target:
        return None
    try:
        pa.array([], type=source).cast(target)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        return str(exc).splitlines()[0]
    return None


def check_conformable(produced: pa.Schema, target: pa.Schema, what: str) -> None:
    """A PlanError naming the first declared column ``produced`` lacks or cannot be cast to."""
    names = produced.names
    for field in target:
        i = _find(names, field.name)
        if i is None:
            raise PlanError(
                f"{what}: the declared column {field.name!r} is not in the output (it has {names}); "
                "declare the stage's own columns (e.g. schema=flight_map(...).schema)"
            )
        problem = _castable(produced.field(i).type, field.type)
        if problem is not None:
            raise PlanError(
                f"{what}: column {field.name!r} is {produced.field(i).type} but declared as {field.type} "
                f"and cannot be cast: {problem}"
            )


class Conformer:
    """Make batches exactly ``target``: its columns, in its order, of its types.

    The column mapping is worked out once per input schema; a batch that already
    has the target schema passes through untouched.
    """

    def __init__(self, target: pa.Schema, what: str) -> None:
        self.target = target
        self.what = what
        self._plans: dict[pa.Schema, list[int]] = {}

    def _plan(self, schema: pa.Schema) -> list[int]:
        plan = self._plans.get(schema)
        if plan is None:
            plan = []
            for field in self.target:
                i = _find(schema.names, field.name)
                if i is None:
                    raise PlanError(
                        f"{self.what}: the declared column {field.name!r} is missing from the output "
                        f"(it has {schema.names})"
                    )
                plan.append(i)
            self._plans[schema] = plan
        return plan

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if batch.schema.equals(self.target):
            return batch
        columns = []
        for field, i in zip(self.target, self._plan(batch.schema)):
            column = batch.column(i)
            if column.type != field.type:
                try:
                    column = column.cast(field.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                    raise PlanError(
                        f"{self.what}: column {field.name!r} is {column.type} but declared as {field.type}, "
                        f"and a value does not fit: {str(exc).splitlines()[0]}"
                    ) from exc
            if not field.nullable and column.null_count:
                raise PlanError(
                    f"{self.what}: column {field.name!r} is declared NOT NULL but has {column.null_count} null(s)"
                )
            columns.append(column)
        return pa.RecordBatch.from_arrays(columns, schema=self.target)
