"""The typed options of string, time and nested-data functions, as the worker reads them from a plan: each
field a peer chose is checked or clamped before pyarrow sees it (``flight.compute.expressions`` decodes
the calls; ``flight.plan.expr_options`` writes the same messages on the coordinator).
"""

from __future__ import annotations

import pyarrow.compute as pc

from flight.errors import ProtocolError
from flight.wire._proto import plan_pb2
from flight.wire.limits import MAX_FIELD_DEPTH, MAX_FIXED_SLICE, MAX_PAD_WIDTH, MAX_TEMPORAL_MULTIPLE, check_count

__all__ = ["text_options"]


_JOIN_NULLS = frozenset({"", "emit_null", "replace"})  # not "skip": pyarrow 26.0.1 drops all-null rows (flight.plan.expr_options)
_TEMPORAL_UNITS = frozenset({"year", "quarter", "month", "week", "day", "hour", "minute", "second", "millisecond", "microsecond", "nanosecond"})


def text_options(kind: str, opts: object, path: str) -> pc.FunctionOptions:
    """The string and time functions' options, each field a peer chose checked or clamped first."""
    if isinstance(opts, plan_pb2.PadOptions):
        if not 0 <= opts.width <= MAX_PAD_WIDTH:
            raise ProtocolError(f"a pad's width is {opts.width}; at most {MAX_PAD_WIDTH} characters", field=f"{path}.width")
        return pc.PadOptions(opts.width, opts.padding or " ")
    if isinstance(opts, plan_pb2.ReplaceSubstringOptions):
        limit = opts.max_replacements if opts.HasField("max_replacements") and opts.max_replacements >= 0 else None
        return pc.ReplaceSubstringOptions(opts.pattern, opts.replacement, max_replacements=limit)
    if isinstance(opts, plan_pb2.TrimOptions):
        return pc.TrimOptions(opts.characters)
    if isinstance(opts, plan_pb2.JoinOptions):
        if opts.null_handling not in _JOIN_NULLS:
            raise ProtocolError(f"null_handling {opts.null_handling[:40]!r} is not one of emit_null, replace", field=f"{path}.null_handling")
        if opts.null_handling == "replace":
            return pc.JoinOptions("replace", opts.null_replacement)
        return pc.JoinOptions("emit_null")
    if isinstance(opts, plan_pb2.RoundTemporalOptions):
        if opts.unit not in _TEMPORAL_UNITS:
            raise ProtocolError(f"unit {opts.unit[:40]!r} is not a calendar unit", field=f"{path}.unit")
        if not 0 <= opts.multiple <= MAX_TEMPORAL_MULTIPLE:
            raise ProtocolError(f"multiple {opts.multiple} is not within 0 to {MAX_TEMPORAL_MULTIPLE}", field=f"{path}.multiple")
        return pc.RoundTemporalOptions(opts.multiple or 1, opts.unit, week_starts_monday=opts.week_starts_monday)  # type: ignore[arg-type]
    if isinstance(opts, plan_pb2.StrftimeOptions):
        return pc.StrftimeOptions(opts.format, locale="C")
    if isinstance(opts, plan_pb2.StrptimeOptions):
        if opts.unit not in ("s", "ms", "us", "ns"):
            raise ProtocolError(f"unit {opts.unit[:40]!r} is not s, ms, us or ns", field=f"{path}.unit")
        return pc.StrptimeOptions(opts.format, opts.unit, error_is_null=opts.error_is_null)  # type: ignore[arg-type]
    return _nested_options(kind, opts, path)


def _nested_options(kind: str, opts: object, path: str) -> pc.FunctionOptions:
    """A struct field's path (a few indices) and a list slice (a short fixed-size one: its rows are allocated whole)."""
    if isinstance(opts, plan_pb2.StructFieldOptions):
        check_count(len(opts.indices), MAX_FIELD_DEPTH, f"{path}.indices", "field indices")
        if not opts.indices:
            raise ProtocolError("a struct field needs at least one index", field=f"{path}.indices")
        return pc.StructFieldOptions(list(opts.indices))
    if isinstance(opts, plan_pb2.ListSliceOptions):
        if not 0 <= opts.start < opts.stop or opts.stop - opts.start > MAX_FIXED_SLICE:
            raise ProtocolError(f"a list slice from {opts.start} to {opts.stop}: 0 <= start < stop, at most {MAX_FIXED_SLICE} apart",
                                field=f"{path}.stop")
        return pc.ListSliceOptions(opts.start, opts.stop, return_fixed_size_list=True)
    raise ProtocolError(f"Options of kind {kind!r} are not supported.", field=path)
