"""Adaptive planning: a join side whose size no estimate can know runs first, and the rest of the query
is planned from the rows it actually gave.

Why: the planner sizes a join's sides from the Parquet footers and textbook selectivities. A filter on
an aggregate's output (SQL ``HAVING``, a decorrelated subquery's comparison) is a guess: nothing says
how many groups pass. TPC-H Q18 keeps the orders whose quantity passes 300, ~6,000 of 15 million at
SF 10, where the estimate, a third of a tenth, is ~2 million. The semi joins by them (on orders, and
copied onto lineitem) were then sized as keeping every row, so ``orders ⋈ lineitem`` was estimated at
60 million rows and the plan shuffled it and customer (1.5 million rows) to meet, where the actual
43,000 rows should have gone to customer's tasks. Spark's adaptive execution re-plans at each finished
stage from its actual size; here the guess that decides the joins above it is settled before the plan
is made.

The rule, a decision apart from I/O (``flight.coordinator.adaptive`` carries it out):

* a side is *uncertain* when it is a filter on an aggregate's output columns (under projects and
  filters): the guess itself, nothing more, so settling it runs no more than the guess needs;
* it is worth settling when the join's other side is estimated at ``PARTNER_BYTES`` or more: what the
  exact size can change (a broadcast, a semi join's rows, one task) is how that side moves, and fewer
  bytes are not worth the wait for the side to finish before the rest starts;
* it reads repeatable sources only (read once to settle it, and again if it turns out large), and no
  input a caller sends;
* no aggregate or join inside it is also computed by the rest of the query (a CTE used on both sides of
  the join: the plan computes it once, and running the side first would compute it again: ``_shares_work``);
* the first such side, top-down, is chosen (one per query); with none, a join of two large tables on a composite key
  is one too (``flight.planner.composite``: the plan rotated so that the pair is a side).

At run time the side runs as a query of its own. If its rows fit ``ExecOptions.adaptive_bytes`` they
replace the side, everywhere it is (a semi join copied onto both sides of a join shares it), as a
``ValuesNode``, and the whole query is planned again: literal rows go into each task's plan, and a semi
join by them is sized from their exact keys (``flight.planner.literal``); each join that builds them
filters its other side to their key range, which moves down to that side's scans (``key_filters``:
dynamic filtering). If they pass it, they are
dropped as soon as they do and the query runs as planned: the side's work is lost, the answer is the same.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.compute as pc

from flight.compute.expressions import to_pyarrow
from flight.errors import FlightExecError
from flight.plan.expr import Expr, col, lit
from flight.plan.expr_nodes import CallNode, FieldNode, LiteralNode
from flight.plan.nodes import ExchangeInputNode, FeedScanNode, FilterNode, InputCallNode, Node, ProjectNode, ValuesNode
from flight.plan.relnodes import AggregateNode, JoinNode, UnionNode
from flight.planner.colocate import key_scan
from flight.planner.cost import BROADCAST_ALWAYS_BYTES, row_width
from flight.planner.keysets import estimated_rows
from flight.planner.notes import join_text, repeatable
from flight.planner.optimize import conjunction, conjuncts, push_filters
from flight.planner.ranges import range_selectivity
from flight.planner.reuse import subtree_key, subtree_keys
from flight.planner.rowgroups import clustered
from flight.sources.providers import FileListProvider

__all__ = [
    "MAX_PRUNE_POINTS", "PARTNER_BYTES", "PRUNE_BAND_ROWS", "PRUNE_SIDE_ROWS", "AdaptivePoint", "find_point", "key_filters", "prune_points",
    "rebuilt", "settleable", "settled", "size_of", "uncertain",
]

PARTNER_BYTES = BROADCAST_ALWAYS_BYTES
"""The other side must be estimated at this many bytes or more: moving fewer is not worth the wait."""


@dataclass(frozen=True)
class AdaptivePoint:
    """A join side to run first: the node, the join it is a side of, and the estimates that chose it. ``pruned``: the
    feed and column of a cut file in that column's order whose row groups the side's key range picks (``prune_points``)."""

    side: Node
    join: JoinNode
    rows: float | None
    size: float | None
    partner_size: float
    pruned: tuple[str, str] | None = None
    probe: object | None = None
    """A pruning point's provider (of the cut file): copies of the side that build joins with its scans settle too."""
    why: str | None = None
    """What the notes say before the side runs, when another rule chose it (``flight.planner.composite``)."""

    def text(self) -> str:
        """What the plan's rewrite notes say before the side runs."""
        if self.why is not None:
            return f"adaptive: {self.why}"
        if self.pruned is not None:
            return (f"adaptive: {join_text(self.join)}'s side {_label(self.side)} ({_estimate(self.rows, self.size)}) runs first "
                    f"as a query of its own: the range of its keys filters {self.pruned[0]}'s {self.pruned[1]!r}, in whose order "
                    "the file's row groups are, so that only the row groups it keeps are cut into the tasks' runs")
        return (f"adaptive: {join_text(self.join)}'s side {_label(self.side)} ({_estimate(self.rows, self.size)}, a guess: "
                "it filters an aggregate's output) runs first as a query of its own; the rest is planned from its actual "
                f"rows if they fit adaptive_bytes (the other side, ~{self.partner_size / (1 << 20):,.1f} MiB, moves as they decide)")

    def outcome(self, table: pa.Table | None, seconds: float, limit: int) -> str:
        """What the plan's rewrite notes say after it ran: ``table`` its rows, None when they passed ``limit``."""
        head = f"adaptive: {join_text(self.join)}'s side {_label(self.side)} ran first ({seconds:.2f} s), estimated {_estimate(self.rows, self.size)}"
        if table is None:
            return f"{head}; its rows passed adaptive_bytes ({limit / (1 << 20):,.1f} MiB), so the query runs as planned"
        return (f"{head}, actual {table.num_rows:,} rows, {table.nbytes / (1 << 20):,.1f} MiB: the query is planned again "
                "with those rows as literal input")


