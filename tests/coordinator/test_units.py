"""A recoverable task's rows on the coordinator: ``UnitGate`` lets a unit's rows through once it is complete.

A tagged task sends every row of a unit before any row of the next, with the unit's id in a
hidden last column (``UNIT_COLUMN``, run-end encoded ``UNIT_TYPE``). The gate holds a unit's
rows until a later unit's rows arrive or the output ends, then releases them without that
column and reports the unit done. These tests build tagged batches with pyarrow alone and
check the gate against plain Python: hand-written cases for each rule, and a hypothesis
property over arbitrary batch boundaries, runs and slices.
"""

from __future__ import annotations

import itertools
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flight.coordinator.events import CancelTask, CreditGranted, FailQuery, Item, SendUnits, StartSending, UnitsDone, UnitsFound
from flight.coordinator.state import FeedState
from flight.coordinator.units import UnitGate
from flight.errors import ProtocolError
from flight.wire.arrow_types import UNIT_COLUMN, UNIT_TYPE

PLAIN_TYPES: dict[str, pa.DataType] = {"x": pa.int64(), "name": pa.string()}
PLAIN = pa.schema(PLAIN_TYPES)
"""The rows the caller sees; a tagged batch has ``UNIT_COLUMN`` after these."""
TAGGED = PLAIN.append(pa.field(UNIT_COLUMN, UNIT_TYPE))
RUN_ENDS = pa.int32()
"""``UNIT_TYPE``'s run-end type (checked below: the tags built here must be of that type)."""

run_end_encode: Any = getattr(pc, "run_end_encode")  # noqa: B009  # pyarrow-stubs lack it


def encoded(units: list[int]) -> pa.Array:
    """Per-row unit ids as run-end encoded tags (one run per stretch of equal ids)."""
    tags: pa.Array = run_end_encode(pa.array(units, pa.uint64()), run_end_type=RUN_ENDS)
    assert tags.type == UNIT_TYPE
    return tags


def from_runs(runs: list[tuple[int, int]]) -> pa.Array:
    """Tags from explicit runs of (unit, rows): adjacent runs may be of the same unit."""
    ends = list(itertools.accumulate(rows for _, rows in runs))
    tags: pa.Array = pa.RunEndEncodedArray.from_arrays(pa.array(ends, RUN_ENDS), pa.array([u for u, _ in runs], pa.uint64()))
    assert tags.type == UNIT_TYPE
    return tags


def tagged(units: list[int], xs: list[int] | None = None, tags: pa.Array | None = None) -> pa.RecordBatch:
    """One tagged batch: row i belongs to ``units[i]``; ``x`` is ``xs[i]`` (default: i), ``name`` says it."""
    xs = list(range(len(units))) if xs is None else xs
    names = [None if x % 3 == 0 else f"row {x}" for x in xs]
    return pa.RecordBatch.from_arrays(
        [pa.array(xs, pa.int64()), pa.array(names, pa.string()), encoded(units) if tags is None else tags], schema=TAGGED
    )


def xs_of(batches: list[pa.RecordBatch]) -> list[int]:
    """The ``x`` of every released row, in order (and every batch is plain: no unit column)."""
    for batch in batches:
        assert batch.schema.equals(PLAIN), f"a released batch is not plain: {batch.schema}"
    return cast(list[int], pa.Table.from_batches(batches, schema=PLAIN).column("x").to_pylist())


def gate() -> UnitGate:
    return UnitGate("task s0 on grpc://a:1")


# ------------------------------------------------------------------- rules


def test_a_units_rows_are_held_until_a_later_units_rows_arrive() -> None:
    g = gate()
    assert g.feed(tagged([7, 7], [0, 1])) == ([], [])
    assert g.held_rows == 2
    released, done = g.feed(tagged([8], [2]))
    assert (xs_of(released), done) == ([0, 1], [7])
    assert g.held_rows == 1


def test_the_last_unit_is_released_at_the_end() -> None:
    g = gate()
    g.feed(tagged([7], [0]))
    g.feed(tagged([8, 8], [1, 2]))
    assert not g.read_all
    released, done = g.end()
    assert (xs_of(released), done) == ([1, 2], [8])
    assert g.read_all and g.held_rows == 0


def test_released_rows_keep_their_values_and_lose_the_unit_column() -> None:
    g = gate()
    batch = tagged([1, 1, 1], [3, 4, 5])
    g.feed(batch)
    released, _ = g.end()
    assert pa.Table.from_batches(released).equals(pa.Table.from_batches([batch]).drop_columns([UNIT_COLUMN]))


def test_a_batch_spanning_several_units_releases_the_complete_ones() -> None:
    g = gate()
    released, done = g.feed(tagged([3, 3, 4, 5, 5, 5]))
    assert (xs_of(released), done) == ([0, 1, 2], [3, 4])
    assert g.held_rows == 3
    released, done = g.end()
    assert (xs_of(released), done) == ([3, 4, 5], [5])


