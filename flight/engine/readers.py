"""Readers turn one work unit into record batches; built-ins plus a registry.

A reader is looked up by the name a ``FeedScan`` carries, so nothing
executable crosses the wire: a worker runs only the readers it ships or that
an extension module loaded at its start registered (``flight-worker --extension``).

Batches are conformed to the scan's declared schema here, which is where types
Acero cannot process (``string_view``, as ``tpchgen-cli`` writes) become the
plain types it can.

**Data confinement.** A worker reads files only under its ``--data-root``
directories (``flight.engine.confine``). Every reader that opens a file a unit
names must first ask ``ctx.open_path(path)``, which returns the path to open (the
resolved real path) or raises ``PathRefused``, whose message names the rule and
never says whether the file exists. The built-in ``parquet``, ``ipc`` and ``csv``
readers do; an extension reader that opens files must do the same.

**Object storage.** A unit may name a URI (``s3://bucket/key``, ``gs://``, ``abfs://``,
``hdfs://``, ``file://``): the built-in readers open it through ``pyarrow.fs`` with the
worker's own configuration (``flight.sources.storage``), after the same confinement
check (a URI root: ``--data-root s3://bucket/prefix``). An extension reader opens
what a unit names with ``ctx.open_input_file(path)`` / ``ctx.open_input_stream(path)``,
which do both: check, then open, wherever the file lives.

**Errors never quote a file.** pyarrow's messages may (a CSV row, an IPC header's
first bytes read as a length, a value that does not cast), so the built-in
readers report a fixed description of the failure instead; the unit is named by
the caller (``work unit N of feed 'F' partition P``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from google.protobuf.message import DecodeError

from flight.engine.confine import NO_ROOTS, DataRoots, PathRefused
from flight.engine.decode import CHUNK_BYTES, row_group_batches
from flight.engine.pruning import ScanStats, row_groups
from flight.errors import UnitReadError
from flight.sources.storage import FileSystems, Location, describe, process_filesystems
from flight.wire._proto import plan_pb2
from flight.wire.arrow_types import UNITS_READER

log = logging.getLogger(__name__)

__all__ = [
    "DataRoots",
    "PathRefused",
    "Reader",
    "ReaderContext",
    "ScanStats",
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
    roots: DataRoots = NO_ROOTS
    """Where this worker may read files; the default, no roots, refuses every path."""
    files: FileSystems | None = None
    """The stores URIs are opened in; None: this process's (``storage.process_filesystems()``)."""
    prune: pc.Expression | None = None
    """The filter right above the scan, if any: the Parquet reader skips the row groups whose
    statistics show no row can pass it (the filter itself still runs above)."""
    scan: ScanStats | None = None
    """Where the Parquet reader counts row groups read and skipped (the task's)."""
    decode_threads: int = 1
    """How many row groups of one Parquet unit the readers decode at once (``flight.engine.decode``)."""

    def open_path(self, path: str | os.PathLike[str]) -> str:
        """The path to open for the file a unit names, or ``PathRefused`` (the one check every file reader makes).

        For a URI, the normalized URI: open it with ``open_input_file``, not ``open()``.
        """
        return self.roots.check(path)

    def locate(self, path: str | os.PathLike[str]) -> str | Location:
        """``open_path``, with a remote file as its ``storage.Location``."""
        return self.roots.locate(path)

    def filesystems(self) -> FileSystems:
        return self.files if self.files is not None else process_filesystems()

    def open_input_file(self, path: str | os.PathLike[str]) -> pa.NativeFile:
        """The file a unit names, checked and opened for random access, local or in a store."""
        where = self.locate(path)
        if isinstance(where, Location):
            return self.filesystems().open_input_file(where)
        try:
            return pa.OSFile(where, "r")
        except OSError as exc:
            raise UnitReadError(f"cannot open {os.fspath(path)!r}: {_why(exc, where, 'a')}") from None

    def open_input_stream(self, path: str | os.PathLike[str]) -> pa.NativeFile:
        """The file a unit names, checked and opened to be read from start to end."""
        where = self.locate(path)
        if isinstance(where, Location):
            return self.filesystems().open_input_stream(where)
        return self.open_input_file(where)


