"""Worker side: decode the expression IR into ``pyarrow.compute.Expression``.

The bytes come from the network, so nothing in them is trusted: every oneof
must be set, every function must be on the whitelist of
``flight.plan.functions`` (checked before any name is handed to pyarrow),
argument counts and option kinds must fit that function, and Arrow IPC payloads
must decode to exactly what the message promises. Each violation raises
``ProtocolError`` whose ``field`` is a readable path into the message, such as
``plan.root.filter.predicate.call.args[1].literal.arrow``. Nothing is
evaluated, unpickled or looked up by a user-provided name.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.acero as acero
import pyarrow.compute as pc

from flight._proto import plan_pb2
from flight.errors import ProtocolError
from flight.plan.functions import FunctionSpec, lookup

__all__ = ["MAX_DEPTH", "bind", "referenced_fields", "to_pyarrow"]

MAX_DEPTH = 200
"""Deepest expression nesting the decoder accepts (keeps the worker off Python's recursion limit)."""

# What decoding Arrow IPC bytes or building options may raise on bad input.
_BAD_INPUT = (pa.ArrowException, OSError, ValueError, TypeError, OverflowError, LookupError)


def to_pyarrow(msg: plan_pb2.Expression, field: str = "expr") -> pc.Expression:
    """Decode ``msg`` into a pyarrow compute expression.

    ``field`` is the path of ``msg`` inside its enclosing message; error paths
    extend it. Raises ``ProtocolError`` on anything malformed.
    """
    return _expression(msg, field, 0)


def _expression(msg: plan_pb2.Expression, path: str, depth: int) -> pc.Expression:
    if depth > MAX_DEPTH:
        raise ProtocolError(f"The expression is nested more than {MAX_DEPTH} levels deep.", field=path)
    kind = msg.WhichOneof("kind")
    if kind == "field":
        if not msg.field.name:
            raise ProtocolError("A field reference has an empty column name.", field=f"{path}.field.name")
        return pc.field(msg.field.name)
    if kind == "literal":
        value = _literal(msg.literal, f"{path}.literal")
        try:
            return pc.scalar(value)
        except _BAD_INPUT as exc:
            message = f"Cannot use a {value.type} value as a literal: {exc}"
            raise ProtocolError(message, field=f"{path}.literal") from exc
    if kind == "call":
        return _call(msg.call, f"{path}.call", depth)
    raise ProtocolError("The expression sets none of field, literal or call.", field=path)


def _literal(msg: plan_pb2.Literal, path: str) -> pa.Scalar:
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
        column = _ipc_column(msg.arrow, f"{path}.arrow", "literal")
        if len(column) != 1:
            message = f"An Arrow literal must hold exactly one row, not {len(column)}."
            raise ProtocolError(message, field=f"{path}.arrow")
        return column[0]
    raise ProtocolError("The literal sets no value.", field=path)


def _ipc_column(data: bytes, path: str, what: str) -> pa.Array:
    """The single column of an Arrow IPC stream holding one record batch, fully validated."""
    try:
        with pa.ipc.open_stream(pa.py_buffer(data)) as reader:
            batches = list(reader)
        if len(batches) != 1 or batches[0].num_columns != 1:
            raise ProtocolError(
                f"The {what} must be an Arrow IPC stream of one record batch with one column.", field=path
            )
        batches[0].validate(full=True)  # corrupt buffers must fail here, not crash a kernel later
        return batches[0].column(0)
    except _BAD_INPUT as exc:
        raise ProtocolError(f"The {what} is not a valid Arrow IPC stream: {exc}", field=path) from exc


def _call(msg: plan_pb2.Call, path: str, depth: int) -> pc.Expression:
    try:
        spec = lookup(msg.function)
    except ValueError as exc:
        raise ProtocolError(str(exc), field=f"{path}.function") from exc
    if not spec.accepts_arity(len(msg.args)):
        raise ProtocolError(
            f"Function {spec.name!r} takes {spec.arity_text()} arguments, not {len(msg.args)}.", field=f"{path}.args"
        )
    args = [_expression(arg, f"{path}.args[{i}]", depth + 1) for i, arg in enumerate(msg.args)]
    options = _options(msg, spec, f"{path}.options")
    try:
        if spec.name == "cast":
            return args[0].cast(options=options)
        return pc.Expression._call(spec.name, args, options)
    except _BAD_INPUT as exc:
        raise ProtocolError(f"Cannot build a call of {spec.name!r}: {exc}", field=path) from exc


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
        values = _ipc_column(opts.value_set, f"{path}.value_set", "value set")
        return pc.SetLookupOptions(values, skip_nulls=opts.skip_nulls)
    if isinstance(opts, plan_pb2.MatchSubstringOptions):
        return pc.MatchSubstringOptions(opts.pattern, ignore_case=opts.ignore_case)
    if isinstance(opts, plan_pb2.SliceOptions):
        stop = opts.stop if opts.HasField("stop") else None
        return pc.SliceOptions(opts.start, stop, opts.step or 1)
    if isinstance(opts, plan_pb2.RoundOptions):
        return pc.RoundOptions(opts.ndigits)
    if isinstance(opts, plan_pb2.NullOptions):
        return pc.NullOptions(nan_is_null=opts.nan_is_null)
    raise ProtocolError(f"Options of kind {kind!r} are not supported.", field=path)


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
    """Column names an expression message reads (after ``to_pyarrow`` accepted it)."""
    kind = msg.WhichOneof("kind")
    if kind == "field":
        return {msg.field.name}
    if kind == "call":
        return set().union(*(referenced_fields(a) for a in msg.call.args)) if msg.call.args else set()
    return set()


def bind(msg: plan_pb2.Expression, expr: pc.Expression, schema: pa.Schema, field: str) -> pa.DataType:
    """The type ``expr`` yields over ``schema``; ``ProtocolError`` naming ``field`` when it does not fit.

    Checked before the task's pipeline is built: Acero must never see an
    expression that does not bind (pyarrow can crash the process on one).
    """
    missing = sorted(referenced_fields(msg) - set(schema.names))
    if missing:
        raise ProtocolError(f"{field} reads column {missing[0]!r}, which its input does not have ({schema.names})", field=field)
    source = acero.Declaration("table_source", acero.TableSourceNodeOptions(schema.empty_table()))
    project = acero.Declaration("project", acero.ProjectNodeOptions([expr], ["out"]))
    try:
        return acero.Declaration.from_sequence([source, project]).to_table().schema.field(0).type
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, KeyError) as exc:
        raise ProtocolError(f"{field} does not fit its input: {exc}", field=field) from exc
