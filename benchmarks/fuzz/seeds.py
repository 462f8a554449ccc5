"""Valid seeds: a task header whose plan the worker accepts, with the units and input that feed it.

Every case mutates one of these; ``--check-seeds`` runs each unmutated, since a seed the worker rejects
would only ever test its rejection path.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from benchmarks.fuzz.data import DATA_FILES, DATA_SCHEMA, DATA_TOKEN, LABEL_SCHEMA, UNITS_SCHEMA, data_table, ipc_stream, schema_bytes, table_stream
from benchmarks.fuzz.plans import call, col, expression, lit, wire
from benchmarks.fuzz.proto import L, P, ser
from benchmarks.fuzz.settings import PROTOCOL, SELF_URL, T0

if TYPE_CHECKING:
    from benchmarks.fuzz.plans import Tree

__all__ = [
    "MAP_TEMPLATES", "NAME_TEMPLATES", "SOURCES", "TEMPLATES", "UNIT_BODIES", "UNIT_TEMPLATES", "Seed", "all_seed_kinds", "cancel_request",
    "data_root", "data_values", "file_unit", "make_seed", "make_ticket", "project_op", "query_secret", "source", "stage_key", "task_header",
    "templates_for", "units_root", "values_op",
]


# ---------------------------------------------------------------------- seeds

SOURCES = ("values", "parquet", "csv", "ipc", "units", "exchange", "shuffle")
TEMPLATES = ("identity", "filter", "filter_str", "project", "limit", "aggregate", "sort", "union", "join", "join_filter", "window",
             "window_range", "aggregate_duckdb", "partitioned")
MAP_TEMPLATES = ("identity", "filter", "filter_str", "project", "limit", "aggregate", "sort")
UNIT_TEMPLATES = ("identity", "limit", "filter_len", "count", "project_len")
NAME_TEMPLATES = ("identity", "filter_str", "project", "aggregate", "sort", "join", "partitioned")
"""Templates whose kernels read the ``name`` strings (where corrupt offsets would be dereferenced)."""
UNIT_BODIES = [b"alpha", b"", b"\x00\xff\x00", b"x" * 100, b"unit-5"]


@dataclass
class Seed:
    """A valid task: its header, the units its feed partitions get, a map stage's input, a producer to run first."""

    kind: str
    template: str
    header: Any
    units: dict[tuple[str, int], list[bytes]] = field(default_factory=dict)
    window: int = 4
    is_map: bool = False
    upload: list[bytes] = field(default_factory=list)
    producer: bytes | None = None


def stage_key(qid: str, task: int = 0, stage: int = 0) -> Any:
    return P.StageKey(query_id=qid, stage_id=stage, task_number=task)


def _has(message: Any, name: str) -> bool:
    return name in message.DESCRIPTOR.fields_by_name


def query_secret(qid: str) -> dict[str, bytes]:
    """The query's secret, as keyword arguments for a TaskHeader, Ticket or CancelRequest (if the protocol has one).

    Derived from the query id, so cases stay deterministic; every task of a case's query shares it.
    """
    if not _has(P.TaskHeader, "query_secret"):
        return {}
    return {"query_secret": hashlib.sha256(f"flight-exec-fuzz/{qid}".encode()).digest()}


def make_ticket(key: Any, start: int, end: int) -> Any:
    """A DoGet ticket for ``key``'s partitions [start, end), with the query's secret."""
    extra = query_secret(key.query_id) if _has(P.Ticket, "query_secret") else {}
    return P.Ticket(stage_key=key, partition_start=start, partition_end=end, **extra)


def cancel_request(qid: str) -> Any:
    extra = query_secret(qid) if _has(P.CancelRequest, "query_secret") else {}
    return P.CancelRequest(query_id=qid, **extra)


def task_header(key: Any, plan: Any, feeds: Sequence[Any] = (), window: int = 0, compression: int = 0) -> Any:
    return P.TaskHeader(
        **query_secret(key.query_id),
        protocol_version=PROTOCOL["version"],
        stage_key=key,
        task_count=key.task_number + 1,
        plan=wire(plan),
        feeds=list(feeds),
        target_worker_url=SELF_URL,
        query_start_unix_nanos=T0,
        options=P.TaskOptions(ipc_compression=compression, feed_window=window),
    )


