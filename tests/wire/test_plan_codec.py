"""``flight.wire.plan_codec``: a stage plan's operators as a flat list on the wire, and back to a tree, checked.

No sockets: the codec, and ``decode_header`` around it. A real plan deeper than protobuf's 100 levels
on real workers is ``tests/sql/test_sql_deep.py``'s.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pytest

import flight
from flight import col, lit
from flight.errors import PlanError, ProtocolError
from flight.plan.nodes import FilterNode, ProjectNode
from flight.plan.query import Query
from flight.wire import plan_codec
from flight.wire._proto import plan_pb2, protocol_pb2
from flight.wire.limits import MAX_PLAN_OPERATORS
from flight.wire.plan_codec import CHILDREN, check_operators, decode_plan, encode_plan, flatten
from flight.wire.protocol import PROTOCOL_VERSION, decode_header

PREDICATE = (col("x") > lit(1)).to_proto()


def deep_plan(levels: int) -> plan_pb2.StagePlan:
    """A plan ``levels`` operators deep, every kind on the way, built top down (a constructor given a deep
    subtree would make protobuf parse it again, and refuse it past 100 levels of nesting)."""
    plan = plan_pb2.StagePlan(output=plan_pb2.OutputSpec(partitions=3, hash_keys=["x"], readers=2), output_schema=b"schema")
    op = plan.root
    for i in range(levels):
        step = i % 8
        if step == 0:
            op.filter.predicate.CopyFrom(PREDICATE)
            op = op.filter.input
        elif step == 1:
            op.project.exprs.add(name="x", expr=PREDICATE)
            op = op.project.input
        elif step == 2:
            op.limit.count, op.limit.offset = 10 + i, 1
            op = op.limit.input
        elif step == 3:
            op.aggregate.keys.append("x")
            op.aggregate.aggregates.add(function="count_all", name="n")
            op = op.aggregate.input
        elif step == 4:
            op.sort.keys.add(column="x", descending=True)
            op.sort.fetch = i
            op = op.sort.input
        elif step == 5:
            op.window.partition_by.append("x")
            op.window.calls.add(function="row_number", name="rn", frame=plan_pb2.WindowFrame(start=-2))
            op = op.window.input
        elif step == 6:  # the left side goes on; the right is a leaf
            join = op.hash_join
            join.left_keys.append("x")
            join.right_keys.append("y")
            join.join_type = "left semi"
            join.filter.CopyFrom(PREDICATE)
            join.right.shuffle_read.producers.add(url=f"grpc://w{i}:1", stage_key=b"k")
            join.right.shuffle_read.partition_end = 1
            op = join.left
        else:  # the middle input goes on
            union = op.union
            union.inputs.add().values.ipc_stream = b"before"
            op = union.inputs.add()
            union.inputs.add().feed_scan.feed.feed_id = f"after-{i}"
    op.feed_scan.feed.feed_id = "f"
    op.feed_scan.reader = "parquet"
    op.feed_scan.columns.extend(["x", "y"])
    op.feed_scan.reader_options["prune"] = "false"
    return plan


def received(data: bytes) -> plan_pb2.StagePlan:
    plan = plan_pb2.StagePlan()
    plan.ParseFromString(data)
    return plan


def test_a_plan_two_thousand_operators_deep_travels_flat_and_comes_back_equal() -> None:
    plan = deep_plan(2000)
    data = encode_plan(plan)
    wire = received(data)  # parsing a nested plan this deep fails: Exceeded upb_DecodeOptions_MaxDepth
    assert not wire.HasField("root") and len(wire.operators) == 2000 + 1 + 3 * (2000 // 8)  # and a join's right, a union's two others
    for i, node in enumerate(wire.operators):
        kind = node.WhichOneof("kind")
        assert kind is not None and all(j < i for j in node.inputs)
        body = getattr(node, kind)
        assert not any(len(body.inputs) if kind == "union" else body.HasField(name) for name in CHILDREN[kind])
    assert wire.operators[-1].WhichOneof("kind") == "filter"  # the root is last
    decode_plan(wire, "header.plan")
    assert not wire.operators and wire == plan  # the same tree, output and schema


def test_inputs_keep_their_order() -> None:
    plan = plan_pb2.StagePlan()
    join = plan.root.hash_join
    join.left.values.ipc_stream = b"left"
    union = join.right.union
    for name in ("a", "b", "c"):
        union.inputs.add().exchange_input.input_id = name
    nodes = flatten(plan.root)
    assert [n.WhichOneof("kind") for n in nodes] == ["values", "exchange_input", "exchange_input", "exchange_input", "union", "hash_join"]
    assert list(nodes[4].inputs) == [1, 2, 3] and list(nodes[5].inputs) == [0, 4]
    assert [nodes[i].exchange_input.input_id for i in nodes[4].inputs] == ["a", "b", "c"]
    wire = received(encode_plan(plan))
    decode_plan(wire, "plan")
    assert wire == plan


def test_a_body_without_fields_keeps_its_kind() -> None:
    plan = plan_pb2.StagePlan()
    plan.root.limit.input.values.SetInParent()  # Values{} and Limit{input} only: nothing else set
    wire = received(encode_plan(plan))
    assert [n.WhichOneof("kind") for n in wire.operators] == ["values", "limit"]
    decode_plan(wire, "plan")
    assert wire == plan


def test_the_coordinator_refuses_a_plan_over_the_limit_by_name_before_sending_it() -> None:
    plan = plan_pb2.StagePlan()
    for _ in range(MAX_PLAN_OPERATORS):  # a union of this many: one operator more than the limit
        plan.root.union.inputs.add().values.ipc_stream = b"v"
    with pytest.raises(PlanError, match=rf"has {MAX_PLAN_OPERATORS + 1} operators; a worker accepts at most {MAX_PLAN_OPERATORS}"):
        encode_plan(plan)
    del plan.root.union.inputs[0]
    assert len(received(encode_plan(plan)).operators) == MAX_PLAN_OPERATORS  # at the limit: fine


def node(kind: str, *inputs: int, **body: object) -> plan_pb2.OperatorNode:
    out = plan_pb2.OperatorNode(inputs=inputs)
    getattr(out, kind).SetInParent()
    for name, value in body.items():
        setattr(getattr(out, kind), name, value)
    return out


VALUES = node("values", ipc_stream=b"v")

MALFORMED: dict[str, tuple[Callable[[], plan_pb2.StagePlan], str]] = {
    "empty": (lambda: plan_pb2.StagePlan(), "header.plan.operators"),
    "root set (protocol 5)": (lambda: plan_pb2.StagePlan(root=plan_pb2.Operator(values=plan_pb2.Values()), operators=[VALUES]), "header.plan.root"),
    "no kind": (lambda: plan_pb2.StagePlan(operators=[VALUES, plan_pb2.OperatorNode(inputs=[0])]), "header.plan.operators[1]"),
    "input nested in the body": (
        lambda: plan_pb2.StagePlan(operators=[VALUES, plan_pb2.OperatorNode(limit=plan_pb2.Limit(input=plan_pb2.Operator(values=plan_pb2.Values())),
                                                                            inputs=[0])]),
        "header.plan.operators[1].limit.input",
    ),
    "union inputs nested": (
        lambda: plan_pb2.StagePlan(operators=[VALUES, plan_pb2.OperatorNode(union=plan_pb2.Union(inputs=[plan_pb2.Operator()]), inputs=[0])]),
        "header.plan.operators[1].union.inputs",
    ),
    "a filter without input": (lambda: plan_pb2.StagePlan(operators=[node("filter")]), "header.plan.operators[0].inputs"),
    "a sort with two": (lambda: plan_pb2.StagePlan(operators=[VALUES, VALUES, node("sort", 0, 1)]), "header.plan.operators[2].inputs"),
    "a join with one": (lambda: plan_pb2.StagePlan(operators=[VALUES, node("hash_join", 0)]), "header.plan.operators[1].inputs"),
    "a union with none": (lambda: plan_pb2.StagePlan(operators=[node("union")]), "header.plan.operators[0].inputs"),
    "a leaf with one": (lambda: plan_pb2.StagePlan(operators=[VALUES, node("feed_scan", 0)]), "header.plan.operators[1].inputs"),
    "an input that is the node itself": (lambda: plan_pb2.StagePlan(operators=[VALUES, node("limit", 1)]), "header.plan.operators[1].inputs[0]"),
    "an input that comes later": (lambda: plan_pb2.StagePlan(operators=[node("limit", 1), VALUES]), "header.plan.operators[0].inputs[0]"),
    "an input past the end": (lambda: plan_pb2.StagePlan(operators=[VALUES, node("hash_join", 0, 2**32 - 1)]), "header.plan.operators[1].inputs[1]"),
    "a node two operators share": (
        lambda: plan_pb2.StagePlan(operators=[VALUES, node("limit", 0), node("union", 1, 0)]),
        "header.plan.operators[2].inputs[1]",
    ),
    "a node used twice by one": (lambda: plan_pb2.StagePlan(operators=[VALUES, node("union", 0, 0)]), "header.plan.operators[1].inputs[1]"),
    "two roots": (lambda: plan_pb2.StagePlan(operators=[VALUES, VALUES, node("limit", 1)]), "header.plan.operators[0]"),
    "over the limit": (lambda: plan_pb2.StagePlan(operators=[VALUES] * (MAX_PLAN_OPERATORS + 1)), "header.plan.operators"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_operator_list_is_refused_naming_the_node(case: str) -> None:
    make, field = MALFORMED[case]
    plan = received(make().SerializeToString())
    with pytest.raises(ProtocolError) as info:
        check_operators(plan, "header.plan")
    assert info.value.field == field, str(info.value)
    assert field in str(info.value)


def header(plan: bytes) -> bytes:
    return protocol_pb2.TaskHeader(
        protocol_version=PROTOCOL_VERSION,
        stage_key=protocol_pb2.StageKey(query_id="q", stage_id=0, task_number=0),
        task_count=1,
        plan=plan,
        query_secret=b"0123456789abcdef",
    ).SerializeToString()


def test_a_worker_decodes_the_flat_list_into_its_tree_and_refuses_a_bad_one_by_name() -> None:
    plan = deep_plan(300)
    _, got = decode_header(header(encode_plan(plan)))
    assert got == plan and not got.operators
    too_many = plan_pb2.StagePlan(operators=[VALUES] * (MAX_PLAN_OPERATORS + 1))
    with pytest.raises(ProtocolError, match=f"at most {MAX_PLAN_OPERATORS}") as info:
        decode_header(header(too_many.SerializeToString()))
    assert info.value.field == "header.plan.operators"
    shared = plan_pb2.StagePlan(operators=[VALUES, node("limit", 0), node("union", 1, 0)])
    with pytest.raises(ProtocolError) as info:
        decode_header(header(shared.SerializeToString()))
    assert info.value.field == "header.plan.operators[2].inputs[1]"


def test_a_query_hundreds_of_operators_deep_builds_its_tree_without_copying_subtrees() -> None:
    # Node.to_proto builds top down: a constructor given the subtree below refused 50 operators.
    query = flight.from_arrow(pa.table({"x": [1, 2, 3]}))
    node = query.node
    for i in range(600):
        node = FilterNode(node, col("x") > lit(-i)) if i % 2 else ProjectNode(node, [("x", col("x"))])
    plan = Query(node).stage_plan()
    wire = received(encode_plan(plan))
    assert len(wire.operators) == 601
    decode_plan(wire, "plan")
    assert wire == plan


def test_the_limit_is_one_constant(monkeypatch: pytest.MonkeyPatch) -> None:
    # The coordinator and the worker read the same name: lowering it lowers both.
    monkeypatch.setattr(plan_codec, "MAX_PLAN_OPERATORS", 3)
    plan = deep_plan(3)
    with pytest.raises(PlanError, match="has 4 operators; a worker accepts at most 3"):
        encode_plan(plan)
    with pytest.raises(ProtocolError, match="at most 3"):
        check_operators(plan_pb2.StagePlan(operators=[VALUES] * 4), "plan")
