"""The ``header`` family: mutated ``TaskHeader``s and plans (deep, wide, flat lists that are not trees)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from benchmarks.fuzz.data import DATA_SCHEMA, schema_bytes
from benchmarks.fuzz.plans import (
    bad_reference_expression,
    call,
    chain_expression,
    chain_operator,
    col,
    dag_expression,
    expression,
    node_bytes,
    over_root,
    plan_bytes,
    tree_of,
    wire,
    with_nodes,
)
from benchmarks.fuzz.proto import FLAT_EXPRESSIONS, FLAT_OPERATORS, L, field_number, parse, pb_field, pb_int_field, ser, varint
from benchmarks.fuzz.seeds import data_values, project_op, stage_key
from benchmarks.fuzz.settings import DEAD_URL, SELF_URL

if TYPE_CHECKING:
    from benchmarks.fuzz.mutator import Mutator

__all__ = [
    "DEEP_OPERATORS", "HEADER_MUTATIONS", "HEADER_OPS", "HEADER_OPS_W", "header_deep_expression", "header_deep_operator",
    "header_flat_expression", "header_flat_operators", "header_struct", "header_wide", "plan_of",
]


# -- header mutations

def plan_of(header: Any) -> Any:
    """The header's plan as sent: its operators flat (``FLAT_OPERATORS``), else nested in ``root``."""
    return parse(L.StagePlan, header.plan) or L.StagePlan()


def _project_body(expr: bytes) -> bytes:
    """A Project's body (its input left out) computing one column ``x`` = the serialized Expression ``expr``."""
    named = pb_field(field_number(L.NamedExpression, "name"), b"x") + pb_field(field_number(L.NamedExpression, "expr"), expr)
    return pb_field(field_number(L.Project, "exprs"), named)


def header_struct(m: Mutator, header: Any) -> None:
    m.message(header, "TaskHeader")


def header_deep_expression(m: Mutator, header: Any) -> None:
    """A filter (or project) whose expression nests ``depth`` calls deep."""
    plan = plan_of(header)
    depth = m.rng.choice([10, 60, 99, 100, 101, 150, 199, 200, 201, 1_000, 10_000, 100_000])
    if m.rng.random() < 0.5:
        expr = chain_expression(depth, "invert", "name", "is_valid")
        header.plan = over_root(plan, "filter", pb_field(field_number(L.Filter, "predicate"), expr))
    else:
        expr = chain_expression(depth, "negate", "score")
        header.plan = over_root(plan, "project", _project_body(expr))
    m.note(f"plan: expression nested {depth} deep")


DEEP_OPERATORS = [10, 40, 50, 64, 100, 1_000, 5_000] + ([9_990, 10_001, 30_000] if FLAT_OPERATORS else [])
"""Chains of operators over a plan's root. Nested, protobuf refused them past 50; flat, the worker takes up to
10,000 operators (limits.MAX_PLAN_OPERATORS), refuses longer lists, and refuses a plan deeper than its engines
compile (a few hundred operators), each by name."""


def header_deep_operator(m: Mutator, header: Any) -> None:
    plan = plan_of(header)
    depth = m.rng.choice(DEEP_OPERATORS)
    kind = m.rng.choice(["limit", "filter"])
    if not FLAT_OPERATORS:
        header.plan = plan_bytes(chain_operator(ser(plan.root), depth, kind), plan)
    else:
        if kind == "limit":
            body = pb_int_field(field_number(L.Limit, "count"), 5)
        else:
            body = pb_field(field_number(L.Filter, "predicate"), ser(expression(call("is_valid", col("name")))))
        base = len(plan.operators)
        header.plan = with_nodes(plan, [node_bytes(kind, body, [max(0, base + k - 1)]) for k in range(depth)])
    m.note(f"plan: {depth} nested {kind} operators")


def header_wide(m: Mutator, header: Any) -> None:
    plan = tree_of(plan_of(header))  # the operators as a tree, however they travel
    kind = m.rng.choice(["union", "project", "coalesce", "aggregate", "sort", "partitions", "producers", "and"])
    n = m.rng.choice([100, 100, 1_000, 1_000, 10_000])
    root = L.Operator()
    root.CopyFrom(plan.root)
    if kind == "union":
        n = min(n, 300)
        plan.root.CopyFrom(L.Operator(union=L.Union(inputs=[root] + [data_values(2)] * n)))
    elif kind == "project":
        plan.root.CopyFrom(project_op(root, [(f"c{i}", col("id")) for i in range(n)]))
    elif kind == "coalesce":
        plan.root.CopyFrom(project_op(root, [("c", call("coalesce", *[col("name")] * n))]))
    elif kind == "aggregate":
        aggs = [L.AggregateCall(function="count_all", name=f"n{i}") for i in range(n)]
        # partial: a peer may claim any aggregate is a pre-aggregate (the worker may then run it per unit).
        plan.root.CopyFrom(L.Operator(aggregate=L.Aggregate(input=root, aggregates=aggs, partial=True)))
    elif kind == "sort":
        plan.root.CopyFrom(L.Operator(sort=L.Sort(input=root, keys=[L.SortKey(column="id")] * n)))
    elif kind == "partitions":
        for feed in header.feeds:
            feed.partitions.extend(range(2, 2 + n))
    elif kind == "producers":
        # Absent producers on this worker (each read waits 10 s for its task) or at a port nobody listens on.
        producer = L.ProducerTask(url=m.rng.choice([SELF_URL, DEAD_URL]), stage_key=ser(stage_key("nobody")))
        read = L.ShuffleRead(producers=[producer] * min(n, 5_000), partition_start=0, partition_end=1, schema=schema_bytes(DATA_SCHEMA))
        plan.root.CopyFrom(L.Operator(union=L.Union(inputs=[root, L.Operator(shuffle_read=read)])))
    else:  # a long chain of and(...): deep in the nested encoding, long in the flat one
        predicate = pb_field(field_number(L.Filter, "predicate"), chain_expression(n, "and", "name", "is_valid", binary=True))
        header.plan = over_root(plan_of(header), "filter", predicate)
        m.note(f"plan: and-chain of {n}")
        return
    header.plan = wire(plan)
    m.note(f"plan: wide {kind} x{n}")