def file_unit(path: str) -> bytes:
    # Partition values for columns the scan does not have: ignored by the reader, but there for mutations to reach.
    return ser(L.FileUnit(path=path, partition_values={"zone": "7"}, null_partitions=["region"]))


def values_op(table: pa.Table) -> Any:
    return L.Operator(values=L.Values(ipc_stream=table_stream(table)))


@functools.lru_cache(maxsize=8)
def data_values(rows: int, start: int = 0) -> Any:
    """A Values operator of ``data_table(rows, start)`` (cached: seeds use a few, thousands of times)."""
    return values_op(data_table(rows, start))


@functools.lru_cache(maxsize=1)
def _labels() -> Any:
    table = pa.table({"name": [f"item-{i}" for i in range(7)], "label": [f"L{i}" for i in range(7)]}, schema=LABEL_SCHEMA)
    return values_op(table)


def _scan(feed: str, reader: str, schema: pa.Schema, **extra: Any) -> Any:
    return L.Operator(feed_scan=L.FeedScan(feed=L.WorkUnitFeed(feed_id=feed), reader=reader, schema=schema_bytes(schema), **extra))


def source(kind: str, qid: str, window: int) -> tuple[Any, list[Any], dict[tuple[str, int], list[bytes]]]:
    """A seed's bottom operator, its feed assignments and the units each partition gets."""
    if kind == "values":
        return data_values(50), [], {}
    if kind == "exchange":
        return L.Operator(exchange_input=L.ExchangeInput(schema=schema_bytes(DATA_SCHEMA))), [], {}
    if kind == "shuffle":
        producer = L.ProducerTask(url=SELF_URL, stage_key=ser(stage_key(qid, stage=1)))  # same query, stage 1
        read = L.ShuffleRead(stage_id=0, producers=[producer], partition_start=0, partition_end=1, schema=schema_bytes(DATA_SCHEMA))
        return L.Operator(shuffle_read=read), [], {}
    if kind == "units":
        units = {("u", 0): list(UNIT_BODIES)}
        window = max(window, len(UNIT_BODIES))  # all bodies go in the first frame, under the initial credit
        return _scan("u", "units", UNITS_SCHEMA), [P.FeedAssignment(feed_id="u", partitions=[0], window=window)], units
    files = DATA_FILES[kind]
    units = {(kind, p): [file_unit(f"{DATA_TOKEN}/{files[p % len(files)]}")] for p in range(2)}
    extra = {"reader_options": {"delimiter": ","}} if kind == "csv" else {}
    op = _scan(kind, kind, DATA_SCHEMA, **extra)
    return op, [P.FeedAssignment(feed_id=kind, partitions=[0, 1], window=window)], units


def _options(**member: Any) -> Any:
    return L.FunctionOptions(**member)


@functools.lru_cache(maxsize=1)
def _arrow_literal() -> bytes:
    return table_stream(pa.table({"v": pa.array([10], pa.int64())}))


@functools.lru_cache(maxsize=1)
def _value_set() -> bytes:
    return table_stream(pa.table({"v": pa.array(["item-1", "item-3"], pa.string())}))