def _label(node: Node) -> str:
    return node.label() if len(node.label()) <= 80 else node.label()[:77] + "..."


def _estimate(rows: float | None, size: float | None) -> str:
    if rows is None or size is None:
        return "size unknown"
    return f"~{rows:,.0f} rows, {size / (1 << 20):,.1f} MiB"


def size_of(node: Node) -> tuple[float | None, float | None]:
    """``node``'s estimated rows and bytes (None: unknown)."""
    rows = estimated_rows(node)
    return rows, None if rows is None else rows * row_width(node.schema)


def uncertain(node: Node) -> bool:
    """Whether ``node`` is a filter over an aggregate's output columns (not its group keys), under projects and
    filters: the subplan whose size is a guess, and nothing more."""
    guessed = False
    while isinstance(node, (ProjectNode, FilterNode)):
        if isinstance(node, FilterNode):
            below = node.input
            while isinstance(below, (ProjectNode, FilterNode)):
                below = below.input
            guessed = guessed or (isinstance(below, AggregateNode) and bool(node.predicate.referenced_fields() - set(below.keys)))
        node = node.input
    return guessed and isinstance(node, AggregateNode) and bool(node.keys)


def settleable(side: Node) -> bool:
    """Whether ``side`` may run first as a query of its own: repeatable sources only, no input a caller sends."""
    return repeatable(side) and not any(isinstance(n, (InputCallNode, ExchangeInputNode, ValuesNode)) for n in side.walk())


def _may_settle(side: Node) -> bool:
    return uncertain(side) and settleable(side)