def header_flat_expression(m: Mutator, header: Any) -> None:
    """(flat expressions) shared subexpressions that explode when expanded, or arguments that are not earlier nodes."""
    if not FLAT_EXPRESSIONS:
        header_deep_expression(m, header)
        return
    plan = plan_of(header)
    kind = m.rng.choice(["dag", "self", "forward", "huge", "cycle", "empty"])
    expr = {"dag": lambda: dag_expression(m.rng.choice([20, 40, 64, 200])), "empty": lambda: b""}.get(kind, lambda: bad_reference_expression(kind))()
    header.plan = over_root(plan, "project", _project_body(expr))
    m.note(f"plan: flat expression {kind}")


def _flat_values() -> bytes:
    """A Values node (no inputs) of two data rows."""
    return node_bytes("values", ser(data_values(2).values))


def header_flat_operators(m: Mutator, header: Any) -> None:
    """(flat operators) a list that is not a tree, a node of the wrong shape, or more nodes than a worker takes."""
    if not FLAT_OPERATORS:
        header_deep_operator(m, header)
        return
    plan = plan_of(header)
    n = len(plan.operators)
    root, leaf = max(0, n - 1), _flat_values()
    limit = pb_int_field(field_number(L.Limit, "count"), 3)
    kind = m.rng.choice(["self", "forward", "huge", "shared", "two-roots", "no-kind", "no-inputs", "extra-input", "join-one",
                         "union-none", "leaf-input", "nested-input", "nested-root", "empty", "over-limit", "at-limit"])
    if kind in ("self", "forward", "huge"):
        index = {"self": n, "forward": n + 5, "huge": 2**32 - 1}[kind]
        header.plan = with_nodes(plan, [node_bytes("limit", limit, [index])])
    elif kind == "shared":  # the root is the input of two operators
        header.plan = with_nodes(plan, [node_bytes("limit", limit, [root]), node_bytes("limit", limit, [root]),
                                        node_bytes("union", b"", [n, n + 1])])
    elif kind == "two-roots":
        header.plan = with_nodes(plan, [leaf])
    elif kind == "no-kind":
        header.plan = with_nodes(plan, [pb_field(field_number(L.OperatorNode, "inputs"), varint(root))])
    elif kind == "no-inputs":
        header.plan = with_nodes(plan, [node_bytes("filter", b"")])
    elif kind == "extra-input":
        header.plan = with_nodes(plan, [leaf, node_bytes("limit", limit, [root, n])])
    elif kind == "join-one":
        header.plan = with_nodes(plan, [node_bytes("hash_join", ser(L.HashJoin(left_keys=["id"], right_keys=["id"], join_type="inner")), [root])])
    elif kind == "union-none":
        header.plan = with_nodes(plan, [node_bytes("union", b"")])
    elif kind == "leaf-input":
        header.plan = with_nodes(plan, [node_bytes("values", ser(data_values(2).values), [root])])  # a leaf with an input
    elif kind == "nested-input":  # an input nested in the body as well as named
        nested = pb_field(field_number(L.Limit, "input"), ser(data_values(2))) + limit
        header.plan = with_nodes(plan, [node_bytes("limit", nested, [root])])
    elif kind == "nested-root":  # the nested encoding of protocol 5, root set beside the operators
        header.plan = ser(plan) + pb_field(field_number(L.StagePlan, "root"), ser(data_values(2)))
    elif kind == "empty":
        plan.ClearField("operators")
        header.plan = ser(plan)
    else:  # a union of as many Values as make the list one more than a worker takes, or exactly as many
        total = 10_000 + (kind == "over-limit")
        leaves = max(1, total - n - 1)
        header.plan = with_nodes(plan, [leaf] * leaves + [node_bytes("union", b"", [root, *range(n, n + leaves)])])
    m.note(f"plan: flat operators {kind}")


HEADER_OPS_W: list[tuple[str, float]] = [
    ("struct", 52), ("raw", 18), ("splice", 4), ("deep_expression", 8), ("deep_operator", 5), ("wide", 5), ("flat_expression", 6),
    ("flat_operators", 6),
]
HEADER_OPS = [name for name, _ in HEADER_OPS_W]
HEADER_MUTATIONS: dict[str, Callable[[Mutator, Any], None]] = {
    "struct": header_struct,
    "deep_expression": header_deep_expression,
    "deep_operator": header_deep_operator,
    "wide": header_wide,
    "flat_expression": header_flat_expression,
    "flat_operators": header_flat_operators,
}
