"""A checked stage plan as DuckDB SQL over the task's sources and unit fragments."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator

import pyarrow as pa

from flight.engine.duck.alike import Alike, alike_key
from flight.engine.duck.keyfilter import KeyFilter, build_source, mark_scan
from flight.engine.duck.sql import Untranslatable, column_list, expression_sql, ident, sql_type
from flight.engine.duck.sqltext import cast_to, named, string_literal
from flight.engine.duck.task import UNITS, DuckTask
from flight.engine.duck.units import WholeFeed, fragment_scan, unit_fragment
from flight.engine.readers import conform
from flight.errors import ProtocolError
from flight.wire._proto import plan_pb2
from flight.wire.ipc import read_ipc_stream
from flight.wire.protocol import decode_schema


class _Chains:
    """A query's inner joins written as one join list: ``FROM a, b, c WHERE a.k = b.k AND ...``.

    Why: a join written as a subquery of another (``(SELECT ... FROM a JOIN b ON ...) AS l JOIN c``)
    leaves DuckDB the order it was written in for its filters across joins, so a selective join's
    keys do not reach the scans they would prune. As one list, DuckDB orders every join of it as it
    does its own SQL: TPC-H Q5 at SF 0.1 took 16.7 ms instead of 21.1 (DuckDB's own text 15.5).
    Only for a query's only task (``Translator.query``); inner joins without a condition beside the
    keys, through projections that only pick columns; every other operator is a leaf of the list."""

    task: DuckTask

    def relation(self, op: plan_pb2.Operator, path: str) -> str:  # pragma: no cover - Translator's
        raise NotImplementedError

    def joins(self, op: plan_pb2.Operator, path: str, schema: pa.Schema) -> str:
        """``op``, an inner join (``_chain``), with the inner joins below it as one join list."""
        leaves: list[str] = []
        conds: list[str] = []
        refs = self._flat(op, path, leaves, conds, itertools.count())
        picked = ", ".join(named(ref, out) for ref, out in zip(refs, schema.names))
        return f"SELECT {picked} FROM {', '.join(leaves)} WHERE {' AND '.join(conds)}"

    def _chain(self, op: plan_pb2.Operator, path: str) -> bool:
        """Whether ``op`` (at ``path``) is such an inner join, or picks columns of one. Asked again at each level of
        a join list as ``_flat`` goes down it: remembered per path (a deep list's questions were a fifth of translating it)."""
        known: dict[str, bool] = self.__dict__.setdefault("_chained", {})
        if path not in known:
            known[path] = self._chain_of(op, path)
        return known[path]

    def _chain_of(self, op: plan_pb2.Operator, path: str) -> bool:
        kind = op.WhichOneof("kind")
        if kind == "project":
            if any(len(e.expr.nodes) != 1 or e.expr.nodes[0].WhichOneof("kind") != "field" for e in op.project.exprs):
                return False
            return self._unique(f"{path}.project.input") and self._chain(op.project.input, f"{path}.project.input")
        if kind != "hash_join" or op.hash_join.join_type != "inner" or op.hash_join.HasField("filter"):
            return False
        here = f"{path}.hash_join"
        sides = len(self.task.schemas[f"{here}.left"]) + len(self.task.schemas[f"{here}.right"])
        return sides == len(self.task.schemas[path]) and self._unique(f"{here}.left") and self._unique(f"{here}.right")

    def _flat(self, op: plan_pb2.Operator, path: str, leaves: list[str], conds: list[str], aliases: Iterator[int]) -> list[str]:
        """The qualified column of each output column of ``op`` (at ``path``); its leaves and join
        conditions appended to ``leaves`` and ``conds``, each leaf aliased ``j0``, ``j1``, ... within the list."""
        if not self._chain(op, path):
            alias = f"j{next(aliases)}"
            leaves.append(f"({self.relation(op, path)}) AS {alias}")
            return [f"{alias}.{ident(n)}" for n in self.task.schemas[path].names]
        if op.WhichOneof("kind") == "project":
            below = f"{path}.project.input"
            refs = dict(zip(self.task.schemas[below].names, self._flat(op.project.input, below, leaves, conds, aliases)))
            return [refs[e.expr.nodes[0].field.name] for e in op.project.exprs]
        join, here = op.hash_join, f"{path}.hash_join"
        left = dict(zip(self.task.schemas[f"{here}.left"].names, self._flat(join.left, f"{here}.left", leaves, conds, aliases)))
        right = dict(zip(self.task.schemas[f"{here}.right"].names, self._flat(join.right, f"{here}.right", leaves, conds, aliases)))
        conds.extend(f"{left[a]} = {right[b]}" for a, b in zip(join.left_keys, join.right_keys))
        return [*left.values(), *right.values()]

    def _unique(self, path: str) -> bool:
        schema = self.task.schemas[path]
        return len({f.name for f in schema}) == len(schema)


class Translator(_Chains):
    """Operators → SQL text over the task's sources (see the module docstring)."""

    def __init__(self, task: DuckTask, whole: bool = False, query: bool = False) -> None:
        self.task = task
        self.root_fragment: Iterator[pa.RecordBatch] | None = None
        self.whole = whole
        self.query = query
        self.feeds: list[WholeFeed] = []
        """``whole``: the stage is one query, each Parquet scan reading all of its task's units at once
        (``duck_units.whole_feeds``); these are its scans, their tokens filled in when the units are here."""
        self.builds: list[tuple[str, str]] = []
        """``whole``: each join's right side that is more than a scan (``_plain_scan``), made a table
        before the query (inner ones first), so that DuckDB orders the joins by true sizes; (name, query).
        Not for the query's only task (``query``): its text is the whole query, which DuckDB plans as
        it plans its own; a table first costs a write and a read (TPC-H at SF 0.1 and 1: Q3, Q5, Q11,
        Q17, Q18, Q20, Q22 took 0.79 to 0.98 of the time without their tables, Q2 the same)."""
        self.alike: dict[str, Alike] = {}
        """The builds' keys: one alike to an earlier build is not made again (``flight.engine.duck.alike``)."""
        self.exact_means: dict[str, dict[str, str]] = {}
        """By a projection's path: its columns an average reads as the DECIMAL column they cast (``decimal_means``)."""
        self.key_filters: dict[str, KeyFilter] = {}  # by a whole scan's path: a broadcast's keys it may keep (keyfilter.py)

    def sub(self, op: plan_pb2.Operator, path: str) -> str:
        """``op`` as a FROM item: a parenthesised query with an alias. Always ``t``: nothing names it (each
        query is a scope of its own), and equal subplans are then equal texts (``flight.engine.duck.shared``)."""
        return f"({self.relation(op, path)}) AS t"

    def relation(self, op: plan_pb2.Operator, path: str) -> str:
        if self.whole:
            if op.WhichOneof("kind") == "feed_scan" and op.feed_scan.reader == "parquet":
                text, kept = self.whole_scan(op.feed_scan, path), self.key_filters.get(path)
                return text if kept is None else f"SELECT * FROM ({text}) AS t WHERE {kept.placeholder}"
            return self.operator(op, path)
        if fragment_scan(op, path) is None:
            if op.WhichOneof("kind") == "aggregate":
                merged = self.local_partial(op, path)
                if merged is not None:
                    return merged
            return self.operator(op, path)
        fragment = _FragmentTranslator(self.task)
        text = fragment.relation(op, path)
        batches = unit_fragment(self.task, op, path, text, fragment.builds)
        if path == "plan.root":
            self.root_fragment = batches  # the whole stage is one fragment: its output is the task's
            return text
        # A unit fragment below other operators: its per-unit output is a source of this query.
        return f"SELECT * FROM {self.task.source(self.task.schemas[path], batches)}"

    def operator(self, op: plan_pb2.Operator, path: str) -> str:
        kind = op.WhichOneof("kind")
        here = f"{path}.{kind}"
        task = self.task
        schema = task.schemas[path]
        if kind == "feed_scan":  # not Parquet: the scan's own reader is a source
            return f"SELECT * FROM {task.source(schema, iter(task.scan_reader(op.feed_scan, here)))}"
        if kind == "values":
            table = read_ipc_stream(op.values.ipc_stream, f"{here}.ipc_stream")
            rows = table.to_batches() if task.inputs.task_number == 0 or op.values.every_task else []
            return f"SELECT * FROM {task.source(schema, iter(rows))}"
        if kind == "exchange_input":
            batches = (conform(b, schema, "an input batch") for b in task.inputs.input_batches())  # type: ignore[attr-defined]
            return f"SELECT * FROM {task.source(schema, batches)}"
        if kind == "shuffle_read":
            rd = op.shuffle_read
            producers = [(p.url, p.stage_key) for p in rd.producers]
            where = f"stage {rd.stage_id} output"
            read = task.read_partitions(producers, rd.partition_start, rd.partition_end)
            return f"SELECT * FROM {task.source(schema, (conform(b, schema, where) for b in read))}"
        if kind == "filter":
            child_schema = task.schemas[f"{here}.input"]
            predicate = expression_sql(op.filter.predicate, child_schema, f"{here}.predicate", predicate=True)
            scans = len(self.feeds)
            text = f"SELECT * FROM {self.sub(op.filter.input, f'{here}.input')} WHERE {predicate}"
            if len(self.feeds) > scans and self.feeds[-1].path == f"{here}.input":  # a whole scan right below
                self.feeds[-1] = dataclasses.replace(self.feeds[-1], above=(op.filter, f"{here}.predicate"))  # units pyarrow reads
            return text
        if kind == "project":
            return self.project(op.project, here, schema)
        if kind == "limit":
            lim = op.limit
            return f"SELECT * FROM {self.sub(lim.input, f'{here}.input')} LIMIT {int(lim.count)} OFFSET {int(lim.offset)}"
        if kind == "sort":
            srt = op.sort
            nulls = "NULLS FIRST" if srt.nulls_first else "NULLS LAST"
            keys = ", ".join(f"{ident(k.column)} {'DESC' if k.descending else 'ASC'} {nulls}" for k in srt.keys)
            fetch = f" LIMIT {int(srt.fetch)}" if srt.fetch else ""
            return f"SELECT * FROM {self.sub(srt.input, f'{here}.input')} ORDER BY {keys}{fetch}"
        if kind == "union":
            parts = [f"SELECT * FROM {self.sub(child, f'{here}.inputs[{i}]')}" for i, child in enumerate(op.union.inputs)]
            return " UNION ALL ".join(parts)
        if kind == "aggregate":
            return self.aggregate(op.aggregate, here, schema)
        if kind == "hash_join":
            return self.joins(op, path, schema) if self.query and self._chain(op, path) else self.join(op.hash_join, here, schema)
        if kind == "window":
            return self.window(op.window, here, schema)
        if kind == "unnest":  # DuckDB's unnest: a row per element; an empty or null list gives none
            un = op.unnest
            element = sql_type(schema.field(un.name).type)
            return f"SELECT *, CAST(unnest({ident(un.column)}) AS {element}) AS {ident(un.name)} FROM {self.sub(un.input, f'{here}.input')}"
        raise Untranslatable(f"operator {kind}")

    def window(self, win: plan_pb2.Window, here: str, schema: pa.Schema) -> str:
        """``SELECT *, f(...) OVER (...)``: the calls share the partition and the order."""
        over = []
        if win.partition_by:
            over.append(f"PARTITION BY {column_list(win.partition_by)}")
        if win.order_by:
            over.append("ORDER BY " + ", ".join(f"{ident(k.column)} {'DESC' if k.descending else 'ASC'} NULLS LAST" for k in win.order_by))
        items = ["*"]
        for c in win.calls:
            arg = ident(c.column) if c.column else ""
            text = {
                "row_number": "row_number()", "rank": "rank()", "dense_rank": "dense_rank()", "count_all": "count(*)",
                "lag": f"lag({arg}, {max(c.offset, 1)})", "lead": f"lead({arg}, {max(c.offset, 1)})", "mean": f"avg({arg})",
            }.get(c.function, f"{c.function}({arg})")
            frame = _frame(c.frame) if c.HasField("frame") else ""
            items.append(f"CAST({text} OVER ({' '.join(over)}{frame}) AS {sql_type(schema.field(c.name).type)}) AS {ident(c.name)}")
        return f"SELECT {', '.join(items)} FROM {self.sub(win.input, f'{here}.input')}"

    def whole_scan(self, scan: plan_pb2.FeedScan, path: str) -> str:
        feed = WholeFeed(scan, path, f"__flight_units_{next(self.task.names)}__")
        self.feeds.append(feed)
        schema = self.task.schemas[path]
        items = ", ".join(f"CAST({ident(f.name)} AS {sql_type(f.type)}) AS {ident(f.name)}" for f in schema)
        return f"SELECT {items} FROM {feed.token}"

    def local_partial(self, op: plan_pb2.Operator, path: str) -> str | None:
        """An aggregate over a unit fragment, split here as the planner splits one across stages:
        a partial aggregate per work unit (inside the fragment's query), merged by this query.

        The units' rows then never cross into Python; only each unit's groups do. None when the
        aggregate does not split (``count_distinct``, or a mean that is not a float).
        """
        agg = op.aggregate
        in_path = f"{path}.aggregate.input"
        if agg.partial or fragment_scan(agg.input, in_path) is None:
            return None
        task = self.task
        out, source = task.schemas[path], task.schemas[in_path]
        parts: list[str] = [ident(k) for k in agg.keys]
        fields: list[pa.Field] = [source.field(k) for k in agg.keys]
        merged: dict[str, str] = {}
        for i, a in enumerate(agg.aggregates):
            t = out.field(a.name).type
            p, arg = f"__part{i}", ident(a.column) if a.column else ""
            if a.function in ("count", "count_all"):
                parts.append(f"count({arg or '*'}) AS {p}")
                fields.append(pa.field(p, pa.int64()))
                merged[a.name] = f"coalesce(sum({p}), 0)"
            elif a.function in ("sum", "min", "max"):
                parts.append(f"CAST({a.function}({arg}) AS {sql_type(t)}) AS {p}")
                fields.append(pa.field(p, t))
                merged[a.name] = f"{a.function}({p})"
            elif a.function == "mean" and pa.types.is_floating(t):
                parts.append(f"CAST(sum({arg}) AS DOUBLE) AS {p}s, count({arg}) AS {p}c")
                fields += [pa.field(f"{p}s", pa.float64()), pa.field(f"{p}c", pa.int64())]
                merged[a.name] = f"(CASE WHEN sum({p}c) = 0 THEN NULL ELSE sum({p}s) / sum({p}c) END)"
            else:
                return None
        fragment = _FragmentTranslator(task)
        group = f" GROUP BY {column_list(agg.keys)}" if agg.keys else ""
        text = f"SELECT {', '.join(parts)} FROM ({fragment.relation(agg.input, in_path)}) AS t{group}"
        schema = pa.schema(fields)
        name = task.source(schema, unit_fragment(task, agg.input, in_path, text, fragment.builds, schema))
        items = [f"CAST({merged.get(f.name, ident(f.name))} AS {sql_type(f.type)}) AS {ident(f.name)}" for f in out]
        return f"SELECT {', '.join(items)} FROM {name}{group}"

    def aggregate(self, agg: plan_pb2.Aggregate, here: str, schema: pa.Schema) -> str:
        calls = {}
        for a in agg.aggregates:
            arg = ident(a.column) if a.column else ""
            calls[a.name] = {
                "count_all": "count(*)",
                "count": f"count({arg})",
                "count_distinct": f"count(DISTINCT {arg})",
                "sum": f"sum({arg})",
                "min": f"min({arg})",
                "max": f"max({arg})",
                "mean": f"avg({arg})",
                "var_samp": f"var_samp({arg})",
                "var_pop": f"var_pop({arg})",
                "stddev_samp": f"stddev_samp({arg})",
                "stddev_pop": f"stddev_pop({arg})",
                "median": f"median({arg})",
                "quantile_cont": f"quantile_cont({arg}, {float(a.fraction)!r})",
                "quantile_disc": f"quantile_disc({arg}, {float(a.fraction)!r})",
                "string_agg": f"string_agg({arg}, {string_literal(a.separator)}{_order_by(a)}){_filter(a)}",
                "array_agg": f"array_agg({arg}{_order_by(a)}){_filter(a)}",
            }[a.function]
        items = []
        below = self.task.schemas[f"{here}.input"]
        if agg.input.WhichOneof("kind") == "project":
            self.exact_means[f"{here}.input.project"] = decimal_means(agg, self.task.schemas[f"{here}.input.project.input"])
        for f in schema:
            text = calls.get(f.name, ident(f.name))
            if f.name not in calls and below.field(f.name).type == f.type:
                items.append(named(text, f.name))  # a group key as it was: already of its type
            else:
                items.append(named(cast_to(text, f.type), f.name))
        group = f" GROUP BY {column_list(agg.keys)}" if agg.keys else ""
        return f"SELECT {', '.join(items)} FROM {self.sub(agg.input, f'{here}.input')}{group}"

    def project(self, project: plan_pb2.Project, here: str, schema: pa.Schema) -> str:
        child_schema = self.task.schemas[f"{here}.input"]
        items = []
        exact = self.exact_means.get(here, {})
        for i, ne in enumerate(project.exprs):
            if ne.name in exact:  # read only by an average, which takes the DECIMAL itself
                items.append(named(ident(exact[ne.name]), ne.name))
                continue
            text = expression_sql(ne.expr, child_schema, f"{here}.exprs[{i}].expr")
            target = schema.field(i).type
            items.append(named(text, ne.name) if _column_of(ne.expr, child_schema) == target else
                         named(cast_to(text, target), ne.name))
        return f"SELECT {', '.join(items)} FROM {self.sub(project.input, f'{here}.input')}"

    def right_side(self, join: plan_pb2.HashJoin, here: str) -> str:
        text = self.relation(join.right, f"{here}.right")
        if not self.whole or self.query or _plain_scan(join.right) or join.right.WhichOneof("kind") == "shuffle_read":
            # Another stage's rows are made a table of their own before the query (``whole_feeds``):
            # built again, they were copied into a second table (TPC-H Q9, Q16, Q17, Q20).
            return f"({text})"
        name = f"__flight_whole_build_{next(self.task.names)}__"
        self.builds.append((name, text))
        key = alike_key(join.right, {f.scan.feed.feed_id: f.token for f in self.feeds})
        if key is not None and "__flight_keys_" not in text:  # a scan in it may keep a broadcast's keys: not a copy
            self.alike[name] = Alike(key, tuple(self.task.schemas[f"{here}.right"].names))
        return name

    def join(self, join: plan_pb2.HashJoin, here: str, schema: pa.Schema) -> str:
        left = self.task.schemas[f"{here}.left"]
        right = self.task.schemas[f"{here}.right"]
        kind = {"inner": "JOIN", "left outer": "LEFT JOIN", "right outer": "RIGHT JOIN", "full outer": "FULL JOIN",
                "left semi": "SEMI JOIN", "left anti": "ANTI JOIN"}[join.join_type]
        on = " AND ".join(f"l.{ident(a)} = r.{ident(b)}" for a, b in zip(join.left_keys, join.right_keys))
        if join.HasField("filter"):  # the sides' names differ (checked): unqualified names are unambiguous
            both = pa.schema([*left, *right])
            on += f" AND ({expression_sql(join.filter, both, f'{here}.filter', predicate=True)})"
        sides = [("l", n) for n in left.names]
        if join.join_type not in ("left semi", "left anti"):
            sides += [("r", n) for n in right.names]
        if len(sides) != len(schema):
            raise Untranslatable("a join whose output is not its inputs' columns")
        items = [named(f"{q}.{ident(n)}", out) for (q, n), out in zip(sides, schema.names)]
        kept = mark_scan(join, here, self.task.schemas, self.key_filters, self.task.names) if self.whole and not self.query else None
        lsub = f"({self.relation(join.left, f'{here}.left')}) AS l"
        rsub = f"{self.right_side(join, here)} AS r"
        if kept is not None:
            kept.source = build_source(rsub) or ""
        return f"SELECT {', '.join(items)} FROM {lsub} {kind} {rsub} ON {on}"


class _FragmentTranslator(Translator):
    """A unit fragment's query: the scan reads ``UNITS`` (one unit's file, filled in per unit), and
    a join's right side is a table built once (``builds``) by a query over the task's sources."""

    def __init__(self, task: DuckTask) -> None:
        super().__init__(task)
        self.builds: list[tuple[str, str]] = []

    def right_side(self, join: plan_pb2.HashJoin, here: str) -> str:
        table = f"__flight_build_{next(self.task.names)}"
        self.builds.append((table, Translator(self.task).relation(join.right, f"{here}.right")))
        return table

    def relation(self, op: plan_pb2.Operator, path: str) -> str:
        if op.WhichOneof("kind") == "feed_scan":
            schema = self.task.schemas[path]
            items = ", ".join(f"CAST({ident(f.name)} AS {sql_type(f.type)}) AS {ident(f.name)}" for f in schema)
            return f"SELECT {items} FROM {UNITS}"
        return self.operator(op, path)


def decimal_means(agg: plan_pb2.Aggregate, below: pa.Schema) -> dict[str, str]:
    """The columns of the aggregate's input projection that only averages read and that cast a DECIMAL
    column (of at most 18 digits) to DOUBLE, each with that column's name.

    Why: DuckDB averages a DECIMAL exactly (its sum in 128 bits, divided once), as in its own text
    ``avg(l_quantity)``; the plan's average of DOUBLEs (its meaning on every engine: ``flight.plan.agg.mean``)
    converts each row first, which cost TPC-H Q1 a sixth of its time (DuckDB's own text with its averages
    of DOUBLEs takes as long as ours). The answer is the same average, rounded once rather than per row."""
    means = {a.column for a in agg.aggregates if a.function == "mean"}
    others = {*agg.keys, *(a.column for a in agg.aggregates if a.function != "mean"), *(a.filter for a in agg.aggregates)}
    others |= {o.column for a in agg.aggregates for o in a.order}
    out: dict[str, str] = {}
    for ne in agg.input.project.exprs:
        if ne.name in means and ne.name not in others and (column := _decimal_cast_to_double(ne.expr, below)) is not None:
            out[ne.name] = column
    return out


def _decimal_cast_to_double(expr: plan_pb2.Expression, schema: pa.Schema) -> str | None:
    """The column ``expr`` casts to DOUBLE (casts to DOUBLE only, of one DECIMAL(<= 18) column), else None."""
    nodes = expr.nodes
    if len(nodes) < 2 or nodes[0].WhichOneof("kind") != "field":
        return None
    for i, node in enumerate(nodes[1:], 1):
        call = node.call
        if node.WhichOneof("kind") != "call" or call.function != "cast" or list(call.args) != [i - 1]:
            return None
        if call.options.WhichOneof("kind") != "cast" or _cast_target(call.options.cast.target_type) != pa.float64():
            return None
    index = schema.get_field_index(nodes[0].field.name)
    t = schema.field(index).type if index >= 0 else None
    return nodes[0].field.name if isinstance(t, pa.Decimal128Type) and t.precision <= 18 else None


def _cast_target(ipc_schema: bytes) -> pa.DataType | None:
    try:
        schema = decode_schema(ipc_schema, "cast.target_type")
    except ProtocolError:
        return None  # the compile checked it already: not a case to take
    return schema.field(0).type if len(schema) == 1 else None


def _column_of(expr: plan_pb2.Expression, schema: pa.Schema) -> pa.DataType | None:
    """The type of the column ``expr`` passes through as it is (None: it computes something).

    Such a column needs no cast to its type: every operator's output is of its plan type already.
    A cast of a bare column, even to its own type, is not free in DuckDB: over TPC-H at SF 0.1 the
    projections' casts of columns cost 5 to 8% of DuckDB's time (Q3, Q5, Q9, Q14)."""
    nodes = expr.nodes
    return schema.field(nodes[0].field.name).type if len(nodes) == 1 and nodes[0].WhichOneof("kind") == "field" else None


def _frame(frame: plan_pb2.WindowFrame) -> str:
    def bound(unbounded: bool, offset: int, side: str) -> str:
        if unbounded:
            return f"UNBOUNDED {side}"
        if offset == 0:
            return "CURRENT ROW"
        return f"{abs(int(offset))} {'PRECEDING' if offset < 0 else 'FOLLOWING'}"

    start = bound(frame.start_unbounded, frame.start, "PRECEDING")
    return f" {'RANGE' if frame.range else 'ROWS'} BETWEEN {start} AND {bound(frame.end_unbounded, frame.end, 'FOLLOWING')}"


def _plain_scan(op: plan_pb2.Operator) -> bool:
    """Whether ``op`` only filters and projects a Parquet scan. Such a join side stays in the query:
    DuckDB knows its size from the footers, may build the other side instead (a semi join whose
    probe side is the smaller: TPC-H Q4's orders against lineitem), and pushes the join's key filter
    into its scan; made a table first, it is read and written whole (Q4: 37 of 49 ms)."""
    while True:
        kind = op.WhichOneof("kind")
        if kind == "feed_scan":
            return op.feed_scan.reader == "parquet"
        if kind not in ("filter", "project"):
            return False
        op = getattr(op, kind).input


def _order_by(a: plan_pb2.AggregateCall) -> str:
    """An ordered aggregate's ORDER BY (empty: any order)."""
    keys = [f"{ident(o.column)} {'DESC' if o.descending else 'ASC'} NULLS {'FIRST' if o.nulls_first else 'LAST'}" for o in a.order]
    return f" ORDER BY {', '.join(keys)}" if keys else ""


def _filter(a: plan_pb2.AggregateCall) -> str:
    return f" FILTER (WHERE {ident(a.filter)})" if a.filter else ""
