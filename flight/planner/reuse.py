"""The same subplan twice in one query becomes one stage, read by each use.

Why: SQL inlines a CTE or a view at each place it is named (DataFusion's planner does), so TPC-H
Q15's ``revenue0`` reaches the planner as two equal subtrees, each scanning lineitem. Like Spark's
reuse of equal exchanges, the cutter asks before it makes a stage whether an equal one exists: the
same operators over the same sources, reading the same stages, cut the same way for the same number
of tasks. If so, the use reads that stage. The scan then happens once, and the rows it makes are
the same for every use, which matters for a source that is not repeatable.

Reuse at the cut alone misses a CTE whose scans share a fragment with each use's own operators (an
aggregate straight over it: each use's partial aggregate differs, so no cut is equal). Over files
that is right: reading them again costs less than moving every row through a stage more (TPC-H Q18
names lineitem's two columns twice; shuffling its 6 million rows once took 2.4 s where reading them
twice took 1.2). Over a source that is not repeatable (a feed of units discovered at run time) each
use must see the same rows, so ``repeated_subtrees`` finds the equal subtrees that scan something
and the cutter makes such a subtree a stage of its own when its scans would run in the uses' tasks,
its rows spread round-robin to the tasks of each use.

A stage read more than once keeps its output until the query ends (``StageSpec.shared``: retained,
spilled past the output bound), since one use may start reading only after another finished (a
join's probe side waits for its build side), and bounded buffers would then hold the producer for
the slow reader while the fast one waits for rows. The uses of a hash output read one partition
each, so they must have the same task count: ``align_task_counts`` gives them the largest.
"""

from __future__ import annotations

import hashlib

from flight.plan.nodes import OWN_KEY, FeedScanNode, Node, ProjectNode
from flight.planner.stages import FeedPlan, StageSpec
from flight.wire._proto import plan_pb2

__all__ = ["align_task_counts", "fingerprint", "link_consumers", "repeated_subtrees", "subtree_key", "subtree_keys"]


_KEPT = "_subtree_key"
"""Where a node keeps its key once made: a node is never changed after it is made (each rewrite makes new ones), so
its subtree's key is too. The planner asks for the keys of one plan a dozen times (pruning, sizing, cutting, each
stage's fingerprint): made each time, they were an eighth of planning the 99 TPC-DS queries."""


def subtree_keys(root: Node) -> dict[int, bytes]:
    """A key for every subtree of ``root`` by the id of its top node: equal keys for equal operators over the
    same sources (each scan named by its source, its provider, not its feed id: a second scan of a source
    gets a feed of its own).

    Made bottom up, each node's own operator serialized once (``fill_proto`` without its inputs) and hashed
    with its inputs' keys (SHA-256): linear in the plan's size. Serializing each subtree whole was quadratic:
    1.5 s of TPC-DS q14's planning, whose CTEs repeat thousands of operators."""
    keys: dict[int, bytes] = {}
    for node in reversed(list(root.walk())):  # inputs before the nodes above them
        if id(node) in keys:
            continue  # a node shared by two parents
        known = node.__dict__.get(_KEPT)
        if known is None:
            digest = hashlib.sha256(_own_key(node))
            for child in node.children():
                digest.update(keys[id(child)])
            known = node.__dict__[_KEPT] = digest.digest()
        keys[id(node)] = known
    return keys