def _project_exprs() -> list[tuple[str, Tree]]:
    return [
        ("id_k", call("add", col("id"), lit(int_value=1000))),
        ("upper", call("utf8_upper", col("name"))),
        ("score2", call("multiply", col("score"), lit(float_value=2.0))),
        ("in_set", call("is_in", col("name"), options=_options(set_lookup=L.SetLookupOptions(value_set=_value_set())))),
        ("id32", call("cast", col("id"), options=_options(cast=L.CastOptions(target_type=schema_bytes(pa.schema([("t", pa.int32())])))))),
        ("year", call("year", col("day"))),
        ("rounded", call("round", col("score"), options=_options(round=L.RoundOptions(ndigits=1)))),
        ("rounded_sql", call("round", col("score"), options=_options(round=L.RoundOptions(ndigits=1, round_mode="half_towards_infinity")))),
        ("prefix", call("utf8_slice_codeunits", col("name"), options=_options(slice=L.SliceOptions(start=0, stop=3)))),
        ("label", call("coalesce", col("name"), lit(string_value="?"))),
        ("joined", call("binary_join_element_wise", col("name"), lit(string_value="x"), lit(string_value="-"))),
        ("len", call("utf8_length", col("name"))),
        ("big", call("greater", col("id"), lit(arrow=_arrow_literal()))),
        ("like", call("match_like", col("name"), options=_options(match_substring=L.MatchSubstringOptions(pattern="item-%")))),
        ("cond", call("if_else", call("is_null", col("name")), lit(string_value="none"), col("name"))),
        ("padded", call("utf8_lpad", col("name"), options=_options(pad=L.PadOptions(width=12, padding="*")))),
        ("swapped", call("replace_substring_regex", col("name"),
                         options=_options(replace_substring=L.ReplaceSubstringOptions(pattern="([0-9]+)", replacement="<\\1>")))),
        ("trimmed", call("utf8_trim", col("name"), options=_options(trim=L.TrimOptions(characters="i-")))),
        ("joined_or", call("binary_join_element_wise", col("name"), lit(string_value="-"),
                           options=_options(join=L.JoinOptions(null_handling="replace", null_replacement="?")))),
        ("month", call("floor_temporal", col("day"), options=_options(round_temporal=L.RoundTemporalOptions(unit="month")))),
        ("shown", call("strftime", col("day"), options=_options(strftime=L.StrftimeOptions(format="%Y/%m/%d")))),
        ("parsed", call("strptime", lit(string_value="2024-01-02"), options=_options(strptime=L.StrptimeOptions(format="%Y-%m-%d", unit="us")))),
        ("greater_of", call("max_element_wise", col("score"), lit(float_value=0.0))),
        ("digits", call("count_substring_regex", col("name"), options=_options(match_substring=L.MatchSubstringOptions(pattern="[0-9]")))),
    ]


def project_op(src: Any, exprs: Sequence[tuple[str, Tree]]) -> Any:
    named = [L.NamedExpression(name=n, expr=expression(t)) for n, t in exprs]
    return L.Operator(project=L.Project(input=src, exprs=named))


def _filter(src: Any, predicate: Tree) -> Any:
    return L.Operator(filter=L.Filter(input=src, predicate=expression(predicate)))


def data_root(template: str, src: Any) -> Any:
    """The operator tree of ``template`` over a source with DATA_SCHEMA columns."""
    if template in ("identity", "partitioned"):
        return src
    if template == "filter":
        return _filter(src, call("greater_equal", col("score"), lit(float_value=20.0)))
    if template == "filter_str":
        match = _options(match_substring=L.MatchSubstringOptions(pattern="item"))
        return _filter(src, call("and_kleene", call("starts_with", col("name"), options=match), call("is_valid", col("name"))))
    if template == "project":
        return project_op(src, _project_exprs())
    if template == "limit":
        return L.Operator(limit=L.Limit(input=data_root("filter", src), count=5, offset=2))
    if template == "aggregate":
        calls = [("count_all", "", "n"), ("sum", "score", "s"), ("count_distinct", "id", "d"), ("mean", "score", "m"), ("max", "name", "top"),
                 ("stddev_samp", "score", "sd"), ("var_pop", "score", "vp")]
        aggs = [L.AggregateCall(function=f, column=c, name=n) for f, c, n in calls]
        return L.Operator(aggregate=L.Aggregate(input=src, keys=["name"], aggregates=aggs))
    if template == "aggregate_duckdb":  # only DuckDB computes these; a peer chooses a fraction, a separator, an order
        aggs = [L.AggregateCall(function="median", column="score", name="med"),
                L.AggregateCall(function="quantile_cont", column="score", name="q9", fraction=0.9),
                L.AggregateCall(function="string_agg", column="name", name="names", separator=",",
                                order=[L.AggregateOrder(column="id", descending=True)])]
        return L.Operator(aggregate=L.Aggregate(input=src, keys=["day"], aggregates=aggs))
    if template == "sort":
        keys = [L.SortKey(column="score", descending=True), L.SortKey(column="name")]
        return L.Operator(sort=L.Sort(input=src, keys=keys, nulls_first=True, fetch=7))
    if template == "union":
        return L.Operator(union=L.Union(inputs=[src, data_values(5, 500)]))
    if template == "join":
        join = L.HashJoin(left=src, right=_labels(), left_keys=["name"], right_keys=["name"], join_type="left outer", right_suffix="_r")
        return L.Operator(hash_join=join)
    if template == "join_filter":  # a condition beside the keys: the sides' names must differ
        right = project_op(_labels(), [("lname", col("name")), ("label", col("label"))])
        condition = expression(call("greater", col("score"), lit(float_value=10.0)))
        join = L.HashJoin(left=src, right=right, left_keys=["name"], right_keys=["lname"], join_type="left semi", filter=condition)
        return L.Operator(hash_join=join)
    if template == "window":
        calls = [L.WindowCall(function="row_number", name="rn"), L.WindowCall(function="lag", column="score", name="prev", offset=2),
                 L.WindowCall(function="sum", column="score", name="run", frame=L.WindowFrame(start=-2, end=0))]
        order = [L.SortKey(column="id"), L.SortKey(column="score", descending=True)]
        return L.Operator(window=L.Window(input=src, partition_by=["name"], order_by=order, calls=calls))
    if template == "window_range":  # a RANGE frame: its offsets are distances in the one order key's values
        call_ = L.WindowCall(function="count_all", name="near", frame=L.WindowFrame(start=-3, end=2, range=True))
        return L.Operator(window=L.Window(input=src, partition_by=["name"], order_by=[L.SortKey(column="score")], calls=[call_]))
    raise ValueError(f"unknown template {template!r}")


