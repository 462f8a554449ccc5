"""A scalar subquery's global aggregate, finished in each task that reads it instead of in a stage of its own.

Why: a scalar subquery (an aggregate without keys) is partial aggregates in the tasks that scan, gathered
into one task that finishes the aggregate and broadcasts its one row. Instead the producers broadcast
their partial rows and every reading task finishes the aggregate itself (a few rows each): one stage and
one hop fewer before the reader's query (TPC-H Q11, Q15, Q22).

The same subquery read twice (a probe side read a second time to reduce a semi join's build side,
``flight.planner.semibuild``: TPC-H Q22's ``c_acctbal > (SELECT avg(...))``) is one stage: the second
use's partial stage, equal to the first's, is dropped and the first's broadcast read instead. Computed
twice, the two stages ran at once on each core, before everything else (Q22 at SF 10 on two one-core
hosts: two 185 ms stages). Only a stage made for that read alone is dropped: one a cut handed to another use
too (``reused``: a union's branch reading the same average gathered) stays, or that use would read whatever
stage took its id next.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from flight.plan.nodes import FilterNode, ProjectNode
from flight.plan.relnodes import AggregateNode, ShuffleReadNode
from flight.planner.frag import Frag
from flight.planner.replicate import substitute_reads
from flight.planner.stages import StageSpec

__all__ = ["finished_in_each_task"]


class Cutter(Protocol):
    """What this needs of the cutter: its stages, their fingerprints (``made``), those already finished in
    each task (``finished``), those handed out to more than one use (``reused``), and its notes."""

    stages: list[StageSpec]
    made: dict[bytes, int]
    finished: dict[bytes, int]
    reused: set[int]
    rewrites: list[str]


def finished_in_each_task(planner: Cutter, f: Frag) -> Frag | None:
    """``f``, a one-task final aggregate of gathered partial aggregates, as read by each task that reads
    it (the partials broadcast); None for anything else."""
    if f.tasks != 1 or f.feeds or not f.reads or f.rows is None or f.rows > 1:
        return None
    if not all(isinstance(n, (ProjectNode, FilterNode, AggregateNode, ShuffleReadNode)) for n in f.node.walk()):
        return None
    producers = [planner.stages[r.stage_id] for r in f.reads]
    if any(r.mode != "gather" or not (isinstance(p.root, AggregateNode) and p.root.partial and not p.root.keys)
           for r, p in zip(f.reads, producers)):
        return None
    inline: dict[int, ShuffleReadNode] = {}
    keys = {stage: key for key, stage in planner.made.items()}
    for r, p in sorted(zip(f.reads, producers), key=lambda rp: -rp[0].stage_id):  # the newest first: it may be dropped
        key = keys.get(r.stage_id)
        earlier = planner.finished.get(key) if key is not None else None
        if (key is not None and earlier is not None and r.stage_id == len(planner.stages) - 1 and not p.reads
                and r.stage_id not in planner.reused):
            # Made just now for this read alone (no other use was handed it; it reads no stage, so none is left
            # unread), and equal to one already broadcast.
            planner.stages.pop()
            del planner.made[key]
            inline[r.stage_id] = replace(r, stage_id=earlier, mode="broadcast")
            planner.rewrites.append(f"stage {earlier} is computed once and read again (the same scalar subquery twice)")
            continue
        p.output_mode = "broadcast"
        planner.made = {k: v for k, v in planner.made.items() if v != r.stage_id}  # no other use may read it as gathered
        if key is not None:
            planner.finished[key] = r.stage_id
        inline[r.stage_id] = replace(r, mode="broadcast")
    planner.rewrites.append(f"the global aggregate over stage(s) {sorted({r.stage_id for r in inline.values()})} is "
                            "finished by each task reading it: their partial rows are broadcast, not gathered into a stage of its own")
    return Frag(substitute_reads(f.node, inline), 1, f.rows, [], list(inline.values()))  # type: ignore[arg-type]
