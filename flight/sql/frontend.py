"""SQL text to DataFusion's optimized logical plan: statements, the session, and errors a person can act on.

DataFusion parses, resolves, type-checks, decorrelates and optimizes (docs/sql.md says why it
and not sqlglot: 3.8 ms against 44 ms median over the 22 TPC-H queries, and subqueries come
out as joins). It plans only: every table is registered as an empty in-memory table of its
schema, so nothing is read and nothing runs here. Its session is set to DuckDB's semantics
where they differ: NULLS LAST by default, a number with a point is a DECIMAL.

The text may hold several statements: ``CREATE [OR REPLACE] VIEW`` and ``DROP VIEW`` shape the
session, and exactly one query is the result (TPC-H Q15). Any other statement is refused before
DataFusion sees it: ``CREATE EXTERNAL TABLE`` would read the coordinator's files while planning.
"""

from __future__ import annotations

import difflib
import re
import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from flight.errors import PlanError
from flight.sql.library import declare

__all__ = ["Statement", "number_placeholders", "plan_text", "position", "split_statements"]

_SETTINGS = {
    "datafusion.sql_parser.default_null_ordering": "nulls_last",
    "datafusion.sql_parser.parse_float_as_decimal": "true",
    "datafusion.sql_parser.map_string_types_to_utf8view": "false",
    "datafusion.optimizer.enable_physical_uncorrelated_scalar_subquery": "false",  # a join instead
    # Two passes of the rules, not three: on the 22 TPC-H queries the third changed no plan and cost
    # a fifth of the optimizer's time (0.47 ms a query); the worker's DuckDB optimizes its SQL again.
    "datafusion.optimizer.max_passes": "2",
}

_DIALECT_SETTINGS = {
    # Spark's text reaches DataFusion in PostgreSQL's spelling (flight.sql.spark), where sqlglot writes each null order
    # that differs from PostgreSQL's default: read with that default, a Spark ASC sorts NULLS FIRST and DESC NULLS LAST.
    "spark": {"datafusion.sql_parser.default_null_ordering": "nulls_max"},
}
"""Settings of one dialect's sessions over ``_SETTINGS`` (DuckDB's semantics)."""

DIALECTS = {"duckdb": "duckdb", "generic": "generic", "postgres": "postgresql", "spark": "postgresql"}
"""The dialects ``flight.sql`` takes, and the DataFusion parser dialect each one uses (Spark's text
is first rewritten in PostgreSQL's spelling by ``flight.sql.spark``)."""


class Statement:
    """One statement of the text: where it starts (line, column: 1-based) and its text."""

    def __init__(self, text: str, line: int, column: int) -> None:
        self.text, self.line, self.column = text, line, column
        self.in_subquery = True
        """Whether the query holds an ``IN (subquery)`` (its plan as written shows one): a mark join may then be
        an IN's, whose mark is never null where SQL's is (``flight.sql.joins._mark``). Set when it is planned."""
        self.schema: pa.Schema | None = None
        """The query's output as DataFusion types it (set when it is planned): a CTE planned alone is then known to the
        rest of its text with the types it had inlined (``flight.sql.ctes``)."""

    def keywords(self) -> list[str]:
        return re.findall(r"[a-z_]+", _strip_comments(self.text).lower())[:4]


def _code(text: str, backslash: bool = False) -> Iterator[int]:
    """The offsets of ``text``'s characters outside quotes and comments (``backslash``: Spark's strings, where a
    backslash escapes the next character)."""
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in "'\"`":
            i = _quote_end(text, i, backslash and c != "`")
        elif text.startswith("--", i):
            end = text.find("\n", i)
            i = n if end == -1 else end + 1
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end == -1 else end + 2
        else:
            yield i
            i += 1


def _quote_end(text: str, i: int, backslash: bool) -> int:
    """The offset just past the quoted text that starts at ``i`` (its end, if it is not closed)."""
    c, n = text[i], len(text)
    j = i + 1
    while j < n:
        if backslash and text[j] == "\\":
            j += 2
        elif text[j] == c:
            if j + 1 < n and text[j + 1] == c:  # a doubled quote inside
                j += 2
            else:
                return j + 1
        else:
            j += 1
    return n


def split_statements(text: str, backslash: bool = False) -> list[Statement]:
    """The statements of ``text``, split at semicolons outside quotes and comments (``backslash``: as ``_code``)."""
    out: list[Statement] = []
    start = 0
    body = text.rstrip()
    if ";" not in body[:-1]:  # one statement, perhaps ended by its ";": no need to walk the text character by character
        _add(out, text, 0, len(body) - 1 if body.endswith(";") else len(text))
        return out
    for i in _code(text, backslash):
        if text[i] == ";":
            _add(out, text, start, i)
            start = i + 1
    _add(out, text, start, len(text))
    return out


