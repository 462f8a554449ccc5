"""An expression's constants as Arrow IPC bytes, and each call's typed options (one filler per
``FunctionOptions`` kind, keyed by the oneof field's name), as the builder writes them.

Private helpers of ``flight.plan.expr``; the worker reads the same messages back in
``flight.compute.expressions``, checking what a peer could have chosen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

import pyarrow as pa

from flight.errors import PlanError
from flight.plan.expr_nodes import Node
from flight.wire._proto import plan_pb2
from flight.wire.functions import FunctionSpec

__all__ = ["JOIN_NULLS", "ROUND_MODES", "TEMPORAL_UNITS", "options_message", "scalar_bytes"]

_T = TypeVar("_T")
_ARROW_ERRORS = (pa.ArrowException, OSError, TypeError, ValueError, OverflowError)


def _is_expr(value: object) -> bool:
    """Whether ``value`` is an ``Expr`` (it holds its tree in ``_node``; ``expr`` builds on this module)."""
    return isinstance(getattr(value, "_node", None), Node)


def _ipc_stream(array: pa.Array) -> bytes:
    batch = pa.record_batch([array], names=["value"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def scalar_bytes(value: object, type: pa.DataType | None) -> bytes:
    try:
        if isinstance(value, pa.Scalar) and type is not None:
            value = value.cast(type)
        return _ipc_stream(pa.array([value], type=type))
    except _ARROW_ERRORS as exc:
        as_type = f" of type {type}" if type is not None else ""
        raise PlanError(f"Cannot make a literal{as_type} from {value!r}: {exc}") from exc


def _value_set_bytes(function: str, values: object) -> bytes:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not isinstance(values, pa.Array):
        if isinstance(values, (str, bytes)) or _is_expr(values) or not isinstance(values, Iterable):
            raise PlanError(f"The value_set of {function!r} must be a collection of values, not {values!r}.")
        try:
            values = pa.array(list(values))
        except _ARROW_ERRORS as exc:
            raise PlanError(f"The value_set of {function!r} cannot be made an Arrow array: {exc}") from exc
    return _ipc_stream(values)  # type: ignore[arg-type]  # pa.array above made it an Array


# -- options: one filler per FunctionOptions kind, keyed by the oneof field name


class _Options:
    """The keyword options of one ``call``, read with type checks."""

    def __init__(self, function: str, given: Mapping[str, object]) -> None:
        self.function = function
        self.given = given

    def require(self, key: str, kind: type[_T]) -> _T:
        if self.given.get(key) is None:
            raise PlanError(f"Function {self.function!r} requires the option {key}.")
        return self._check(key, kind)

    def get(self, key: str, kind: type[_T], default: _T) -> _T:
        return default if key not in self.given else self._check(key, kind)

    def optional(self, key: str, kind: type[_T]) -> _T | None:
        return None if self.given.get(key) is None else self._check(key, kind)

    def _check(self, key: str, kind: type[_T]) -> _T:
        value = self.given[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise PlanError(
                f"Option {key} of {self.function!r} must be {kind.__name__}, not {value.__class__.__name__}."
            )
        return value


def _fill_cast(out: plan_pb2.FunctionOptions, o: _Options) -> None:
    target = o.require("target_type", pa.DataType)
    out.cast.target_type = pa.schema([pa.field("t", target)]).serialize().to_pybytes()
    out.cast.safe = o.get("safe", bool, True)


def _fill_set_lookup(out: plan_pb2.FunctionOptions, o: _Options) -> None:
    out.set_lookup.value_set = _value_set_bytes(o.function, o.require("value_set", object))
    out.set_lookup.skip_nulls = o.get("skip_nulls", bool, False)


def _fill_match_substring(out: plan_pb2.FunctionOptions, o: _Options) -> None:
    out.match_substring.pattern = o.require("pattern", str)
    out.match_substring.ignore_case = o.get("ignore_case", bool, False)


def _fill_slice(out: plan_pb2.FunctionOptions, o: _Options) -> None:
    out.slice.start = o.require("start", int)
    stop = o.optional("stop", int)
    if stop is not None:
        out.slice.stop = stop
    step = o.get("step", int, 1)
    if step == 0:
        raise PlanError(f"Option step of {o.function!r} must not be 0.")
    out.slice.step = step


ROUND_MODES = ("", "half_to_even", "half_towards_infinity", "towards_zero")


def _fill_round(out: plan_pb2.FunctionOptions, o: _Options) -> None:
    out.round.SetInParent()
    out.round.ndigits = o.get("ndigits", int, 0)
    mode = o.get("round_mode", str, "")
    if mode not in ROUND_MODES:
        raise PlanError(f"Option round_mode of {o.function!r} must be one of {ROUND_MODES}, not {mode!r}.")
    out.round.round_mode = mode


def _fill_null(out: plan_pb2.FunctionOptions, o: _Options) -> None:
    out.null.SetInParent()
    out.null.nan_is_null = o.get("nan_is_null", bool, False)


def _fill_pad(out: plan_pb2.FunctionOptions, o: _Options) -> None:
    out.pad.width = o.require("width", int)
    out.pad.padding = o.get("padding", str, " ")


def _fill_replace(out: plan_pb2.FunctionOptions, o: _Options) -> None:
    out.replace_substring.pattern = o.require("pattern", str)
    out.replace_substring.replacement = o.require("replacement", str)
    limit = o.optional("max_replacements", int)
    if limit is not None:
        out.replace_substring.max_replacements = limit


def _fill_trim(out: plan_pb2.FunctionOptions, o: _Options) -> None:
    out.trim.characters = o.require("characters", str)


JOIN_NULLS = ("", "emit_null", "replace")
"""Not "skip": pyarrow 26.0.1's join drops the rows whose parts are all null, so the rows after them shift
(SQL's concat_ws is built from "emit_null" joins instead: flight.sql.functions)."""


def _fill_join(out: plan_pb2.FunctionOptions, o: _Options) -> None:
    out.join.null_handling = o.get("null_handling", str, "emit_null")
    if out.join.null_handling not in JOIN_NULLS:
        raise PlanError(f"Option null_handling of {o.function!r} must be one of {JOIN_NULLS}, not {out.join.null_handling!r}.")
    out.join.null_replacement = o.get("null_replacement", str, "")


TEMPORAL_UNITS = ("year", "quarter", "month", "week", "day", "hour", "minute", "second", "millisecond", "microsecond", "nanosecond")


def _fill_round_temporal(out: plan_pb2.FunctionOptions, o: _Options) -> None:
    out.round_temporal.unit = o.require("unit", str)
    if out.round_temporal.unit not in TEMPORAL_UNITS:
        raise PlanError(f"Option unit of {o.function!r} must be one of {TEMPORAL_UNITS}, not {out.round_temporal.unit!r}.")
    out.round_temporal.multiple = o.get("multiple", int, 1)
    out.round_temporal.week_starts_monday = o.get("week_starts_monday", bool, True)


def _fill_strftime(out: plan_pb2.FunctionOptions, o: _Options) -> None:
    out.strftime.format = o.require("format", str)


def _fill_strptime(out: plan_pb2.FunctionOptions, o: _Options) -> None:
    out.strptime.format = o.require("format", str)
    out.strptime.unit = o.get("unit", str, "us")
    out.strptime.error_is_null = o.get("error_is_null", bool, False)


def _fill_struct_field(out: plan_pb2.FunctionOptions, o: _Options) -> None:
    indices = o.require("indices", list)
    if not indices or not all(isinstance(i, int) and i >= 0 for i in indices):
        raise PlanError(f"Option indices of {o.function!r} must be a list of field numbers, not {indices!r}.")
    out.struct_field.indices.extend(indices)


def _fill_list_slice(out: plan_pb2.FunctionOptions, o: _Options) -> None:
    out.list_slice.start = o.require("start", int)
    out.list_slice.stop = o.require("stop", int)


_FILLERS: dict[str, tuple[tuple[str, ...], Callable[[plan_pb2.FunctionOptions, _Options], None]]] = {
    "cast": (("target_type", "safe"), _fill_cast),
    "set_lookup": (("value_set", "skip_nulls"), _fill_set_lookup),
    "match_substring": (("pattern", "ignore_case"), _fill_match_substring),
    "slice": (("start", "stop", "step"), _fill_slice),
    "round": (("ndigits", "round_mode"), _fill_round),
    "null": (("nan_is_null",), _fill_null),
    "pad": (("width", "padding"), _fill_pad),
    "replace_substring": (("pattern", "replacement", "max_replacements"), _fill_replace),
    "trim": (("characters",), _fill_trim),
    "join": (("null_handling", "null_replacement"), _fill_join),
    "round_temporal": (("unit", "multiple", "week_starts_monday"), _fill_round_temporal),
    "strftime": (("format",), _fill_strftime),
    "strptime": (("format", "unit", "error_is_null"), _fill_strptime),
    "struct_field": (("indices",), _fill_struct_field),
    "list_slice": (("start", "stop"), _fill_list_slice),
}


def options_message(spec: FunctionSpec, given: Mapping[str, object]) -> plan_pb2.FunctionOptions | None:
    """The typed options of a call of ``spec`` with keyword options ``given`` (None: the call sets none)."""
    if spec.options is None:
        if given:
            raise PlanError(f"Function {spec.name!r} takes no options, but got {', '.join(sorted(given))}.")
        return None
    if not given and not spec.options_required:
        return None
    keys, fill = _FILLERS[spec.options]
    unknown = sorted(set(given) - set(keys))
    if unknown:
        raise PlanError(
            f"Function {spec.name!r} does not take the option(s) {', '.join(unknown)}; it takes {', '.join(keys)}."
        )
    out = plan_pb2.FunctionOptions()
    fill(out, _Options(spec.name, given))
    return out
