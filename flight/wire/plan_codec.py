"""A stage plan's operators on the wire: a flat list, as its expressions are (docs/protocol.md, section 5).

Why: a process holds a plan as a tree of ``plan_pb2.Operator`` messages (``StagePlan.root``),
each operator's inputs nested in its body. Sent that way, every level of the plan nests two
protobuf messages, and protobuf's decoder refuses more than 100: a SQL query with a dozen scalar
subqueries made workers fail with ``Exceeded upb_DecodeOptions_MaxDepth``. On the wire,
``StagePlan.operators`` lists the operators in post-order instead, each ``OperatorNode`` naming its
inputs by the indexes of earlier nodes, the root last. The planner, the coordinator and the engines
keep the tree; this module converts at the boundary, both ways, in time linear in the operators and
without recursion: Python's stops at 1,000 frames, and protobuf's C code recurses to copy, compare
or serialize a nested message (a tree 50,000 operators deep crashed a process), so no deep subtree
is ever copied whole.
"""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf.message import Message

from flight.errors import PlanError, ProtocolError
from flight.wire._proto import plan_pb2
from flight.wire.limits import MAX_PLAN_OPERATORS, check_count

__all__ = ["CHILDREN", "check_operators", "decode_plan", "encode_plan", "flatten", "unflatten"]

CHILDREN: dict[str, tuple[str, ...]] = {
    "feed_scan": (),
    "exchange_input": (),
    "values": (),
    "shuffle_read": (),
    "filter": ("input",),
    "project": ("input",),
    "limit": ("input",),
    "aggregate": ("input",),
    "sort": ("input",),
    "window": ("input",),
    "unnest": ("input",),
    "hash_join": ("left", "right"),
    "union": ("inputs",),
}
"""Each operator kind's fields that hold its inputs, in the order ``OperatorNode.inputs`` lists them.
A union's one field is repeated (one input or more); every other kind takes exactly one input per field."""


def _inputs(op: plan_pb2.Operator, kind: str) -> list[plan_pb2.Operator]:
    """``op``'s inputs in ``OperatorNode.inputs`` order (an unset input is none)."""
    body = getattr(op, kind)
    if kind == "union":
        return list(body.inputs)
    return [getattr(body, name) for name in CHILDREN[kind] if body.HasField(name)]


def _copy_body(source: Message, target: Message, skip: tuple[str, ...]) -> None:
    """``source``'s fields but ``skip`` (its inputs) into the empty ``target``; ``CopyFrom`` would copy
    the whole subtree below."""
    target.SetInParent()  # a body without fields (Values{}) still sets its kind
    for fd, value in source.ListFields():
        if fd.name in skip:
            continue
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            entries = getattr(target, fd.name)
            scalar = fd.message_type.fields_by_name["value"].message_type is None
            for key in value:
                if scalar:
                    entries[key] = value[key]
                else:
                    entries[key].CopyFrom(value[key])
        elif fd.is_repeated:
            getattr(target, fd.name).extend(value)
        elif fd.message_type is not None:
            getattr(target, fd.name).CopyFrom(value)
        else:
            setattr(target, fd.name, value)


def flatten(root: plan_pb2.Operator, into: plan_pb2.StagePlan | None = None) -> Sequence[plan_pb2.OperatorNode]:
    """The tree at ``root`` as ``OperatorNode``s in post-order, the root last (appended to ``into.operators``).

    The tree is encoded as it is (an operator without a kind, a filter without an input: the
    receiver refuses those, naming the node); only its size is checked here: more than
    ``MAX_PLAN_OPERATORS`` operators is a ``PlanError``, since no worker would take the plan.
    """
    # Pre-order first, each operator's inputs as positions in it, left to right.
    order: list[tuple[plan_pb2.Operator, str | None]] = []
    inputs: list[list[int]] = []
    stack: list[tuple[plan_pb2.Operator, int]] = [(root, -1)]
    while stack:
        op, parent = stack.pop()
        here = len(order)
        kind = op.WhichOneof("kind")
        order.append((op, kind))
        inputs.append([])
        if parent >= 0:
            inputs[parent].append(here)
        if kind is not None:
            stack.extend((child, here) for child in reversed(_inputs(op, kind)))
    if len(order) > MAX_PLAN_OPERATORS:
        raise PlanError(
            f"a stage's plan has {len(order)} operators; a worker accepts at most {MAX_PLAN_OPERATORS} "
            "(MAX_PLAN_OPERATORS in flight/wire/limits.py): split the query, or build it with fewer operators"
        )
    # Then post-order: a node once all its inputs have theirs.
    out = (into if into is not None else plan_pb2.StagePlan()).operators
    base = len(out)
    number = [0] * len(order)
    walk = [[0, 0]]  # [position, inputs visited]
    while walk:
        top = walk[-1]
        here, seen = top
        if seen < len(inputs[here]):
            top[1] += 1
            walk.append([inputs[here][seen], 0])
            continue
        walk.pop()
        op, what = order[here]
        node = out.add()
        if what is not None:
            _copy_body(getattr(op, what), getattr(node, what), CHILDREN[what])
            node.inputs.extend(number[i] for i in inputs[here])
        number[here] = len(out) - 1 - base
    return out[base:] if into is None else out


