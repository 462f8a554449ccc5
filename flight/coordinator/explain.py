"""``explain()``: the stage tree with each stage's tasks and workers, and what they measured."""

from __future__ import annotations

from typing import Protocol

from flight.coordinator.metrics import QueryMetrics
from flight.coordinator.recovery import Attempt
from flight.coordinator.resolver import WorkerResolver
from flight.planner.stages import QueryPlan, StageSpec

__all__ = ["Explained", "explain_plan"]


class Explained(Protocol):
    """What ``explain()`` reads of a ``DistributedExec``: its plan and its latest execution.

    A protocol, not the class: exec.py imports this module, and this one needs none of exec.py.
    """

    resolver: WorkerResolver
    plan: QueryPlan
    metrics: QueryMetrics | None
    query_id: str | None
    bound: dict[int, list[str]]
    attempts: list[Attempt]


def explain_plan(ex: Explained, analyze: bool) -> str:
    urls = ex.resolver.get_urls()
    lines: list[str] = []
    if ex.plan.rewrites:
        lines.append("Plan rewrites:")
        lines += [f"  - {r}" for r in ex.plan.rewrites]
    metrics = {t.stage_key: t for t in ex.metrics.tasks} if (analyze and ex.metrics) else {}
    for stage in reversed(ex.plan.stages):  # the head first, as the result flows up to it
        lines += _stage(ex, stage, urls, metrics)
    failed = [a for a in ex.attempts if a.replayed is None]
    replayed = [a for a in ex.attempts if a.replayed is not None]
    if failed:
        lines.append(f"Retried after losing workers ({len(failed)} failed attempt(s), then {ex.query_id}):")
        lines += [f"  - {a.describe()}" for a in failed]
    if replayed:
        lines.append(f"Recovered from losing workers ({len(replayed)} task(s) replaced, their units replayed):")
        lines += [f"  - {a.describe()}" for a in replayed]
    if ex.metrics is not None:
        if ex.metrics.notes:
            lines.append("Opening:")
            lines += [f"  - {n}" for n in ex.metrics.notes]
        lines.append(ex.metrics.summary())
    return "\n".join(lines)


def _accounting(ex: Explained, stage: StageSpec, metrics: dict) -> list[str]:
    """The rows a stage's tasks sent beside the rows its readers received (their streams checked by trailers)."""
    prefix = f"{ex.query_id}/{stage.stage_id}/"
    mine = [m for k, m in metrics.items() if k.startswith(prefix)]
    if not mine or stage.consumer is None:
        return []
    received = sum(rows for m in metrics.values() for sid, rows in m.inputs if sid == stage.stage_id)
    sent = sum(m.rows_out for m in mine)
    return [f"  rows: sent {sent:,}, received {received:,} by {'stages' if stage.shared else 'stage'} "
            f"{', '.join(map(str, stage.consumers)) if stage.shared else stage.consumer} ({stage.output_mode})"]


def _output(ex: Explained, stage: StageSpec, metrics: dict) -> list[str]:
    """The planner's estimate of a stage's output, which its choices (broadcast or shuffle, task counts)
    rested on, beside what the tasks produced after a run."""
    if stage.output_rows is None:
        return []
    line = f"  output: estimated ~{stage.output_rows:,.0f} rows, {(stage.output_bytes or 0) / (1 << 20):,.1f} MiB"
    mine = [m for k, m in metrics.items() if k.startswith(f"{ex.query_id}/{stage.stage_id}/")]
    if mine:
        line += f"; actual {sum(m.rows_out for m in mine):,} rows, {sum(m.bytes_out for m in mine) / (1 << 20):,.1f} MiB"
    return [line]


def _stage(ex: Explained, stage: StageSpec, urls: list[str], metrics: dict) -> list[str]:
    bound = ex.bound.get(stage.stage_id)
    pending = stage.sized_at_execution and stage.estimate is None
    count = f"up to {stage.max_tasks}" if pending and not bound else str(len(bound) if bound else stage.task_count)
    role = "head" if stage.consumer is None else f"-> stage {stage.consumer} ({stage.output_mode})"
    if stage.shared:
        role = f"-> stages {', '.join(map(str, stage.consumers))} ({stage.output_mode}, retained: read {len(stage.consumers)} times)"
    kind = "leaf" if stage.feeds else "values" if not stage.reads else "upper"
    lines = [f"Stage {stage.stage_id} [{kind}, {role}]: {count} task(s), {'bound' if bound else 'planned'} workers"]
    lines += [f"  note: {n}" for n in stage.notes]
    if stage.estimate is not None:
        lines.append(f"  estimate: {stage.estimate.describe()}")
    shared = {f.feed.feed_id for f in stage.shared_feeds}
    n = len(bound) if bound else (stage.max_tasks if pending else stage.task_count)
    for t, assigned in enumerate(stage.assignments(n)):
        url = bound[t] if bound else (urls[(stage.stage_id + t) % len(urls)] if urls else "?")
        feeds = ", ".join(f"{fid}{'[shared]' if fid in shared else parts}" for fid, parts in assigned.items())
        line = f"  task {t} -> {url}" + (f"  feeds: {feeds}" if feeds else "")
        key = f"{ex.query_id}/{stage.stage_id}/{t}"
        if key in metrics:
            m = metrics[key]
            units = sum(f.units for f in m.feeds)
            line += (
                f"  | rows in {m.rows_in}, out {m.rows_out}; {m.batches_out} batches; "
                f"{m.bytes_in} bytes in ({m.bytes_in_local} local), {m.bytes_out} out; {units} units; {m.elapsed_s * 1000:.1f} ms"
                + (f"; {m.engine}" if m.engine else "")
                + (f"; {scan}" if (scan := m.describe_scan()) else "")
            )
        lines.append(line)
        lines += [f"    note: {n}" for n in (metrics[key].notes if key in metrics else ())]
    lines += _output(ex, stage, metrics)
    lines += _accounting(ex, stage, metrics)
    lines += ["  " + line for line in stage.root.explain_lines()]
    return lines