def _own_key(node: Node) -> bytes:
    """The hash of ``node``'s own operator (``fill_proto``, its inputs left out), kept on it (``OWN_KEY``).

    A projection, most of a plan's operators, is hashed from its names and its expressions' kept wire bytes
    (``Expr.wire``) instead: building its message was two thirds of keying TPC-DS q14; a bare column by its name
    (``c`` and the name, where a wire form starts with its length's digits): flattening each ``col(x)`` to a message
    for its bytes was ~3% of planning the 99 TPC-DS queries (cProfile). The first byte tells the two forms apart."""
    own: bytes | None = node.__dict__.get(OWN_KEY)
    if own is None and isinstance(node, ProjectNode):
        digest = hashlib.sha256(b"\x00")
        for name, expr in node.exprs:
            label, column = name.encode(), expr.column_name()
            if column is not None:  # a bare column, most of them: its name, without building its message
                column_bytes = column.encode()
                digest.update(b"%d:%sc%d:%s" % (len(label), label, len(column_bytes), column_bytes))
                continue
            wire = expr.wire()
            digest.update(b"%d:%s%d:" % (len(label), label, len(wire)))
            digest.update(wire)
        own = node.__dict__[OWN_KEY] = digest.digest()
    if own is None:
        op = plan_pb2.Operator()
        node.fill_proto(op)
        if isinstance(node, FeedScanNode):
            op.feed_scan.feed.feed_id = f"provider-{id(node.feed.inner())}"
        own = node.__dict__[OWN_KEY] = hashlib.sha256(b"\x01" + op.SerializeToString(deterministic=True)).digest()
    return own


def subtree_key(node: Node) -> bytes:
    """``node``'s own key (``subtree_keys``), kept on it once made."""
    return node.remembered(_KEPT, lambda: subtree_keys(node)[id(node)])


def fingerprint(node: Node, feeds: list[FeedPlan], tasks: int, mode: str, keys: list[str]) -> bytes:
    """What makes two cuts the same stage: operators, sources, the stages read, the feed partitions,
    the task count and the output partitioning."""
    shape = repr((sorted((id(f.feed.inner()), f.partitions, f.shared) for f in feeds), tasks, mode, keys))
    # The subtree's own key, once made (``subtree_keys`` keeps it): walking the subtree again to find it was a tenth of cutting.
    return subtree_key(node) + shape.encode()


def repeated_subtrees(root: Node) -> set[int]:
    """The ids of the largest subtrees of ``root`` that occur more than once (equal operators over the
    same sources) and scan something: each use of a CTE or a view. A new set each call (callers change theirs),
    worked out once per plan: the planner asks three times."""
    return set(root.remembered("_repeated_subtrees", lambda: frozenset(_repeated(root))))


def _repeated(root: Node) -> set[int]:
    scans = [id(n.feed.inner()) for n in root.walk() if isinstance(n, FeedScanNode)]
    if len(scans) == len(set(scans)):
        return set()  # no source is scanned twice: no subtree that scans can repeat
    nodes = list(root.walk())
    scanning: dict[int, bool] = {}
    for node in reversed(nodes):  # children before parents
        scanning[id(node)] = isinstance(node, FeedScanNode) or any(scanning[id(c)] for c in node.children())
    every = subtree_keys(root)
    keys = {id(n): every[id(n)] for n in nodes if scanning[id(n)]}
    seen: dict[bytes, int] = {}
    for key in keys.values():  # by node object: one shared by two parents is one subtree
        seen[key] = seen.get(key, 0) + 1
    out: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        known = keys.get(id(node))
        if known is not None and seen[known] > 1:
            out.add(id(node))
        else:
            stack.extend(node.children())
    return out


def link_consumers(stages: list[StageSpec]) -> None:
    """Each stage's ``consumers``: the stages that read it, once per read."""
    for stage in stages:
        stage.consumers = []
    for stage in stages:
        for read in stage.reads:
            stages[read.stage_id].consumers.append(stage.stage_id)


def align_task_counts(stages: list[StageSpec]) -> None:
    """Give the consumers of each shared hash output one task count, the largest planned.

    Such consumers are upper stages (a shuffle's reader has no feeds), whose count the planner
    chose from estimated rows and may raise. Raising one can make it differ from a fellow consumer
    of another shared output, so this repeats until nothing changes.
    """
    changed = True
    while changed:
        changed = False
        for stage in stages:
            if stage.output_mode not in ("hash", "round_robin") or not stage.shared:
                continue
            readers = [stages[c] for c in set(stage.consumers)]
            count = max(r.task_count for r in readers)
            for r in readers:
                if r.task_count != count:
                    assert not r.feeds and r.task_roots is None, f"stage {r.stage_id} reads a hash output yet is sized by its feeds"
                    r.task_count, r.max_tasks, changed = count, max(r.max_tasks, count), True
