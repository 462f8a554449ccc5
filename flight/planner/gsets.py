"""Grouping sets across tasks: one aggregate over every set's rows, the input computed once.

Why: the SQL front end writes ``GROUP BY ROLLUP``/``CUBE``/``GROUPING SETS`` as a union of plain
aggregates, one per set, each over the same input (``flight.sql.grouping``). In one task's DuckDB query
the copies of that input are computed once (``flight.engine.duck.shared``); cut into stages, each set's
aggregate became a leaf stage of its own that computed the input again. TPC-DS q18 at SF 10 on two
one-core hosts ran its five-way join five times: 3.2 s, where DuckDB takes 0.75 s on one core.

The rewrite, for a union whose inputs are ``Project ← Aggregate[keys_i; calls] ← X`` over the same ``X``
(equal subtrees, under projections that only select), is the form Spark's ``Expand`` gives grouping sets:

    Project[the union's columns] ← Aggregate[G + __gs_set; calls]
        ← Project[G as set __gs_set has them, __gs_set, each call's argument]
            ← X ⋈ Values[one row per set: __gs_set = 0, 1, ...] (on a constant)

where ``G`` are the union's columns that are, in every set, a key of its aggregate or a literal (the keys
a set rolls up are null literals there, its ``__grouping_id`` a constant), each chosen per row by
``if_else(__gs_set == i, ...)`` where the sets differ. The literal rows go into every task's plan
(``flight.planner.literal``), so nothing moves for them and each task computes ``X`` once. Rows of set ``i``
group by its keys (every one of them is a column of ``G``: else the rewrite is not made) and constants, and
``__gs_set`` keeps the sets' groups apart whatever their values, so each output row is the one the set's
own aggregate made. The planner then cuts one aggregate: a partial per task over the sets' rows (the
input computed once in the task's query), one shuffle, one final.

Only when it is plainly the same: the columns that are calls are, in every set, the same expression of the
same calls (function, argument, options) with no ordering or filter of their own (else the union is left as it
is), and there are at most ``MAX_SETS`` of them. A set with no keys (the grand
total) gives a row even over no rows, which a grouped aggregate does not: its group gets a row of its own,
every argument null (``_totals_row``, emitted by task 0 alone), which the aggregates allowed then
(``NULL_BLIND``) pass over, ``count(*)`` counting a column of ones instead. Made only where the input will be
read by more than one task (``small.scans_split``): one task's query computes the copies once already, and
TPC-DS q14 at SF 1 on one host (single-file tables) kept its two stages rather than ten of one task each.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

from flight.errors import PlanError
from flight.plan.expr import Expr, col, if_else, lit
from flight.plan.expr_nodes import LiteralNode
from flight.plan.nodes import Node, ProjectNode, ValuesNode
from flight.plan.relnodes import AggCall, AggregateNode, JoinNode, UnionNode
from flight.planner.reuse import subtree_keys

__all__ = ["SET_COLUMN", "merge_grouping_sets"]

SET_COLUMN = "__gs_set"
"""The column that tells the sets' rows apart in the merged aggregate (dropped above it)."""

MAX_SETS = 32
"""Most sets merged: each set's value of a column is chosen by a CASE on the set's number, one branch per set (a
CUBE of 7 keys, 128 sets, would pass the engine's expression size and run its whole stage on Acero)."""

ROWS_COLUMN = "__gs_rows"
"""1 in each row of the input, null in a grand total's own row: what ``count(*)`` counts once that row is there."""

NULL_BLIND = frozenset({"count", "count_all", "count_distinct", "sum", "min", "max", "mean", "var_samp", "var_pop",
                        "stddev_samp", "stddev_pop", "median", "quantile_cont", "quantile_disc"})
"""Aggregates a row of null arguments leaves as they were (``count(*)`` counts ``ROWS_COLUMN`` instead)."""

Branch = tuple[ProjectNode, AggregateNode]


def merge_grouping_sets(root: Node, splits: Callable[[Node], bool] = lambda _: True) -> tuple[Node, list[str]]:
    """``root`` with each union of aggregates over one input made one aggregate (module doc); what was done.
    ``splits(input)``: whether the input will be read by more than one task; one that will not is left as it is, its
    sets in one task whose query computes it once (and keeps the stages of the repeats within it as they were)."""
    if not any(isinstance(n, UnionNode) and len(n.inputs) > 1 for n in root.walk()):
        return root, []
    notes: list[str] = []
    keys = subtree_keys(root)
    done: dict[int, Node] = {}

    def walk(node: Node) -> Node:
        if id(node) not in done:
            new = _with_children(node, walk)
            if isinstance(new, UnionNode):
                new = _merged(new, keys, notes, splits) or new
            done[id(node)] = new
        return done[id(node)]

    return walk(root), notes


