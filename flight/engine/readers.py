"""Readers turn one work unit into record batches; built-ins plus a registry.

A reader is looked up by the name a ``FeedScan`` carries, so nothing
executable crosses the wire: a worker runs only the readers it ships or that
an extension module loaded at its start registered (``flight-worker --extension``).

Batches are conformed to the scan's declared schema here, which is where types
Acero cannot process (``string_view``, as ``tpchgen-cli`` writes) become the
plain types it can.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from google.protobuf.message import DecodeError

from flight._proto import plan_pb2
from flight.arrow_types import UNITS_READER

__all__ = [
    "Reader",
    "ReaderContext",
    "UnitReadError",
    "conform",
    "get_reader",
    "reader_names",
    "register_reader",
]



@dataclass(frozen=True)
class ReaderContext:
    schema: pa.Schema
    columns: list[str] | None = None
    options: Mapping[str, str] = field(default_factory=dict)
    batch_rows: int = 64 * 1024


Reader = Callable[[bytes, ReaderContext], Iterable[pa.RecordBatch]]


class UnitReadError(Exception):
    """A unit could not be read; the message names what (e.g. the file) and why."""


_READERS: dict[str, Reader] = {}


def register_reader(name: str, reader: Reader) -> None:
    """Make ``reader`` available to FeedScans on this worker under ``name``."""
    if not name or name == UNITS_READER:
        raise ValueError(f"reader name {name!r} is empty or reserved")
    _READERS[name] = reader


def get_reader(name: str) -> Reader | None:
    return _READERS.get(name)


def reader_names() -> list[str]:
    return sorted([*_READERS, UNITS_READER])


# ---------------------------------------------------------------- conforming


def conform(batch: pa.RecordBatch, schema: pa.Schema, where: str) -> pa.RecordBatch:
    """``batch`` with exactly ``schema``'s columns, order and types; a clear error otherwise."""
    if batch.schema.equals(schema):
        return batch
    columns = []
    for f in schema:
        idx = batch.schema.get_field_index(f.name)
        if idx < 0:
            raise UnitReadError(f"{where}: column {f.name!r} is missing (it has {batch.schema.names})")
        column = batch.column(idx)
        if column.type != f.type:
            try:
                column = column.cast(f.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise UnitReadError(f"{where}: column {f.name!r} of type {column.type} cannot become {f.type}: {exc}") from exc
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, schema=schema)


# ------------------------------------------------------------------- built-ins


def _file_unit(body: bytes) -> plan_pb2.FileUnit:
    unit = plan_pb2.FileUnit()
    try:
        unit.ParseFromString(body)
    except DecodeError as exc:
        raise UnitReadError(f"the unit is not a FileUnit: {exc}") from exc
    if not unit.path:
        raise UnitReadError("the unit's FileUnit has an empty path")
    return unit


def read_parquet(body: bytes, ctx: ReaderContext) -> Iterator[pa.RecordBatch]:
    unit = _file_unit(body)
    try:
        pf = pq.ParquetFile(unit.path)
        groups = list(unit.row_groups) or None
        if groups and max(groups) >= pf.num_row_groups:
            raise UnitReadError(f"file {unit.path!r} has {pf.num_row_groups} row groups, not {max(groups) + 1}")
        # use_threads=False: this runs on a pool thread already; decoding must not wait on the pool itself.
        yield from pf.iter_batches(batch_size=ctx.batch_rows, row_groups=groups, columns=ctx.columns, use_threads=False)
    except (OSError, pa.ArrowException) as exc:
        raise UnitReadError(f"cannot read parquet file {unit.path!r}: {exc}") from exc


_MAPS: OrderedDict[tuple[str, int, int], pa.MemoryMappedFile] = OrderedDict()
_MAPS_LOCK = threading.Lock()
MAPPED_FILES = 64
"""IPC files a worker keeps mapped: a long-lived worker re-reading hot files skips re-faulting their pages."""


def _mapped(path: str) -> pa.MemoryMappedFile:
    """A read-only memory map of ``path``, reused while the file is unchanged (same mtime and size)."""
    st = os.stat(path)
    key = (path, st.st_mtime_ns, st.st_size)
    with _MAPS_LOCK:
        source = _MAPS.get(key)
        if source is not None:
            _MAPS.move_to_end(key)
            return source
    source = pa.memory_map(path)
    with _MAPS_LOCK:
        _MAPS[key] = source
        while len(_MAPS) > MAPPED_FILES:
            _MAPS.popitem(last=False)  # closed when its last reader lets go
    return source


def read_ipc(body: bytes, ctx: ReaderContext) -> Iterator[pa.RecordBatch]:
    unit = _file_unit(body)
    try:
        source = _mapped(unit.path)
        try:
            reader = pa.ipc.open_file(source)
            batches: Iterable[pa.RecordBatch] = (reader.get_batch(i) for i in range(reader.num_record_batches))
        except pa.ArrowInvalid:
            # Not the file format: an IPC stream, read from a map of its own (streams read sequentially).
            batches = pa.ipc.open_stream(pa.memory_map(unit.path))
        for batch in batches:
            yield batch.select(ctx.columns) if ctx.columns else batch
    except (OSError, pa.ArrowException) as exc:
        raise UnitReadError(f"cannot read Arrow IPC file {unit.path!r}: {exc}") from exc


def read_csv(body: bytes, ctx: ReaderContext) -> Iterator[pa.RecordBatch]:
    unit = _file_unit(body)
    convert = pacsv.ConvertOptions(
        column_types={f.name: f.type for f in ctx.schema},
        include_columns=ctx.columns or ctx.schema.names,
    )
    delimiter = ctx.options.get("delimiter", ",")
    try:
        yield from pacsv.open_csv(unit.path, parse_options=pacsv.ParseOptions(delimiter=delimiter), convert_options=convert)
    except (OSError, pa.ArrowException) as exc:
        raise UnitReadError(f"cannot read CSV file {unit.path!r}: {exc}") from exc


register_reader("parquet", read_parquet)
register_reader("ipc", read_ipc)
register_reader("csv", read_csv)
