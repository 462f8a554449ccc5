"""The Arrow data the seeds carry and the files their work units read, written deterministically."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from benchmarks.fuzz.settings import BOMB_ROWS

__all__ = [
    "DATA_FILES", "DATA_SCHEMA", "DATA_TOKEN", "LABEL_SCHEMA", "UNITS_SCHEMA", "data_dir_in", "data_table", "ipc_file", "ipc_stream",
    "schema_bytes", "table_stream", "write_data_files", "zeros_batch", "zstd_bomb",
]


# ----------------------------------------------------------------------- Arrow data

DATA_FIELDS: list[pa.Field] = [
    pa.field("id", pa.int64()), pa.field("name", pa.string()), pa.field("score", pa.float64()), pa.field("day", pa.date32()),
]
DATA_SCHEMA = pa.schema(DATA_FIELDS)
UNITS_SCHEMA = pa.schema([("unit", pa.binary())])
LABEL_SCHEMA = pa.schema([("name", pa.string()), ("label", pa.string())])
DATA_TOKEN = "/fuzz-data-dir".ljust(64, "-")
"""Stands for the directory of the data files in work-unit paths (workers want absolute paths under their
``--data-root``); replaced at run time by that directory, whose path is made exactly as long (protobuf
length prefixes stay valid), so that cases stay deterministic and replayable anywhere."""
DATA_FILES = {
    "parquet": ("part-0.parquet", "part-1.parquet"),
    "csv": ("part-0.csv",),
    "ipc": ("part-0.arrow", "part-0.arrows"),
}


def data_table(rows: int = 40, start: int = 0) -> pa.Table:
    ids = list(range(start, start + rows))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array([None if i % 11 == 0 else f"item-{i % 7}" for i in ids], pa.string()),
            "score": pa.array([float(i * 7 % 50) for i in ids], pa.float64()),
            "day": pa.array([19_000 + i for i in ids], pa.int32()).cast(pa.date32()),
        },
        schema=DATA_SCHEMA,
    )


def schema_bytes(schema: pa.Schema) -> bytes:
    return _data_schema_bytes() if schema is DATA_SCHEMA else bytes(schema.serialize().to_pybytes())


@functools.lru_cache(maxsize=1)
def _data_schema_bytes() -> bytes:
    return bytes(DATA_SCHEMA.serialize().to_pybytes())


def ipc_stream(schema: pa.Schema, batches: Sequence[pa.RecordBatch], compression: str | None = None) -> bytes:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)  # type: ignore[arg-type]  # a codec name drawn at run time
    with pa.ipc.new_stream(sink, schema, options=options) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def ipc_file(schema: pa.Schema, batches: Sequence[pa.RecordBatch]) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def table_stream(table: pa.Table, compression: str | None = None) -> bytes:
    return ipc_stream(table.schema, table.combine_chunks().to_batches(), compression)


def data_dir_in(workdir: Path) -> Path:
    """Where the data files go: under ``workdir``, padded to DATA_TOKEN's length."""
    base = workdir.resolve() / "data"
    pad = len(DATA_TOKEN) - len(str(base)) - 1
    if pad < 1:
        raise SystemExit(f"the scratch directory's path is too long for the data files: {workdir} (use a shorter --workdir)")
    return base / ("d" * pad)


def write_data_files(data_dir: Path) -> None:
    """The files the seeds' work units name (as DATA_TOKEN/NAME)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(DATA_FILES["parquet"]):
        pq.write_table(data_table(40, i * 40), data_dir / name, row_group_size=16)
    pacsv.write_csv(data_table(40, 80), data_dir / DATA_FILES["csv"][0])
    table = data_table(40, 120)
    (data_dir / DATA_FILES["ipc"][0]).write_bytes(ipc_file(DATA_SCHEMA, table.to_batches()))
    (data_dir / DATA_FILES["ipc"][1]).write_bytes(table_stream(table))


def _zeros(size: int) -> pa.Buffer:
    """``size`` zero bytes; numpy's calloc leaves untouched pages unallocated."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy comes with pyarrow's usual installs
        return pa.py_buffer(bytes(size))
    return pa.py_buffer(np.zeros(size, dtype=np.uint8))  # type: ignore[arg-type]  # an ndarray is a buffer; the stubs do not say so


@functools.lru_cache(maxsize=2)
def zeros_batch(rows: int) -> pa.RecordBatch:
    """A DATA_SCHEMA batch of zeros and empty strings: compresses to almost nothing."""
    wide, narrow = _zeros(8 * rows), _zeros(4 * (rows + 1))
    columns: list[pa.Array] = [
        pa.Array.from_buffers(pa.int64(), rows, [None, wide]),
        pa.Array.from_buffers(pa.string(), rows, [None, narrow, pa.py_buffer(b"")]),
        pa.Array.from_buffers(pa.float64(), rows, [None, wide]),
        pa.Array.from_buffers(pa.date32(), rows, [None, narrow]),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=DATA_SCHEMA)


@functools.lru_cache(maxsize=4)
def zstd_bomb(role: str) -> bytes:
    """A small zstd IPC stream that inflates to hundreds of MB."""
    if role == "values":
        return ipc_stream(DATA_SCHEMA, [zeros_batch(BOMB_ROWS)], "zstd")
    column = pa.Array.from_buffers(pa.int64(), BOMB_ROWS * 3, [None, _zeros(24 * BOMB_ROWS)])
    batch = pa.record_batch([column], names=["v"])
    return ipc_stream(batch.schema, [batch], "zstd")
