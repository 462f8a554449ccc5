"""Worker side: decode the expression IR into ``pyarrow.compute.Expression``.

An ``Expression`` is a flat list of nodes in post-order: a call names its
arguments by the indexes of earlier nodes, the last node is the root, and a
node may be an argument of several calls. The decoder walks the list once,
front to back, with no recursion, so no depth a peer sends can exhaust a
stack here, and each node is decoded once however often it is used.

The bytes come from the network, so nothing in them is trusted: every oneof
must be set, every argument index must name an earlier node, every function
must be on the whitelist of ``flight.wire.functions`` (checked before any name
is handed to pyarrow), argument counts and option kinds must fit that
function, and Arrow IPC payloads must decode to exactly what the message
promises. The size of what pyarrow gets is bounded too: at most
``MAX_NODES`` nodes, both in the message and counting a shared node once per
use (pyarrow gets a tree), and at most ``MAX_DEPTH`` levels of nesting in the
expression pyarrow actually evaluates (its binding, simplification and
evaluation recurse, in C++, and a stack overflow there kills the worker).
Each violation raises ``ProtocolError`` whose ``field`` is a readable path
into the message, such as ``plan.root.filter.predicate.nodes[2].literal.arrow``.
Nothing is evaluated, unpickled or looked up by a user-provided name.

Depth is counted as Acero will see it. Acero's ``Canonicalize`` (run by every
filter and project) flattens nested calls of the same associative function
(``and``, ``or``, ``and_kleene``, ``or_kleene``, ``xor``, ``add``, ``multiply``
and their ``_checked`` forms) and folds them back up as a left-deep chain, so
a balanced ``add`` tree of 30,000 leaves becomes 30,000 levels deep and a
balanced tree would not help a long ``or`` either. So a chain of ``m`` operands
of one such function counts ``m - 1`` levels above its deepest operand, and
``and_kleene`` / ``or_kleene``, n-ary here (the builder folds ``a | b | c`` into
one node), are cut into chunks of ``_CHUNK`` operands, each wrapped in a
one-argument ``coalesce`` (the identity, which Acero does not flatten through):
a 5,000-term ``or`` evaluates about 64 levels deep.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import acero

from flight.compute.options import text_options
from flight.errors import ProtocolError
from flight.wire._proto import plan_pb2
from flight.wire.functions import NARY_FUNCTIONS, FunctionSpec, lookup
from flight.wire.ipc import read_ipc_stream
from flight.wire.limits import clip
from flight.wire.memo import Memo

__all__ = [
    "MAX_DEPTH", "MAX_NODES", "bind", "bound_types", "column_types", "ipc_column", "literal_value", "referenced_fields", "to_pyarrow",
    "to_pyarrow_nodes",
]

MAX_DEPTH = 1000
"""Deepest expression nesting the decoder accepts, as Acero evaluates it: a leaf is 1 level, a call 1
more than its deepest argument, except that a chain of ``m`` operands of one associative function counts
``m - 1`` levels above its deepest operand (Acero re-folds such chains left-deep) and a long n-ary
``and_kleene`` / ``or_kleene`` is evaluated in chunks (see the module's docstring). pyarrow recurses over
expressions in C++ and crashes the process somewhere near 9,000 levels on an 8 MiB thread stack; 1,000
keeps a wide margin."""

MAX_NODES = 100_000
"""Most nodes an expression may have, in the message and also counting a node shared by several calls
once per use (pyarrow gets a tree, so a small message must not expand exponentially). The n-ary
``and_kleene`` / ``or_kleene`` add at most one binary call per argument to what pyarrow gets."""

MAX_ROUND_DIGITS = 400
"""Most decimal places ``round`` may be asked for, either way: a double spans 10^±308 and a decimal 76
digits, so more changes nothing, and Arrow's time grows with it (4,294,967,296 places took 8.6 s)."""

# Functions whose nested calls Acero's Canonicalize flattens into one left-deep chain
# (IsBinaryAssociativeCommutative in arrow/compute/expression.cc).
_ASSOCIATIVE = frozenset(
    {"and", "or", "and_kleene", "or_kleene", "xor", "add", "multiply", "add_checked", "multiply_checked"}
)
_CHUNK = 16
"""Operands per chunk of an n-ary and_kleene / or_kleene: each chunk is about 16 levels deep."""

# What decoding Arrow IPC bytes or building options may raise on bad input.
_BAD_INPUT = (pa.ArrowException, OSError, ValueError, TypeError, OverflowError, LookupError)


def to_pyarrow(msg: plan_pb2.Expression, field: str = "expr") -> pc.Expression:
    """Decode ``msg`` into a pyarrow compute expression.

    ``field`` is the path of ``msg`` inside its enclosing message; error paths
    extend it (``field.nodes[i]...``). Raises ``ProtocolError`` on anything malformed.
    """
    wire = msg.SerializeToString(deterministic=True)
    if len(wire) <= _DECODED_KEY_BYTES and (known := _DECODED.get(wire)) is not None:
        return known
    expr = to_pyarrow_nodes(msg, field)[-1]
    if len(wire) <= _DECODED_KEY_BYTES:
        _DECODED.put(wire, expr)
    return expr


_DECODED: Memo[bytes, pc.Expression] = Memo(2048)
"""Expressions decoded before, by their bytes: decoding checks every node and builds pyarrow's expression, the
same for the same bytes (errors are not remembered). Every task of a stage, and every run of a query, sends the
same expressions: decoding them again was a third of compiling a TPC-DS task's plan (py-spy, q66). Small ones
only (TPC-DS's largest is under 1 KB), and at most 2,048: a peer's expressions cannot grow it past a few MB."""
_DECODED_KEY_BYTES = 4 << 10


def to_pyarrow_nodes(msg: plan_pb2.Expression, field: str = "expr") -> list[pc.Expression]:
    """Decode every node of ``msg``: item ``i`` is the expression rooted at node ``i`` (the last is the root).

    Validates the whole message as ``to_pyarrow`` does.
    """
    nodes = msg.nodes
    count = len(nodes)
    if count == 0:
        raise ProtocolError("The expression has no nodes.", field=f"{field}.nodes")
    if count > MAX_NODES:
        raise ProtocolError(f"The expression has {count} nodes, more than the {MAX_NODES} allowed.", field=f"{field}.nodes")
    decoded: list[_Decoded] = []
    for i, node in enumerate(nodes):
        kind = node.WhichOneof("kind")
        if kind == "field":
            if not node.field.name:
                raise ProtocolError("A field reference has an empty column name.", field=f"{field}.nodes[{i}].field.name")
            item = _Decoded(pc.field(node.field.name))
        elif kind == "literal":
            path = f"{field}.nodes[{i}].literal"
            value = literal_value(node.literal, path)
            try:
                item = _Decoded(pc.scalar(value))  # type: ignore[arg-type]  # stubs: a Scalar is accepted
            except _BAD_INPUT as exc:
                raise ProtocolError(f"Cannot use a {value.type} value as a literal: {exc}", field=path) from exc
        elif kind == "call":
            item = _call(node.call, f"{field}.nodes[{i}].call", i, decoded)
        else:
            raise ProtocolError("The expression sets none of field, literal or call.", field=f"{field}.nodes[{i}]")
        if item.depth > MAX_DEPTH:
            raise ProtocolError(f"The expression is nested more than {MAX_DEPTH} levels deep.", field=f"{field}.nodes[{i}]")
        if item.size > MAX_NODES:
            message = f"The expression expands to more than {MAX_NODES} nodes (a shared node counts once per use)."
            raise ProtocolError(message, field=f"{field}.nodes[{i}]")
        decoded.append(item)
    return [item.expr for item in decoded]


class _Decoded:
    """One decoded node: its pyarrow expression, the depth Acero will see, and its size as a tree.

    ``chain`` is set when the expression is a call of an ``_ASSOCIATIVE`` function that a
    parent call of the same function would flatten into its own chain: the function, the
    number of operands of the chain, and the depth of its deepest operand.
    """

    __slots__ = ("chain", "depth", "expr", "size")

    def __init__(
        self, expr: pc.Expression, depth: int = 1, size: int = 1, chain: tuple[str, int, int] | None = None
    ) -> None:
        self.expr = expr
        self.depth = depth
        self.size = size
        self.chain = chain


def _operands(function: str, items: list[_Decoded]) -> tuple[int, int]:
    """How many operands a chain of ``function`` over ``items`` has once Acero flattens it, and the deepest one's depth."""
    count = deepest = 0
    for item in items:
        if item.chain is not None and item.chain[0] == function:
            count += item.chain[1]
            deepest = max(deepest, item.chain[2])
        else:
            count += 1
            deepest = max(deepest, item.depth)
    return count, deepest


def literal_value(msg: plan_pb2.Literal, path: str) -> pa.Scalar:
    kind = msg.WhichOneof("value")
    if kind == "bool_value":
        return pa.scalar(msg.bool_value, pa.bool_())
    if kind == "int_value":
        return pa.scalar(msg.int_value, pa.int64())
    if kind == "float_value":
        return pa.scalar(msg.float_value, pa.float64())
    if kind == "string_value":
        return pa.scalar(msg.string_value, pa.string())
    if kind == "binary_value":
        return pa.scalar(msg.binary_value, pa.binary())
    if kind == "arrow":
        return _arrow_literal(msg.arrow, f"{path}.arrow")
    raise ProtocolError("The literal sets no value.", field=path)


def _arrow_literal(data: bytes, path: str) -> pa.Scalar:
    """The value of an Arrow literal (an IPC stream of one row), remembered per process by its bytes.

    Why: every decimal, date and timestamp literal is one, and decoding an IPC stream (validated in
    full) costs about 50 us; a plan is decoded twice on a worker (the compile, the translation to
    SQL) and every query of the same shape carries the same literals. A remembered value is what
    the same bytes decoded to; only small streams are kept, and at most ``_LITERALS_MAX`` of them,
    so a peer cannot grow the memory. Errors are not remembered."""
    keep = len(data) <= _LITERAL_KEY_BYTES
    if keep and (known := _LITERALS.get(data)) is not None:
        return known
    column = ipc_column(data, path, "literal")
    if len(column) != 1:
        raise ProtocolError(f"An Arrow literal must hold exactly one row, not {len(column)}.", field=path)
    if keep:
        _LITERALS.put(data, column[0])
    return column[0]


_LITERALS: Memo[bytes, pa.Scalar] = Memo(4096)
_LITERAL_KEY_BYTES = 4 << 10


def ipc_column(data: bytes, path: str, what: str) -> pa.Array:
    """The single column of an Arrow IPC stream holding one record batch: sized before it is
    decompressed and fully validated (``flight.wire.ipc``), so corrupt buffers fail here, not in a kernel."""
    try:
        table = read_ipc_stream(data, path)
    except ProtocolError as exc:
        raise ProtocolError(f"The {what} is not a valid Arrow IPC stream: {exc}", field=path) from None
    batches = table.to_batches()
    if len(batches) != 1 or table.num_columns != 1:
        raise ProtocolError(f"The {what} must be an Arrow IPC stream of one record batch with one column.", field=path)
    return batches[0].column(0)


def _call(msg: plan_pb2.Call, path: str, index: int, decoded: list[_Decoded]) -> _Decoded:
    """Node ``index``, a call (its arguments are the earlier nodes in ``decoded``)."""
    try:
        spec = lookup(msg.function)
    except ValueError as exc:
        raise ProtocolError(str(exc), field=f"{path}.function") from exc
    refs = list(msg.args)
    if not spec.accepts_arity(len(refs)):
        raise ProtocolError(
            f"Function {spec.name!r} takes {spec.arity_text()} arguments, not {len(refs)}.", field=f"{path}.args"
        )
    for position, ref in enumerate(refs):
        if ref >= index:
            raise ProtocolError(
                f"Argument {position} of node {index} names node {ref}; a call's arguments must be earlier nodes.",
                field=f"{path}.args",
            )
    args = [decoded[ref] for ref in refs]
    size = sum(arg.size for arg in args) + 1
    options = _options(msg, spec, f"{path}.options")
    try:
        if spec.name in NARY_FUNCTIONS:
            return _chunked(spec.name, args, size)
        exprs = [arg.expr for arg in args]
        if spec.name == "cast":
            return _Decoded(exprs[0].cast(options=options), args[0].depth + 1, size)  # type: ignore[call-arg, arg-type]
        expr = pc.Expression._call(spec.name, exprs, options)  # type: ignore[attr-defined]  # pyarrow's own builder
        if spec.name in _ASSOCIATIVE:
            count, deepest = _operands(spec.name, args)
            return _Decoded(expr, deepest + count - 1, size, (spec.name, count, deepest))
        return _Decoded(expr, max(arg.depth for arg in args) + 1, size)
    except _BAD_INPUT as exc:
        raise ProtocolError(f"Cannot build a call of {spec.name!r}: {exc}", field=path) from exc


def _chunked(function: str, items: list[_Decoded], size: int) -> _Decoded:
    """Associative ``function`` (binary in pyarrow) over all ``items``, in order, kept shallow for Acero.

    While more than ``_CHUNK`` operands remain, each run of ``_CHUNK`` becomes a left-deep
    chain (the shape Acero would give it anyway) wrapped in ``coalesce(x)``, which is ``x``
    but stops Acero from flattening the chunks back into one long chain.
    """
    while len(items) > _CHUNK:
        wrapped = []
        for start in range(0, len(items), _CHUNK):
            chunk = items[start : start + _CHUNK]
            if len(chunk) == 1:
                wrapped.append(chunk[0])
                continue
            count, deepest = _operands(function, chunk)
            expr = pc.Expression._call("coalesce", [_left_fold(function, chunk)])  # type: ignore[attr-defined]
            wrapped.append(_Decoded(expr, deepest + count, sum(item.size for item in chunk)))
        items = wrapped
    count, deepest = _operands(function, items)
    return _Decoded(_left_fold(function, items), deepest + count - 1, size, (function, count, deepest))


def _left_fold(function: str, items: list[_Decoded]) -> pc.Expression:
    expr = items[0].expr
    for item in items[1:]:
        expr = pc.Expression._call(function, [expr, item.expr])  # type: ignore[attr-defined]
    return expr


def _options(msg: plan_pb2.Call, spec: FunctionSpec, path: str) -> pc.FunctionOptions | None:
    kind = msg.options.WhichOneof("kind") if msg.HasField("options") else None
    if msg.HasField("options") and kind is None:
        raise ProtocolError("The call's options set no kind.", field=path)
    if kind is None:
        if spec.options_required:
            raise ProtocolError(f"Function {spec.name!r} requires {spec.options} options.", field=path)
        return None
    if kind != spec.options:
        accepted = f"only {spec.options} options" if spec.options else "no options"
        raise ProtocolError(f"Function {spec.name!r} accepts {accepted}, not {kind} options.", field=path)
    opts = getattr(msg.options, kind)  # kind is a oneof field name of our own schema, not user text
    try:
        return _build_options(kind, opts, f"{path}.{kind}")
    except _BAD_INPUT as exc:
        raise ProtocolError(f"Invalid {kind} options: {exc}", field=f"{path}.{kind}") from exc


def _build_options(kind: str, opts: object, path: str) -> pc.FunctionOptions:
    if isinstance(opts, plan_pb2.CastOptions):
        target = _ipc_type(opts.target_type, f"{path}.target_type")
        return pc.CastOptions.safe(target) if opts.safe else pc.CastOptions.unsafe(target)
    if isinstance(opts, plan_pb2.SetLookupOptions):
        values = ipc_column(opts.value_set, f"{path}.value_set", "value set")
        return pc.SetLookupOptions(values, skip_nulls=opts.skip_nulls)
    if isinstance(opts, plan_pb2.MatchSubstringOptions):
        return pc.MatchSubstringOptions(opts.pattern, ignore_case=opts.ignore_case)
    if isinstance(opts, plan_pb2.SliceOptions):
        stop = opts.stop if opts.HasField("stop") else None
        return pc.SliceOptions(opts.start, stop, opts.step or 1)
    if isinstance(opts, plan_pb2.RoundOptions):
        if abs(opts.ndigits) > MAX_ROUND_DIGITS:  # -4,294,967,296 took Arrow 8.6 s (fuzzer, seed 2, case 7625)
            raise ProtocolError(f"round to {opts.ndigits} digits: at most {MAX_ROUND_DIGITS} either way", field=f"{path}.ndigits")
        if opts.round_mode == "half_towards_infinity":  # SQL's ROUND: half away from zero
            return pc.RoundOptions(opts.ndigits, round_mode="half_towards_infinity")
        if opts.round_mode == "towards_zero":  # truncation (Spark's cast to an integer)
            return pc.RoundOptions(opts.ndigits, round_mode="towards_zero")
        if opts.round_mode not in ("", "half_to_even"):
            raise ProtocolError(f"round_mode {opts.round_mode[:40]!r} is not half_to_even, half_towards_infinity or towards_zero", field=path)
        return pc.RoundOptions(opts.ndigits)
    if isinstance(opts, plan_pb2.NullOptions):
        return pc.NullOptions(nan_is_null=opts.nan_is_null)
    return text_options(kind, opts, path)




def _ipc_type(data: bytes, path: str) -> pa.DataType:
    """The type of the single field of an Arrow IPC schema message."""
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(data))
        if len(schema) != 1:
            message = f"The target type's schema must have exactly one field, not {len(schema)}."
            raise ProtocolError(message, field=path)
        return schema.field(0).type
    except _BAD_INPUT as exc:
        raise ProtocolError(f"The target type is not a readable Arrow IPC schema: {exc}", field=path) from exc