Reader = Callable[[bytes, ReaderContext], Iterable[pa.RecordBatch]]


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
            except pa.ArrowNotImplementedError as exc:  # about the types only: "Unsupported cast from ..."
                raise UnitReadError(f"{where}: column {f.name!r} of type {column.type} cannot become {f.type}: {exc}") from None
            except pa.ArrowInvalid:  # pyarrow's message quotes the value, which may come from a file
                raise UnitReadError(f"{where}: column {f.name!r} of type {column.type} cannot become {f.type}: a value does not convert") from None
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


def _why(exc: BaseException, real: str, kind: str) -> str:
    """What went wrong reading a file, in fixed words: never pyarrow's text, which may quote the file
    (a CSV row, an IPC header's first bytes read as a length) or name the resolved path."""
    if "://" in real and isinstance(exc, OSError):
        return describe(exc)
    if isinstance(exc, FileNotFoundError):
        return "no such file"
    if isinstance(exc, PermissionError):
        return "permission denied"
    if isinstance(exc, OSError):
        if os.path.isdir(real):
            return "it is a directory"
        return os.strerror(exc.errno) if exc.errno else "an I/O error"
    if isinstance(exc, pa.ArrowNotImplementedError):
        return f"it uses a {kind} feature this worker cannot read"
    return f"not a valid {kind} file, or a damaged one"


def _cannot_read(kind: str, path: str, real: str, exc: BaseException) -> UnitReadError:
    return UnitReadError(f"cannot read {kind} file {path!r}: {_why(exc, real, kind)}")


def read_parquet(body: bytes, ctx: ReaderContext) -> Iterator[pa.RecordBatch]:
    unit = _file_unit(body)
    where = ctx.locate(unit.path)
    real = str(where)
    try:
        pf, reopen = _open_parquet(where, ctx)
        named = list(unit.row_groups)
        if named and max(named) >= pf.num_row_groups:
            raise UnitReadError(f"file {unit.path!r} has {pf.num_row_groups} row groups, not {max(named) + 1}")
        groups = row_groups(pf, named or list(range(pf.num_row_groups)), where, ctx)
        if not groups:
            return
        constants = _constants(unit, ctx)
        wanted = list(ctx.columns or ctx.schema.names)
        columns = [c for c in wanted if c not in constants] if constants else ctx.columns
        if constants:
            have = set(pf.schema_arrow.names)
            for c in columns or ():
                if c not in have:
                    raise UnitReadError(f"column {c!r} is missing (it has {sorted(have)})")
        batches = row_group_batches(pf, reopen, groups, columns, ctx.batch_rows, ctx.decode_threads, _chunk_bytes(where))
        if not constants:
            yield from batches
            return
        for batch in batches:
            arrays = [pa.repeat(constants[n], batch.num_rows) if n in constants else batch.column(n) for n in wanted]  # type: ignore[call-overload]  # a Scalar: pyarrow-stubs want a Python value
            yield pa.RecordBatch.from_arrays(arrays, names=wanted)
    except (OSError, pa.ArrowException) as exc:
        raise _cannot_read("Parquet", unit.path, real, exc) from None


def _chunk_bytes(where: str | Location) -> int:
    """How much a decoding thread reads per call: a chunk in a store (one coalesced request), a row group locally."""
    return CHUNK_BYTES if isinstance(where, Location) else 0


def _open_parquet(where: str | Location, ctx: ReaderContext) -> tuple[pq.ParquetFile, Callable[[], pq.ParquetFile]]:
    """The unit's file, and how a decoding thread opens its own reader of it over the same footer."""
    if isinstance(where, Location):
        # Ranged reads of a store: the column chunks a row group needs, fetched together. The
        # handle is shared: ReadAt is safe from several threads (Parquet's own threaded reads rely on it).
        handle = ctx.filesystems().open_input_file(where)
        pf = pq.ParquetFile(handle, pre_buffer=True)
        return pf, lambda: pq.ParquetFile(handle, metadata=pf.metadata, pre_buffer=True)
    pf = pq.ParquetFile(where)
    return pf, lambda: pq.ParquetFile(where, metadata=pf.metadata)


def _constants(unit: plan_pb2.FileUnit, ctx: ReaderContext) -> dict[str, pa.Scalar]:
    """The unit's partition values (columns its file does not hold), typed as the scan's columns."""
    out: dict[str, pa.Scalar] = {}
    names = set(ctx.schema.names)
    for name, text in unit.partition_values.items():
        if name in names:
            target = ctx.schema.field(name).type
            try:
                out[name] = pa.scalar(text, pa.string()).cast(target)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                raise UnitReadError(f"the partition value of column {name!r} does not convert to {target}") from None
    for name in unit.null_partitions:
        if name in names:
            out[name] = pa.scalar(None, ctx.schema.field(name).type)
    return out