def _with_children(node: Node, f: Callable[[Node], Node]) -> Node:
    """``node`` over ``f`` of each of its inputs (itself when none changed, or when it is of a shape not known here).
    The rewrite keeps every schema, so the operators above are not typed again (``Node.with_inputs``)."""
    children = node.children()
    new = [f(c) for c in children]
    if all(a is b for a, b in zip(new, children)):
        return node
    if isinstance(node, UnionNode):
        return node.with_inputs(inputs=new)
    if isinstance(node, JoinNode):
        return node.with_inputs(left=new[0], right=new[1])
    if len(new) == 1 and hasattr(node, "input"):
        return node.with_inputs(input=new[0])
    return node


def _merged(union: UnionNode, keys: dict[int, bytes], notes: list[str], splits: Callable[[Node], bool]) -> Node | None:
    """The union with its largest group of aggregates over one input (one keyed at least) merged, or None."""
    branches = [_branch(n) for n in union.inputs]
    groups: dict[bytes, list[int]] = {}
    for i, b in enumerate(branches):
        key = None if b is None else keys.get(id(_base(b[1].input)))
        if key is not None:
            groups.setdefault(key, []).append(i)
    keyed = [g for g in groups.values() if any(b is not None and b[1].keys for b in (branches[i] for i in g))]
    chosen = max(keyed, key=len, default=[])
    first = branches[chosen[0]] if chosen else None
    if not 2 <= len(chosen) <= MAX_SETS or first is None or not splits(_base(first[1].input)):
        return None
    merged = _combine([b for i, b in enumerate(branches) if i in chosen and b is not None], union.schema)
    if merged is None:
        return None
    notes.append(f"Union of {len(chosen)} aggregates over one input (grouping sets): one aggregate over each set's rows, "
                 f"its keys by {SET_COLUMN}; {_base(first[1].input).label()} computed once, not {len(chosen)} times")
    rest = [n for i, n in enumerate(union.inputs) if i not in chosen]
    return UnionNode([merged, *rest]) if rest else merged


def _branch(node: Node) -> Branch | None:
    """``node`` as a set's aggregate under its projection, when every key it groups by is one of its columns (else
    grouping the merged rows by the columns would mix its groups: Spark's grand total, grouped by a constant)."""
    if isinstance(node, ProjectNode) and isinstance(node.input, AggregateNode) and not node.input.partial:
        if set(node.input.keys) <= {e.column_name() for _, e in node.exprs}:
            return node, node.input
    return None


def _base(node: Node) -> Node:
    """``node`` under the projections that only select its columns (the front end prunes each set's input
    to the columns it reads): the sets' common input, whose columns keep their names."""
    while isinstance(node, ProjectNode) and node.selects():
        node = node.input
    return node


def _is_literal(expr: Expr) -> bool:
    return isinstance(expr._node, LiteralNode)


def _same_call(a: AggCall, b: AggCall) -> bool:
    same_expr = (a.expr is None and b.expr is None) or (a.expr is not None and b.expr is not None and a.expr.wire() == b.expr.wire())
    return same_expr and (a.function, a.fraction, a.separator) == (b.function, b.fraction, b.separator)


def _columns(branches: list[Branch], names: list[str]) -> tuple[list[str], dict[str, Expr], dict[str, AggCall]] | None:
    """The union's group columns, its other columns (each an expression of calls, the same in every set) and
    those calls by name, or None when a column is neither or the sets' calls differ."""
    group: list[str] = []
    finals: dict[str, Expr] = {}
    calls: dict[str, AggCall] = {}
    for name in names:
        exprs = [dict(project.exprs)[name] for project, _ in branches]
        kinds = [_kind(expr, aggregate) for expr, (_, aggregate) in zip(exprs, branches)]
        if all(k == "group" for k in kinds):
            group.append(name)
            continue
        if any(k != "calls" for k in kinds) or any(e.wire() != exprs[0].wire() for e in exprs):
            return None
        for used in sorted(exprs[0].referenced_fields()):  # in one order: the plan is the same in every process
            per_set = [next(c for c in aggregate.calls if c.name == used) for _, aggregate in branches]
            first = per_set[0]
            if any(c.order or c.where is not None for c in per_set) or not all(_same_call(c, first) for c in per_set):
                return None
            calls[used] = first
        finals[name] = exprs[0]
    for project, aggregate in branches:  # every key of a set must group the merged rows
        outputs = dict(project.exprs)
        if not set(aggregate.keys) <= {outputs[g].column_name() for g in group}:
            return None
    return group, finals, calls