def number_placeholders(text: str, backslash: bool = False) -> str:
    """``text`` with each ``?`` parameter (JDBC's and ADBC's) numbered as DataFusion's ``$1``, ``$2``, …"""
    marks = [i for i in _code(text, backslash) if text[i] == "?"] if "?" in text else []
    for n, i in reversed(list(enumerate(marks, 1))):
        text = f"{text[:i]}${n}{text[i + 1:]}"
    return text


def _add(out: list[Statement], text: str, start: int, end: int) -> None:
    piece = text[start:end]
    if not _strip_comments(piece).strip():
        return
    lead = len(piece) - len(piece.lstrip())
    line, column = _line_column(text, start + lead)
    out.append(Statement(piece.strip(), line, column))


def _line_column(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def _strip_comments(text: str) -> str:
    return re.sub(r"--[^\n]*|/\*.*?\*/", " ", text, flags=re.S)


def position(statement: Statement, word: str) -> str:
    """``line L:C`` of the first whole-word ``word`` in ``statement`` (case-insensitive), or ''."""
    match = re.search(rf"(?<![\w.]){re.escape(word)}(?!\w)", statement.text, flags=re.I)
    if match is None:
        return ""
    before = statement.text[: match.start()]
    line = statement.line + before.count("\n")
    column = (statement.column if "\n" not in before else 1) + len(before) - (before.rfind("\n") + 1)
    return f"line {line}:{column}"


class _Session:
    """A kept DataFusion session and the table schemas it knows (by name)."""

    def __init__(self, ctx: Any, tables: dict[str, pa.Schema]) -> None:
        self.ctx, self.tables = ctx, tables

    def know(self, schemas: dict[str, pa.Schema]) -> None:
        """Know exactly ``schemas``: a table it knew that the text may not name is dropped (so that
        it is "not found", as it would be in a fresh session), one whose schema changed is registered anew."""
        for name in [n for n, known in self.tables.items() if schemas.get(n) != known]:
            self.ctx.deregister_table(name)
            del self.tables[name]
        for name, schema in schemas.items():
            if name not in self.tables:
                _register(self.ctx, name, schema)
                self.tables[name] = schema


class _Sessions:
    """DataFusion sessions kept for the next query of their dialect.

    Why: making a session costs ~0.1 ms and registering a table ~0.15 ms, a tenth of planning a
    small query; TPC-DS names 3 to 10 of its 24 tables a query, a different few each time. A kept
    session is brought to know exactly the tables the next text may name, registering only those
    it did not know (``_Session.know``). A session only plans queries (``SQLOptions`` refuse DDL,
    DML and statements), so one that planned a query is as it was; a text with views makes a session
    of its own, never kept. One query at a time uses a session (taken out, put back); at most
    ``_KEEP`` are kept per dialect (one per query planned at once)."""

    _KEEP = 8

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[str, list[_Session]] = {}

    def take(self, schemas: dict[str, pa.Schema], dialect: str) -> _Session:
        with self._lock:
            idle = self._idle.get(dialect)
            kept = idle.pop() if idle else None
        if kept is None:
            return _Session(session(schemas, dialect), dict(schemas))
        kept.know(schemas)
        return kept

    def give_back(self, dialect: str, kept: _Session) -> None:
        with self._lock:
            idle = self._idle.setdefault(dialect, [])
            if len(idle) < self._KEEP:
                idle.append(kept)


_SESSIONS = _Sessions()


def session(schemas: dict[str, pa.Schema], dialect: str) -> Any:
    """A DataFusion session that knows each table by its schema (and holds no data)."""
    try:
        import datafusion
    except ImportError:
        raise PlanError("flight.sql needs DataFusion's SQL planner: pip install 'flight-exec[sql]'") from None
    if dialect not in DIALECTS:
        raise PlanError(f"SQL: dialect {dialect!r} is not one of {', '.join(DIALECTS)}")
    config = datafusion.SessionConfig()
    for key, value in {**_SETTINGS, **_DIALECT_SETTINGS.get(dialect, {}), "datafusion.sql_parser.dialect": DIALECTS[dialect]}.items():
        config = config.set(key, value)
    ctx = datafusion.SessionContext(config)
    if dialect == "spark":
        # A SUM beside a count(DISTINCT ...) stays one SUM: the rule splits it into a sum of partial sums, each
        # typed DECIMAL(p + 10, s) again, where Spark's answer is one SUM's type (TPC-DS q16, q94, q95).
        ctx.remove_optimizer_rule("single_distinct_aggregation_to_group_by")
    declare(ctx)
    for name, schema in schemas.items():
        _register(ctx, name, schema)
    return ctx


def _register(ctx: Any, name: str, schema: pa.Schema) -> None:
    ctx.register_record_batches(name, [[pa.RecordBatch.from_pylist([], schema=_plannable(schema))]])


def _plannable(schema: pa.Schema) -> pa.Schema:
    """The schema as DataFusion's planner sees it: its metadata left out (nothing there is SQL)."""
    return pa.schema([pa.field(f.name, f.type, f.nullable) for f in schema])


def plan_text(
    text: str,
    schemas: dict[str, pa.Schema],
    dialect: str = "duckdb",
    tables: list[str] | None = None,
    params: dict[str, Any] | None = None,
) -> tuple[Any, Statement]:
    """The optimized logical plan of the one query in ``text``, and that query's statement.

    ``schemas``: the tables the text may name; ``tables``: every table there is (for errors);
    ``params``: the values of the query's parameters (``$1`` or ``?`` by number, ``$name`` by name)."""
    known = tables if tables is not None else list(schemas)
    statements = split_statements(text, backslash=dialect == "spark")
    if not statements:
        raise PlanError("SQL: the text holds no statement")
    if dialect not in DIALECTS:
        raise PlanError(f"SQL: dialect {dialect!r} is not one of {', '.join(DIALECTS)}")
    if dialect == "spark":
        from flight.sql.spark import to_postgres

        statements = [Statement(to_postgres(st.text), st.line, st.column) for st in statements]
    if any(_is_view(st.keywords()) for st in statements):
        return _plan_statements(session(schemas, dialect), statements, schemas, known, params)
    kept = _SESSIONS.take(schemas, dialect)
    planned = _plan_statements(kept.ctx, statements, schemas, known, params)
    _SESSIONS.give_back(dialect, kept)  # not after a failure: a session that failed is let go
    return planned


MAX_NESTING = 64
"""Parentheses a statement may nest (DataFusion's parser refuses past 50 itself)."""
MAX_CASE_NESTING = 16
"""CASE ... END a statement may nest: the parser's time doubles every two levels on a misspelt one."""
MAX_CONDITIONS = 4096
"""AND and OR a statement may hold."""
_UNCODE = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|`[^`]*`|--[^\n]*|/\*.*?\*/", re.S)
_NESTS = re.compile(r"[()]|\b(?:case|end)\b", re.I)
_CONDITIONS = re.compile(r"\b(?:and|or)\b", re.I)


def check_shape(st: Statement) -> None:
    """Refuse a statement DataFusion's parser cannot take safely, before it sees it.

    Why: the service fuzzer found that 20,000 ANDed comparisons (110 KB) overflow the parser's stack
    and kill the process (SIGSEGV), and 100 nested CASEs with one THEN misspelt keep it busy for
    good (uninterruptible: 24 levels took 0.12 s, 32 levels 2.8 s, each two more doubling it). Both
    are far past what people write (TPC-DS nests CASEs 2 deep and ANDs 60 conditions); 8,192
    conditions planned in well under a second."""
    code = _UNCODE.sub(" ", st.text)
    where = f"the statement at line {st.line}:{st.column}"
    depth = deepest = cases = deepest_case = 0
    for m in _NESTS.finditer(code):
        token = m.group(0).lower()
        if token == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif token == ")":
            depth -= 1
        elif token == "case":
            cases += 1
            deepest_case = max(deepest_case, cases)
        else:
            cases = max(0, cases - 1)
    if deepest > MAX_NESTING:
        raise PlanError(f"SQL: {where} nests parentheses {deepest} deep; at most {MAX_NESTING} are taken")
    if deepest_case > MAX_CASE_NESTING:
        raise PlanError(f"SQL: {where} nests CASE expressions {deepest_case} deep; at most {MAX_CASE_NESTING} are taken")
    conditions = len(_CONDITIONS.findall(code))
    if conditions > MAX_CONDITIONS:
        raise PlanError(f"SQL: {where} holds {conditions} ANDs and ORs; at most {MAX_CONDITIONS} are taken "
                        "(an IN list holds many values in one condition)")


def _plan_statements(
    ctx: Any, statements: list[Statement], schemas: dict[str, pa.Schema], known: list[str], params: dict[str, Any] | None
) -> tuple[Any, Statement]:
    import datafusion

    query_only = datafusion.SQLOptions().with_allow_ddl(False).with_allow_dml(False).with_allow_statements(False)
    views = datafusion.SQLOptions().with_allow_dml(False).with_allow_statements(False)
    result: tuple[Any, Statement] | None = None
    for st in statements:
        check_shape(st)
        words = st.keywords()
        if _is_view(words):
            _run(ctx, st, views, schemas, known)
        elif (words and words[0] in ("select", "with", "values", "from")) or st.text.startswith("("):
            if result is not None:
                raise PlanError(f"SQL: the text holds more than one query (the second at line {st.line}:{st.column}); send one")
            result = (_run(ctx, st, query_only, schemas, known, params or {}), st)
        else:
            what = " ".join(words[:2]).upper() or st.text[:20]
            raise PlanError(
                f"SQL: {what} at line {st.line}:{st.column} is not supported; a text holds queries, CREATE VIEW and DROP VIEW"
            )
    if result is None:
        raise PlanError("SQL: the text holds no query (only views)")
    frame, st = result
    try:
        st.in_subquery = "IN (<subquery>)" in frame.logical_plan().display_indent()
        st.schema = frame.schema()
        return frame.optimized_logical_plan(), st
    except Exception as exc:  # noqa: BLE001 - DataFusion's optimizer raises plain Exceptions, worded its way
        raise PlanError(explain_error(str(exc), st, schemas, known)) from None


def _is_view(words: list[str]) -> bool:
    if words[:1] == ["drop"]:
        return words[1:2] == ["view"]
    if words[:1] != ["create"]:
        return False
    rest = [w for w in words[1:] if w not in ("or", "replace", "temp", "temporary")]
    return rest[:1] == ["view"]


def _run(ctx: Any, st: Statement, options: Any, schemas: dict[str, pa.Schema], known: list[str], params: dict[str, Any] | None = None) -> Any:
    try:
        return ctx.sql(st.text, options, param_values=params) if params else ctx.sql_with_options(st.text, options)
    except Exception as exc:  # noqa: BLE001 - DataFusion raises ValueErrors and plain Exceptions with its own wording
        raise PlanError(explain_error(str(exc), st, schemas, known)) from None


def explain_error(message: str, st: Statement, schemas: dict[str, pa.Schema], tables: list[str]) -> str:
    """DataFusion's error as a person can act on it: what, where (line:column), the nearest names."""
    lines = [x.strip() for x in message.strip().splitlines() if x.strip() and not x.strip().startswith("caused by")]
    first = next((x for x in reversed(lines) if x.startswith(("Error during planning", "Schema error"))), None)
    first = first or (lines[0] if lines else "planning failed")
    m = re.search(r"at Line: (\d+), Column: (\d+)", first)
    if m:
        line = st.line + int(m.group(1)) - 1
        column = int(m.group(2)) + (st.column - 1 if m.group(1) == "1" else 0)
        what = re.sub(r"^SQL error: ParserError\(\"?|\"?\)$|\s*at Line: \d+, Column: \d+", "", first)
        return f"SQL syntax error at line {line}:{column}: {what}"
    if "ParserError" in first:
        what = re.sub(r"^SQL error: ParserError\(\"?|\"?\)$", "", first)
        return f"SQL syntax error at the end of the statement that starts at line {st.line}:{st.column}: {what}"
    m = re.search(r"table '(?:[\w]+\.)*([^'.]+)' not found", first)
    if m:
        name = m.group(1)
        return _unknown("table", name, tables, st)
    m = re.search(r"No field named (\S+?)\.?(?:\s|$)", first)
    if m:
        name = m.group(1).strip('"').rsplit(".", 1)[-1].strip('"')
        columns = sorted({f.name for s in schemas.values() for f in s})
        if name in columns:
            where = position(st, name)
            return f"SQL: column {name!r} cannot be used there" + (f" (at {where})" if where else "")
        return _unknown("column", name, columns, st)
    text = re.sub(r"^(Error during planning|Schema error|This feature is not implemented|Optimizer rule '[^']*' failed): ", "", first)
    return f"SQL: {text}"


def _unknown(kind: str, name: str, known: list[str], st: Statement) -> str:
    where = position(st, name)
    nearest = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(repr(n) for n in nearest)}?" if nearest else ""
    listed = f"; {kind}s: {', '.join(known[:20])}" if not nearest and known else ""
    return f"SQL: unknown {kind} {name!r}" + (f" at {where}" if where else "") + hint + listed


def iter_plans(plan: Any) -> Iterator[Any]:
    """Every node of ``plan``, parents first (for checks that look for one kind)."""
    stack = [plan]
    while stack:
        p = stack.pop()
        yield p
        stack.extend(p.inputs())