def referenced_fields(msg: plan_pb2.Expression) -> set[str]:
    """Column names an expression message reads (after ``to_pyarrow`` accepted it).

    Only nodes the root reaches count; one backward pass over the flat nodes.
    """
    nodes = msg.nodes
    if not nodes:
        return set()
    reached = bytearray(len(nodes))
    reached[-1] = 1
    names: set[str] = set()
    for i in range(len(nodes) - 1, -1, -1):
        if not reached[i]:
            continue
        node = nodes[i]
        kind = node.WhichOneof("kind")
        if kind == "field":
            names.add(node.field.name)
        elif kind == "call":
            for ref in node.call.args:
                if ref < i:
                    reached[ref] = 1
    return names


def bind(msg: plan_pb2.Expression, expr: pc.Expression, schema: pa.Schema, field: str) -> pa.DataType:
    """The type ``expr`` yields over ``schema``; ``ProtocolError`` naming ``field`` when it does not fit.

    Checked before the task's pipeline is built: Acero must never see an
    expression that does not bind (pyarrow can crash the process on one).
    """
    used = referenced_fields(msg)
    missing = sorted(used - set(schema.names))
    if missing:
        raise ProtocolError(f"{field} reads column {clip(missing[0], 200)!r}, which its input does not have ({clip(schema.names, 500)})", field=field)
    if len(msg.nodes) == 1 and msg.nodes[0].WhichOneof("kind") == "field":
        return schema.field(msg.nodes[0].field.name).type  # a column passed through: nothing to bind
    try:
        return bound_types("root", msg, schema, lambda: [expr])[0]
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, KeyError) as exc:
        raise ProtocolError(f"{field} does not fit its input: {exc}", field=field) from exc


