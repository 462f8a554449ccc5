"""Progress bars while a query runs (``execute(progress=True)``): a bar per stage, the same rows."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

import flight
from flight.coordinator.progress import StageBars
from support import sorted_table


def test_progress_shows_a_bar_per_stage_and_changes_no_row(cluster: flight.LocalCluster, parquet_files: list[Path],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    query = flight.read_parquet(parquet_files).aggregate(["name"], n=flight.agg.count_all()).sort("name")
    screen = io.StringIO()
    made: list[StageBars] = []
    original = StageBars.__init__

    def on_screen(self: StageBars, current: object, query: str = "query", console: object = None) -> None:
        original(self, current, query, Console(file=screen, force_terminal=True, width=120))
        made.append(self)

    monkeypatch.setattr(StageBars, "__init__", on_screen)
    ex = flight.DistributedExec(query, cluster.urls)
    with_bars = ex.execute(progress=True).read_all()
    assert made, "execute(progress=True) drew no bars"
    drawn = screen.getvalue()
    for stage in ex.plan.stages:
        assert f"stage {stage.stage_id}" in drawn, drawn[-2000:]
    assert "(head)" in drawn
    assert sorted_table(with_bars).equals(sorted_table(flight.DistributedExec(query, cluster.urls).to_table()))


def test_without_rich_progress_is_refused_clearly(cluster: flight.LocalCluster, parquet_files: list[Path],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_rich(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("rich"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_rich)
    with pytest.raises(flight.PlanError, match=r"progress bars need rich: pip install 'flight-exec\[progress\]'"):
        flight.DistributedExec(flight.read_parquet(parquet_files), cluster.urls).execute(progress=True)


def test_progress_is_a_live_view_of_the_latest_execute(cluster: flight.LocalCluster, parquet_files: list[Path]) -> None:
    """``DistributedExec.progress()``: nothing before ``execute()``; while its reader lives, each stage with its
    tasks, all finished once the rows are read, their rows out adding up to what the head received."""
    query = flight.read_parquet(parquet_files).aggregate(["name"], n=flight.agg.count_all())
    ex = flight.DistributedExec(query, cluster.urls, small_query_bytes=0)
    assert ex.progress() == []
    reader = ex.execute()
    table = reader.read_all()
    stages = ex.progress()
    assert [s.stage_id for s in stages] == [s.stage_id for s in ex.plan.stages]
    assert all(s.done == len(s.tasks) > 0 and all(t.state == "finished" for t in s.tasks) for s in stages), stages
    head = stages[-1]
    assert head.consumers == () and sum(t.rows_out for t in head.tasks) == table.num_rows