def encode_plan(plan: plan_pb2.StagePlan) -> bytes:
    """``plan`` as ``TaskHeader.plan`` carries it: its tree (``root``) as the flat ``operators``.

    ``PlanError`` for a plan of more than ``MAX_PLAN_OPERATORS`` operators (``flatten``).
    """
    wire = plan_pb2.StagePlan()
    if plan.HasField("output"):
        wire.output.CopyFrom(plan.output)
    wire.output_schema = plan.output_schema
    if plan.HasField("root"):
        flatten(plan.root, wire)
    return wire.SerializeToString()


def check_operators(plan: plan_pb2.StagePlan, field: str) -> None:
    """A received plan's operator list is a tree (``ProtocolError`` naming the node otherwise).

    Checked: ``root`` unset; at least one node and at most ``MAX_PLAN_OPERATORS``; each node
    sets a kind, nests none of its inputs, lists as many inputs as its kind takes (``CHILDREN``),
    each the index of an earlier node that is no other node's input; and every node but the
    last is some node's input, so the last is the one root. A node shared by two operators is
    refused: the engines compile a tree, and a shared node would be compiled (and its sources
    read) once per use, so a short list could stand for an exponentially large plan.
    """
    where = f"{field}.operators"
    if plan.HasField("root"):
        raise ProtocolError(
            f"{field}.root is set: a plan's operators travel flat in {where} (docs/protocol.md, section 5)", field=f"{field}.root"
        )
    nodes = plan.operators
    if not nodes:
        raise ProtocolError(f"{where} is empty; a plan has at least one operator", field=where)
    check_count(len(nodes), MAX_PLAN_OPERATORS, where, "operators")
    parent = [-1] * len(nodes)
    for i, node in enumerate(nodes):
        here = f"{where}[{i}]"
        kind = node.WhichOneof("kind")
        if kind is None:
            raise ProtocolError(f"{here} sets no operator kind", field=here)
        body = getattr(node, kind)
        for name in CHILDREN[kind]:
            if len(body.inputs) if kind == "union" else body.HasField(name):
                raise ProtocolError(
                    f"{here}.{kind}.{name} is set: an operator names its inputs by index, in {here}.inputs",
                    field=f"{here}.{kind}.{name}",
                )
        count, need = len(node.inputs), len(CHILDREN[kind])
        if (count < 1) if kind == "union" else (count != need):
            takes = "one or more" if kind == "union" else str(need)
            raise ProtocolError(f"{here}.inputs lists {count} inputs; a {kind} takes {takes}", field=f"{here}.inputs")
        for k, j in enumerate(node.inputs):
            if j >= i:
                raise ProtocolError(f"{here}.inputs[{k}] is {j}: an input is an earlier node (an index below {i})", field=f"{here}.inputs[{k}]")
            if parent[j] >= 0:
                raise ProtocolError(
                    f"{here}.inputs[{k}] is {j}, already an input of node {parent[j]}: each operator is the input of one other",
                    field=f"{here}.inputs[{k}]",
                )
            parent[j] = i
    for i in range(len(nodes) - 1):
        if parent[i] < 0:
            raise ProtocolError(
                f"{where}[{i}] is no node's input: only the last node, the root, may be", field=f"{where}[{i}]"
            )


def unflatten(plan: plan_pb2.StagePlan) -> None:
    """Build ``plan.root`` from its checked ``operators`` (``check_operators``), then drop them.

    Top down: each node's body is copied into its place in the tree (a body holds no inputs on
    the wire, so the copy is the node's own size), and its inputs' places are made in it.
    """
    nodes = plan.operators
    stack: list[tuple[int, plan_pb2.Operator]] = [(len(nodes) - 1, plan.root)]
    while stack:
        i, target = stack.pop()
        node = nodes[i]
        kind = node.WhichOneof("kind")
        assert kind is not None  # check_operators
        body = getattr(target, kind)
        body.SetInParent()
        body.CopyFrom(getattr(node, kind))
        if kind == "union":
            stack.extend((j, body.inputs.add()) for j in node.inputs)
        else:
            stack.extend((j, getattr(body, name)) for name, j in zip(CHILDREN[kind], node.inputs))
    plan.ClearField("operators")


def decode_plan(plan: plan_pb2.StagePlan, field: str) -> None:
    """A received plan (``plan``, parsed; ``field`` names it in errors) checked, and its tree built in ``root``."""
    check_operators(plan, field)
    unflatten(plan)
