"""Arrow type vocabulary shared by the plan builder and the engine.

Acero cannot process some types readers produce (``string_view``, as
``tpchgen-cli`` writes it); both sides agree here on what they become, so the
coordinator's schemas match what workers emit.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["UNITS_READER", "UNIT_COLUMN", "UNIT_TYPE", "normalize_schema", "normalize_type", "unit_tag", "unit_tags"]

UNITS_READER = "units"
"""The built-in reader whose rows are the unit bodies themselves (column ``unit``, binary)."""

UNIT_COLUMN = "__flight_unit"
"""The hidden last column (``UNIT_TYPE``: ``WorkUnit.id``) of a task that tags its rows with their
work unit (``TaskOptions.tag_units``); the coordinator strips it before the caller sees a row."""

UNIT_TYPE = pa.run_end_encoded(pa.int32(), pa.uint64())
"""Run-end encoded: a batch of one unit's rows carries one run, a few bytes, not 8 per row."""


def unit_tags(ids: pa.Array) -> pa.Array:
    """Per-row unit ids (uint64) as a ``UNIT_TYPE`` column."""
    return pc.run_end_encode(ids, run_end_type=pa.int32())  # type: ignore[attr-defined]  # pyarrow-stubs lack it


def unit_tag(unit: int, rows: int) -> pa.Array:
    """A ``UNIT_TYPE`` column of ``rows`` rows, all of unit ``unit`` (of no run when ``rows`` is 0: a run ends past 0)."""
    return pa.RunEndEncodedArray.from_arrays(pa.array([rows] if rows else [], pa.int32()), pa.array([unit] if rows else [], pa.uint64()))


def normalize_type(t: pa.DataType) -> pa.DataType:
    """The type Acero processes for ``t``: view types become their plain forms.

    Called for every column of every schema planned or compiled (thousands per query), so a type
    with nothing to change (no view, no nesting: nearly all) returns after one set lookup."""
    if t.id not in _REWRITTEN:
        return t
    if pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_list_view(t) or pa.types.is_large_list_view(t) or pa.types.is_list(t):
        return pa.list_(normalize_type(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(normalize_type(f.type)) for f in t])
    return t


_REWRITTEN = frozenset(
    t.id for t in (pa.string_view(), pa.binary_view(), pa.list_view(pa.int8()), pa.large_list_view(pa.int8()),
                   pa.list_(pa.int8()), pa.struct([]))
)
"""The type ids ``normalize_type`` may change (the views, and the nested types that can hold them)."""


def normalize_schema(schema: pa.Schema) -> pa.Schema:
    if all(t.id not in _REWRITTEN for t in schema.types):
        return schema  # nothing to change (nearly always): building fields again costs ~2 us each
    fields = [f.with_type(normalize_type(f.type)) for f in schema]
    return pa.schema(fields, metadata=schema.metadata)  # type: ignore[arg-type]  # stubs: bytes keys are what it gives