def bound_types(
    tag: str, msg: plan_pb2.Expression, schema: pa.Schema, decode: Callable[[], Sequence[pc.Expression]]
) -> list[pa.DataType]:
    """The types of the expressions ``decode()`` makes of ``msg`` (which ``tag`` names: its root,
    every node), as one Acero project over no rows of ``schema`` binds them.

    Remembered per process: every task of a stage, and every run of a query of the same shape,
    binds the same expressions over the same columns, and each bind runs an Acero plan (about
    0.5 ms, more on a worker whose other tasks hold the GIL; profiled on TPC-H as 1-2 ms of a
    task's start). Keys are the message's bytes and the names and types of the columns it reads
    (pyarrow's type equality: a zone, a precision, an extension type count; the schema's IPC
    bytes were most of the key's cost), so a remembered answer is Acero's own for the same input; only small keys are kept and the
    entries are bounded (``_BOUND``: a ``Memo``), so a peer's large or many expressions cannot grow it.
    Errors are not remembered: a bad expression is bound, and refused, each time.
    ``msg`` must have been decoded (validated) once already; a hit skips ``decode``.
    """
    # Over the columns it reads only: over a wide input, binding each expression over every
    # column would cost columns x expressions, and the answer does not depend on the others.
    used = referenced_fields(msg)
    wire = msg.SerializeToString(deterministic=True)
    shape = column_types(schema, used)
    key = (tag, wire, shape) if len(wire) <= _BOUND_KEY_BYTES and len(shape) <= _BOUND_KEY_FIELDS else None
    if key is not None and (known := _BOUND.get(key)) is not None:
        return list(known)
    schema = pa.schema([f for f in schema if f.name in used])
    exprs = list(decode())
    source = acero.Declaration("table_source", acero.TableSourceNodeOptions(schema.empty_table()))
    project = acero.Declaration("project", acero.ProjectNodeOptions(exprs, [f"n{i}" for i in range(len(exprs))]))
    types = tuple(acero.Declaration.from_sequence([source, project]).to_table().schema.types)
    if key is not None:
        _BOUND.put(key, types)
    return list(types)


def column_types(schema: pa.Schema, names: set[str]) -> tuple[tuple[str, pa.DataType | None], ...]:
    """Each of ``names`` with its type in ``schema`` (None: not there once), in name order: what an expression's
    type and text depend on, as a key (the types decide: equal types are the same type). Looked up by name: going
    through a wide schema's fields makes a pyarrow field per column."""
    out = []
    for name in sorted(names):
        i = schema.get_field_index(name)
        out.append((name, schema.field(i).type if i >= 0 else None))
    return tuple(out)


_BOUND: Memo[tuple[str, bytes, tuple[tuple[str, pa.DataType | None], ...]], tuple[pa.DataType, ...]] = Memo(1024)
_BOUND_KEY_BYTES = 16 << 10
_BOUND_KEY_FIELDS = 256

