"""A crowded plan (a text whose one task would hold too many sources: every subplan it repeats is a stage of its
own) is cut again with each repeat computed where it is used when those stages would move more than
``small.CROWDED_MOVES_BYTES`` and one worker's source threads hold the whole (``flight.planner.cut.plan_query``).

On the TPC-DS corpus (SF 0.01: its estimates are small, so the bound is lowered to 0 here to exercise the cut):
q64 with its CTE written out at each of its two uses (as a view is inlined: its own text's CTE is planned once and
computed once, ``flight.planner.optimize.push_filters``) keeps its stages at the default bound and loses them below it, saying so;
q14 (more sources than a worker has) keeps them whatever the bound; q64 cut again answers as DuckDB on two
real workers, every plan forced into stages. (q04, the first crowded text, is no longer one: its CTE's uses
stopped reading each other's keys, ``flight.planner.keysets``.)
"""

from __future__ import annotations

import re

import pytest
from tpcds_support import answer, catalog, data_root, difference, ordered, texts

import flight
from flight.planner import small
from flight.planner.cut import plan_query
from flight.planner.small import WORKER_SOURCES, source_count, too_many_sources

NOTE = "a stage per repeated subplan would move"
STAGED = {"one_host_query_bytes": 0, "small_query_bytes": 0}


def inlined(text: str, name: str) -> str:
    """``text`` with its CTE ``name`` cut out and its body written at each use (``FROM name alias``)."""
    found = re.search(rf"\b{name}\s+AS\s*\(", text, re.I)
    assert found is not None
    depth, end = 0, found.end() - 1
    for end in range(found.end() - 1, len(text)):
        depth += {"(": 1, ")": -1}.get(text[end], 0)
        if depth == 0:
            break
    body = text[found.end() - 1 : end + 1]
    rest = text[: found.start()].rstrip().rstrip(",") + " " + text[end + 1 :].lstrip().lstrip(",")
    return re.sub(rf"\b{name}\s+(\w+)", lambda m: f"{body} {m.group(1)}", rest)


def q64_inlined() -> str:
    return inlined(texts()[64], "cross_sales")


def planned(n: int, workers: int = 2) -> flight.DistributedExec:
    text = q64_inlined() if n == 64 else texts()[n]
    return flight.DistributedExec(flight.sql(text, flight.Catalog(catalog())), [f"grpc://127.0.0.{2 + i}:1" for i in range(workers)],
                                  **STAGED)


def test_q64_computes_its_cte_once_and_is_not_cut_again() -> None:
    ex = flight.DistributedExec(flight.sql(texts()[64], flight.Catalog(catalog())), ["grpc://127.0.0.2:1", "grpc://127.0.0.3:1"], **STAGED)
    assert any("the OR of its 2 uses' filters" in r for r in ex.plan.rewrites), ex.explain()
    assert not any(NOTE in r for r in ex.plan.rewrites)


def test_q64_is_crowded_and_keeps_a_stage_per_repeat_while_they_move_little() -> None:
    ex = planned(64)
    assert len(ex.stages) > 3 and not any(NOTE in r for r in ex.plan.rewrites)


def test_q64_is_cut_again_when_its_repeats_would_move_more_than_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    crowded = len(planned(64).stages)
    monkeypatch.setattr(small, "CROWDED_MOVES_BYTES", 0)
    ex = planned(64)
    assert len(ex.stages) < crowded
    assert any(NOTE in r and f"up to {WORKER_SOURCES} source threads" in r for r in ex.plan.rewrites)
    assert not any("is computed once and read again" in r for r in ex.plan.rewrites)


def test_more_sources_than_a_worker_has_keep_their_stages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(small, "CROWDED_MOVES_BYTES", 0)
    root = flight.sql(texts()[14], flight.Catalog(catalog())).node
    assert too_many_sources(root) and source_count(root) > WORKER_SOURCES
    plan = plan_query(root, 2)
    assert not any(NOTE in r for r in plan.rewrites)


@pytest.mark.slow
def test_q64_cut_again_answers_as_duckdb(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(small, "CROWDED_MOVES_BYTES", 0)
    q = flight.sql(q64_inlined(), flight.Catalog(catalog()))
    with flight.LocalCluster(2, data_roots=[data_root()]) as c:
        ex = flight.DistributedExec(q, c.urls, **STAGED)
        got = ex.to_table()
    assert any(NOTE in r for r in ex.plan.rewrites)
    why = difference(got, answer(64), ordered(texts()[64]))
    assert why is None, why