def units_root(template: str, src: Any) -> Any:
    """The operator tree of ``template`` over the ``units`` reader (one binary column ``unit``)."""
    if template == "identity":
        return src
    if template == "limit":
        return L.Operator(limit=L.Limit(input=src, count=2))
    if template == "filter_len":
        return _filter(src, call("greater", call("binary_length", col("unit")), lit(int_value=1)))
    if template == "count":
        return L.Operator(aggregate=L.Aggregate(input=src, aggregates=[L.AggregateCall(function="count_all", name="n")]))
    if template == "project_len":
        return project_op(src, [("len", call("binary_length", col("unit"))), ("unit", col("unit"))])
    raise ValueError(f"unknown units template {template!r}")


def templates_for(kind: str) -> tuple[str, ...]:
    if kind == "units":
        return UNIT_TEMPLATES
    if kind == "exchange":
        return MAP_TEMPLATES
    return TEMPLATES


def make_seed(kind: str, template: str, qid: str, window: int = 4, compression: int = 0) -> Seed:
    src, feeds, units = source(kind, qid, window)
    root = units_root(template, src) if kind == "units" else data_root(template, src)
    partitioned = template == "partitioned"
    output = L.OutputSpec(partitions=3 if partitioned else 1, hash_keys=["id"] if partitioned else [])
    plan = L.StagePlan(root=root, output=output)
    header = task_header(stage_key(qid), plan, feeds, window=window, compression=compression)
    if template == "identity" and kind != "exchange":
        header.options.retain_output = True  # a retained output (a detached query's head): read any number of times
    taggable = (kind in ("parquet", "csv", "ipc") and template in ("filter", "project")) or (kind, template) == ("units", "filter_len")
    if taggable:
        header.options.tag_units = True  # rows tagged with their unit (unit-level recovery): one unit at a time
    seed = Seed(kind, template, header, units, max(window, len(UNIT_BODIES)), kind == "exchange")
    if seed.is_map:
        table = data_table(30)
        seed.upload = [ipc_stream(DATA_SCHEMA, [b]) for b in table.to_batches(max_chunksize=10)]
    if kind == "shuffle":
        producer = L.StagePlan(root=data_values(50), output=L.OutputSpec(partitions=1))
        seed.producer = ser(task_header(stage_key(qid, stage=1), producer))
    return seed


def all_seed_kinds() -> list[tuple[str, str]]:
    return [(kind, template) for kind in SOURCES for template in templates_for(kind)]
