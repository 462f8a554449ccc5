"""Join sides equal but for their column names are built once per task (``flight.engine.duck.alike``).

The keys are checked on subplans written here: alike under other names, and not alike when anything but a
name the plan chose differs. The rewrite of a task's builds is run by DuckDB beside the builds as they were
(the oracle): the same rows, fewer tables.
"""

from __future__ import annotations

import duckdb
import pyarrow as pa
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from flight.engine.duck.alike import NAMES, VERBATIM, Alike, alike_key, share_alike_builds
from flight.wire._proto import plan_pb2
from flight.wire.protocol import encode_schema

SALES = pa.schema([("item", pa.int64()), ("qty", pa.int64()), ("price", pa.float64())])
TOKENS = {"feed-a": "__flight_units_1__", "feed-b": "__flight_units_2__", "feed-c": "__flight_units_3__"}


def scan(feed: str, schema: pa.Schema = SALES, reader: str = "parquet") -> plan_pb2.Operator:
    return plan_pb2.Operator(feed_scan=plan_pb2.FeedScan(feed=plan_pb2.WorkUnitFeed(feed_id=feed), reader=reader,
                                                         schema=encode_schema(schema), columns=schema.names))


def field(name: str) -> plan_pb2.Expression:
    return plan_pb2.Expression(nodes=[plan_pb2.ExprNode(field=plan_pb2.FieldRef(name=name))])


def project(op: plan_pb2.Operator, **named: str) -> plan_pb2.Operator:
    exprs = [plan_pb2.NamedExpression(name=out, expr=field(src)) for out, src in named.items()]
    return plan_pb2.Operator(project=plan_pb2.Project(input=op, exprs=exprs))


def total(op: plan_pb2.Operator, key: str, column: str, name: str, function: str = "sum") -> plan_pb2.Operator:
    call = plan_pb2.AggregateCall(function=function, column=column, name=name)
    return plan_pb2.Operator(aggregate=plan_pb2.Aggregate(input=op, keys=[key], aggregates=[call]))


def per_item(feed: str, item: str, amount: str, out: str, column: str = "qty") -> plan_pb2.Operator:
    """Sales per item under names of our choosing: what a CTE's use looks like once the planner named it."""
    return total(project(scan(feed), **{item: "item", amount: column}), item, amount, out)


def test_a_subplan_under_other_names_has_the_same_key() -> None:
    first = alike_key(per_item("feed-a", "item___1", "amount___2", "total___3"), TOKENS)
    second = alike_key(per_item("feed-b", "item___7", "amount___8", "total___9"), TOKENS)
    assert first is not None and second is not None
    assert first != second  # two feeds: alike only once both read the same files
    assert first.replace("__flight_units_1__", "F") == second.replace("__flight_units_2__", "F")


def test_anything_but_a_chosen_name_makes_another_key() -> None:
    base = alike_key(per_item("feed-a", "i", "a", "t"), TOKENS)
    others = [
        per_item("feed-a", "i", "a", "t", column="price"),  # another column of the files
        total(project(scan("feed-a"), i="item", a="qty"), "i", "a", "t", function="max"),
        project(per_item("feed-a", "i", "a", "t"), t="t", i="i"),  # the same columns in another order
        per_item("feed-a", "item", "a", "t"),  # a name the files have is kept as it is
    ]
    assert base is not None
    assert all(alike_key(op, TOKENS) not in (None, base) for op in others)


def test_names_are_renamed_one_for_one() -> None:
    def picked(a: str, b: str, first: str, second: str) -> plan_pb2.Operator:
        return project(project(scan("feed-a"), **{a: "qty", b: "price"}), **{a: a, "out": second, "other": first})

    assert alike_key(picked("x", "y", "x", "y"), TOKENS) == alike_key(picked("p", "q", "p", "q"), TOKENS)
    # The second reads one column twice where the first reads two: not alike, whatever the names.
    assert alike_key(picked("x", "y", "x", "y"), TOKENS) != alike_key(picked("p", "q", "p", "p"), TOKENS)