_MAPS: OrderedDict[tuple[str, int, int], pa.MemoryMappedFile] = OrderedDict()
_MAPS_LOCK = threading.Lock()
MAPPED_FILES = 64
"""IPC files a worker keeps mapped: a long-lived worker re-reading hot files skips re-faulting their pages."""


def _mapped(path: str) -> tuple[pa.MemoryMappedFile, tuple[str, int, int]]:
    """A read-only memory map of ``path``, reused while the file is unchanged (same mtime and size), and its key."""
    st = os.stat(path)
    key = (path, st.st_mtime_ns, st.st_size)
    with _MAPS_LOCK:
        source = _MAPS.get(key)
        if source is not None:
            _MAPS.move_to_end(key)
            return source, key
    source = pa.memory_map(path)
    with _MAPS_LOCK:
        _MAPS[key] = source
        while len(_MAPS) > MAPPED_FILES:
            old, _ = _MAPS.popitem(last=False)  # closed when its last reader lets go
            _BATCHES.pop(old, None)
    return source, key


_BATCHES: dict[tuple[str, int, int], list[pa.RecordBatch]] = {}
"""Mapped IPC files read whole, each batch validated: their batches (views of the map), served again while the file
is unchanged. Why: Arrow's read of a mapped range asks the kernel to read it ahead (``madvise``) every time."""


def read_ipc(body: bytes, ctx: ReaderContext) -> Iterator[pa.RecordBatch]:
    unit = _file_unit(body)
    where = ctx.locate(unit.path)
    if isinstance(where, Location):
        yield from _remote_ipc(unit.path, where, ctx)
        return
    real = where
    try:
        source, key = _mapped(real)
        kept = _BATCHES.get(key)
        if kept is not None:
            for batch in kept:
                yield batch.select(ctx.columns) if ctx.columns else batch
            return
        read: list[pa.RecordBatch] | None = []
        try:
            reader = pa.ipc.open_file(source)
            batches: Iterable[pa.RecordBatch] = (reader.get_batch(i) for i in range(reader.num_record_batches))
        except pa.ArrowInvalid:
            # Not the file format: an IPC stream, read from a map of its own (streams read sequentially).
            batches, read = pa.ipc.open_stream(pa.memory_map(real)), None
        for batch in batches:
            # IPC readers trust the file: a damaged one (bad offsets, dictionary indices) must fail
            # here, not crash the kernel that first dereferences it. Parquet's decoder checks itself.
            batch.validate(full=True)
            if read is not None:
                read.append(batch)
            yield batch.select(ctx.columns) if ctx.columns else batch
        if read is not None:
            with _MAPS_LOCK:
                if key in _MAPS:
                    _BATCHES[key] = read
    except (OSError, pa.ArrowException) as exc:
        # pyarrow's "Expected to read N metadata bytes" gives away the file's first bytes as N.
        raise _cannot_read("Arrow IPC", unit.path, real, exc) from None


def _remote_ipc(path: str, where: Location, ctx: ReaderContext) -> Iterator[pa.RecordBatch]:
    """An IPC file in a store: read through pyarrow.fs, every batch validated (no map to cache)."""
    try:
        source = ctx.filesystems().open_input_file(where)
        try:
            reader = pa.ipc.open_file(source)
            batches: Iterable[pa.RecordBatch] = (reader.get_batch(i) for i in range(reader.num_record_batches))
        except pa.ArrowInvalid:
            batches = pa.ipc.open_stream(ctx.filesystems().open_input_stream(where))
        for batch in batches:
            batch.validate(full=True)
            yield batch.select(ctx.columns) if ctx.columns else batch
    except (OSError, pa.ArrowException) as exc:
        raise _cannot_read("Arrow IPC", path, str(where), exc) from None


_CSV_CONVERSION = re.compile(r"^In CSV column #(\d+): CSV conversion error")
_CSV_MISSING = re.compile(r"^Column '(.*)' in include_columns does not exist in CSV file$", re.DOTALL)