def _kind(expr: Expr, aggregate: AggregateNode) -> str:
    """``group`` (a key of ``aggregate`` or a literal), ``calls`` (an expression of its calls only) or ``other``."""
    column = expr.column_name()
    if (column is not None and column in aggregate.keys) or (column is None and _is_literal(expr)):
        return "group"
    used = expr.referenced_fields()
    return "calls" if used and used <= {c.name for c in aggregate.calls} else "other"


def _combine(branches: list[Branch], schema: pa.Schema) -> Node | None:
    """One aggregate computing every set of ``branches`` over their one input, of the union's ``schema``."""
    found = _columns(branches, schema.names)
    if found is None:
        return None
    group, finals, calls = found
    totals = [i for i, (_, aggregate) in enumerate(branches) if not aggregate.keys]
    if totals and any(c.function not in NULL_BLIND for c in calls.values()):
        return None
    source = _base(branches[0][1].input)
    arguments: dict[bytes, tuple[str, Expr]] = {}
    merged_calls: list[AggCall] = []
    for name, call in calls.items():
        argument = None
        if totals and call.function == "count_all":  # the grand total's row of nulls is not a row
            merged_calls.append(AggCall(name, "count", col(ROWS_COLUMN)))
            continue
        if call.expr is not None:
            name_of = arguments.setdefault(call.expr.wire(), (f"__gs_arg{len(arguments)}", call.expr))[0]
            argument = col(name_of)
        merged_calls.append(AggCall(name, call.function, argument, call.fraction, call.separator))
    per_set = {g: [_grouped(dict(project.exprs)[g], aggregate) for project, aggregate in branches] for g in group}
    items = [(g, _by_set(list(enumerate(exprs)))) for g, exprs in per_set.items()]
    items += [(SET_COLUMN, col(SET_COLUMN)), *arguments.values(), (ROWS_COLUMN, lit(1, pa.int32()))]
    try:
        expanded = ProjectNode(_expanded(source, len(branches)), items)
        rows: Node = UnionNode([expanded, _totals_row(expanded, totals, per_set)]) if totals else expanded
        aggregate = AggregateNode(rows, [*group, SET_COLUMN], merged_calls, branches[0][1].label_text)
        out = ProjectNode(aggregate, [(n, finals.get(n, col(n))) for n in schema.names])
    except PlanError:
        return None
    return out if out.schema.equals(schema) else None


def _grouped(expr: Expr, aggregate: AggregateNode) -> Expr:
    """A group column as one set makes it, over the sets' input: its key's column there, or its literal."""
    key = expr.column_name()
    return col(key) if key is not None and key in aggregate.keys else expr


def _by_set(per_set: list[tuple[int, Expr]]) -> Expr:
    """The expression each numbered set gives a column, chosen by ``SET_COLUMN`` (one when all are alike)."""
    chosen = per_set[-1][1]
    for i, expr in reversed(per_set[:-1]):
        if expr.wire() != chosen.wire():
            chosen = if_else(col(SET_COLUMN) == lit(i, pa.int32()), expr, chosen)
    return chosen


def _totals_row(rows: ProjectNode, totals: list[int], per_set: dict[str, list[Expr]]) -> Node:
    """A row for each grand total set, every call's argument null: an aggregate with no keys gives a row over no
    rows, a grouped one none, so its group must exist whatever the input holds. Task 0 alone emits it."""
    numbers = ValuesNode(pa.table({SET_COLUMN: pa.array(totals, pa.int32())}))
    items = [(g, _by_set([(i, exprs[i]) for i in totals])) for g, exprs in per_set.items()]
    items.append((SET_COLUMN, col(SET_COLUMN)))
    items += [(name, lit(None, rows.schema.field(name).type)) for name in rows.schema.names[len(items):]]
    return ProjectNode(numbers, items)


def _expanded(source: Node, sets: int) -> Node:
    """Each row of ``source`` once per set, numbered by ``SET_COLUMN``: joined with literal rows on a constant,
    which go into every task's plan (``flight.planner.literal``), so the input is computed once per task."""
    one = "__gs_one"
    keyed = ProjectNode(source, [*((n, col(n)) for n in source.schema.names), (one, lit(1, pa.int32()))])
    numbers = pa.table({f"{one}_r": pa.array([1] * sets, pa.int32()), SET_COLUMN: pa.array(range(sets), pa.int32())})
    return JoinNode(keyed, ValuesNode(numbers), [one], [f"{one}_r"], "inner")