def test_a_unit_spread_over_several_batches_is_released_whole() -> None:
    g = gate()
    assert g.feed(tagged([2, 2], [0, 1])) == ([], [])
    assert g.feed(tagged([2], [2])) == ([], [])
    assert g.feed(tagged([2, 2], [3, 4])) == ([], [])
    released, done = g.feed(tagged([9], [5]))
    assert (xs_of(released), done) == ([0, 1, 2, 3, 4], [2])


def test_a_batch_continuing_the_held_unit_and_starting_others_releases_it_whole() -> None:
    g = gate()
    g.feed(tagged([2, 2], [0, 1]))
    released, done = g.feed(tagged([2, 3, 4], [2, 3, 4]))
    assert (xs_of(released), done) == ([0, 1, 2, 3], [2, 3])
    assert g.end()[1] == [4]


def test_adjacent_runs_of_one_unit_are_one_unit() -> None:
    g = gate()
    released, done = g.feed(tagged([7, 7, 7, 8], tags=from_runs([(7, 2), (7, 1), (8, 1)])))
    assert (xs_of(released), done) == ([0, 1, 2], [7])


def test_a_sliced_batch_is_read_from_its_offset() -> None:
    """A slice of a batch keeps the whole run-end encoded column, with an offset into it."""
    whole = tagged([1, 1, 1, 2, 2, 2, 3, 3, 3])
    g = gate()
    released, done = g.feed(whole.slice(4, 4))  # rows 4, 5 of unit 2; 6, 7 of unit 3
    assert (xs_of(released), done) == ([4, 5], [2])
    released, done = g.feed(whole.slice(8, 1))
    assert (xs_of(released), done) == ([], [])
    released, done = g.end()
    assert (xs_of(released), done) == ([6, 7, 8], [3])


def test_units_may_come_in_any_order_of_their_ids() -> None:
    """A shared queue hands a task units in the order it takes them, not by number."""
    g = gate()
    released, done = g.feed(tagged([9, 2, 2**64 - 1, 0]))
    assert (xs_of(released), done) == ([0, 1, 2], [9, 2, 2**64 - 1])
    assert g.end()[1] == [0]


def test_an_empty_batch_releases_nothing() -> None:
    g = gate()
    g.feed(tagged([1]))
    assert g.feed(tagged([])) == ([], [])
    assert g.held_rows == 1


def test_the_end_with_nothing_held_releases_nothing() -> None:
    g = gate()
    assert g.end() == ([], [])
    assert g.read_all


def test_drop_forgets_the_held_rows() -> None:
    g = gate()
    released, done = g.feed(tagged([1, 2, 2, 2]))
    assert (xs_of(released), done) == ([0], [1])
    assert g.drop() == 3
    assert g.held_rows == 0
    assert g.end() == ([], [])  # unit 2 was never complete here: it is replayed elsewhere


def test_a_unit_split_by_another_within_one_batch_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="split by another's in one batch") as info:
        gate().feed(tagged([4, 5, 4]))
    assert info.value.field == UNIT_COLUMN


def test_a_unit_seen_again_in_a_later_batch_is_reported_again_and_the_state_machine_fails_the_query() -> None:
    """The gate leaves revisits to ``UnitsDone``: a unit no longer outstanding fails the query."""
    state = FeedState(max_frame=8, buffer=8, affinity_wait=0.05)
    source = state.add_source("f", shared=False)
    state.add_task("t0", "grpc://a:1", recoverable=True)
    state.add_slot("t0", source, 0)
    state.handle(StartSending(0.0))
    state.handle(UnitsFound(source, (Item(b"u0"), Item(b"u1")), 0.0))
    out = state.handle(CreditGranted("t0", "f", 0, 2, 0.0))
    assert [i.id for ins in out if isinstance(ins, SendUnits) for i in ins.items] == [0, 1]
    g = gate()
    reported: list[list[int]] = []
    for batch in (tagged([0], [0]), tagged([1], [1]), tagged([0], [2])):
        reported.append(g.feed(batch)[1])
    reported.append(g.end()[1])
    assert reported == [[], [0], [1], [0]]
    assert state.handle(UnitsDone("t0", (0,), 1.0)) == []
    assert state.handle(UnitsDone("t0", (1,), 1.0)) == []
    out = state.handle(UnitsDone("t0", (0,), 1.0))
    assert [type(i) for i in out] == [CancelTask, FailQuery]