def _csv_why(exc: BaseException, real: str, ctx: ReaderContext) -> str:
    """Like ``_why``, with the CSV failures worth telling apart: never the row or value pyarrow quotes."""
    text = str(exc) if isinstance(exc, (pa.ArrowInvalid, pa.ArrowKeyError)) else ""
    if text.startswith("CSV parse error"):
        return "a row does not parse (another number of fields than the header, or bad quoting)"
    if m := _CSV_CONVERSION.match(text):
        return f"a value in column #{m.group(1)} does not convert to the scan's type"
    if (m := _CSV_MISSING.match(text)) and m.group(1) in ctx.schema.names:  # the scan's column, not the file's text
        return f"its header has no column {m.group(1)!r}"
    if text == "Empty CSV file":
        return "the file is empty"
    return _why(exc, real, "CSV")


def read_csv(body: bytes, ctx: ReaderContext) -> Iterator[pa.RecordBatch]:
    unit = _file_unit(body)
    where = ctx.locate(unit.path)
    real = str(where)
    convert = pacsv.ConvertOptions(
        column_types={f.name: f.type for f in ctx.schema},
        include_columns=ctx.columns or ctx.schema.names,
    )
    delimiter = ctx.options.get("delimiter", ",")
    try:
        source = ctx.filesystems().open_input_stream(where) if isinstance(where, Location) else real
        yield from pacsv.open_csv(source, parse_options=pacsv.ParseOptions(delimiter=delimiter), convert_options=convert)  # type: ignore[arg-type]  # a NativeFile: pyarrow-stubs say IO
    except (OSError, pa.ArrowException) as exc:
        # pyarrow's parse and conversion errors quote the offending row or value.
        raise UnitReadError(f"cannot read CSV file {unit.path!r}: {_csv_why(exc, real, ctx)}") from None


def read_iceberg(body: bytes, ctx: ReaderContext) -> Iterator[pa.RecordBatch]:
    """An Iceberg data file (Parquet): its columns matched to the scan's by field id, not by name.

    ``ctx.options["field_ids"]`` (JSON: column name → Iceberg field id) comes from the
    coordinator's table schema (``flight.tables.iceberg``). A renamed column is found by its id; a
    column added after the file was written reads as nulls; a promoted type is cast.
    """
    unit = _file_unit(body)
    ids = _field_ids(ctx.options.get("field_ids", ""))
    where = ctx.locate(unit.path)
    real = str(where)
    try:
        pf, reopen = _open_parquet(where, ctx)
        in_file: dict[int, str] = {}
        for f in pf.schema_arrow:
            text = (f.metadata or {}).get(b"PARQUET:field_id", b"")
            if text.isdigit():
                in_file[int(text)] = f.name
        if not in_file:
            raise UnitReadError(f"data file {unit.path!r} has no Parquet field ids (a table needing a name mapping is not read yet)")
        wanted = ctx.columns or ctx.schema.names
        read = [in_file[ids[name]] for name in wanted if ids.get(name) in in_file]
        groups = row_groups(pf, list(range(pf.num_row_groups)), where, replace(ctx, prune=None))
        for batch in row_group_batches(pf, reopen, groups, read, ctx.batch_rows, ctx.decode_threads, _chunk_bytes(where)):
            columns = []
            for name in wanted:
                target = ctx.schema.field(name).type
                fid = ids.get(name)
                if fid in in_file:
                    columns.append(_as_type(batch.column(in_file[fid]), target, name))
                else:
                    columns.append(pa.nulls(batch.num_rows, target))
            yield pa.RecordBatch.from_arrays(columns, names=list(wanted))
    except (OSError, pa.ArrowException) as exc:
        raise _cannot_read("Parquet", unit.path, real, exc) from None


def _field_ids(text: str) -> dict[str, int]:
    """The ``field_ids`` option: a JSON object of column name to a non-negative integer id."""
    why = "the iceberg reader needs the reader option field_ids (a JSON object of column name to field id)"
    try:
        loaded = json.loads(text)
    except (ValueError, RecursionError):
        raise UnitReadError(why) from None
    if not isinstance(loaded, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**31 for v in loaded.values()
    ):
        raise UnitReadError(why)
    return {str(k): v for k, v in loaded.items()}


def _as_type(column: pa.Array, target: pa.DataType, name: str) -> pa.Array:
    """A data file's column as the table's type (a promotion); a clear error when it is not one."""
    if column.type == target:
        return column
    try:
        return column.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise UnitReadError(f"column {name!r} is {column.type} in the data file, which does not become {target}") from None


register_reader("parquet", read_parquet)
register_reader("iceberg", read_iceberg)
register_reader("ipc", read_ipc)
register_reader("csv", read_csv)