def find_point(root: Node) -> AdaptivePoint | None:
    """The join side to settle first (module doc), or None. ``root``: filters and semi joins already pushed."""
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, JoinNode):
            for side, other in ((node.right, node.left), (node.left, node.right)):
                _, partner = size_of(other)
                if partner is not None and partner >= PARTNER_BYTES and _may_settle(side) and not _shares_work(root, side):
                    rows, size = size_of(side)
                    return AdaptivePoint(side, node, rows, size, partner)
        stack.extend(reversed(list(node.children())))
    return None


def _shares_work(root: Node, side: Node) -> bool:
    """Whether an aggregate or a join inside ``side`` is also computed outside it: a CTE used twice, TPC-DS q39's
    inventory grouped by month, filtered to January on one side of the join and to February on the other. The plan
    computes it once and reads it twice (``reuse.repeated_subtrees``); run first, the side computes it a second time
    (q39 at SF 10 on two hosts: 0.66 s of its 1.5). Only the side's own object is skipped (a semi join copied onto
    both sides of a join shares it: ``settled`` replaces it everywhere); an equal copy elsewhere, a CTE named
    twice (q64's ``cs_ui`` in both uses of ``cross_sales``, q23's ``best_ss_customer`` in both legs of a union), is
    not replaced by ``settled`` and would still be computed."""
    keys = subtree_keys(root)
    inside = {keys[id(n)] for n in side.walk() if isinstance(n, (AggregateNode, JoinNode)) and id(n) in keys}
    stack = [root]
    while stack and inside:
        node = stack.pop()
        if node is side:
            continue
        if isinstance(node, (AggregateNode, JoinNode)) and keys[id(node)] in inside:
            return True
        stack.extend(node.children())
    return False


PRUNE_SIDE_ROWS = 100_000
"""A side run first for its keys' range (``prune_points``) is estimated at most this many rows: a dimension filtered."""

PRUNE_BAND_ROWS = 2_000_000
"""The rows of the scan a side's keys are estimated to keep (its rows over the key's range in the footers, times the
scan's rows) must be at least this many: a narrower band is read in a few tens of milliseconds by one task, what
running the side first and planning again cost (TPC-DS q40's 61 days of catalog_sales at SF 10: 0.10 -> 0.17 s)."""

MAX_PRUNE_POINTS = 4
"""At most this many sides of one query are run first for their keys' range (each is a query's start and a wait)."""


def prune_points(root: Node, cut_rows: int, tasks: int, taken: Node | None = None) -> list[AdaptivePoint]:
    """The build sides worth running first for their keys' range: a small filtered side (a dimension) of an inner or
    semi join whose other side's key is a column of Parquet files cut into runs (``cut_rows``, fewer files than
    ``tasks``) that are in that column's order (``rowgroups.clustered``: a fact table written by date). Their rows'
    range becomes a filter on that scan (``key_filters``), and only the row groups it keeps are cut into the tasks'
    runs (``flight.planner.rowgroups``): each task reads an even share of them, where the run holding the kept band
    gave it all to one task. ``taken``: a side already chosen (``find_point``), not chosen again."""
    points: list[AdaptivePoint] = []
    seen = {subtree_key(taken)} if taken is not None else set()  # one point for the copies of a side (``settled``)
    for node in root.walk():
        if len(points) >= MAX_PRUNE_POINTS or not isinstance(node, JoinNode) or node.join_type not in ("inner", "left semi"):
            continue
        side = node.right
        rows, size = size_of(side)
        if (subtree_key(side) in seen or rows is None or rows > PRUNE_SIDE_ROWS or not any(isinstance(n, FilterNode) for n in side.walk())
                or not repeatable(side) or any(isinstance(n, (InputCallNode, ExchangeInputNode, ValuesNode)) for n in side.walk())):
            continue
        for key in node.left_keys:
            traced = key_scan(node.left, key)
            provider = None if traced is None else traced[0].feed.inner()
            if traced is None or not isinstance(provider, FileListProvider) or not provider.cuts(tasks):
                continue
            kind = traced[0].schema.field(traced[1]).type
            if ((pa.types.is_integer(kind) or pa.types.is_date(kind)) and provider.may_cut(cut_rows) and clustered(provider, traced[1])
                    and _band_rows(provider, traced[1], _side_rows(side, rows)) >= PRUNE_BAND_ROWS):
                seen.add(subtree_key(side))
                _, partner = size_of(node.left)
                points.append(AdaptivePoint(side, node, rows, size, partner or 0.0, (traced[0].feed.feed_id, traced[1]), provider))
                break
    return points


