"""Progress bars while a query runs: one per stage, its tasks done out of its tasks, in a terminal or Jupyter.

``DistributedExec.execute(progress=True)`` (or ``ExecOptions(progress=True)``) draws them with
``rich`` (the ``progress`` extra), which renders in a terminal and in a Jupyter notebook alike. A
thread looks at the attempt's task channels five times a second, and the bars go when the result has
been read (or the query ended). Nothing here touches a channel: it only reads the events the
channels set (a task finished, or its exchange ended).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from flight.errors import PlanError

__all__ = ["StageBars"]


class StageBars:
    """Bars for the stages of whatever attempt ``current()`` returns (a ``Run``, or None before it exists)."""

    def __init__(self, current: Callable[[], Any], query: str = "query", console: Any = None) -> None:
        try:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        except ImportError:
            raise PlanError("progress bars need rich: pip install 'flight-exec[progress]'") from None
        self._current = current
        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), transient=True, console=console
        )
        self._bars: dict[int, Any] = {}
        self._query = query
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="progress", daemon=True)

    def start(self) -> StageBars:
        self._progress.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(2.0)
        self._update()
        self._progress.stop()

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            self._update()

    def _update(self) -> None:
        run = self._current()
        if run is None:
            return
        for stage in run.plan.stages:
            channels = list(run.by_stage.get(stage.stage_id, []))
            done = sum(1 for c in channels if c.finished.is_set() or c.done.is_set())
            bar = self._bars.get(stage.stage_id)
            if bar is None:
                role = "head" if stage.consumer is None else f"-> {', '.join(map(str, stage.consumers))}"
                bar = self._bars[stage.stage_id] = self._progress.add_task(f"{self._query} stage {stage.stage_id} ({role})", total=None)
            self._progress.update(bar, completed=done, total=len(channels) or None)
