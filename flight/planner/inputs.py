"""Stages that read an input call (rows another process sends: ``flight.spark.table``).

Kept apart from the cutter: such a stage is sized by its input, not by the workers (one task
per partition, each fed by one sender), and an input feeds one stage only, since its rows are
sent once. Both rules are checked here, at planning, before any task opens.
"""

from __future__ import annotations

from flight.errors import PlanError
from flight.plan.nodes import InputCallNode
from flight.planner.frag import Frag
from flight.planner.stages import StageSpec

__all__ = ["check_inputs_read_once", "fix_to_input", "refuse_unsent_inputs"]


def fix_to_input(spec: StageSpec, frag: Frag, inputs: list[InputCallNode]) -> None:
    """A stage reading an input call has exactly one task per partition of its input (fixed count)."""
    if len(inputs) > 1 or frag.tasks != inputs[0].partitions:
        names = ", ".join(n.input_id for n in inputs)
        raise PlanError(
            f"a stage would read more than one input ({names}) or not one task per partition; two single-partition "
            "DataFrames meet in one task: give one of them more partitions (flight.spark.table(df, partitions=2))"
        )
    spec.task_roots = [frag.node] * frag.tasks
    spec.notes.append(f"input {inputs[0].input_id}: {frag.tasks} tasks, one per partition, its rows sent by another process (fixed count)")


def check_inputs_read_once(stages: list[StageSpec]) -> None:
    """Each input feeds one stage: its rows are sent once (a second use must read that stage again)."""
    seen: dict[str, int] = {}
    for stage in stages:
        for n in stage.root.walk():
            if isinstance(n, InputCallNode):
                if n.input_id in seen and seen[n.input_id] != stage.stage_id:
                    raise PlanError(
                        f"input {n.input_id} would be read by stages {seen[n.input_id]} and {stage.stage_id}; "
                        "its rows are sent once: use it once in the query (flight.spark.table(df) again makes a second input)"
                    )
                seen[n.input_id] = stage.stage_id


def refuse_unsent_inputs(stages: list[StageSpec], how: str) -> None:
    """A plan with inputs runs only where something sends them (``flight.spark.read``/``sql``):
    elsewhere its input tasks would wait for rows that never come."""
    ids = sorted({n.input_id for st in stages for n in st.root.walk() if isinstance(n, InputCallNode)})
    if ids:
        raise PlanError(f"the query reads {', '.join(ids)}, rows another process sends (flight.spark.table): {how} cannot send "
                        "them; run it with flight.spark.read or flight.spark.sql")