def test_only_whole_parquet_scans_have_keys() -> None:
    stage = plan_pb2.Operator(shuffle_read=plan_pb2.ShuffleRead(stage_id=0, partition_end=1, schema=encode_schema(SALES)))
    assert alike_key(total(project(stage, i="item", a="qty"), "i", "a", "t"), TOKENS) is None  # a producer counts its reads
    assert alike_key(per_item("feed-z", "i", "a", "t"), TOKENS) is None  # a scan the query does not read whole
    assert alike_key(total(project(scan("feed-a", reader="csv"), i="item", a="qty"), "i", "a", "t"), TOKENS) is None


def test_every_string_field_of_the_plan_is_a_name_or_a_value() -> None:
    """A string field in neither list would make no key: a new field of plan.proto must be placed in one."""
    seen: set[str] = set()
    found: set[tuple[str, str]] = set()

    def walk(message: Descriptor) -> None:
        if message.full_name in seen:
            return
        seen.add(message.full_name)
        for f in message.fields:
            if f.type == FieldDescriptor.TYPE_STRING:
                found.add((message.name, f.name))
            elif f.message_type is not None:
                walk(f.message_type)

    walk(plan_pb2.Operator.DESCRIPTOR)
    assert found - {("WorkUnitFeed", "feed_id")} == NAMES | VERBATIM
    assert not NAMES & VERBATIM


def test_builds_alike_are_made_once_and_read_under_their_names() -> None:
    con = duckdb.connect()
    con.register("sales", pa.table({"item": [1, 1, 2, 3], "qty": [5, 6, 7, 8]}))
    files = "(SELECT * FROM sales)"
    inner = 'SELECT "item" AS "{i}", sum("qty") AS "{t}" FROM {src} AS t GROUP BY "item"'
    builds = [
        ("__flight_whole_build_1__", inner.format(i="i1", t="t1", src="__flight_units_1__")),
        ("__flight_whole_build_2__", inner.format(i="i2", t="t2", src="__flight_units_2__")),
        ("__flight_whole_build_3__", 'SELECT "i2" AS "k", "t2" AS "v" FROM __flight_whole_build_2__ WHERE "t2" > 7'),
    ]
    text = ('SELECT a."i1", a."t1", b."k", b."v" FROM __flight_whole_build_1__ AS a'
            ' JOIN __flight_whole_build_2__ AS c ON a."i1" = c."i2" LEFT JOIN __flight_whole_build_3__ AS b ON a."i1" = b."k"')
    key = alike_key(per_item("feed-a", "i1", "a", "t1"), TOKENS)
    other = alike_key(per_item("feed-b", "i2", "a", "t2"), TOKENS)
    assert key is not None and other is not None
    alike = {"__flight_whole_build_1__": Alike(key, ("i1", "t1")), "__flight_whole_build_2__": Alike(other, ("i2", "t2"))}
    sources = {"__flight_units_1__": files, "__flight_units_2__": files}
    kept, shared = share_alike_builds([(n, b.replace("__flight_units_1__", files).replace("__flight_units_2__", files))
                                       for n, b in builds], text, alike, sources)
    assert [n for n, _ in kept] == ["__flight_whole_build_1__", "__flight_whole_build_3__"]
    assert '(SELECT "i1" AS "i2", "t1" AS "t2" FROM __flight_whole_build_1__)' in kept[1][1]

    def answer(made: list[tuple[str, str]], query: str) -> list[tuple[object, ...]]:
        c = con
        for name, body in made:
            c.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS {body.replace('__flight_units_1__', files).replace('__flight_units_2__', files)}")
        return sorted(c.sql(query).fetchall())

    assert answer(kept, shared) == answer(builds, text) and answer(builds, text)
    # Scans of other files are not alike, whatever their plans.
    kept, _ = share_alike_builds(builds, text, alike, {"__flight_units_1__": files, "__flight_units_2__": "(SELECT 1)"})
    assert len(kept) == 3