def _side_rows(side: Node, estimate: float) -> float:
    """The rows a dimension side (filters and projections over one scan) keeps, an equality on an integer column
    whose range the footers give counted as one value of that range: the planner's textbook tenth made a month of
    2001 in TPC-DS's date_dim (``d_year = 2001 and d_moy = 2``) ~730 rows, not 28. ``estimate`` otherwise."""
    node, terms = side, []
    while isinstance(node, (ProjectNode, FilterNode)):
        terms += conjuncts(node.predicate) if isinstance(node, FilterNode) else []
        node = node.input
    column_range = getattr(node.feed.inner(), "column_range", None) if isinstance(node, FeedScanNode) else None
    rows = node.feed.inner().estimated_rows() if isinstance(node, FeedScanNode) else None
    if column_range is None or rows is None or not terms:
        return estimate
    rest: list[Expr] = []
    for term in terms:
        call = term._node
        names = sorted(term.referenced_fields())
        plain = isinstance(call, CallNode) and call.function == "equal" and {type(a) for a in call.args} == {FieldNode, LiteralNode}
        known = column_range(names[0]) if plain else None  # column = literal
        if known is None or not isinstance(node, FeedScanNode) or not pa.types.is_integer(node.schema.field(names[0]).type):
            rest.append(term)
        else:
            rows /= max(1.0, known[1] - known[0] + 1)
    if rest:
        rows *= range_selectivity(conjunction(rest), column_range)
    return min(rows, estimate)


def _band_rows(provider: FileListProvider, column: str, keys: float) -> float:
    """How many of the scan's rows ``keys`` distinct keys of ``column`` are estimated to hold: each key's share of the
    column's range in the footers (dates, integer ids: one value a step), times the scan's rows."""
    span, rows = provider.column_range(column), provider.estimated_rows()
    if span is None or rows is None:
        return 0.0
    return rows * min(1.0, keys / max(1.0, span[1] - span[0] + 1))


def settled(root: Node, side: Node, table: pa.Table, probe: object | None = None) -> Node:
    """``root`` with ``side`` replaced by its rows, as one ``ValuesNode`` (its columns in its order), each place it
    is (a semi join copied onto both sides of a join shares its build side). With ``probe`` (a pruning point's
    provider), also each copy of a subplan equal to it (``subtree_keys``) that builds a join whose key comes from a
    scan of that provider: a rollup's sets are each over their own copy of the input, and with the same rows in each
    they stay equal (``flight.planner.gsets`` merges the sets of one input). Copies that other tables join are left
    alone (TPC-DS q04's year of dates for its three channels): literal rows there would plan those legs anew."""
    keys = subtree_keys(root) if probe is not None else {}
    key = subtree_key(side) if probe is not None else b""
    rows = ValuesNode(table.select(side.schema.names).cast(side.schema))

    def copy(join: JoinNode) -> bool:
        if join.join_type not in ("inner", "left semi") or keys.get(id(join.right)) != key:
            return False
        traced = [key_scan(join.left, k) for k in join.left_keys]
        return any(t is not None and t[0].feed.inner() is probe for t in traced)

    def visit(node: Node) -> Node:
        if node is side:
            return rows
        if isinstance(node, JoinNode) and probe is not None and copy(node):
            left = visit(node.left)
            return replace(node, left=left, right=rows)
        return rebuilt(node, visit)

    return visit(root)


