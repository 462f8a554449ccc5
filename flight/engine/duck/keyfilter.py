"""A broadcast build's keys kept by a scan below another join: the semi-join filter DuckDB does not place itself.

Why: DuckDB filters a probe side's scan by a join's build keys itself, but not a scan below the build side of
a join further down (that side is built first), and it orders joins by its estimates, which do not see how few
keys a filtered broadcast holds. TPC-H Q3's co-located stage at SF 10 joins half of orders (~3.6 million rows)
with lineitem, then with the broadcast customers of one market segment (a fifth of them); with orders first
kept to those customers' keys, a task's query took 0.92 s instead of 1.05 (one thread).

The translator (``flight.engine.duck.translate``) marks such a scan with a placeholder condition
(``KeyFilter``); once the stage's inputs are tables (``flight.engine.duck.units``), ``resolve`` makes it the
semi-join filter where the build holds at most half the keys the scan's footers allow (``max - min + 1`` of an
integer column), and ``TRUE`` elsewhere: a build of every customer (TPC-H Q5, Q7, Q8) filters nothing, and its
second hash table cost more than the first (Q7 took 1.8 times as long). A join side whose text holds a placeholder
is never taken for a copy of another (``flight.engine.duck.alike``): its rows may be fewer.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import duckdb
import pyarrow as pa

from flight.engine.duck.sqltext import ident
from flight.sources.providers import footer_range
from flight.wire._proto import plan_pb2

__all__ = ["KEEPS", "KeyFilter", "build_source", "key_source", "mark_scan", "resolve"]

KEEPS = 0.5
"""The largest share of the scan's possible keys a build may hold for its keys to filter the scan."""

_SOURCE = re.compile(r"__flight_source_[0-9]+(?![0-9A-Za-z_])")


@dataclass
class KeyFilter:
    """A scan's condition to be: ``placeholder`` in the text stands for ``column IN (build's keys)`` or ``TRUE``."""

    placeholder: str
    scan_path: str
    column: str
    source: str = ""
    """The broadcast's source name (``DuckTask.source``); its table is ``{source}_table`` once made."""
    build_key: str = ""


def mark_scan(join: plan_pb2.HashJoin, here: str, schemas: Mapping[str, pa.Schema], marked: dict[str, KeyFilter],
              names: Iterator[int]) -> KeyFilter | None:
    """For an inner join (at ``here``) whose build is another stage's broadcast rows, the scan its key comes from
    below another join (``key_source``) marked in ``marked`` by its path, to keep only the build's keys where they
    are few (``resolve``); None when there is no such scan. The caller fills in the build's source."""
    if join.join_type != "inner" or len(join.left_keys) != 1 or join.HasField("filter") or join.right.WhichOneof("kind") != "shuffle_read":
        return None
    found = key_source(join.left, f"{here}.left", join.left_keys[0], schemas)
    if found is None or found[0] in marked:
        return None
    kept = marked[found[0]] = KeyFilter(f"__flight_keys_{next(names)}__", *found, build_key=join.right_keys[0])
    return kept


def key_source(op: plan_pb2.Operator, path: str, name: str, schemas: Mapping[str, pa.Schema]) -> tuple[str, str] | None:
    """The path of the Parquet scan whose column ``name`` of ``op`` is, unchanged, and that column, when it passes
    through at least one join, and only through filters, renames, inner joins and a semi or anti join's left side
    (each drops a row whatever rows are beside it: dropping it sooner changes no answer); else None."""
    joins = 0
    while True:
        kind = op.WhichOneof("kind")
        here = f"{path}.{kind}"
        if kind == "feed_scan":
            ok = op.feed_scan.reader == "parquet" and joins > 0 and name in schemas[path].names
            return (path, name) if ok else None
        if kind == "filter":
            op, path = op.filter.input, f"{here}.input"
        elif kind == "project":
            expr = next((ne.expr for ne in op.project.exprs if ne.name == name), None)
            if expr is None or len(expr.nodes) != 1 or expr.nodes[0].WhichOneof("kind") != "field":
                return None
            op, path, name = op.project.input, f"{here}.input", expr.nodes[0].field.name
        elif kind == "hash_join" and op.hash_join.join_type in ("inner", "left semi", "left anti"):
            joins += 1
            j = op.hash_join
            if name in schemas[f"{here}.left"].names:
                op, path = j.left, f"{here}.left"
            elif j.join_type == "inner" and name in schemas[f"{here}.right"].names:
                op, path = j.right, f"{here}.right"
            else:
                return None
        else:
            return None


def build_source(right_text: str) -> str | None:
    """The one source a broadcast build's text reads (``SELECT * FROM __flight_source_N``), or None."""
    found = set(_SOURCE.findall(right_text))
    return found.pop() if len(found) == 1 else None


def resolve(cur: duckdb.DuckDBPyConnection, filters: Sequence[KeyFilter], files: Mapping[str, list[str]],
            text: str, builds: list[tuple[str, str]]) -> tuple[str, list[tuple[str, str]], list[str]]:
    """The query and its builds with each placeholder made the filter or ``TRUE`` (see the module docstring), and
    what was decided, in words (``TaskMetrics.notes``: explain() shows them). ``files``: each whole scan's local
    Parquet files by its path (a scan of other units is not filtered)."""
    notes = []
    for f in filters:
        condition = "TRUE"
        bound = _key_bound(files.get(f.scan_path, []), f.column)
        if bound is None or not f.source:
            notes.append(f"{f.column!r} not kept to a broadcast's {f.build_key!r} keys: no integer bound in its footers")
        else:
            table = f"{f.source}_table"
            found = cur.execute(f"SELECT count(*) FROM {table}").fetchall()  # all: the cursor then has no open result
            rows = int(found[0][0]) if found else bound
            kept = rows <= KEEPS * bound
            if kept:
                condition = f"{ident(f.column)} IN (SELECT {ident(f.build_key)} FROM {table})"
            notes.append(f"{f.column!r} {'kept' if kept else 'not kept'} to a broadcast's {f.build_key!r} keys: {rows:,} rows "
                         f"against {bound:,} values its footers allow")
        text = text.replace(f.placeholder, condition)
        builds = [(n, b.replace(f.placeholder, condition)) for n, b in builds]
    return text, builds, notes


def _key_bound(paths: list[str], column: str) -> int | None:
    """``max - min + 1`` of an integer column over the files' footers, or None when they do not bound it."""
    found = footer_range(paths, column)
    if found is None or not all(float(x).is_integer() and abs(x) <= 2**53 for x in found):
        return None
    return int(found[1]) - int(found[0]) + 1
