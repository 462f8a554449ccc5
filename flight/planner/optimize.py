"""Plan rewrites that change cost, never results.

``push_filters`` moves every filter as far down as it stays exact, so filters
end directly above the scans (where a worker fuses them into its per-unit
scan) and joins see fewer rows:

* a filter's conjuncts travel separately (``a & b``: two filters);
* through a project when the columns they read are plain pass-throughs
  (renamed as the project renames them), through a sort without a fetch, into
  every input of a union, below a grouped aggregate when they read only its
  keys;
* below a join onto the side whose columns they read, where the join type
  allows it: both sides of an inner join, only the preserved side of a left
  (right) outer join, the left side of a semi or anti join, neither side of a
  full outer join. Names the join suffixed (``right_suffix``) are mapped back
  to the input's own names;
* a conjunct that reads both sides and is a disjunction of conjunctions,
  ``OR_i (AND_j t_ij)``, stays above the join and also gives each side it may
  filter ``OR_i (AND of the t_ij that read only that side)``: implied by the
  original (a row it keeps satisfies some disjunct, hence that disjunct's
  terms on each side), so exact. A side gets nothing unless every disjunct
  has at least one such term;
* into a subplan that does work and that two parents share (a CTE planned
  once), only what all its uses ask: its copies stay equal and are computed
  once (``push_filters``).

A moved or derived filter carries its origin (``FilterNode.origins``), which
``explain()`` prints next to it. Rewrites that need the planner's size
estimates (join sides, a semi join's distinct build side) live in
``flight.planner.cut``.

``prune_columns`` (``flight.planner.prune``) pushes the columns a plan actually
uses down into its scans, so a worker reads (and a shuffle moves) only those.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from flight.plan.expr import Expr, call
from flight.plan.expr_nodes import CallNode
from flight.plan.nodes import FilterNode, LimitNode, Node, ProjectNode, UnnestNode
from flight.plan.relnodes import AggregateNode, JoinNode, SortNode, UnionNode
from flight.plan.window import WindowNode
from flight.planner.prune import prune_columns

__all__ = ["PUSHABLE_SIDES", "conjunction", "conjuncts", "derive_side_filter", "disjuncts", "prune_columns", "push_filters", "rename_fields"]

_AND = ("and_kleene", "and")
_OR = ("or_kleene", "or")
_WORK = (AggregateNode, JoinNode, WindowNode)

PUSHABLE_SIDES = {
    "inner": ("left", "right"),
    "left outer": ("left",),
    "right outer": ("right",),
    "full outer": (),
    "left semi": ("left",),
    "left anti": ("left",),
    "right semi": ("right",),
    "right anti": ("right",),
}
"""Which sides of a join a filter above it may move onto: those whose rows reach its output whole and not
null-extended (a filter on them commutes with the join)."""


# ------------------------------------------------------------ expressions


def _args(expr: Expr, functions: tuple[str, ...]) -> list[Expr] | None:
    """The arguments of ``expr`` when it is a call of one of ``functions`` without options, else None."""
    node = expr._node
    if isinstance(node, CallNode) and node.function in functions and node.options is None:
        return [Expr._of(a) for a in node.args]
    return None


def _flatten(expr: Expr, functions: tuple[str, ...]) -> list[Expr]:
    """The operands of nested calls of ``functions`` under ``expr``, left to right (no recursion)."""
    out: list[Expr] = []
    stack = [expr]
    while stack:
        e = stack.pop()
        args = _args(e, functions)
        if args is None:
            out.append(e)
        else:
            stack.extend(reversed(args))
    return out


def conjuncts(expr: Expr) -> list[Expr]:
    """The terms of a conjunction (``and_kleene`` / ``and``, nested ones flattened); ``[expr]`` otherwise.

    A filter keeps a row when its predicate is true, and a conjunction is true
    exactly when every term is, so filtering by each term in turn is the same.
    """
    return _flatten(expr, _AND)


def disjuncts(expr: Expr) -> list[Expr]:
    """The terms of a disjunction (``or_kleene`` / ``or``, nested ones flattened); ``[expr]`` otherwise."""
    return _flatten(expr, _OR)


def _all(terms: list[Expr]) -> Expr:
    return terms[0] if len(terms) == 1 else call("and_kleene", *terms)


def conjunction(terms: Sequence[Expr]) -> Expr:
    """All of ``terms`` (one at least) as one predicate: what ``conjuncts`` takes apart."""
    return _all(list(terms))


def _any(terms: list[Expr]) -> Expr:
    return terms[0] if len(terms) == 1 else call("or_kleene", *terms)


def derive_side_filter(expr: Expr, columns: set[str]) -> Expr | None:
    """A predicate on ``columns`` alone implied by ``expr``, from a disjunction of conjunctions; None if none.

    For ``OR_i (AND_j t_ij)``: ``OR_i (AND of the t_ij reading only columns)``,
    provided every disjunct has such a term (a term reading no column at all
    does not count). Wherever ``expr`` is true, the result is true.
    """
    branches = disjuncts(expr)
    if len(branches) < 2:
        return None
    derived = []
    for branch in branches:
        mine = [t for t in conjuncts(branch) if (used := t.referenced_fields()) and used <= columns]
        if not mine:
            return None
        derived.append(_all(mine))
    return _any(derived)


def rename_fields(expr: Expr, names: dict[str, str]) -> Expr:
    """``expr`` reading column ``names[n]`` wherever it read ``n``."""
    if all(names.get(n, n) == n for n in expr.referenced_fields()):
        return expr
    msg = expr.to_proto()
    for node in msg.nodes:
        if node.WhichOneof("kind") == "field" and node.field.name in names:
            node.field.name = names[node.field.name]
    return Expr.from_proto(msg)


# ---------------------------------------------------------------- filters


@dataclass(frozen=True)
class _Pred:
    """One conjunct on its way down, and why it is where it ends up ("": written there)."""

    expr: Expr
    origin: str = ""

    def moved(self, names: dict[str, str], origin: str) -> _Pred:
        return _Pred(rename_fields(self.expr, names), self.origin or origin)


def push_filters(node: Node) -> Node:
    """``node`` with every filter moved as far down as it stays exact (see the module's doc).

    A subplan that does work and that two parents share (one node object: a CTE planned once, ``flight.sql.ctes``)
    stays shared: what goes into it is what all its uses ask (``_into``), and each use keeps the rest above it.
    Pushed into each use on its own, the copies differed and each was computed: TPC-DS q24's ``ssales`` (an
    aggregate of 2.9 million joined rows) twice, once for the item colour its main use asks and once whole for the
    HAVING's average; q31's quarters three times. Spark pushes a CTE's uses' filters the same way (their OR into
    its definition). Decided outermost first: what reaches a shared subplan inside another depends on what went
    into the outer one, so each pass decides the shared subplans no undecided one holds, until none is left."""
    shared = _shared(node)
    decided: dict[int, list[_Pred]] = {}
    while True:
        pusher = _Pusher(set(shared), decided)
        out = pusher.push(node, [])
        if not pusher.arrivals:
            return out
        inside = {i for o in pusher.arrivals for i in shared[o] if i != o}
        for o, uses in pusher.arrivals.items():
            if o not in inside:
                decided[o] = _into(uses)


def _shared(root: Node) -> dict[int, set[int]]:
    """The subplans of ``root`` under more than one parent that join, aggregate or compute a window (a scan shared is
    read by each use with its own filters: pushed into each, they skip what that use does not read), each with the
    ids of the shared ones in it (itself included)."""
    parents: Counter[int] = Counter()
    seen: dict[int, Node] = {}
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) not in seen:
            seen[id(node)] = node
            for child in node.children():
                parents[id(child)] += 1
                stack.append(child)
    tops = {i for i, n in parents.items() if n > 1 and any(isinstance(d, _WORK) for d in seen[i].walk())}
    return {i: {id(d) for d in seen[i].walk() if id(d) in tops} for i in tops}


def _key(pred: _Pred) -> bytes:
    return pred.expr.wire()


def _into(uses: list[list[_Pred]]) -> list[_Pred]:
    """What goes into a subplan its ``uses`` share, each use asking its conjuncts: those every use asks, and the OR of
    the rest when each use asks some (a use that asks none takes every row: nothing more goes in)."""
    keyed = [{_key(p): p for p in use} for use in uses]
    every = set(keyed[0]).intersection(*keyed[1:])
    into = [p for k, p in keyed[0].items() if k in every]
    if len(uses) > 1 and all(k.keys() - every for k in keyed):
        rest = [_all([p.expr for k, p in use.items() if k not in every]) for use in keyed]
        unique = {r.wire(): r for r in rest}
        into.append(_Pred(_any(list(unique.values())), f"the OR of its {len(uses)} uses' filters, pushed into the subplan they share"))
    return into


class _Pusher:
    """One pass of ``push_filters``: a shared subplan with its filters ``decided`` gets them in each use, under the
    filters that use asks beyond them: equal copies, which the planner computes once where that is cheaper
    (``flight.planner.reuse``, ``flight.engine.duck.shared``). Each use gets its own nodes (pushed once, copied
    for the others): the plan that comes out is a tree, as every later rewrite expects (a rewrite of one use must
    not change another). Of one not yet decided only what reaches it is recorded (``arrivals``), and the pass's
    plan is not kept: the next decides it."""

    def __init__(self, shared: set[int], decided: dict[int, list[_Pred]]) -> None:
        self.shared, self.decided = shared, decided
        self.arrivals: dict[int, list[list[_Pred]]] = {}
        self.done: dict[int, Node] = {}  # each decided one pushed once; each further use gets a copy

    def push(self, node: Node, preds: list[_Pred]) -> Node:
        """``node`` with ``preds`` (conjuncts over its output) applied to it, as low as they can go."""
        if id(node) not in self.shared:
            return self._push(node, preds)
        into = self.decided.get(id(node))
        if into is None:  # this pass only records what reaches it: its result is not the one kept
            self.arrivals.setdefault(id(node), []).append(preds)
            return node
        done = self.done.get(id(node))
        pushed = self.done.setdefault(id(node), self._push(node, into)) if done is None else _copied(done)
        below = {_key(p) for p in into}
        return _filtered(pushed, [p for p in preds if _key(p) not in below])

    def _push(self, node: Node, preds: list[_Pred]) -> Node:
        if isinstance(node, FilterNode):
            terms = conjuncts(node.predicate)
            origins = node.origins if len(node.origins) == len(terms) else ("",) * len(terms)
            return self.push(node.input, [_Pred(t, o) for t, o in zip(terms, origins)] + preds)
        if isinstance(node, ProjectNode):
            passthrough = {n: c for n, e in node.exprs if (c := e.column_name()) is not None}
            down = [p for p in preds if p.expr.referenced_fields() <= passthrough.keys()]
            stay = [p for p in preds if not p.expr.referenced_fields() <= passthrough.keys()]
            moved = [p.moved(passthrough, "") for p in down]
            return _filtered(node.with_inputs(input=self.push(node.input, moved)), stay)
        if isinstance(node, SortNode) and node.fetch == 0:
            return node.with_inputs(input=self.push(node.input, preds))
        if isinstance(node, UnionNode):
            return node.with_inputs(inputs=[self.push(n, list(preds)) for n in node.inputs])
        if isinstance(node, AggregateNode) and node.keys:
            keys = set(node.keys)
            where = f"pushed below {node.label_text or 'Aggregate'}[keys={node.keys}]"
            down = [p.moved({}, where) for p in preds if p.expr.referenced_fields() <= keys]
            stay = [p for p in preds if not p.expr.referenced_fields() <= keys]
            pushed = node.with_inputs(input=self.push(node.input, down)) if down else self.children_pushed(node)
            return _filtered(pushed, stay)
        if isinstance(node, JoinNode):
            return self.push_join(node, preds)
        return _filtered(self.children_pushed(node), preds)

    def children_pushed(self, node: Node) -> Node:
        """``node`` with the filters inside each of its inputs pushed down (none from above)."""
        if isinstance(node, (AggregateNode, LimitNode, SortNode, WindowNode, UnnestNode)):
            return node.with_inputs(input=self.push(node.input, []))
        if isinstance(node, (FilterNode, ProjectNode, UnionNode, JoinNode)):
            return self._push(node, [])
        return node

    def push_join(self, node: JoinNode, preds: list[_Pred]) -> Node:
        sides = join_sides(node)
        allowed = PUSHABLE_SIDES.get(node.join_type, ())
        keys = ", ".join(f"{a}={b}" for a, b in zip(node.left_keys, node.right_keys))
        here = f"HashJoin[{node.join_type}, {keys}]"
        down: dict[str, list[_Pred]] = {"left": [], "right": []}
        stay: list[_Pred] = []
        for p in preds:
            used = p.expr.referenced_fields()
            if not used <= sides.keys():
                stay.append(p)
                continue
            read = {sides[n][0] for n in used}
            names = {n: sides[n][1] for n in used}
            target = next((s for s in allowed if read <= {s}), None)
            if target is not None:
                down[target].append(p.moved(names, f"pushed below {here}"))
                continue
            stay.append(p)
            for side in allowed:
                mine = {n for n in sides if sides[n][0] == side}
                derived = derive_side_filter(p.expr, mine)
                if derived is not None:
                    rename = {n: sides[n][1] for n in derived.referenced_fields()}
                    down[side].append(_Pred(rename_fields(derived, rename), f"derived from the OR above {here}"))
        left = self.push(node.left, down["left"])
        right = self.push(node.right, down["right"])
        return _filtered(node.with_inputs(left=left, right=right), stay)


def _copied(node: Node) -> Node:
    """``node`` with new nodes above its leaves (scans, inputs: never changed, so shared as they were before)."""
    if isinstance(node, JoinNode):
        return node.with_inputs(left=_copied(node.left), right=_copied(node.right))
    if isinstance(node, UnionNode):
        return node.with_inputs(inputs=[_copied(n) for n in node.inputs])
    if isinstance(node, (FilterNode, ProjectNode, LimitNode, UnnestNode, AggregateNode, SortNode, WindowNode)):
        return node.with_inputs(input=_copied(node.input))
    return node


def _filtered(node: Node, preds: list[_Pred]) -> Node:
    """``node`` under one filter of ``preds`` (the same conjunct once), or ``node`` itself when there are none."""
    seen: dict[bytes, _Pred] = {}
    for p in preds:
        seen.setdefault(_key(p), p)
    unique = list(seen.values())
    if not unique:
        return node
    origins = tuple(p.origin for p in unique)
    return FilterNode(node, _all([p.expr for p in unique]), origins if any(origins) else ())


def join_sides(node: JoinNode) -> dict[str, tuple[str, str]]:
    """Each output column of ``node`` -> (``"left"`` or ``"right"``, its name in that input).

    Read off the join's own output schema (Acero's: left columns, then right
    columns, a right one clashing with a left one suffixed), by position. A
    name the output holds twice is left out: nothing that reads it moves.
    """
    ln, rn = node.left.schema.names, node.right.schema.names
    if node.join_type in ("left semi", "left anti"):
        pairs = [("left", n) for n in ln]
    elif node.join_type in ("right semi", "right anti"):
        pairs = [("right", n) for n in rn]
    else:
        pairs = [("left", n) for n in ln] + [("right", n) for n in rn]
    out = node.schema.names
    if len(pairs) != len(out):
        return {}
    for o, (side, n) in zip(out, pairs):
        if o != n and not (side == "right" and o == n + node.right_suffix):
            return {}  # not the layout this knows: move nothing
    counts = Counter(out)
    return {o: p for o, p in zip(out, pairs) if counts[o] == 1}