def rebuilt(node: Node, f: Callable[[Node], Node]) -> Node:
    """``node`` with ``f`` applied to each child (``node`` itself when none changed)."""
    if isinstance(node, JoinNode):
        left, right = f(node.left), f(node.right)
        return node if left is node.left and right is node.right else replace(node, left=left, right=right)
    if isinstance(node, UnionNode):
        inputs = [f(n) for n in node.inputs]
        return node if all(a is b for a, b in zip(inputs, node.inputs)) else UnionNode(inputs)
    child = getattr(node, "input", None)
    if isinstance(child, Node):
        new = f(child)
        return node if new is child else replace(node, input=new)  # type: ignore[type-var]
    return node


def key_filters(root: Node) -> tuple[Node, list[str]]:
    """Dynamic filtering from literal rows: each join that builds literal rows (inner, or a semi join on its
    right) also filters its other side to the least and greatest of their keys, for integer and date keys,
    so the filter moves down to that side's scans (``optimize.push_filters``), where the readers skip the
    row groups whose footers fall outside (Trino sends a build side's keys to the probe's scans the same
    way). The join still decides each row: the range only drops rows it would drop. Filters are pushed first, so
    that a filter on the literal rows' own columns (a CTE use's, above its aggregate) narrows their range too."""
    notes: list[str] = []

    def visit(node: Node) -> Node:
        node = rebuilt(node, visit)
        if not isinstance(node, JoinNode) or node.join_type not in ("inner", "left semi"):
            return node
        if (rows := _literal_rows(node.right)) is not None:
            probe = _bounded(node.left, rows, node.left_keys, node.right_keys, node, notes)
            return node if probe is node.left else replace(node, left=probe)
        if node.join_type == "inner" and (rows := _literal_rows(node.left)) is not None:
            probe = _bounded(node.right, rows, node.right_keys, node.left_keys, node, notes)
            return node if probe is node.right else replace(node, right=probe)
        return node

    return visit(push_filters(root)), notes


def _literal_rows(side: Node) -> pa.Table | None:
    """The rows a join side of literal rows gives: a ``ValuesNode``'s, less those the filters right above it drop
    (a use's own filter pushed onto the rows a CTE's uses share: TPC-DS q39's January on one side, February on the
    other, where the range of both months put each use's rows in one task's run of inventory); None for any other
    side. A filter pyarrow cannot evaluate here is left out: a wider range, still exact."""
    predicates = []
    while isinstance(side, FilterNode):
        predicates.append(side.predicate)
        side = side.input
    if not isinstance(side, ValuesNode):
        return None
    table = side.table
    for predicate in predicates:
        try:
            table = table.filter(to_pyarrow(predicate.to_proto()))
        except (pa.ArrowException, FlightExecError):  # ProtocolError: an expression the decoder refuses
            continue
    return table


def _bounded(probe: Node, table: pa.Table, probe_keys: list[str], literal_keys: list[str], join: JoinNode,
             notes: list[str]) -> Node:
    """``probe`` filtered to the range of each literal key (``key_filters``), the filter said in ``notes``."""
    terms: list[Expr] = []
    bounded: list[str] = []
    for mine, theirs in zip(probe_keys, literal_keys):
        kind = probe.schema.field(mine).type
        if table.num_rows == 0 or not (pa.types.is_integer(kind) or pa.types.is_date(kind)):
            continue
        low, high = pc.min_max(table.column(theirs)).values()
        if not low.is_valid:
            continue
        try:
            lo: object = low.cast(kind).as_py()
            hi: object = high.cast(kind).as_py()
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue  # a literal key outside the probe key's type: no range to say
        terms.append(col(mine).between(lit(lo, kind), lit(hi, kind)))
        bounded.append(f"{mine!r} to [{lo}, {hi}]")
    if not terms:
        return probe
    predicate = terms[0]
    for term in terms[1:]:
        predicate = predicate & term
    notes.append(f"dynamic filter: {join_text(join)}'s literal keys bound {', '.join(bounded)} on its other side")
    return FilterNode(probe, predicate)