@pytest.mark.parametrize(
    "column",
    [
        pa.array([1, 2], pa.uint64()),
        pa.array([1, 2], pa.int64()),
        run_end_encode(pa.array([1, 2], pa.uint64()), run_end_type=pa.int16()),
        run_end_encode(pa.array([1, 2], pa.int64()), run_end_type=RUN_ENDS),
    ],
    ids=["plain-uint64", "plain-int64", "int16-run-ends", "int64-values"],
)
def test_a_unit_column_of_another_type_is_a_protocol_error(column: pa.Array) -> None:
    batch = pa.record_batch([pa.array([10, 11], pa.int64()), column], names=["x", UNIT_COLUMN])
    with pytest.raises(ProtocolError, match=UNIT_COLUMN) as info:
        gate().feed(batch)
    assert info.value.field == UNIT_COLUMN


@pytest.mark.parametrize(
    "batch",
    [
        pa.record_batch([pa.array([1, 2], pa.int64())], names=["x"]),
        pa.record_batch([encoded([1, 2]), pa.array([1, 2], pa.int64())], names=[UNIT_COLUMN, "x"]),
        pa.RecordBatch.from_pydict({}),
    ],
    ids=["no-unit-column", "unit-column-not-last", "no-columns"],
)
def test_a_batch_without_a_last_unit_column_is_a_protocol_error(batch: pa.RecordBatch) -> None:
    with pytest.raises(ProtocolError, match=UNIT_COLUMN) as info:
        gate().feed(batch)
    assert info.value.field == UNIT_COLUMN


def test_a_batch_with_null_unit_ids_is_a_protocol_error() -> None:
    tags: pa.Array = pa.RunEndEncodedArray.from_arrays(pa.array([1, 2], RUN_ENDS), pa.array([3, None], pa.uint64()))
    with pytest.raises(ProtocolError, match="null work unit ids") as info:
        gate().feed(tagged([3, 0], tags=tags))
    assert info.value.field == UNIT_COLUMN


def test_errors_name_the_task() -> None:
    with pytest.raises(ProtocolError, match="task s0 on grpc://a:1"):
        gate().feed(pa.record_batch([pa.array([1], pa.int64())], names=["x"]))


# -------------------------------------------------------- any batching


@st.composite
def tagged_streams(draw: st.DrawFn) -> tuple[list[tuple[int, int]], list[tuple[int, int]], list[int], list[bool]]:
    """Units in the order a task ran them, as (id, rows) with distinct ids (rows may be 0: the unit
    is then absent from the stream); the runs the whole stream's tags are encoded in (a unit's rows
    may be several adjacent runs); where it is cut into batches (row offsets, repeated ones make
    empty batches); and for each batch, whether it is a slice of the whole or encoded afresh."""
    ids = draw(st.lists(st.integers(0, 2**64 - 1), max_size=8, unique=True))
    units = [(unit, draw(st.integers(0, 4))) for unit in ids]
    runs: list[tuple[int, int]] = []
    for unit, rows in units:
        if rows:  # a unit with no rows has no run
            cuts = sorted(draw(st.sets(st.integers(1, rows - 1), max_size=2))) if rows > 1 else []
            runs += [(unit, b - a) for a, b in itertools.pairwise([0, *cuts, rows])]
    total = sum(rows for _, rows in units)
    cuts = sorted(draw(st.lists(st.integers(0, total), max_size=8)))
    sliced = draw(st.lists(st.booleans(), min_size=len(cuts) + 1, max_size=len(cuts) + 1))
    return units, runs, cuts, sliced


@settings(max_examples=400, deadline=None)
@given(tagged_streams())
def test_any_batching_gives_back_every_row_in_order_and_each_unit_once_when_complete(
    stream: tuple[list[tuple[int, int]], list[tuple[int, int]], list[int], list[bool]],
) -> None:
    units, runs, cuts, sliced = stream
    unit_of_row = [unit for unit, rows in units for _ in range(rows)]
    whole = tagged(unit_of_row, tags=from_runs(runs))
    bounds = [0, *cuts, len(unit_of_row)]
    g = gate()
    released: list[pa.RecordBatch] = []
    done: list[int] = []
    for (start, end), as_slice in zip(itertools.pairwise(bounds), sliced):
        xs = list(range(start, end))
        batch = whole.slice(start, end - start) if as_slice else tagged(unit_of_row[start:end], xs)
        rows, completed = g.feed(batch)
        released += rows
        done += completed
        # Complete now: the units before the one the last row read belongs to; exactly their rows are out.
        if end:
            before = unit_of_row[: unit_of_row.index(unit_of_row[end - 1])]
            assert done == list(dict.fromkeys(before)), "a unit reported done before a later unit's rows arrived"
            assert xs_of(released) == list(range(len(before))), "rows released before their unit was complete"
            assert g.held_rows == end - len(before)
        else:
            assert (released, done) == ([], [])
    rows, completed = g.end()
    released += rows
    done += completed
    assert xs_of(released) == list(range(len(unit_of_row))), "rows lost, repeated or out of order"
    assert done == [unit for unit, rows in units if rows], "each unit with rows done once, in order"
    assert pa.Table.from_batches(released, schema=PLAIN).equals(pa.Table.from_batches([whole]).drop_columns([UNIT_COLUMN]))
