"""Fuzz one flight-exec worker over the wire: no input a peer can send may kill or wedge it.

Why: a worker takes a ``TaskHeader``, a plan, frames, tickets, action bodies and
Arrow IPC payloads from whoever dials it, and docs/protocol.md (section 10)
promises that any malformed input ends as a clean error naming the offending
field while the worker stays healthy. The unit tests check the inputs someone
thought of; this sends thousands that nobody did.

How: every case starts from a *valid* seed (a task header whose plan the
worker accepts, the frames that feed it, a map stage's input batches, a ticket
for a live task, an action) and mutates it: bit flips, truncations, splices,
field values set to huge / max-uint / negative / empty, repeated fields blown
up, deeply nested or very wide expressions and operators, flat operator lists
that are not trees (an input that is no earlier node, a node two operators share,
two roots, a kind with the wrong number of inputs, more nodes than a worker takes), and Arrow IPC
payloads with corrupted offsets and lengths (string offsets out of range in a
``Values.ipc_stream``, in an IPC file read by a feed scan and in a map stage's
input batches; zstd bodies that inflate hugely; duplicate field names in
schemas). It talks to the worker with nothing but ``pyarrow.flight`` and the
generated modules of ``flight/wire/_proto`` (loaded without importing the ``flight``
package), so it tests the wire, not the client library.

Two families hold resources instead of sending malformed input (about 3 cases in 100, drawn
apart from the others so that a seed's other cases stay what they were): a **hoarder** opens
20-70 task exchanges, keeps them alive with ``Heartbeat`` frames doing nothing else, asks
``health`` meanwhile and abandons them (Release, Cancel, half-close or nothing, then the calls
cancelled); a **flood** makes a task hold what a client may (the largest credit window flooded
with units of up to 1 MiB; the largest output buffer with its DoGet open and never read; a
map stage sent 12 MiB batches with its output never read), and passes when the worker refuses
(a protocol error, field ``app_metadata.units``) or holds the client back (the flood's calls,
bounded by FLOOD_WAIT, stall). After either, the ``info`` action must count no running task
within the case's deadline: a leftover task is a hang. A third family drawn apart, **input**
(2 in 100, added with protocol 5), opens a task whose input comes on an input call
(docs/protocol.md, section 16) and sends that call mutated: its ``InputAttach`` corrupted or
naming another task or secret, messages left out or repeated, ``InputEnd`` counts that lie,
frames an input call does not carry.

After each case the ``health`` action must answer within ``--health-timeout``:

* **crash**: the worker process died, or health could not connect (or failed);
* **hang**: a call of the case did not return within its deadline (``--timeout``,
  for the whole case) or health did not answer in time;
* **unclear**: an error status holds a Python traceback (pyarrow appends one when
  a handler lets a non-Flight exception escape), or the part a client shows (the
  text before pyarrow's ``". Detail:"``, docs/protocol.md section 10), or an
  ``ErrorInfo`` message, names a file of the code (the repository, site-packages),
  is longer than 2,000 characters, or is a generic internal error without a
  ``[field: ...]``.

Without ``--url`` the fuzzer starts its own worker (``python -m flight.worker
--port 0``, with ``--data-root`` on the scratch directory that holds the files
the seeds read, when the worker has that flag), restarts it after a crash or a
hang, and keeps a spare starting so that a restart costs little. A crashing
case is run once more on the fresh worker: when it does not crash alone (an
earlier case corrupted memory, say), the report names the range of cases to
replay together (``--start A --cases N``). Every crash and hang input, and the
first few unclear ones of each kind, is kept as a JSON file in ``--corpus``
(with the worker's log, faulthandler's stacks included); replay one with
``--replay FILE``. ``drain`` is never sent (it disables the
worker for good); every other action is. Nothing is sent anywhere but
127.0.0.1: shuffle reads may only name loopback URLs and work units only local
paths outside /dev, /proc and /sys, and a mutation that breaks either rule is
drawn again. Cases are deterministic given ``--seed`` and the worker's protocol
version (case ``i`` depends on them and ``i`` only; the worker's URL and the data
directory are filled in when the case runs).

    python -m benchmarks.fuzz_worker [--cases N] [--seed S] [--corpus DIR] [--url grpc://127.0.0.1:PORT]
    python -m benchmarks.fuzz_worker --replay .fuzz-corpus/crash-ipc-s1-c00042.json
    python -m benchmarks.fuzz_worker --check-seeds      # every unmutated seed must run cleanly
    python -m benchmarks.fuzz_worker --cases 2000 --rss-limit-mb 200   # exit 1 if the worker grew more
    FUZZ_MEMDIAG=1 python -m benchmarks.fuzz_worker --worker-arg=--extension=benchmarks.memdiag   # where a large idle sample's memory is

Memory: the fuzzer reads the RSS of the worker it started (``VmRSS`` in /proc/PID/status).
What it measures is what the worker *keeps*: every RSS_EVERY (100) cases, and at the end, it
waits until the worker runs no task and its RSS stops falling, and takes that idle RSS. The
baseline is the idle RSS after its first RSS_WARMUP (20) cases, which load the engines, open
DuckDB and start the thread pools every later case reuses; a worker swapped for a fresh one
gets its own. ``max_rss_growth_mb`` is the largest idle RSS minus the baseline, in MiB
(``n/a`` with ``--url``: the process is not ours to read). What a case makes the worker hold
while it runs (a flood's unread output, up to its bounds) is reported as the peak beside it.

Progress goes to stderr; the last stdout line is exactly
``fuzz_cases: N, crashes: C, hangs: H, unclear: U, max_rss_growth_mb: G``. The exit code is 1
when there was a crash or a hang, or (with ``--rss-limit-mb``) when G is above the limit.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import functools
import hashlib
import importlib.util
import json
import math
import os
import queue
import random
import re
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Self

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.flight as fl
import pyarrow.parquet as pq
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, EncodeError, Message

REPO_ROOT = Path(__file__).resolve().parents[1]


def _load_proto(name: str) -> ModuleType:
    """``flight/wire/_proto/NAME.py`` without importing the ``flight`` package: the wire, not the library."""
    full = f"flight.wire._proto.{name}"
    if full in sys.modules:
        return sys.modules[full]
    path = REPO_ROOT / "flight" / "wire" / "_proto" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(full, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the generated protobuf module {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[full] = module
    spec.loader.exec_module(module)
    return module


P = _load_proto("protocol_pb2")
L = _load_proto("plan_pb2")
INPUT_CALL_PATH = "flight-exec.input"  # the descriptor path of an input call (docs/protocol.md, section 16)

PROTOCOL = {"version": 1}
"""The protocol version seeds speak: the worker's own, asked with the ``info`` action before any case is made."""
SUMMARY = "fuzz_cases: {n}, crashes: {c}, hangs: {h}, unclear: {u}, max_rss_growth_mb: {g}"
LISTENING = re.compile(r"^flight-worker listening on (grpc://\S+)$")
SELF_URL = "grpc://127.0.0.1:00000"
"""Stands for the worker's own URL in shuffle reads; replaced at run time (same length, so protobuf stays valid)."""
DEAD_URL = "grpc://127.0.0.1:1"
GET_WAIT_S = 10.0
"""How long a worker waits for a task named by a DoGet or a shuffle read to appear (``--get-wait``): a case whose
plan reads absent producers on its own worker rightly takes that long, so its deadline is extended by it."""
LOOPBACK_URL = re.compile(r"grpc(\+tcp)?://127\.0\.0\.1:\d{1,5}")
FORBIDDEN_DIRS = ("/dev", "/proc", "/sys", "/run")

DEFAULT_CASES = 10_000
CASE_TIMEOUT = 10.0
HEALTH_TIMEOUT = 2.0
SETTLE = 0.15
"""Seconds a case reads a task's output before it half-closes anyway (a mutated plan may rightly wait for ever)."""
SHORT_WAIT = 0.05
"""Deadline of a DoGet whose ticket names a task that never ran: the worker waits 10 s for it, by design."""
WATCHDOG_GRACE = 5.0
RECYCLE_THREADS = 400
"""An owned worker left with more threads than this by a case (say, a shuffle read of 1,000 absent
producers, each waiting 10 s on a thread of its own) is swapped for the spare: not a failure, but
it would slow every later case down. Each recycle is reported with the case that caused it."""
START_TIMEOUT = 60.0
MAX_MESSAGE = 2_000
MAX_ENDS = 64
"""Most feed partitions a case feeds and ends (a mutated header may assign thousands)."""
BLOWUP_BYTES = 4 << 20
BOMB_ROWS = 12_000_000
"""Rows of the all-zero batches that zstd squeezes into a few KB: 288 MB once inflated."""
UNCLEAR_KEPT = 3
"""Unclear cases kept in the corpus per family and reason (crashes and hangs: all)."""
T0 = 1_700_000_000_000_000_000
"""Work-unit timestamps: fixed, so that cases are deterministic."""
HOARD_TASKS = (20, 70)
"""Exchanges a hoarder opens: more than one client may run at once (64), few enough to open within a case's deadline."""
HOARD_BEAT = 0.2
"""Seconds between a hoarder's rounds of Heartbeat frames."""
FLOOD_WAIT = 1.5
"""Deadline of a flood's calls: a worker holding the flood back (gRPC flow control) stalls them, and that is the pass."""
FLOOD_FRAME_BYTES = 8 << 20
"""Unit bytes per WorkUnitBatch of a flood (a frame may carry up to 64 MiB)."""
FLOOD_UNIT_SIZES = (1 << 20, 256 << 10, 16 << 10)
FLOOD_BATCH_ROWS = 1 << 19
"""Rows of a map flood's batches: 12 MiB of zeros each."""
RSS_WARMUP = 20
"""Cases a fresh worker runs before its RSS becomes the baseline of ``max_rss_growth_mb``: the first ones
import the engines, open the DuckDB database and start the thread pools, which every later case reuses."""
RSS_EVERY = 100
"""Cases between two settled RSS samples (``RssWatch``)."""
SETTLE_S = 2.5
"""An idle worker's RSS counts as settled once it has not fallen for this long (it trims within two
seconds: after a whole round of its watchdog, a second long, in which no call ended)."""
SETTLE_MAX_S = 15.0
"""The longest wait for a settled sample: past the worker's 10 s peer timeout, which frees a task a
hoarder abandoned without a word."""
RSS_NOTE_MB = 150.0
"""An idle sample this far above the baseline is logged with the worker's thread count and whether it was idle."""

FRAME_MEMBERS = [f.name for f in P.CoordinatorFrame.DESCRIPTOR.oneofs_by_name["frame"].fields]
FLAT_EXPRESSIONS = "nodes" in L.Expression.DESCRIPTOR.fields_by_name
FLAT_OPERATORS = "operators" in L.StagePlan.DESCRIPTOR.fields_by_name
"""Whether a plan's operators travel as a flat list (``StagePlan.operators``, protocol 6) rather than nested in ``root``."""


def ser(msg: Message) -> bytes:
    return bytes(msg.SerializeToString(deterministic=True))


def parse(cls: Any, data: bytes) -> Any | None:
    """``cls`` parsed from ``data``, or None where the worker's own parser would fail too."""
    try:
        return cls.FromString(data)
    except (DecodeError, RecursionError, ValueError):
        return None


def _number(message: Any, name: str) -> int:
    return int(message.DESCRIPTOR.fields_by_name[name].number)


# ----------------------------------------------------------------- protobuf wire


_SMALL = [bytes((i,)) for i in range(128)]


def _varint(n: int) -> bytes:
    if 0 <= n < 128:
        return _SMALL[n]
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | 0x80 if n else low)
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (a message, string or bytes)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _int_field(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


Wrap = Callable[[int], tuple[bytes, bytes]]


def _wrapper(outer: int, before: bytes, inner: int, after: bytes = b"") -> Wrap:
    """One nesting level: field ``outer`` holding ``before``, field ``inner`` (the level below), ``after``."""

    def wrap(size: int) -> tuple[bytes, bytes]:
        head = _varint(inner << 3 | 2) + _varint(size)
        body = len(before) + len(head) + size + len(after)
        return _varint(outer << 3 | 2) + _varint(body) + before + head, after

    return wrap


def nest(core: bytes, wrap: Wrap, depth: int) -> bytes:
    """``depth`` levels of ``wrap`` around ``core``, built in linear time (protobuf libraries recurse)."""
    prefixes, suffixes, size = [], [], len(core)
    for _ in range(depth):
        prefix, suffix = wrap(size)
        prefixes.append(prefix)
        suffixes.append(suffix)
        size += len(prefix) + len(suffix)
    return b"".join(reversed(prefixes)) + core + b"".join(suffixes)


# ----------------------------------------------------------------------- Arrow data

DATA_SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64()), ("day", pa.date32())])
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
    with pa.ipc.new_stream(sink, schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as writer:
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
    return pa.py_buffer(np.zeros(size, dtype=np.uint8))


@functools.lru_cache(maxsize=2)
def zeros_batch(rows: int) -> pa.RecordBatch:
    """A DATA_SCHEMA batch of zeros and empty strings: compresses to almost nothing."""
    wide, narrow = _zeros(8 * rows), _zeros(4 * (rows + 1))
    columns = [
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


# ------------------------------------------------------------------- expressions

Tree = tuple[Any, ...]
"""("col", name) | ("lit", {Literal field: value}) | ("call", function, [Tree, ...], FunctionOptions | None)."""


def col(name: str) -> Tree:
    return ("col", name)


def lit(**value: Any) -> Tree:
    return ("lit", value)


def call(function: str, *args: Tree, options: Any = None) -> Tree:
    return ("call", function, list(args), options)


def _node(tree: Tree, args: list[Any]) -> dict[str, Any]:
    if tree[0] == "col":
        return {"field": L.FieldRef(name=tree[1])}
    if tree[0] == "lit":
        return {"literal": L.Literal(**tree[1])}
    message = L.Call(function=tree[1], args=args)
    if tree[3] is not None:
        message.options.CopyFrom(tree[3])
    return {"call": message}


def expression(tree: Tree) -> Any:
    """An ``Expression`` in whichever encoding plan.proto has: nested calls, or a flat post-order node list."""
    if not FLAT_EXPRESSIONS:
        args = [expression(a) for a in tree[2]] if tree[0] == "call" else []
        return L.Expression(**_node(tree, args))
    nodes: list[Any] = []
    _flatten(tree, nodes)
    return L.Expression(nodes=nodes)


def _flatten(tree: Tree, nodes: list[Any]) -> int:
    args = [_flatten(a, nodes) for a in tree[2]] if tree[0] == "call" else []
    nodes.append(L.ExprNode(**_node(tree, args)))
    return len(nodes) - 1


@functools.lru_cache(maxsize=64)
def chain_expression(depth: int, function: str, column: str, leaf_function: str = "", binary: bool = False) -> bytes:
    """``function`` applied ``depth`` times over a column (or ``leaf_function(column)``), serialized.

    With ``binary``, each level's second argument is the leaf again: ``f(f(leaf, leaf), leaf)``.
    """
    leaf = call(leaf_function, col(column)) if leaf_function else col(column)
    base = expression(leaf)
    if FLAT_EXPRESSIONS:
        first = len(base.nodes) - 1
        nodes_no, call_no, args_no = _number(L.Expression, "nodes"), _number(L.ExprNode, "call"), _number(L.Call, "args")
        name = _field(_number(L.Call, "function"), function.encode())
        second = _varint(first) if binary else b""
        # Node i: {call: {function, args: [first + i (, first)]}}, args packed, written directly (100,000 of them).
        args_tag, call_tag, nodes_tag = _varint(args_no << 3 | 2), _varint(call_no << 3 | 2), _varint(nodes_no << 3 | 2)
        parts = [ser(base)]
        for i in range(depth):
            args = _varint(first + i) + second
            body = name + args_tag + _varint(len(args)) + args
            node = call_tag + _varint(len(body)) + body
            parts.append(nodes_tag + _varint(len(node)) + node)
        return b"".join(parts)
    name = _field(_number(L.Call, "function"), function.encode())
    after = _field(_number(L.Call, "args"), ser(base)) if binary else b""
    return nest(ser(base), _wrapper(_number(L.Expression, "call"), name, _number(L.Call, "args"), after), depth)


def dag_expression(levels: int) -> bytes:
    """(flat encoding) each node adds the previous node to itself: 2**levels leaves once expanded."""
    nodes = [L.ExprNode(field=L.FieldRef(name="score"))]
    nodes += [L.ExprNode(call=L.Call(function="add", args=[i, i])) for i in range(levels)]
    return ser(L.Expression(nodes=nodes))


def bad_reference_expression(kind: str) -> bytes:
    """(flat encoding) a call whose argument index is not an earlier node."""
    index = {"self": 1, "forward": 5, "huge": 2**32 - 1, "cycle": 2}[kind]
    nodes = [L.ExprNode(field=L.FieldRef(name="score")), L.ExprNode(call=L.Call(function="negate", args=[index]))]
    if kind == "cycle":
        nodes.append(L.ExprNode(call=L.Call(function="negate", args=[1])))
        nodes[1].call.args[0] = 2
    return ser(L.Expression(nodes=nodes))


def chain_operator(core: bytes, depth: int, kind: str) -> bytes:
    """``depth`` Limit (or Filter) operators around the serialized operator ``core``."""
    if kind == "limit":
        after = _int_field(_number(L.Limit, "count"), 5)
        wrap = _wrapper(_number(L.Operator, "limit"), b"", _number(L.Limit, "input"), after)
    else:
        predicate = ser(expression(call("is_valid", col("name"))))
        wrap = _wrapper(_number(L.Operator, "filter"), b"", _number(L.Filter, "input"), _field(_number(L.Filter, "predicate"), predicate))
    return nest(core, wrap, depth)


def plan_bytes(root: bytes, plan: Any) -> bytes:
    """A StagePlan with ``root`` given as bytes (it may be deeper than protobuf can parse) and ``plan``'s other fields."""
    rest = L.StagePlan()
    rest.CopyFrom(plan)
    rest.ClearField("root")
    return _field(_number(L.StagePlan, "root"), root) + ser(rest)


# -------------------------------------------------------- a plan's operators on the wire

OPERATOR_KINDS = [f.name for f in L.Operator.DESCRIPTOR.oneofs_by_name["kind"].fields]
CHILD_FIELDS = {
    kind: tuple(f.name for f in L.Operator.DESCRIPTOR.fields_by_name[kind].message_type.fields if f.message_type is L.Operator.DESCRIPTOR)
    for kind in OPERATOR_KINDS
}
"""Each operator kind's fields that hold its inputs (``HashJoin``: left, right; ``Union``: inputs), from plan.proto."""


def _inputs_of(op: Any) -> list[Any]:
    kind = op.WhichOneof("kind")
    if kind is None:
        return []
    body = getattr(op, kind)
    out: list[Any] = []
    for name in CHILD_FIELDS[kind]:
        fd = body.DESCRIPTOR.fields_by_name[name]
        out += list(getattr(body, name)) if fd.is_repeated else [getattr(body, name)] if body.HasField(name) else []
    return out


def wire(plan: Any) -> bytes:
    """What ``TaskHeader.plan`` carries for ``plan``, a StagePlan whose operators are a tree in ``root``: with flat
    operators, the tree as ``OperatorNode``s in post-order, each naming its inputs by index, the root last."""
    if not FLAT_OPERATORS:
        return ser(plan)
    out = L.StagePlan()
    out.CopyFrom(plan)
    out.ClearField("root")
    if not plan.HasField("root"):
        return ser(out)
    order, inputs, stack = [], [], [(plan.root, -1)]  # pre-order, each operator's inputs as positions
    while stack:
        op, parent = stack.pop()
        order.append(op)
        inputs.append([])
        if parent >= 0:
            inputs[parent].append(len(order) - 1)
        stack.extend((child, len(order) - 1) for child in reversed(_inputs_of(op)))
    number, walk_ = [0] * len(order), [[0, 0]]
    while walk_:  # post-order: a node once its inputs have theirs
        top = walk_[-1]
        if top[1] < len(inputs[top[0]]):
            top[1] += 1
            walk_.append([inputs[top[0]][top[1] - 1], 0])
            continue
        walk_.pop()
        op, node = order[top[0]], out.operators.add()
        kind = op.WhichOneof("kind")
        if kind is not None:
            getattr(node, kind).CopyFrom(getattr(op, kind))  # seeds are shallow: copying the subtree costs little
            for name in CHILD_FIELDS[kind]:
                getattr(node, kind).ClearField(name)
            node.inputs.extend(number[i] for i in inputs[top[0]])
        number[top[0]] = len(out.operators) - 1
    return ser(out)


def tree_of(plan: Any) -> Any:
    """``plan`` as received (flat operators) with its operators as a tree in ``root`` again, leniently: an input
    index that is not an earlier node, or a node already used, is left out (a mutation may have made either)."""
    if not FLAT_OPERATORS:
        return plan
    tree = L.StagePlan()
    tree.CopyFrom(plan)
    tree.ClearField("operators")
    nodes, used = plan.operators, set()
    stack = [(len(nodes) - 1, tree.root)] if len(nodes) else []
    while stack:
        i, target = stack.pop()
        node = nodes[i]
        kind = node.WhichOneof("kind")
        if kind is None:
            continue
        body = getattr(target, kind)
        body.CopyFrom(getattr(node, kind))
        fields = [(name, body.DESCRIPTOR.fields_by_name[name].is_repeated) for name in CHILD_FIELDS[kind]]
        for k, j in enumerate(node.inputs):
            name, repeated = fields[min(k, len(fields) - 1)] if fields else ("", False)
            if j >= i or j in used or not name or (k >= len(fields) and not repeated):
                continue
            used.add(j)
            stack.append((j, getattr(body, name).add() if repeated else getattr(body, name)))
    return tree


def node_bytes(kind: str, body: bytes, inputs: Sequence[int] = ()) -> bytes:
    """One ``OperatorNode`` written directly (a body may hold an expression of 100,000 nodes): ``kind`` with the
    serialized ``body`` (no inputs in it), naming ``inputs`` by index."""
    packed = b"".join(_varint(i) for i in inputs)
    return _field(_number(L.OperatorNode, kind), body) + (_field(_number(L.OperatorNode, "inputs"), packed) if inputs else b"")


def with_nodes(plan: Any, nodes: Sequence[bytes]) -> bytes:
    """The (flat) ``plan`` as bytes with serialized ``nodes`` appended: the last one is the new root."""
    number = _number(L.StagePlan, "operators")
    return ser(plan) + b"".join(_field(number, n) for n in nodes)


def over_root(plan: Any, kind: str, body: bytes) -> bytes:
    """``plan`` (as received) with one more operator over its root: ``kind`` of ``body`` (serialized, without its
    input), taking the old root as its input."""
    if FLAT_OPERATORS:
        return with_nodes(plan, [node_bytes(kind, body, [max(0, len(plan.operators) - 1)])])
    inner = L.Operator.DESCRIPTOR.fields_by_name[kind].message_type
    return plan_bytes(_field(_number(L.Operator, kind), _field(inner.fields_by_name["input"].number, ser(plan.root)) + body), plan)


# ---------------------------------------------------------------------- seeds

SOURCES = ("values", "parquet", "csv", "ipc", "units", "exchange", "shuffle")
TEMPLATES = ("identity", "filter", "filter_str", "project", "limit", "aggregate", "sort", "union", "join", "join_filter", "window",
             "window_range", "aggregate_duckdb", "partitioned")
MAP_TEMPLATES = ("identity", "filter", "filter_str", "project", "limit", "aggregate", "sort")
UNIT_TEMPLATES = ("identity", "limit", "filter_len", "count", "project_len")
NAME_TEMPLATES = ("identity", "filter_str", "project", "aggregate", "sort", "join", "partitioned")
"""Templates whose kernels read the ``name`` strings (where corrupt offsets would be dereferenced)."""
UNIT_BODIES = [b"alpha", b"", b"\x00\xff\x00", b"x" * 100, b"unit-5"]


@dataclass
class Seed:
    """A valid task: its header, the units its feed partitions get, a map stage's input, a producer to run first."""

    kind: str
    template: str
    header: Any
    units: dict[tuple[str, int], list[bytes]] = field(default_factory=dict)
    window: int = 4
    is_map: bool = False
    upload: list[bytes] = field(default_factory=list)
    producer: bytes | None = None


def stage_key(qid: str, task: int = 0, stage: int = 0) -> Any:
    return P.StageKey(query_id=qid, stage_id=stage, task_number=task)


def _has(message: Any, name: str) -> bool:
    return name in message.DESCRIPTOR.fields_by_name


def query_secret(qid: str) -> dict[str, bytes]:
    """The query's secret, as keyword arguments for a TaskHeader, Ticket or CancelRequest (if the protocol has one).

    Derived from the query id, so cases stay deterministic; every task of a case's query shares it.
    """
    if not _has(P.TaskHeader, "query_secret"):
        return {}
    return {"query_secret": hashlib.sha256(f"flight-exec-fuzz/{qid}".encode()).digest()}


def make_ticket(key: Any, start: int, end: int) -> Any:
    """A DoGet ticket for ``key``'s partitions [start, end), with the query's secret."""
    extra = query_secret(key.query_id) if _has(P.Ticket, "query_secret") else {}
    return P.Ticket(stage_key=key, partition_start=start, partition_end=end, **extra)


def cancel_request(qid: str) -> Any:
    extra = query_secret(qid) if _has(P.CancelRequest, "query_secret") else {}
    return P.CancelRequest(query_id=qid, **extra)


def task_header(key: Any, plan: Any, feeds: Sequence[Any] = (), window: int = 0, compression: int = 0) -> Any:
    return P.TaskHeader(
        **query_secret(key.query_id),
        protocol_version=PROTOCOL["version"],
        stage_key=key,
        task_count=key.task_number + 1,
        plan=wire(plan),
        feeds=list(feeds),
        target_worker_url=SELF_URL,
        query_start_unix_nanos=T0,
        options=P.TaskOptions(ipc_compression=compression, feed_window=window),
    )


def file_unit(path: str) -> bytes:
    # Partition values for columns the scan does not have: ignored by the reader, but there for mutations to reach.
    return ser(L.FileUnit(path=path, partition_values={"zone": "7"}, null_partitions=["region"]))


def values_op(table: pa.Table) -> Any:
    return L.Operator(values=L.Values(ipc_stream=table_stream(table)))


@functools.lru_cache(maxsize=8)
def data_values(rows: int, start: int = 0) -> Any:
    """A Values operator of ``data_table(rows, start)`` (cached: seeds use a few, thousands of times)."""
    return values_op(data_table(rows, start))


@functools.lru_cache(maxsize=1)
def _labels() -> Any:
    table = pa.table({"name": [f"item-{i}" for i in range(7)], "label": [f"L{i}" for i in range(7)]}, schema=LABEL_SCHEMA)
    return values_op(table)


def _scan(feed: str, reader: str, schema: pa.Schema, **extra: Any) -> Any:
    return L.Operator(feed_scan=L.FeedScan(feed=L.WorkUnitFeed(feed_id=feed), reader=reader, schema=schema_bytes(schema), **extra))


def source(kind: str, qid: str, window: int) -> tuple[Any, list[Any], dict[tuple[str, int], list[bytes]]]:
    """A seed's bottom operator, its feed assignments and the units each partition gets."""
    if kind == "values":
        return data_values(50), [], {}
    if kind == "exchange":
        return L.Operator(exchange_input=L.ExchangeInput(schema=schema_bytes(DATA_SCHEMA))), [], {}
    if kind == "shuffle":
        producer = L.ProducerTask(url=SELF_URL, stage_key=ser(stage_key(qid, stage=1)))  # same query, stage 1
        read = L.ShuffleRead(stage_id=0, producers=[producer], partition_start=0, partition_end=1, schema=schema_bytes(DATA_SCHEMA))
        return L.Operator(shuffle_read=read), [], {}
    if kind == "units":
        units = {("u", 0): list(UNIT_BODIES)}
        window = max(window, len(UNIT_BODIES))  # all bodies go in the first frame, under the initial credit
        return _scan("u", "units", UNITS_SCHEMA), [P.FeedAssignment(feed_id="u", partitions=[0], window=window)], units
    files = DATA_FILES[kind]
    units = {(kind, p): [file_unit(f"{DATA_TOKEN}/{files[p % len(files)]}")] for p in range(2)}
    extra = {"reader_options": {"delimiter": ","}} if kind == "csv" else {}
    op = _scan(kind, kind, DATA_SCHEMA, **extra)
    return op, [P.FeedAssignment(feed_id=kind, partitions=[0, 1], window=window)], units


def _options(**member: Any) -> Any:
    return L.FunctionOptions(**member)


@functools.lru_cache(maxsize=1)
def _arrow_literal() -> bytes:
    return table_stream(pa.table({"v": pa.array([10], pa.int64())}))


@functools.lru_cache(maxsize=1)
def _value_set() -> bytes:
    return table_stream(pa.table({"v": pa.array(["item-1", "item-3"], pa.string())}))


def _project_exprs() -> list[tuple[str, Tree]]:
    return [
        ("id_k", call("add", col("id"), lit(int_value=1000))),
        ("upper", call("utf8_upper", col("name"))),
        ("score2", call("multiply", col("score"), lit(float_value=2.0))),
        ("in_set", call("is_in", col("name"), options=_options(set_lookup=L.SetLookupOptions(value_set=_value_set())))),
        ("id32", call("cast", col("id"), options=_options(cast=L.CastOptions(target_type=schema_bytes(pa.schema([("t", pa.int32())])))))),
        ("year", call("year", col("day"))),
        ("rounded", call("round", col("score"), options=_options(round=L.RoundOptions(ndigits=1)))),
        ("rounded_sql", call("round", col("score"), options=_options(round=L.RoundOptions(ndigits=1, round_mode="half_towards_infinity")))),
        ("prefix", call("utf8_slice_codeunits", col("name"), options=_options(slice=L.SliceOptions(start=0, stop=3)))),
        ("label", call("coalesce", col("name"), lit(string_value="?"))),
        ("joined", call("binary_join_element_wise", col("name"), lit(string_value="x"), lit(string_value="-"))),
        ("len", call("utf8_length", col("name"))),
        ("big", call("greater", col("id"), lit(arrow=_arrow_literal()))),
        ("like", call("match_like", col("name"), options=_options(match_substring=L.MatchSubstringOptions(pattern="item-%")))),
        ("cond", call("if_else", call("is_null", col("name")), lit(string_value="none"), col("name"))),
        ("padded", call("utf8_lpad", col("name"), options=_options(pad=L.PadOptions(width=12, padding="*")))),
        ("swapped", call("replace_substring_regex", col("name"),
                         options=_options(replace_substring=L.ReplaceSubstringOptions(pattern="([0-9]+)", replacement="<\\1>")))),
        ("trimmed", call("utf8_trim", col("name"), options=_options(trim=L.TrimOptions(characters="i-")))),
        ("joined_or", call("binary_join_element_wise", col("name"), lit(string_value="-"),
                           options=_options(join=L.JoinOptions(null_handling="replace", null_replacement="?")))),
        ("month", call("floor_temporal", col("day"), options=_options(round_temporal=L.RoundTemporalOptions(unit="month")))),
        ("shown", call("strftime", col("day"), options=_options(strftime=L.StrftimeOptions(format="%Y/%m/%d")))),
        ("parsed", call("strptime", lit(string_value="2024-01-02"), options=_options(strptime=L.StrptimeOptions(format="%Y-%m-%d", unit="us")))),
        ("greater_of", call("max_element_wise", col("score"), lit(float_value=0.0))),
        ("digits", call("count_substring_regex", col("name"), options=_options(match_substring=L.MatchSubstringOptions(pattern="[0-9]")))),
    ]


def _project(src: Any, exprs: Sequence[tuple[str, Tree]]) -> Any:
    named = [L.NamedExpression(name=n, expr=expression(t)) for n, t in exprs]
    return L.Operator(project=L.Project(input=src, exprs=named))


def _filter(src: Any, predicate: Tree) -> Any:
    return L.Operator(filter=L.Filter(input=src, predicate=expression(predicate)))


def data_root(template: str, src: Any) -> Any:
    """The operator tree of ``template`` over a source with DATA_SCHEMA columns."""
    if template in ("identity", "partitioned"):
        return src
    if template == "filter":
        return _filter(src, call("greater_equal", col("score"), lit(float_value=20.0)))
    if template == "filter_str":
        match = _options(match_substring=L.MatchSubstringOptions(pattern="item"))
        return _filter(src, call("and_kleene", call("starts_with", col("name"), options=match), call("is_valid", col("name"))))
    if template == "project":
        return _project(src, _project_exprs())
    if template == "limit":
        return L.Operator(limit=L.Limit(input=data_root("filter", src), count=5, offset=2))
    if template == "aggregate":
        calls = [("count_all", "", "n"), ("sum", "score", "s"), ("count_distinct", "id", "d"), ("mean", "score", "m"), ("max", "name", "top"),
                 ("stddev_samp", "score", "sd"), ("var_pop", "score", "vp")]
        aggs = [L.AggregateCall(function=f, column=c, name=n) for f, c, n in calls]
        return L.Operator(aggregate=L.Aggregate(input=src, keys=["name"], aggregates=aggs))
    if template == "aggregate_duckdb":  # only DuckDB computes these; a peer chooses a fraction, a separator, an order
        aggs = [L.AggregateCall(function="median", column="score", name="med"),
                L.AggregateCall(function="quantile_cont", column="score", name="q9", fraction=0.9),
                L.AggregateCall(function="string_agg", column="name", name="names", separator=",",
                                order=[L.AggregateOrder(column="id", descending=True)])]
        return L.Operator(aggregate=L.Aggregate(input=src, keys=["day"], aggregates=aggs))
    if template == "sort":
        keys = [L.SortKey(column="score", descending=True), L.SortKey(column="name")]
        return L.Operator(sort=L.Sort(input=src, keys=keys, nulls_first=True, fetch=7))
    if template == "union":
        return L.Operator(union=L.Union(inputs=[src, data_values(5, 500)]))
    if template == "join":
        join = L.HashJoin(left=src, right=_labels(), left_keys=["name"], right_keys=["name"], join_type="left outer", right_suffix="_r")
        return L.Operator(hash_join=join)
    if template == "join_filter":  # a condition beside the keys: the sides' names must differ
        right = _project(_labels(), [("lname", col("name")), ("label", col("label"))])
        condition = expression(call("greater", col("score"), lit(float_value=10.0)))
        join = L.HashJoin(left=src, right=right, left_keys=["name"], right_keys=["lname"], join_type="left semi", filter=condition)
        return L.Operator(hash_join=join)
    if template == "window":
        calls = [L.WindowCall(function="row_number", name="rn"), L.WindowCall(function="lag", column="score", name="prev", offset=2),
                 L.WindowCall(function="sum", column="score", name="run", frame=L.WindowFrame(start=-2, end=0))]
        order = [L.SortKey(column="id"), L.SortKey(column="score", descending=True)]
        return L.Operator(window=L.Window(input=src, partition_by=["name"], order_by=order, calls=calls))
    if template == "window_range":  # a RANGE frame: its offsets are distances in the one order key's values
        call_ = L.WindowCall(function="count_all", name="near", frame=L.WindowFrame(start=-3, end=2, range=True))
        return L.Operator(window=L.Window(input=src, partition_by=["name"], order_by=[L.SortKey(column="score")], calls=[call_]))
    raise ValueError(f"unknown template {template!r}")


def units_root(template: str, src: Any) -> Any:
    """The operator tree of ``template`` over the ``units`` reader (one binary column ``unit``)."""
    if template == "identity":
        return src
    if template == "limit":
        return L.Operator(limit=L.Limit(input=src, count=2))
    if template == "filter_len":
        return _filter(src, call("greater", call("binary_length", col("unit")), lit(int_value=1)))
    if template == "count":
        return L.Operator(aggregate=L.Aggregate(input=src, aggregates=[L.AggregateCall(function="count_all", name="n")]))
    if template == "project_len":
        return _project(src, [("len", call("binary_length", col("unit"))), ("unit", col("unit"))])
    raise ValueError(f"unknown units template {template!r}")


def templates_for(kind: str) -> tuple[str, ...]:
    if kind == "units":
        return UNIT_TEMPLATES
    if kind == "exchange":
        return MAP_TEMPLATES
    return TEMPLATES


def make_seed(kind: str, template: str, qid: str, window: int = 4, compression: int = 0) -> Seed:
    src, feeds, units = source(kind, qid, window)
    root = units_root(template, src) if kind == "units" else data_root(template, src)
    partitioned = template == "partitioned"
    output = L.OutputSpec(partitions=3 if partitioned else 1, hash_keys=["id"] if partitioned else [])
    plan = L.StagePlan(root=root, output=output)
    header = task_header(stage_key(qid), plan, feeds, window=window, compression=compression)
    if template == "identity" and kind != "exchange":
        header.options.retain_output = True  # a retained output (a detached query's head): read any number of times
    taggable = (kind in ("parquet", "csv", "ipc") and template in ("filter", "project")) or (kind, template) == ("units", "filter_len")
    if taggable:
        header.options.tag_units = True  # rows tagged with their unit (unit-level recovery): one unit at a time
    seed = Seed(kind, template, header, units, max(window, len(UNIT_BODIES)), kind == "exchange")
    if seed.is_map:
        table = data_table(30)
        seed.upload = [ipc_stream(DATA_SCHEMA, [b]) for b in table.to_batches(max_chunksize=10)]
    if kind == "shuffle":
        producer = L.StagePlan(root=data_values(50), output=L.OutputSpec(partitions=1))
        seed.producer = ser(task_header(stage_key(qid, stage=1), producer))
    return seed


def all_seed_kinds() -> list[tuple[str, str]]:
    return [(kind, template) for kind in SOURCES for template in templates_for(kind)]


# ---------------------------------------------------------------- case scripts


def op(name: str, **fields: Any) -> dict[str, Any]:
    return {"op": name, **fields}


def frame_bytes(**member: Any) -> bytes:
    return ser(P.CoordinatorFrame(**member))


def units_frame(feed: str, partition: int, bodies: Sequence[bytes]) -> bytes:
    """A WorkUnitBatch frame, written field by field (70,000 units as messages would take seconds)."""
    times = ser(P.WorkUnit(created_unix_nanos=T0, sent_unix_nanos=T0 + 1_000))
    units_no, body_no = _number(P.WorkUnitBatch, "units"), _number(P.WorkUnit, "body")
    encoded = {body: _field(units_no, (_field(body_no, body) if body else b"") + times) for body in set(bodies)}
    batch = ser(P.WorkUnitBatch(feed_id=feed, partition=partition)) + b"".join(encoded[body] for body in bodies)
    return _field(_number(P.CoordinatorFrame, "units"), batch)


def feed_end_frame(feed: str, partition: int) -> bytes:
    return frame_bytes(feed_end=P.FeedEnd(feed_id=feed, partition=partition))


def input_end_frame(rows: int, batches: int) -> bytes | None:
    """The map stage's end-of-input frame, if this protocol version has one."""
    if "input_end" not in FRAME_MEMBERS:
        return None
    return frame_bytes(input_end=P.InputEnd(rows=rows, batches=batches))


def walk(msg: Message, skip: tuple[str, ...] = ()) -> Iterator[Message]:
    """``msg`` and every message inside it (not inside bytes fields, nor inside messages of a type in ``skip``)."""
    yield msg
    for fd, value in msg.ListFields():
        if fd.message_type is None or _is_map(fd) or fd.message_type.name in skip:
            continue
        for item in value if fd.is_repeated else [value]:
            yield from walk(item, skip)


def _is_map(fd: Any) -> bool:
    return bool(fd.message_type is not None and fd.message_type.GetOptions().map_entry)


def assigned(header: Any) -> list[tuple[str, int]]:
    pairs: dict[tuple[str, int], None] = {}
    for feed in header.feeds:
        for partition in feed.partitions:
            pairs[(feed.feed_id, partition)] = None
            if len(pairs) >= MAX_ENDS:
                return list(pairs)
    return list(pairs)


def has_exchange_input(plan: Any) -> bool:
    return any(m.DESCRIPTOR.name == "ExchangeInput" for m in walk(plan, skip=("Expression",)))


def map_upload(seed: Seed, batches: Sequence[bytes] | None = None) -> list[dict[str, Any]]:
    """A map stage's input: schema, batches, end-of-input frame, half-close."""
    batches = seed.upload if batches is None else batches
    script = [op("begin", schema=schema_bytes(DATA_SCHEMA), compression=None)]
    script += [op("batch", ipc=b) for b in batches]
    end = input_end_frame(30 if batches is seed.upload else 0, len(batches))
    if end is not None and batches is seed.upload:
        script.append(op("frame", data=end))
    return script + [op("await_finished"), op("half_close")]


def task_script(cmd: bytes, seed: Seed) -> list[dict[str, Any]]:
    """What follows ``Ready``: units and feed ends for every assigned partition (or a map stage's input),
    a DoGet of the output (for at most SETTLE seconds: a mutated task may rightly wait for ever), the
    half-close. Built from the header as sent, mutations included, so that an accepted task can finish."""
    header = parse(P.TaskHeader, cmd)
    plan = parse(L.StagePlan, header.plan) if header is not None else None
    pairs = assigned(header) if header is not None else list(seed.units)
    is_map = has_exchange_input(plan) if plan is not None else seed.is_map
    script: list[dict[str, Any]] = []
    if pairs:
        script.append(op("wait_credits", count=len(pairs)))
    script += [op("frame", data=units_frame(f, p, seed.units[(f, p)])) for f, p in pairs if seed.units.get((f, p))]
    script += [op("frame", data=feed_end_frame(f, p)) for f, p in pairs]
    if is_map:
        return script + map_upload(seed)
    if header is not None and header.HasField("stage_key"):
        parts = plan.output.partitions if plan is not None and 1 <= plan.output.partitions <= MAX_ENDS else 1
        script.append(op("output", ticket=ser(make_ticket(header.stage_key, 0, parts))))
    script.append(op("half_close"))
    return script


def exchange_step(cmd: bytes, script: list[dict[str, Any]], label: str = "task") -> dict[str, Any]:
    return op("exchange", cmd=cmd, script=script, label=label)


def seed_steps(cmd: bytes, seed: Seed, script: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The case's steps: the task's exchange, inside its producer's when it reads one."""
    task = exchange_step(cmd, task_script(cmd, seed) if script is None else script)
    if seed.producer is None:
        return [task]
    return [exchange_step(seed.producer, [task, op("half_close")], "producer")]


# ------------------------------------------------------------------- mutation

INTS: dict[int, list[int]] = {
    FieldDescriptor.CPPTYPE_INT32: [0, 1, -1, 2**31 - 1, -(2**31), 7, 4096],
    FieldDescriptor.CPPTYPE_INT64: [0, 1, -1, 2**63 - 1, -(2**63), 2**32, -(2**32), 10**15],
    FieldDescriptor.CPPTYPE_UINT32: [0, 1, 2, 2**32 - 1, 2**31, 65_535, 65_536, 4_097, 99],
    FieldDescriptor.CPPTYPE_UINT64: [0, 1, 2**64 - 1, 2**63, 2**32, 1 << 40],
    FieldDescriptor.CPPTYPE_ENUM: [0, 1, 2, 3, 5, 8, 99, -1, 2**31 - 1],
}
FLOATS = [math.nan, math.inf, -math.inf, -0.0, 1e308, 5e-324, 0.0]
STRINGS = ["", "x" * 70_000, "\x00", "é" * 600, "../../../../etc/passwd", "id", "name", "score", "day", "unit",
           "files", "no-such", " ", "\U0001f4a5" * 10, "a/b/c", "drain", "%", "*"]
BLOWUPS = [2, 10, 100, 1_000, 10_000, 70_000]
EMBEDDED: dict[tuple[str, str], str] = {
    ("TaskHeader", "plan"): "StagePlan",
    ("ProducerTask", "stage_key"): "StageKey",
    ("WorkUnit", "body"): "FileUnit",
    ("FeedScan", "schema"): "schema",
    ("ExchangeInput", "schema"): "schema",
    ("ShuffleRead", "schema"): "schema",
    ("StagePlan", "output_schema"): "schema",
    ("CastOptions", "target_type"): "schema",
    ("Values", "ipc_stream"): "ipc:values",
    ("Literal", "arrow"): "ipc:literal",
    ("SetLookupOptions", "value_set"): "ipc:value_set",
}
"""Bytes fields that hold something structured: a serialized message, an IPC schema or an IPC stream."""
EMBEDDED_MESSAGES = {"StagePlan": L.StagePlan, "StageKey": P.StageKey, "FileUnit": L.FileUnit}


@dataclass
class Slot:
    """A field of a message in a tree; ``commit`` writes embedded messages back into their bytes fields."""

    owner: Message
    fd: Any  # a FieldDescriptor (pure-Python or upb)
    path: str
    commit: Callable[[], None]


def _weighted(rng: random.Random, options: Sequence[tuple[Any, float]]) -> Any:
    return rng.choices([o for o, _ in options], weights=[w for _, w in options])[0]


class Mutator:
    """Deterministic corruptions (one ``random.Random``) of bytes, messages, IPC schemas and streams.

    Every mutation appends a short note (where and what) that names the case in reports.
    """

    def __init__(self, rng: random.Random, donors: Sequence[bytes] = ()) -> None:
        self.rng = rng
        self.donors = donors
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        self.notes.append(text)

    # ----------------------------------------------------------------- raw bytes

    def raw(self, data: bytes, where: str) -> bytes:
        ops: list[tuple[Callable[[bytearray], bytearray], float]] = [
            (self._flip, 30), (self._set_byte, 10), (self._truncate, 15), (self._delete, 10), (self._duplicate, 8),
            (self._insert, 8), (self.splice, 7), (self._huge_varint, 7), (self._huge_length, 5),
        ]
        mutate = _weighted(self.rng, ops)
        self.note(f"{where}: {mutate.__name__.strip('_').replace('_', '-')}")
        return bytes(mutate(bytearray(data)))

    def _pos(self, data: bytearray) -> int:
        return self.rng.randrange(len(data)) if data else 0

    def _flip(self, data: bytearray) -> bytearray:
        for _ in range(self.rng.choice([1, 1, 1, 2, 3, 8])):
            if data:
                data[self._pos(data)] ^= 1 << self.rng.randrange(8)
        return data

    def _set_byte(self, data: bytearray) -> bytearray:
        if data:
            data[self._pos(data)] = self.rng.choice([0x00, 0xFF, 0x7F, 0x80, 0x01])
        return data

    def _truncate(self, data: bytearray) -> bytearray:
        return data[: self._pos(data)]

    def _delete(self, data: bytearray) -> bytearray:
        start = self._pos(data)
        return data[:start] + data[start + self.rng.randint(1, 32):]

    def _duplicate(self, data: bytearray) -> bytearray:
        start = self._pos(data)
        span = data[start:start + self.rng.randint(1, 64)]
        at = self._pos(data)
        return data[:at] + span * self.rng.choice([1, 2, 16]) + data[at:]

    def _insert(self, data: bytearray) -> bytearray:
        at = self._pos(data)
        return data[:at] + bytearray(self.rng.randbytes(self.rng.randint(1, 64))) + data[at:]

    def splice(self, data: bytearray) -> bytearray:
        if not self.donors:
            return self._flip(data)
        donor = self.rng.choice(self.donors)
        return data[: self._pos(data)] + bytearray(donor[self.rng.randrange(len(donor) or 1):])

    def _huge_varint(self, data: bytearray) -> bytearray:
        at = self._pos(data)
        return data[:at] + bytearray(b"\xff" * 9 + b"\x01") + data[at + self.rng.randint(0, 10):]

    def _huge_length(self, data: bytearray) -> bytearray:
        """A length-delimited field whose length says 4 GB."""
        tags = [i for i, b in enumerate(data[:-1]) if b & 7 == 2 and 1 <= b >> 3 <= 15]
        if not tags:
            return self._huge_varint(data)
        at = self.rng.choice(tags) + 1
        return data[:at] + bytearray(b"\xff\xff\xff\xff\x0f") + data[at + 1:]

    # --------------------------------------------------------------- structured

    def slots(self, msg: Message, path: str, commit: Callable[[], None] = lambda: None) -> list[Slot]:
        """Every field of ``msg`` and of the messages in it, embedded ones included."""
        out: list[Slot] = []
        for fd in msg.DESCRIPTOR.fields:
            here = f"{path}.{fd.name}"
            out.append(Slot(msg, fd, here, commit))
            if _is_map(fd):
                continue
            if fd.message_type is not None:
                items = list(getattr(msg, fd.name))[:20] if fd.is_repeated else [getattr(msg, fd.name)] if msg.HasField(fd.name) else []
                for i, item in enumerate(items):
                    out += self.slots(item, f"{here}[{i}]" if fd.is_repeated else here, commit)
                continue
            role = EMBEDDED.get((msg.DESCRIPTOR.name, fd.name), "")
            inner = parse(EMBEDDED_MESSAGES[role], getattr(msg, fd.name)) if role in EMBEDDED_MESSAGES else None
            if inner is not None:
                out += self.slots(inner, f"{here}<{role}>", _committer(msg, fd.name, inner, commit))
        return out

    def message(self, msg: Message, where: str) -> None:
        """One structured mutation somewhere in ``msg``'s tree."""
        slots = self.slots(msg, where)
        if slots:
            self.mutate_slot(self.rng.choice(slots))

    def mutate_slot(self, slot: Slot) -> None:
        fd = slot.fd
        if _is_map(fd):
            self._map(slot)
        elif fd.is_repeated:
            self._repeated(slot)
        elif fd.message_type is not None:
            self._submessage(slot)
        elif (slot.owner.DESCRIPTOR.name, fd.name) in EMBEDDED and self.rng.random() < 0.6:
            self._embedded(slot)
        else:
            self._scalar(slot)
        slot.commit()

    def _scalar(self, slot: Slot) -> None:
        fd, owner = slot.fd, slot.owner
        current = getattr(owner, fd.name)
        if fd.cpp_type == fd.CPPTYPE_BOOL:
            value: Any = not current
        elif fd.cpp_type in INTS:
            value = self.rng.choice(INTS[fd.cpp_type])
        elif fd.cpp_type in (fd.CPPTYPE_DOUBLE, fd.CPPTYPE_FLOAT):
            value = self.rng.choice(FLOATS)
        elif fd.type == fd.TYPE_BYTES:
            value = self._bytes_value(current)
        else:
            value = self.rng.choice([*STRINGS, current + current, current[:-1], current.upper()])
        setattr(owner, fd.name, value)
        self.note(f"{slot.path} = {_short(value)}")

    def _bytes_value(self, current: bytes) -> bytes:
        return bytes(self.rng.choice([b"", self.rng.randbytes(16), b"\x00" * 1024, b"\xff" * 64, current[: len(current) // 2],
                                      current + current, self.raw(current, "bytes")]))

    def _submessage(self, slot: Slot) -> None:
        owner, name = slot.owner, slot.fd.name
        choice = self.rng.choice(["clear", "empty", "recurse", "recurse"])
        if choice == "recurse" and owner.HasField(name):
            self.message(getattr(owner, name), slot.path)
            return
        owner.ClearField(name)
        if choice != "clear":
            getattr(owner, name).SetInParent()  # set but empty; in a oneof, switches the kind
        self.note(f"{slot.path}: {'cleared' if choice == 'clear' else 'empty'}")

    def _repeated(self, slot: Slot) -> None:
        items = getattr(slot.owner, slot.fd.name)
        choice = self.rng.choice(["clear", "blow-up", "blow-up", "drop", "add", "reverse"])
        if choice == "clear" or (not len(items) and choice != "add"):
            slot.owner.ClearField(slot.fd.name)
            choice = "clear"
        elif choice == "blow-up":
            choice = self._blow_up(items, slot)
        elif choice == "drop":
            del items[self.rng.randrange(len(items))]
        elif choice == "add":
            self._append(items, slot.fd)
        else:
            values = list(items)
            del items[:]
            items.extend(reversed(values))
        self.note(f"{slot.path}: {choice}")

    def _blow_up(self, items: Any, slot: Slot) -> str:
        item = items[self.rng.randrange(len(items))]
        size = len(ser(item)) if slot.fd.message_type is not None else 10
        count = min(self.rng.choice(BLOWUPS), max(1, BLOWUP_BYTES // max(1, size)))
        if slot.fd.message_type is not None:
            for _ in range(count):
                items.add().CopyFrom(item)
        else:
            items.extend([item] * count)
        return f"blow-up x{count}"

    def _append(self, items: Any, fd: FieldDescriptor) -> None:
        if fd.message_type is not None:
            items.add()
        elif fd.cpp_type in INTS:
            items.extend(self.rng.sample(INTS[fd.cpp_type], 3))
        elif fd.cpp_type in (fd.CPPTYPE_DOUBLE, fd.CPPTYPE_FLOAT):
            items.append(self.rng.choice(FLOATS))
        elif fd.cpp_type == fd.CPPTYPE_BOOL:
            items.append(True)
        elif fd.type == fd.TYPE_BYTES:
            items.append(self.rng.randbytes(8))
        else:
            items.append(self.rng.choice(STRINGS))

    def _map(self, slot: Slot) -> None:
        entries = getattr(slot.owner, slot.fd.name)
        choice = self.rng.choice(["clear", "weird", "many"])
        if choice == "clear":
            entries.clear()
        elif choice == "weird":
            entries[self.rng.choice(["delimiter", "", "x" * 300])] = self.rng.choice(["", "\x00", "ab", ";", "\n", "\"", "é"])
        else:
            for i in range(self.rng.choice([100, 10_000])):
                entries[f"k{i}"] = "v"
        self.note(f"{slot.path}: map {choice}")

    def _embedded(self, slot: Slot) -> None:
        role = EMBEDDED[(slot.owner.DESCRIPTOR.name, slot.fd.name)]
        data = getattr(slot.owner, slot.fd.name)
        if role == "schema":
            new = self.schema(data, slot.path)
        elif role.startswith("ipc:"):
            new = self.ipc(data, role[4:], slot.path)
        else:
            new = self.raw(data, slot.path)
        setattr(slot.owner, slot.fd.name, new)

    # ------------------------------------------------------------- Arrow payloads

    def ipc(self, data: bytes, role: str, where: str) -> bytes:
        """A corrupted Arrow IPC stream for a ``Values`` (role ``values``), a literal or a value set."""
        kinds: list[tuple[str, float]] = [
            ("string-offsets", 14), ("binary-offsets", 5), ("large-string-offsets", 4), ("list-offsets", 5),
            ("dictionary-indices", 6), ("zstd-bomb", 3), ("compressed-length", 8), ("metadata-int", 12),
            ("metadata-length", 5), ("body-truncated", 5), ("deep-type", 3), ("duplicate-names", 5),
            ("many-columns", 2), ("odd-stream", 6), ("raw", 17),
        ]
        kind = _weighted(self.rng, kinds)
        try:
            out = IPC_CORRUPTIONS[kind](self, data, role)
        except (pa.ArrowException, OSError, ValueError, TypeError, IndexError, struct.error) as exc:
            self.note(f"{where}: ipc {kind} failed on the client ({type(exc).__name__}); raw instead")
            return self.raw(data, where)
        self.note(f"{where}: ipc {kind}")
        return out

    def schema(self, data: bytes, where: str) -> bytes:
        """A corrupted or hostile encapsulated IPC schema message."""
        kinds: list[tuple[str, float]] = [
            ("duplicate-names", 15), ("deep-struct", 6), ("many-fields", 4), ("odd-type", 20), ("view-types", 6),
            ("empty", 5), ("empty-name", 4), ("huge-metadata", 3), ("stream-instead", 4), ("metadata-int", 8),
            ("truncated", 5), ("raw", 20),
        ]
        kind = _weighted(self.rng, kinds)
        try:
            out = SCHEMA_CORRUPTIONS[kind](self, data)
        except (pa.ArrowException, OSError, ValueError, TypeError, IndexError, struct.error) as exc:
            self.note(f"{where}: schema {kind} failed on the client ({type(exc).__name__}); raw instead")
            return self.raw(data, where)
        self.note(f"{where}: schema {kind}")
        return out


def _committer(owner: Message, name: str, inner: Message, commit: Callable[[], None]) -> Callable[[], None]:
    def write_back() -> None:
        setattr(owner, name, ser(inner))
        commit()

    return write_back


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:30]}...({len(text)} chars)"


# ------------------------------------------------------------- IPC corruptions


def _offsets_array(typ: pa.DataType, values: Sequence[bytes], rng: random.Random, wide: bool = False) -> tuple[pa.Array, str]:
    """A string/binary array whose *middle* offsets are wrong (first and last stay valid, so cheap checks pass)."""
    offsets, data = [0], b""
    for v in values:
        data += v
        offsets.append(len(data))
    how = rng.choice(["huge", "negative", "past-end", "max", "min", "backwards"])
    i = rng.randrange(1, len(values))
    offsets[i] = {"huge": 1 << 30, "negative": -(1 << 20), "past-end": len(data) + 1, "max": 2**31 - 1,
                  "min": -(2**31), "backwards": offsets[i - 1] - 3}[how]
    fmt = "q" if wide else "i"
    buffer = pa.py_buffer(struct.pack(f"<{len(offsets)}{fmt}", *offsets))
    return pa.Array.from_buffers(typ, len(values), [None, buffer, pa.py_buffer(data)]), how


def _names(rows: int) -> list[bytes]:
    return [f"item-{i % 7}".encode() for i in range(rows)]


def _replace_name(table: pa.Table, column: pa.Array) -> pa.Table:
    i = table.schema.get_field_index("name")
    return table.set_column(i, pa.field("name", column.type), column)


def _role_table(role: str) -> pa.Table:
    return data_table(20) if role == "values" else pa.table({"name": pa.array(["item-1"], pa.string())})


def _with_column(m: Mutator, role: str, column: pa.Array) -> bytes:
    table = _role_table(role) if role == "values" else pa.table({"name": pa.array(["x"] * len(column))})
    return table_stream(_replace_name(table, column))


def ipc_string_offsets(m: Mutator, data: bytes, role: str, typ: pa.DataType | None = None, wide: bool = False) -> bytes:
    rows = 20 if role == "values" else 3
    column, how = _offsets_array(typ or pa.string(), _names(rows), m.rng, wide)
    m.note(f"offsets {how}")
    return _with_column(m, role, column)


def ipc_list_offsets(m: Mutator, data: bytes, role: str) -> bytes:
    rows = 20 if role == "values" else 3
    child = pa.array(range(rows * 2), pa.int64())
    offsets = list(range(0, rows * 2 + 1, 2))
    offsets[m.rng.randrange(1, rows)] = m.rng.choice([1 << 30, -(1 << 20), rows * 2 + 5, 2**31 - 1])
    buffer = pa.py_buffer(struct.pack(f"<{len(offsets)}i", *offsets))
    column = pa.Array.from_buffers(pa.list_(pa.int64()), rows, [None, buffer], children=[child])
    base = _role_table(role) if role == "values" else pa.table({"name": pa.array(["x"] * rows)})
    return table_stream(base.append_column("tags", column))


def ipc_dictionary(m: Mutator, data: bytes, role: str) -> bytes:
    rows = 20 if role == "values" else 3
    bad = m.rng.choice([7, 1000, 2**31 - 1, -1, -(2**31)])
    indices = pa.array([bad if i == rows // 2 else i % 7 for i in range(rows)], pa.int32())
    column = pa.DictionaryArray.from_arrays(indices, pa.array([f"item-{i}" for i in range(7)]), safe=False)
    return _with_column(m, role, column)


def ipc_bomb(m: Mutator, data: bytes, role: str) -> bytes:
    return zstd_bomb("values" if role == "values" else "column")


def messages(data: bytes) -> list[tuple[int, int, int, int]]:
    """(metadata start, metadata length, body start, body length) of each message of an IPC stream."""
    out, buf, pos = [], pa.py_buffer(data), 0
    while pos + 8 <= len(data):
        (marker,) = struct.unpack_from("<I", data, pos)
        head = 8 if marker == 0xFFFFFFFF else 4
        (length,) = struct.unpack_from("<i", data, pos + head - 4)
        if length <= 0:
            break
        reader = pa.BufferReader(buf)
        reader.seek(pos)
        try:
            message = pa.ipc.read_message(reader)
        except (pa.ArrowException, OSError):
            break
        end = reader.tell()
        body = message.body.size if message.body is not None else 0
        out.append((pos + head, length, end - body, body))
        pos = end
    return out


def _patch(data: bytes, at: int, fmt: str, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, at, value)
    return bytes(out)


def _readable(data: bytes, role: str) -> bytes:
    """``data`` if it is an IPC stream with a record batch, else a fresh one for ``role``."""
    found = messages(data)
    return data if len(found) >= 2 else table_stream(_role_table(role))


def ipc_compressed_length(m: Mutator, data: bytes, role: str) -> bytes:
    """A compressed buffer whose 8-byte uncompressed-length prefix lies."""
    stream = table_stream(_role_table(role), m.rng.choice(["zstd", "lz4"]))
    _, _, body, size = messages(stream)[-1]
    starts = [body + i for i in range(0, size - 8, 8) if struct.unpack_from("<q", stream, body + i)[0] in _buffer_sizes(role)]
    at = m.rng.choice(starts or [body])
    value = m.rng.choice([2**40, 2**62, 2**63 - 1, -2, 0, 1, 2**31, 7])
    m.note(f"uncompressed length {value}")
    return _patch(stream, at, "<q", value)


def _buffer_sizes(role: str) -> set[int]:
    rows = 20 if role == "values" else 1
    return {rows * 8, rows * 4 + 4, rows * 4, (rows + 7) // 8, 40 + rows}


def ipc_metadata_int(m: Mutator, data: bytes, role: str) -> bytes:
    """An 8-byte integer in a record batch's metadata (a length, a buffer offset or size) set to an extreme."""
    stream = _readable(data, role)
    meta, length, _, body = messages(stream)[-1]
    spots = [meta + i for i in range(0, length - 7, 8) if 0 < struct.unpack_from("<q", stream, meta + i)[0] <= max(body, 64)]
    at = m.rng.choice(spots or [meta])
    value = m.rng.choice([2**62, 2**63 - 1, -1, -(2**63), 2**31, body + 8, 1 << 40])
    m.note(f"metadata int64 at {at - meta} = {value}")
    return _patch(stream, at, "<q", value)


def ipc_metadata_length(m: Mutator, data: bytes, role: str) -> bytes:
    stream = _readable(data, role)
    meta, _, _, _ = m.rng.choice(messages(stream))
    return _patch(stream, meta - 4, "<i", m.rng.choice([2**31 - 1, -8, 0, 7, 1 << 24]))


def ipc_body_truncated(m: Mutator, data: bytes, role: str) -> bytes:
    stream = _readable(data, role)
    _, _, body, size = messages(stream)[-1]
    return stream[: body + m.rng.randrange(max(1, size))]


def ipc_deep_type(m: Mutator, data: bytes, role: str) -> bytes:
    depth = m.rng.choice([40, 63, 64, 65, 100, 300])
    typ: pa.DataType = pa.int64()
    for _ in range(depth):
        typ = pa.struct([("s", typ)]) if m.rng.random() < 0.7 else pa.list_(typ)
    m.note(f"depth {depth}")
    column = pa.array([None] * 2, typ)
    base = _role_table(role).slice(0, 2) if role == "values" else pa.table({"name": ["x", "y"]})
    return table_stream(base.append_column("deep", column))


def ipc_duplicate_names(m: Mutator, data: bytes, role: str) -> bytes:
    table = _role_table(role)
    name = m.rng.choice(table.schema.names)
    extra = table.column(name) if m.rng.random() < 0.5 else pa.chunked_array([pa.array([1] * table.num_rows, pa.int64())])
    return table_stream(table.append_column(name, extra))


def ipc_many_columns(m: Mutator, data: bytes, role: str) -> bytes:
    count = m.rng.choice([1_000, 5_000])
    rows = 2
    table = pa.table({f"c{i}": pa.array([i] * rows, pa.int64()) for i in range(count)})
    base = _role_table(role).slice(0, rows) if role == "values" else pa.table({"name": ["x"] * rows})
    for f in base.schema:
        table = table.append_column(f, base.column(f.name))
    return table_stream(table)


def ipc_odd_stream(m: Mutator, data: bytes, role: str) -> bytes:
    table = _role_table(role)
    kind = m.rng.choice(["empty", "eos-only", "schema-only", "two-streams", "file-format", "no-eos", "two-batches", "zero-rows"])
    m.note(kind)
    stream = table_stream(table)
    if kind == "empty":
        return b""
    if kind == "eos-only":
        return b"\xff\xff\xff\xff\x00\x00\x00\x00"
    if kind == "schema-only":
        return ipc_stream(table.schema, [])
    if kind == "two-streams":
        return stream + stream
    if kind == "file-format":
        return ipc_file(table.schema, table.to_batches())
    if kind == "no-eos":
        return stream[:-8]
    if kind == "two-batches":
        return ipc_stream(table.schema, table.to_batches() * 2)
    return ipc_stream(table.schema, [empty_batch(table.schema)])


def empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)


def ipc_raw(m: Mutator, data: bytes, role: str) -> bytes:
    return m.raw(_readable(data, role), "ipc")


IPC_CORRUPTIONS: dict[str, Callable[[Mutator, bytes, str], bytes]] = {
    "string-offsets": ipc_string_offsets,
    "binary-offsets": lambda m, d, r: ipc_string_offsets(m, d, r, pa.binary()),
    "large-string-offsets": lambda m, d, r: ipc_string_offsets(m, d, r, pa.large_string(), wide=True),
    "list-offsets": ipc_list_offsets,
    "dictionary-indices": ipc_dictionary,
    "zstd-bomb": ipc_bomb,
    "compressed-length": ipc_compressed_length,
    "metadata-int": ipc_metadata_int,
    "metadata-length": ipc_metadata_length,
    "body-truncated": ipc_body_truncated,
    "deep-type": ipc_deep_type,
    "duplicate-names": ipc_duplicate_names,
    "many-columns": ipc_many_columns,
    "odd-stream": ipc_odd_stream,
    "raw": ipc_raw,
}


def _odd_types() -> list[pa.DataType]:
    return [
        pa.map_(pa.string(), pa.int64()), pa.dense_union([pa.field("a", pa.int64()), pa.field("b", pa.string())]),
        pa.sparse_union([pa.field("a", pa.int64())]), pa.dictionary(pa.int8(), pa.string()), pa.large_string(),
        pa.decimal256(76, 10), pa.decimal128(38, -5), pa.binary(1), pa.run_end_encoded(pa.int32(), pa.string()),
        pa.duration("ns"), pa.timestamp("ns", tz="Mars/Olympus_Mons"), pa.timestamp("s", tz="+25:00"), pa.float16(),
        pa.null(), pa.struct([]), pa.large_list(pa.int8()), pa.list_(pa.int8(), 3), pa.month_day_nano_interval(),
        pa.time64("ns"), pa.date64(), pa.bool_(), pa.uint64(), pa.binary(),
    ]


def _schema_or_data(data: bytes) -> pa.Schema:
    try:
        return pa.ipc.read_schema(pa.py_buffer(data))
    except (pa.ArrowException, OSError, ValueError):
        return DATA_SCHEMA


def schema_duplicate_names(m: Mutator, data: bytes) -> bytes:
    schema = _schema_or_data(data)
    f = schema.field(m.rng.randrange(len(schema))) if len(schema) else pa.field("id", pa.int64())
    twin = f if m.rng.random() < 0.5 else pa.field(f.name, m.rng.choice([pa.int64(), pa.string(), pa.bool_()]))
    return schema_bytes(schema.append(twin))


def schema_deep_struct(m: Mutator, data: bytes) -> bytes:
    typ: pa.DataType = pa.int64()
    depth = m.rng.choice([32, 64, 65, 100, 500])
    for _ in range(depth):
        typ = pa.struct([("s", typ)])
    m.note(f"depth {depth}")
    return schema_bytes(_schema_or_data(data).append(pa.field("deep", typ)))


def schema_many_fields(m: Mutator, data: bytes) -> bytes:
    base = _schema_or_data(data)
    count = m.rng.choice([1_000, 5_000])
    return schema_bytes(pa.schema(list(base) + [pa.field(f"c{i}", pa.int64()) for i in range(count)]))


def schema_odd_type(m: Mutator, data: bytes) -> bytes:
    schema = _schema_or_data(data)
    typ = m.rng.choice(_odd_types())
    m.note(str(typ))
    if not len(schema):
        return schema_bytes(pa.schema([pa.field("x", typ)]))
    i = m.rng.randrange(len(schema))
    return schema_bytes(schema.set(i, schema.field(i).with_type(typ)))


def schema_view_types(m: Mutator, data: bytes) -> bytes:
    schema = _schema_or_data(data)
    views = [pa.string_view(), pa.binary_view(), pa.list_view(pa.string_view()), pa.large_list_view(pa.int64()),
             pa.struct([("v", pa.string_view())]), pa.list_(pa.list_view(pa.binary_view()))]
    if not len(schema):
        return schema_bytes(pa.schema([pa.field("v", m.rng.choice(views))]))
    i = m.rng.randrange(len(schema))
    return schema_bytes(schema.set(i, schema.field(i).with_type(m.rng.choice(views))))


def schema_empty_name(m: Mutator, data: bytes) -> bytes:
    schema = _schema_or_data(data)
    name = m.rng.choice(["", " ", "x" * 70_000, "\x00", "a.b", "__index_level_0__"])
    return schema_bytes(schema.append(pa.field(name, pa.int64())))


def schema_huge_metadata(m: Mutator, data: bytes) -> bytes:
    schema = _schema_or_data(data)
    metadata = {b"k": b"v" * m.rng.choice([1 << 20, 8 << 20]), b"ARROW:extension:name": b"arrow.uuid"}
    return schema_bytes(schema.with_metadata(metadata))


SCHEMA_CORRUPTIONS: dict[str, Callable[[Mutator, bytes], bytes]] = {
    "duplicate-names": schema_duplicate_names,
    "deep-struct": schema_deep_struct,
    "many-fields": schema_many_fields,
    "odd-type": schema_odd_type,
    "view-types": schema_view_types,
    "empty": lambda m, d: schema_bytes(pa.schema([])),
    "empty-name": schema_empty_name,
    "huge-metadata": schema_huge_metadata,
    "stream-instead": lambda m, d: ipc_stream(_schema_or_data(d), []),
    "metadata-int": lambda m, d: _patch_schema_int(m, d),
    "truncated": lambda m, d: d[: m.rng.randrange(len(d) or 1)],
    "raw": lambda m, d: m.raw(d, "schema"),
}


def _patch_schema_int(m: Mutator, data: bytes) -> bytes:
    if len(data) < 16:
        return m.raw(data, "schema")
    at = m.rng.randrange(8, len(data) - 4) & ~3
    return _patch(data, at, "<i", m.rng.choice([2**31 - 1, -1, -(2**31), len(data) + 64]))


# ---------------------------------------------------------------------- cases


@dataclass
class Case:
    """One fuzz input: steps the runner plays against the worker, and files the worker's units read."""

    family: str
    index: int
    seed: int
    note: str
    steps: list[dict[str, Any]]
    files: dict[str, bytes] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"family": self.family, "index": self.index, "seed": self.seed, "note": self.note,
                "steps": _encode(self.steps), "files": _encode(self.files)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Case:
        return cls(data["family"], data["index"], data["seed"], data["note"], _decode(data["steps"]), _decode(data.get("files", {})))


def _encode(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"b64": base64.b64encode(value).decode()}
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"b64"}:
            return base64.b64decode(value["b64"])
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def all_steps(steps: Sequence[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for step in steps:
        yield step
        yield from all_steps(step.get("script", []))


def unsafe_reason(case: Case) -> str | None:
    """Why the worker could be made to reach beyond this machine's loopback and scratch files, or None."""
    for step in all_steps(case.steps):
        why = None
        if step["op"] == "exchange":
            why = _unsafe_header(step["cmd"])
        elif step["op"] in ("frame", "batch_frame"):
            why = _unsafe_frame(step["data"])
        if why:
            return why
    bad = [name for name in case.files if "/" in name or name.startswith(".")]
    return f"file {bad[0]!r}" if bad else None


def _unsafe_header(cmd: bytes) -> str | None:
    header = parse(P.TaskHeader, cmd)
    plan = parse(L.StagePlan, header.plan) if header is not None else None
    if plan is None:
        return None
    for message in walk(plan, skip=("Expression",)):
        url = str(getattr(message, "url", ""))
        if message.DESCRIPTOR.name == "ProducerTask" and not LOOPBACK_URL.fullmatch(url):
            return f"shuffle read from {url[:60]!r}"
    return None


def _unsafe_frame(data: bytes) -> str | None:
    frame = parse(P.CoordinatorFrame, data)
    if frame is None or frame.WhichOneof("frame") != "units":
        return None  # only units carry bodies a reader opens
    for body in {u.body for u in frame.units.units if b":" in u.body or b"/" in u.body}:
        unit = parse(L.FileUnit, body)
        if unit is not None and unit.path and not safe_path(unit.path):
            return f"work unit path {unit.path[:60]!r}"
    return None


def safe_path(path: str) -> bool:
    """Local, and not a device or kernel file: no URI scheme (``s3://``, ``hdfs:``), nothing under /dev, /proc, /sys."""
    if ":" in path or "\x00" in path:
        return False
    resolved = os.path.normpath(os.path.join("/scratch/fuzz", path))
    return not any(resolved == d or resolved.startswith(d + "/") for d in FORBIDDEN_DIRS)


# ----------------------------------------------------------------- generator

GENERATION_ERRORS = (pa.ArrowException, OSError, ValueError, TypeError, IndexError, struct.error, RecursionError, DecodeError, EncodeError)
FAMILIES: dict[str, float] = {"header": 30, "frames": 20, "map": 15, "ipc": 20, "ticket": 8, "action": 7}
RESOURCE_FAMILIES: dict[str, float] = {"hoard": 1.5, "flood": 1.5, "input": 2}
"""Cases per 100 drawn with a random generator of their own, so that every other case of a seed stays what it
was before they existed: those that hold the worker's resources (tasks, memory) rather than send it malformed
input (hoard, flood), and input calls (input: protocol 5), added after the others."""


def _input_raw_attach(rng: random.Random, m: Mutator, messages: list[dict[str, Any]], header: Any) -> None:
    messages[0] = op("frame", data=m.raw(messages[0]["data"], "CoordinatorFrame(attach)"))


def _input_other_key(rng: random.Random, m: Mutator, messages: list[dict[str, Any]], header: Any) -> None:
    key = P.StageKey()
    key.CopyFrom(header.stage_key)
    setattr(key, rng.choice(["stage_id", "task_number", "epoch"]), rng.choice([1, 7, 2**32 - 1]))
    secret = header.query_secret if rng.random() < 0.5 else rng.choice([b"", b"x" * 16, b"y" * 65])
    messages[0] = op("frame", data=frame_bytes(attach=P.InputAttach(stage_key=key, query_secret=secret)))
    m.note("input: attach to another key or with another secret")


def _input_drop(rng: random.Random, m: Mutator, messages: list[dict[str, Any]], header: Any) -> None:
    i = rng.randrange(len(messages))
    m.note(f"input: message {i} ({messages[i]['op']}) left out")
    del messages[i]


def _input_repeat(rng: random.Random, m: Mutator, messages: list[dict[str, Any]], header: Any) -> None:
    i = rng.randrange(len(messages))
    m.note(f"input: message {i} ({messages[i]['op']}) sent twice")
    messages.insert(i, dict(messages[i]))


def _input_end(rng: random.Random, m: Mutator, messages: list[dict[str, Any]], header: Any) -> None:
    rows, batches = rng.choice(INTS[FieldDescriptor.CPPTYPE_UINT64]), rng.choice(INTS[FieldDescriptor.CPPTYPE_UINT64])
    messages[-1] = op("frame", data=frame_bytes(input_end=P.InputEnd(rows=rows, batches=batches)))
    m.note(f"input: InputEnd says {rows} rows in {batches} batches")


def _input_foreign(rng: random.Random, m: Mutator, messages: list[dict[str, Any]], header: Any) -> None:
    other = rng.choice([frame_bytes(cancel=P.Cancel(reason="from an input call")), frame_bytes(release=P.Release()),
                        feed_end_frame("f", 0), b"", b"\xff" * 9, ser(P.WorkerFrame(heartbeat=P.Heartbeat()))])
    messages.insert(rng.randrange(len(messages) + 1), op("frame", data=other) if other else op("empty"))
    m.note("input: a frame an input call does not carry")


INPUT_MUTATIONS: dict[str, Callable[[random.Random, Mutator, list[dict[str, Any]], Any], None]] = {
    "raw_attach": _input_raw_attach, "other_key": _input_other_key, "drop": _input_drop, "repeat": _input_repeat,
    "end": _input_end, "foreign": _input_foreign,
}
INPUT_MUTATIONS_W = [("raw_attach", 3), ("other_key", 2), ("drop", 2), ("repeat", 2), ("end", 2), ("foreign", 2)]


class Generator:
    """Case ``index`` for ``seed``: depends on nothing else (so any case can be produced again)."""

    def __init__(self, seed: int, families: Sequence[str] | None = None) -> None:
        self.seed = seed
        self.families = [(f, w) for f, w in FAMILIES.items() if not families or f in families]
        self.resource = [(f, w) for f, w in RESOURCE_FAMILIES.items() if not families or f in families]
        if not self.families and not self.resource:
            raise ValueError(f"no such families {families}; known: {', '.join([*FAMILIES, *RESOURCE_FAMILIES])}")
        donors = [make_seed(k, t, "donor") for k, t in (("values", "project"), ("parquet", "join"), ("exchange", "sort"))]
        self.donors = [ser(s.header) for s in donors] + [frame_bytes(cancel=P.Cancel(reason="donor"))]

    def case(self, index: int) -> Case:
        rng = random.Random(f"flight-exec-fuzz/{self.seed}/{index}")
        family = self._family(index, rng)
        make = getattr(self, f"_{family}")
        for _ in range(20):
            m = Mutator(rng, self.donors)
            try:
                steps, files = make(rng, m, f"fz{self.seed}-{index}")
            except GENERATION_ERRORS:
                continue  # a corruption the client side cannot build (too deep for pyarrow, say): draw again
            case = Case(family, index, self.seed, "; ".join(m.notes) or "unmutated", steps, files)
            if unsafe_reason(case) is None:
                return case
        seed = make_seed("values", "identity", f"fz{self.seed}-{index}")
        return Case(family, index, self.seed, "unmutated (every mutation drawn was unsafe)", seed_steps(ser(seed.header), seed))

    def _family(self, index: int, rng: random.Random) -> str:
        """A resource family in RESOURCE_FAMILIES' share of cases (its own draw), else one of FAMILIES (from ``rng``)."""
        if self.resource:
            own = random.Random(f"flight-exec-fuzz/{self.seed}/{index}/resource")
            if not self.families or own.random() * 100 < sum(w for _, w in self.resource):
                return str(_weighted(own, self.resource))
        return str(_weighted(rng, self.families))

    def _seed(self, rng: random.Random, qid: str, kinds: Sequence[str] = SOURCES, templates: Sequence[str] | None = None) -> Seed:
        kind = rng.choice(list(kinds))
        allowed = [t for t in templates_for(kind) if templates is None or t in templates] or list(templates_for(kind))
        return make_seed(kind, rng.choice(allowed), qid, window=rng.choice([1, 2, 4, 8]), compression=rng.choice([0, 0, 1, 2]))

    # -- header: the DoExchange descriptor
    def _header(self, rng: random.Random, m: Mutator, qid: str) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
        seed = self._seed(rng, qid)
        header = P.TaskHeader()
        header.CopyFrom(seed.header)
        ops = sorted(rng.choices(HEADER_OPS, weights=[w for _, w in HEADER_OPS_W], k=rng.choice([1, 1, 1, 2, 3])),
                     key=lambda o: o in ("raw", "splice"))
        cmd = b""
        for name in ops:  # structured ones first: raw bytes cannot be mutated structurally
            if name == "raw":
                cmd = m.raw(cmd or ser(header), "TaskHeader")
            elif name == "splice":
                cmd = bytes(m.splice(bytearray(cmd or ser(header))))
                m.note("TaskHeader: splice with another seed")
            else:
                HEADER_MUTATIONS[name](m, header)
        steps = seed_steps(cmd or ser(header), seed)
        if SELF_URL.encode() in (cmd or ser(header)):  # it reads producers on this worker that never run: each waits --get-wait
            steps.insert(0, op("extend", seconds=GET_WAIT_S))
        return steps, {}

    # -- frames: CoordinatorFrames and other messages on an open leaf exchange
    def _frames(self, rng: random.Random, m: Mutator, qid: str) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
        seed = self._seed(rng, qid, kinds=("parquet", "csv", "ipc", "units"))
        cmd = ser(seed.header)
        script = task_script(cmd, seed)
        for _ in range(rng.choice([1, 1, 2, 3])):
            _mutate_frames(m, script, seed)
        if not _all_ended(script, assigned(seed.header)):
            script = [s for s in script if s["op"] != "output"]  # it cannot finish: do not wait for its output
        return seed_steps(cmd, seed, script), {}

    # -- input: an input call feeding a task whose ExchangeInput has separate_input (docs/protocol.md §16)
    def _input(self, rng: random.Random, m: Mutator, qid: str) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
        seed = self._seed(rng, qid, kinds=("exchange",))
        header = P.TaskHeader()
        header.CopyFrom(seed.header)
        plan = L.StagePlan.FromString(header.plan)
        for msg in walk(plan, skip=("Expression",)):
            if msg.DESCRIPTOR.name == "ExchangeInput":
                msg.separate_input, msg.input_id = True, "fuzz:input"
        header.plan = ser(plan)
        cmd = ser(header)
        attach = frame_bytes(attach=P.InputAttach(stage_key=header.stage_key, query_secret=header.query_secret))
        messages = [op("frame", data=attach), op("begin", schema=schema_bytes(DATA_SCHEMA), compression=None)]
        messages += [op("batch", ipc=b) for b in seed.upload]
        messages.append(op("frame", data=frame_bytes(input_end=P.InputEnd(rows=30, batches=len(seed.upload)))))
        for _ in range(rng.choice([1, 1, 2])):
            INPUT_MUTATIONS[_weighted(rng, INPUT_MUTATIONS_W)](rng, m, messages, header)
        first = parse(P.CoordinatorFrame, messages[0]["data"]) if messages and messages[0]["op"] == "frame" else None
        named = first.attach.stage_key if first is not None and first.WhichOneof("frame") == "attach" else None
        script = [op("input_call", messages=messages, short=named is not None and named != header.stage_key)]
        if rng.random() < 0.2:
            script.append(op("input_call", messages=[op("frame", data=attach)]))  # a second call for the same task
            m.note("input: a second input call")
        script += [op("output", ticket=ser(make_ticket(header.stage_key, 0, 1))), op("half_close")]
        return [exchange_step(cmd, script)], {}

    # -- map: record batches (and frames) up a map stage's exchange
    def _map(self, rng: random.Random, m: Mutator, qid: str) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
        variant = _weighted(rng, MAP_VARIANTS)
        # Hundreds of MB of zeros go to an aggregate: the point is the inflation, not streaming them back.
        seed = self._seed(rng, qid, kinds=("exchange",), templates=("aggregate",) if variant == "zeros" else None)
        declared, upload = MAP_UPLOADS[variant](m)
        m.note(f"map input {variant}")
        header = P.TaskHeader()
        header.CopyFrom(seed.header)
        if declared is not None:
            _set_exchange_schema(header, declared)
        if rng.random() < 0.15:
            _mutate_exchange_schema(m, header)
        cmd = ser(header)
        script = [s for s in task_script(cmd, seed) if s["op"] not in ("begin", "batch", "frame", "await_finished", "half_close")]
        script += upload
        for _ in range(rng.choice([0, 1, 1, 2])):
            _insert_extra(m, script, seed, map_stage=True)
        return seed_steps(cmd, seed, script), {}

    # -- ipc: Arrow IPC payloads inside plans and in the files units name
    def _ipc(self, rng: random.Random, m: Mutator, qid: str) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
        target = _weighted(rng, IPC_TARGETS)
        return IPC_FAMILY[target](self, rng, m, qid)

    # -- ticket: DoGet
    def _ticket(self, rng: random.Random, m: Mutator, qid: str) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
        return ticket_case(rng, m, qid), {}

    # -- action: DoAction (never drain) and ListActions
    def _action(self, rng: random.Random, m: Mutator, qid: str) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
        return action_case(rng, m, qid), {}

    # -- hoard: many live exchanges kept alive with heartbeats, then abandoned
    def _hoard(self, rng: random.Random, m: Mutator, qid: str) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
        return hoard_case(rng, m, qid), {}

    # -- flood: as much memory as a client may make a task hold
    def _flood(self, rng: random.Random, m: Mutator, qid: str) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
        return flood_case(rng, m, qid), {}


# -- header mutations

def _plan_of(header: Any) -> Any:
    """The header's plan as sent: its operators flat (``FLAT_OPERATORS``), else nested in ``root``."""
    return parse(L.StagePlan, header.plan) or L.StagePlan()


def _project_body(expr: bytes) -> bytes:
    """A Project's body (its input left out) computing one column ``x`` = the serialized Expression ``expr``."""
    named = _field(_number(L.NamedExpression, "name"), b"x") + _field(_number(L.NamedExpression, "expr"), expr)
    return _field(_number(L.Project, "exprs"), named)


def header_struct(m: Mutator, header: Any) -> None:
    m.message(header, "TaskHeader")


def header_deep_expression(m: Mutator, header: Any) -> None:
    """A filter (or project) whose expression nests ``depth`` calls deep."""
    plan = _plan_of(header)
    depth = m.rng.choice([10, 60, 99, 100, 101, 150, 199, 200, 201, 1_000, 10_000, 100_000])
    if m.rng.random() < 0.5:
        expr = chain_expression(depth, "invert", "name", "is_valid")
        header.plan = over_root(plan, "filter", _field(_number(L.Filter, "predicate"), expr))
    else:
        expr = chain_expression(depth, "negate", "score")
        header.plan = over_root(plan, "project", _project_body(expr))
    m.note(f"plan: expression nested {depth} deep")


DEEP_OPERATORS = [10, 40, 50, 64, 100, 1_000, 5_000] + ([9_990, 10_001, 30_000] if FLAT_OPERATORS else [])
"""Chains of operators over a plan's root. Nested, protobuf refused them past 50; flat, the worker takes up to
10,000 operators (limits.MAX_PLAN_OPERATORS), refuses longer lists, and refuses a plan deeper than its engines
compile (a few hundred operators), each by name."""


def header_deep_operator(m: Mutator, header: Any) -> None:
    plan = _plan_of(header)
    depth = m.rng.choice(DEEP_OPERATORS)
    kind = m.rng.choice(["limit", "filter"])
    if not FLAT_OPERATORS:
        header.plan = plan_bytes(chain_operator(ser(plan.root), depth, kind), plan)
    else:
        if kind == "limit":
            body = _int_field(_number(L.Limit, "count"), 5)
        else:
            body = _field(_number(L.Filter, "predicate"), ser(expression(call("is_valid", col("name")))))
        base = len(plan.operators)
        header.plan = with_nodes(plan, [node_bytes(kind, body, [max(0, base + k - 1)]) for k in range(depth)])
    m.note(f"plan: {depth} nested {kind} operators")


def header_wide(m: Mutator, header: Any) -> None:
    plan = tree_of(_plan_of(header))  # the operators as a tree, however they travel
    kind = m.rng.choice(["union", "project", "coalesce", "aggregate", "sort", "partitions", "producers", "and"])
    n = m.rng.choice([100, 100, 1_000, 1_000, 10_000])
    root = L.Operator()
    root.CopyFrom(plan.root)
    if kind == "union":
        n = min(n, 300)
        plan.root.CopyFrom(L.Operator(union=L.Union(inputs=[root] + [data_values(2)] * n)))
    elif kind == "project":
        plan.root.CopyFrom(_project(root, [(f"c{i}", col("id")) for i in range(n)]))
    elif kind == "coalesce":
        plan.root.CopyFrom(_project(root, [("c", call("coalesce", *[col("name")] * n))]))
    elif kind == "aggregate":
        aggs = [L.AggregateCall(function="count_all", name=f"n{i}") for i in range(n)]
        # partial: a peer may claim any aggregate is a pre-aggregate (the worker may then run it per unit).
        plan.root.CopyFrom(L.Operator(aggregate=L.Aggregate(input=root, aggregates=aggs, partial=True)))
    elif kind == "sort":
        plan.root.CopyFrom(L.Operator(sort=L.Sort(input=root, keys=[L.SortKey(column="id")] * n)))
    elif kind == "partitions":
        for feed in header.feeds:
            feed.partitions.extend(range(2, 2 + n))
    elif kind == "producers":
        # Absent producers on this worker (each read waits 10 s for its task) or at a port nobody listens on.
        producer = L.ProducerTask(url=m.rng.choice([SELF_URL, DEAD_URL]), stage_key=ser(stage_key("nobody")))
        read = L.ShuffleRead(producers=[producer] * min(n, 5_000), partition_start=0, partition_end=1, schema=schema_bytes(DATA_SCHEMA))
        plan.root.CopyFrom(L.Operator(union=L.Union(inputs=[root, L.Operator(shuffle_read=read)])))
    else:  # a long chain of and(...): deep in the nested encoding, long in the flat one
        predicate = _field(_number(L.Filter, "predicate"), chain_expression(n, "and", "name", "is_valid", binary=True))
        header.plan = over_root(_plan_of(header), "filter", predicate)
        m.note(f"plan: and-chain of {n}")
        return
    header.plan = wire(plan)
    m.note(f"plan: wide {kind} x{n}")


def header_flat_expression(m: Mutator, header: Any) -> None:
    """(flat expressions) shared subexpressions that explode when expanded, or arguments that are not earlier nodes."""
    if not FLAT_EXPRESSIONS:
        header_deep_expression(m, header)
        return
    plan = _plan_of(header)
    kind = m.rng.choice(["dag", "self", "forward", "huge", "cycle", "empty"])
    expr = {"dag": lambda: dag_expression(m.rng.choice([20, 40, 64, 200])), "empty": lambda: b""}.get(kind, lambda: bad_reference_expression(kind))()
    header.plan = over_root(plan, "project", _project_body(expr))
    m.note(f"plan: flat expression {kind}")


def _flat_values() -> bytes:
    """A Values node (no inputs) of two data rows."""
    return node_bytes("values", ser(data_values(2).values))


def header_flat_operators(m: Mutator, header: Any) -> None:
    """(flat operators) a list that is not a tree, a node of the wrong shape, or more nodes than a worker takes."""
    if not FLAT_OPERATORS:
        header_deep_operator(m, header)
        return
    plan = _plan_of(header)
    n = len(plan.operators)
    root, leaf = max(0, n - 1), _flat_values()
    limit = _int_field(_number(L.Limit, "count"), 3)
    kind = m.rng.choice(["self", "forward", "huge", "shared", "two-roots", "no-kind", "no-inputs", "extra-input", "join-one",
                         "union-none", "leaf-input", "nested-input", "nested-root", "empty", "over-limit", "at-limit"])
    if kind in ("self", "forward", "huge"):
        index = {"self": n, "forward": n + 5, "huge": 2**32 - 1}[kind]
        header.plan = with_nodes(plan, [node_bytes("limit", limit, [index])])
    elif kind == "shared":  # the root is the input of two operators
        header.plan = with_nodes(plan, [node_bytes("limit", limit, [root]), node_bytes("limit", limit, [root]),
                                        node_bytes("union", b"", [n, n + 1])])
    elif kind == "two-roots":
        header.plan = with_nodes(plan, [leaf])
    elif kind == "no-kind":
        header.plan = with_nodes(plan, [_field(_number(L.OperatorNode, "inputs"), _varint(root))])
    elif kind == "no-inputs":
        header.plan = with_nodes(plan, [node_bytes("filter", b"")])
    elif kind == "extra-input":
        header.plan = with_nodes(plan, [leaf, node_bytes("limit", limit, [root, n])])
    elif kind == "join-one":
        header.plan = with_nodes(plan, [node_bytes("hash_join", ser(L.HashJoin(left_keys=["id"], right_keys=["id"], join_type="inner")), [root])])
    elif kind == "union-none":
        header.plan = with_nodes(plan, [node_bytes("union", b"")])
    elif kind == "leaf-input":
        header.plan = with_nodes(plan, [node_bytes("values", ser(data_values(2).values), [root])])  # a leaf with an input
    elif kind == "nested-input":  # an input nested in the body as well as named
        nested = _field(_number(L.Limit, "input"), ser(data_values(2))) + limit
        header.plan = with_nodes(plan, [node_bytes("limit", nested, [root])])
    elif kind == "nested-root":  # the nested encoding of protocol 5, root set beside the operators
        header.plan = ser(plan) + _field(_number(L.StagePlan, "root"), ser(data_values(2)))
    elif kind == "empty":
        plan.ClearField("operators")
        header.plan = ser(plan)
    else:  # a union of as many Values as make the list one more than a worker takes, or exactly as many
        total = 10_000 + (kind == "over-limit")
        leaves = max(1, total - n - 1)
        header.plan = with_nodes(plan, [leaf] * leaves + [node_bytes("union", b"", [root, *range(n, n + leaves)])])
    m.note(f"plan: flat operators {kind}")


HEADER_OPS_W: list[tuple[str, float]] = [
    ("struct", 52), ("raw", 18), ("splice", 4), ("deep_expression", 8), ("deep_operator", 5), ("wide", 5), ("flat_expression", 6),
    ("flat_operators", 6),
]
HEADER_OPS = [name for name, _ in HEADER_OPS_W]
HEADER_MUTATIONS: dict[str, Callable[[Mutator, Any], None]] = {
    "struct": header_struct,
    "deep_expression": header_deep_expression,
    "deep_operator": header_deep_operator,
    "wide": header_wide,
    "flat_expression": header_flat_expression,
    "flat_operators": header_flat_operators,
}


# -- frames: a leaf task's CoordinatorFrames (and what else a client can put on its exchange)

FRAME_OPS: list[tuple[str, float]] = [
    ("frame-raw", 20), ("frame-struct", 22), ("member", 10), ("duplicate", 6), ("drop", 6), ("swap", 4), ("empty", 6),
    ("garbage", 5), ("concat", 4), ("over-credit", 5), ("huge-body", 2), ("many-units", 2), ("batch", 4), ("cancel", 5),
    ("unassigned", 4), ("after-end", 4),
]


def _all_ended(script: list[dict[str, Any]], pairs: list[tuple[str, int]]) -> bool:
    """Whether the script's frames end every assigned feed partition (else the task rightly waits for ever)."""
    ended = set()
    for step in script:
        frame = parse(P.CoordinatorFrame, step["data"]) if step["op"] == "frame" else None
        if frame is not None and frame.WhichOneof("frame") == "feed_end":
            ended.add((frame.feed_end.feed_id, frame.feed_end.partition))
    return set(pairs) <= ended


def _frame_indexes(script: list[dict[str, Any]]) -> list[int]:
    return [i for i, s in enumerate(script) if s["op"] == "frame"]


def _insert(m: Mutator, script: list[dict[str, Any]], *items: dict[str, Any]) -> None:
    """Insert ``items`` somewhere between the first wait and the final output read / half-close."""
    first = 1 if script and script[0]["op"] == "wait_credits" else 0
    last = next((i for i, s in enumerate(script) if s["op"] in ("output", "half_close")), len(script))
    at = m.rng.randint(first, max(first, last))
    script[at:at] = list(items)


def member_frame(m: Mutator, seed: Seed) -> bytes:
    """A CoordinatorFrame with a random oneof member (whatever this protocol version has), maybe mutated."""
    member = m.rng.choice(FRAME_MEMBERS)
    frame = P.CoordinatorFrame()
    pair = m.rng.choice(list(seed.units) or [("files", 0)])
    if member == "units":
        units = [P.WorkUnit(body=b, id=i) for i, b in enumerate(seed.units.get(pair, []))]
        frame.units.CopyFrom(P.WorkUnitBatch(feed_id=pair[0], partition=pair[1], units=units))
    elif member == "feed_end":
        frame.feed_end.CopyFrom(P.FeedEnd(feed_id=pair[0], partition=pair[1]))
    elif member == "cancel":
        frame.cancel.reason = m.rng.choice(["fuzz", "", "x" * 70_000, "\n\x00"])
    elif member == "input_end":
        frame.input_end.CopyFrom(P.InputEnd(rows=m.rng.choice([0, 30, 2**64 - 1]), batches=m.rng.choice([0, 3, 2**64 - 1])))
    else:
        getattr(frame, member).SetInParent()
    if m.rng.random() < 0.4:
        m.message(frame, "CoordinatorFrame")
    m.note(f"frame member {member}")
    return ser(frame)


def _mutate_frames(m: Mutator, script: list[dict[str, Any]], seed: Seed) -> None:
    kind = _weighted(m.rng, FRAME_OPS)
    frames = _frame_indexes(script)
    pair = m.rng.choice(list(seed.units) or [("files", 0)])
    if kind in ("frame-raw", "frame-struct", "duplicate", "drop", "swap", "concat") and not frames:
        kind = "member"
    m.note(f"frames: {kind}")
    if kind == "frame-raw":
        i = m.rng.choice(frames)
        script[i] = op("frame", data=m.raw(script[i]["data"], "frame"))
    elif kind == "frame-struct":
        i = m.rng.choice(frames)
        frame = parse(P.CoordinatorFrame, script[i]["data"]) or P.CoordinatorFrame()
        m.message(frame, "CoordinatorFrame")
        script[i] = op("frame", data=ser(frame))
    elif kind == "member":
        _insert(m, script, op("frame", data=member_frame(m, seed)))
    elif kind == "duplicate":
        i = m.rng.choice(frames)
        script.insert(i + 1, dict(script[i]))
    elif kind == "drop":
        del script[m.rng.choice(frames)]
    elif kind == "swap":
        i, j = m.rng.choice(frames), m.rng.choice(frames)
        script[i], script[j] = script[j], script[i]
    elif kind == "empty":
        _insert(m, script, op("empty"))
    elif kind == "garbage":
        _insert(m, script, op("frame", data=m.rng.randbytes(m.rng.choice([1, 7, 64, 4096]))))
    elif kind == "concat":
        i, j = m.rng.choice(frames), m.rng.choice(frames)
        script[i] = op("frame", data=script[i]["data"] + script[j]["data"])
    elif kind == "over-credit":
        bodies = (seed.units.get(pair) or [b"x"]) * (seed.window * m.rng.choice([1, 2, 4]) + 1)
        _insert(m, script, op("frame", data=units_frame(*pair, bodies[: seed.window * 4 + 1])))
    elif kind == "huge-body":
        _insert(m, script, op("frame", data=units_frame(*pair, [b"\x00" * m.rng.choice([1 << 20, 17 << 20])])))
    elif kind == "many-units":
        _insert(m, script, op("frame", data=units_frame(*pair, [b"x"] * m.rng.choice([5_000, 70_000]))))
    elif kind == "batch":
        batch = data_table(3).to_batches()[0]
        _insert(m, script, op("begin", schema=schema_bytes(DATA_SCHEMA), compression=None), op("batch", ipc=ipc_stream(DATA_SCHEMA, [batch])))
    elif kind == "cancel":
        _insert(m, script, op("frame", data=frame_bytes(cancel=P.Cancel(reason="fuzz"))))
    elif kind == "unassigned":
        feed, partition = m.rng.choice([("nope", 0), (pair[0], 99), (pair[0], 2**32 - 1), ("", 0)])
        member = units_frame(feed, partition, [b"x"]) if m.rng.random() < 0.5 else feed_end_frame(feed, partition)
        _insert(m, script, op("frame", data=member))
    else:  # units after the partition's FeedEnd
        at = max(frames) + 1 if frames else len(script)
        script.insert(at, op("frame", data=units_frame(*pair, seed.units.get(pair) or [b"x"])))


# -- map: what goes up a map stage's exchange

def _stream_ops(schema: pa.Schema, batches: Sequence[pa.RecordBatch], rng: random.Random) -> list[dict[str, Any]]:
    compression = rng.choice([None, None, "lz4", "zstd"])
    script = [op("begin", schema=schema_bytes(schema), compression=compression)]
    script += [op("batch", ipc=ipc_stream(schema, [b])) for b in batches]
    end = input_end_frame(sum(b.num_rows for b in batches), len(batches))
    if end is not None:
        script.append(op("frame", data=end))
    return script + [op("await_finished"), op("half_close")]


def _data_batches(rows: int = 30, chunk: int = 10) -> list[pa.RecordBatch]:
    return data_table(rows).to_batches(max_chunksize=chunk)


def _swap_name(batch: pa.RecordBatch, column: pa.Array) -> pa.RecordBatch:
    arrays = [column if f.name == "name" else batch.column(i) for i, f in enumerate(batch.schema)]
    fields = [pa.field("name", column.type) if f.name == "name" else f for f in batch.schema]
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


def map_string_offsets(m: Mutator) -> tuple[pa.Schema | None, list[dict[str, Any]]]:
    batches = _data_batches()
    i = m.rng.randrange(len(batches))
    typ = m.rng.choice([pa.string(), pa.string(), pa.binary()])
    column, how = _offsets_array(typ, _names(batches[i].num_rows), m.rng)
    m.note(f"{typ} offsets {how}")
    batches = [_swap_name(b, column if j == i else b.column(1).cast(typ)) for j, b in enumerate(batches)]
    return None, _stream_ops(batches[0].schema, batches, m.rng)


def map_dictionary(m: Mutator) -> tuple[pa.Schema | None, list[dict[str, Any]]]:
    batches = _data_batches()
    bad = m.rng.choice([7, 1000, 2**31 - 1, -1])
    dictionary = pa.array([f"item-{i}" for i in range(7)])
    out = []
    for j, b in enumerate(batches):
        indices = pa.array([bad if (j == 1 and i == 3) else i % 7 for i in range(b.num_rows)], pa.int32())
        out.append(_swap_name(b, pa.DictionaryArray.from_arrays(indices, dictionary, safe=False)))
    m.note(f"dictionary index {bad}")
    return None, _stream_ops(out[0].schema, out, m.rng)


def map_list_offsets(m: Mutator) -> tuple[pa.Schema | None, list[dict[str, Any]]]:
    batches = _data_batches()
    out = []
    for j, b in enumerate(batches):
        rows = b.num_rows
        offsets = list(range(0, rows * 2 + 1, 2))
        if j == 1:
            offsets[m.rng.randrange(1, rows)] = m.rng.choice([1 << 30, -(1 << 20), rows * 2 + 5])
        buffer = pa.py_buffer(struct.pack(f"<{len(offsets)}i", *offsets))
        tags = pa.Array.from_buffers(pa.list_(pa.int64()), rows, [None, buffer], children=[pa.array(range(rows * 2), pa.int64())])
        out.append(pa.RecordBatch.from_arrays([*b.columns, tags], schema=b.schema.append(pa.field("tags", pa.list_(pa.int64())))))
    return out[0].schema, _stream_ops(out[0].schema, out, m.rng)


def map_binary_utf8(m: Mutator) -> tuple[pa.Schema | None, list[dict[str, Any]]]:
    batches = [_swap_name(b, pa.array([b"\xff\xfe" if i == 2 else b"ok" for i in range(b.num_rows)], pa.binary())) for b in _data_batches()]
    return None, _stream_ops(batches[0].schema, batches, m.rng)


def map_duplicate_names(m: Mutator) -> tuple[pa.Schema | None, list[dict[str, Any]]]:
    name = m.rng.choice(DATA_SCHEMA.names)
    batches = [pa.RecordBatch.from_arrays([*b.columns, b.column(name)], schema=b.schema.append(b.schema.field(name))) for b in _data_batches()]
    declared = batches[0].schema if m.rng.random() < 0.5 else None
    return declared, _stream_ops(batches[0].schema, batches, m.rng)


def map_retyped(m: Mutator) -> tuple[pa.Schema | None, list[dict[str, Any]]]:
    """The stream's columns are of other types (cast by name), or one is missing."""
    how = m.rng.choice(["int-as-string", "missing", "string-as-int", "all-null"])
    m.note(how)
    out = []
    for b in _data_batches():
        if how == "int-as-string":
            out.append(_swap_name(b, pa.array(range(b.num_rows), pa.int64())))
        elif how == "missing":
            out.append(b.drop_columns(["score"]))
        elif how == "string-as-int":
            i = b.schema.get_field_index("id")
            out.append(b.set_column(i, pa.field("id", pa.string()), pa.array(["12", "x"] * (b.num_rows // 2), pa.string())))
        else:
            out.append(pa.RecordBatch.from_arrays([pa.nulls(b.num_rows, pa.null())] * 4, names=DATA_SCHEMA.names))
    return None, _stream_ops(out[0].schema, out, m.rng)


def map_shapes(m: Mutator) -> tuple[pa.Schema | None, list[dict[str, Any]]]:
    """Zero-row batches, hundreds of one-row batches, thousands of columns, a deeply nested column."""
    how = m.rng.choice(["zero-rows", "many-small", "wide", "deep", "no-batches"])
    m.note(how)
    if how == "zero-rows":
        batches = [empty_batch(DATA_SCHEMA)] * 3
    elif how == "many-small":
        batches = data_table(50).to_batches(max_chunksize=1)  # a sequential client must stay within gRPC's buffers
    elif how == "no-batches":
        batches = []
    elif how == "wide":
        base = _data_batches()[0]
        extra = [pa.array([i] * base.num_rows, pa.int64()) for i in range(2_000)]
        schema = pa.schema(list(base.schema) + [pa.field(f"c{i}", pa.int64()) for i in range(2_000)])
        batches = [pa.RecordBatch.from_arrays([*base.columns, *extra], schema=schema)]
    else:
        base = _data_batches()[0]
        typ: pa.DataType = pa.int64()
        for _ in range(m.rng.choice([30, 60, 62])):  # the client's IPC writer stops at 64 levels
            typ = pa.struct([("s", typ)])
        deep = pa.array([None] * base.num_rows, typ)
        batches = [pa.RecordBatch.from_arrays([*base.columns, deep], schema=base.schema.append(pa.field("deep", typ)))]
    schema = batches[0].schema if batches else DATA_SCHEMA
    return None, _stream_ops(schema, batches, m.rng)


def map_zeros(m: Mutator) -> tuple[pa.Schema | None, list[dict[str, Any]]]:
    """Hundreds of MB of zeros that zstd sends in a few KB."""
    script = [op("begin", schema=schema_bytes(DATA_SCHEMA), compression="zstd"), op("zeros", rows=BOMB_ROWS)]
    end = input_end_frame(BOMB_ROWS, 1)
    return None, script + ([op("frame", data=end)] if end is not None else []) + [op("await_finished"), op("half_close")]


def map_mismatch(m: Mutator) -> tuple[pa.Schema | None, list[dict[str, Any]]]:
    """Plain input, but the stage declares a schema it cannot be conformed to."""
    typ = m.rng.choice(_odd_types())
    name = m.rng.choice(DATA_SCHEMA.names)
    m.note(f"declared {name}: {typ}")
    i = DATA_SCHEMA.get_field_index(name)
    return DATA_SCHEMA.set(i, pa.field(name, typ)), _stream_ops(DATA_SCHEMA, _data_batches(), m.rng)


MAP_VARIANTS: list[tuple[str, float]] = [
    ("plain", 8), ("string-offsets", 18), ("dictionary", 10), ("list-offsets", 8), ("binary-utf8", 6),
    ("duplicate-names", 8), ("retyped", 8), ("shapes", 10), ("zeros", 3), ("mismatch", 6),
]
MAP_UPLOADS: dict[str, Callable[[Mutator], tuple[pa.Schema | None, list[dict[str, Any]]]]] = {
    "plain": lambda m: (None, _stream_ops(DATA_SCHEMA, _data_batches(), m.rng)),
    "string-offsets": map_string_offsets,
    "dictionary": map_dictionary,
    "list-offsets": map_list_offsets,
    "binary-utf8": map_binary_utf8,
    "duplicate-names": map_duplicate_names,
    "retyped": map_retyped,
    "shapes": map_shapes,
    "zeros": map_zeros,
    "mismatch": map_mismatch,
}


def _exchange_inputs(header: Any) -> tuple[Any, list[Any]]:
    plan = _plan_of(header)
    return plan, [msg for msg in walk(plan) if msg.DESCRIPTOR.name == "ExchangeInput"]


def _set_exchange_schema(header: Any, schema: pa.Schema) -> None:
    plan, inputs = _exchange_inputs(header)
    for found in inputs:
        found.schema = schema_bytes(schema)
    header.plan = ser(plan)


def _mutate_exchange_schema(m: Mutator, header: Any) -> None:
    plan, inputs = _exchange_inputs(header)
    for found in inputs:
        found.schema = m.schema(found.schema, "ExchangeInput.schema")
    header.plan = ser(plan)


MAP_EXTRAS = ("empty", "cancel", "member", "garbage", "batch-frame", "input-end-first", "input-end-wrong", "no-input-end")


def _insert_extra(m: Mutator, script: list[dict[str, Any]], seed: Seed, map_stage: bool = False) -> None:
    """Something else on a map stage's exchange: empty messages, frames, a batch carrying a frame."""
    kind = m.rng.choice(MAP_EXTRAS)
    m.note(f"map extra {kind}")
    begin = next((i for i, s in enumerate(script) if s["op"] == "begin"), 0)
    last = next((i for i, s in enumerate(script) if s["op"] in ("await_finished", "half_close")), len(script))
    at = m.rng.randint(begin, max(begin, last))
    if kind == "empty":
        script.insert(at, op("empty"))
    elif kind == "cancel":
        script.insert(at, op("frame", data=frame_bytes(cancel=P.Cancel(reason="fuzz"))))
    elif kind == "member":
        script.insert(at, op("frame", data=member_frame(m, seed)))
    elif kind == "garbage":
        script.insert(at, op("frame", data=m.rng.randbytes(m.rng.choice([1, 9, 300]))))
    elif kind == "batch-frame":
        batches = [i for i, s in enumerate(script) if s["op"] == "batch"]
        if batches:
            i = m.rng.choice(batches)
            script[i] = op("batch_frame", ipc=script[i]["ipc"], data=member_frame(m, seed))
    elif kind.startswith("input-end") or kind == "no-input-end":
        _input_end_extra(m, script, kind, begin)


def _input_end_extra(m: Mutator, script: list[dict[str, Any]], kind: str, begin: int) -> None:
    ends = [i for i, s in enumerate(script) if s["op"] == "frame" and (parse(P.CoordinatorFrame, s["data"]) or P.CoordinatorFrame()).WhichOneof("frame") == "input_end"]
    if kind == "no-input-end":
        for i in reversed(ends):
            del script[i]
        return
    rows = m.rng.choice([0, 1, 29, 31, 2**64 - 1])
    data = input_end_frame(rows, m.rng.choice([0, 1, 2**64 - 1]))
    if data is None:
        return
    if kind == "input-end-first":
        script.insert(begin, op("frame", data=data))
    elif ends:
        script[ends[0]] = op("frame", data=data)


# -- ipc: where Arrow IPC payloads travel

def _replace(m: Mutator, header: Any, owner: str, name: str, make: Callable[[bytes, str], bytes]) -> bool:
    """Set one embedded bytes field ``owner.name`` in the header's tree to ``make(old, path)``."""
    slots = [s for s in m.slots(header, "TaskHeader") if s.owner.DESCRIPTOR.name == owner and s.fd.name == name]
    if not slots:
        return False
    slot = slots[0] if m.rng.random() < 0.7 else m.rng.choice(slots)
    setattr(slot.owner, name, make(getattr(slot.owner, name), slot.path))
    slot.commit()
    return True


def _ipc_case(seed: Seed, header: Any) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
    return seed_steps(ser(header), seed), {}


def _copy_header(seed: Seed) -> Any:
    header = P.TaskHeader()
    header.CopyFrom(seed.header)
    return header


def ipc_target_values(gen: Generator, rng: random.Random, m: Mutator, qid: str) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
    seed = make_seed("values", rng.choice(NAME_TEMPLATES), qid, compression=rng.choice([0, 1, 2]))
    header = _copy_header(seed)
    _replace(m, header, "Values", "ipc_stream", lambda d, p: m.ipc(d, "values", p))
    return _ipc_case(seed, header)


def _ipc_in_expression(owner: str, name: str, role: str) -> Callable[[Generator, random.Random, Mutator, str], tuple[list[dict[str, Any]], dict[str, bytes]]]:
    def make(gen: Generator, rng: random.Random, m: Mutator, qid: str) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
        seed = make_seed(rng.choice(["values", "parquet", "exchange"]), "project", qid)
        header = _copy_header(seed)
        if role == "schema":
            _replace(m, header, owner, name, m.schema)
        else:
            _replace(m, header, owner, name, lambda d, p: m.ipc(d, role, p))
        return _ipc_case(seed, header)

    return make


def ipc_target_scan_schema(gen: Generator, rng: random.Random, m: Mutator, qid: str) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
    seed = gen._seed(rng, qid, kinds=("parquet", "csv", "ipc", "units", "exchange", "shuffle"))
    header = _copy_header(seed)
    for owner in ("FeedScan", "ExchangeInput", "ShuffleRead"):
        if _replace(m, header, owner, "schema", m.schema):
            break
    return _ipc_case(seed, header)


def ipc_target_output_schema(gen: Generator, rng: random.Random, m: Mutator, qid: str) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
    seed = gen._seed(rng, qid)
    header = _copy_header(seed)
    plan = _plan_of(header)
    plan.output_schema = m.schema(schema_bytes(DATA_SCHEMA), "StagePlan.output_schema")
    header.plan = ser(plan)
    return _ipc_case(seed, header)


def ipc_target_file(gen: Generator, rng: random.Random, m: Mutator, qid: str) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
    """A feed scan with the ``ipc`` reader over a corrupted Arrow IPC file (stream or file format)."""
    seed = make_seed("ipc", rng.choice(NAME_TEMPLATES[:-2] + ("limit", "filter")), qid)
    how = rng.choice(["stream", "stream", "file-offsets", "file-raw"])
    if how == "stream":
        content = m.ipc(table_stream(data_table(20)), "values", "file")
    elif how == "file-offsets":
        column, kind = _offsets_array(pa.string(), _names(20), rng)
        m.note(f"IPC file, name offsets {kind}")
        table = _replace_name(data_table(20), column)
        content = ipc_file(table.schema, table.to_batches())
    else:
        content = m.raw(ipc_file(DATA_SCHEMA, data_table(20).to_batches()), "IPC file")
    name = f"c-{hashlib.sha256(content).hexdigest()[:16]}.arrow"
    seed.units = {pair: [file_unit(f"{DATA_TOKEN}/{name}")] for pair in seed.units}
    return seed_steps(ser(seed.header), seed), {name: content}


IPC_TARGETS: list[tuple[str, float]] = [
    ("values", 40), ("literal", 7), ("value_set", 7), ("target_type", 7), ("scan_schema", 14), ("file", 20), ("output_schema", 5),
]
IPC_FAMILY: dict[str, Callable[[Generator, random.Random, Mutator, str], tuple[list[dict[str, Any]], dict[str, bytes]]]] = {
    "values": ipc_target_values,
    "literal": _ipc_in_expression("Literal", "arrow", "literal"),
    "value_set": _ipc_in_expression("SetLookupOptions", "value_set", "value_set"),
    "target_type": _ipc_in_expression("CastOptions", "target_type", "schema"),
    "scan_schema": ipc_target_scan_schema,
    "output_schema": ipc_target_output_schema,
    "file": ipc_target_file,
}


# -- ticket: DoGet

def format_key(key: Any) -> str:
    """How the worker names a task (``flight.wire.protocol.format_stage_key``, written again: the
    fuzzer is the doc's reader, not the code's)."""
    epoch = getattr(key, "epoch", 0)
    return f"{key.query_id}/{key.stage_id}/{key.task_number}" + (f"@{epoch}" if epoch else "")


def expects_wait(ticket: bytes, known: Any) -> bool:
    """Whether the worker will rightly wait (10 s) for the ticket's task to appear: it names a task that never ran."""
    t = parse(P.Ticket, ticket)
    if t is None or not t.HasField("stage_key") or not t.stage_key.query_id or t.partition_end <= t.partition_start:
        return False
    return format_key(t.stage_key) != format_key(known)


def _mutate_ticket(m: Mutator, ticket: Any) -> bytes:
    kind = _weighted(m.rng, [("struct", 55), ("raw", 30), ("special", 15)])
    if kind == "struct":
        m.message(ticket, "Ticket")
        return ser(ticket)
    if kind == "raw":
        return m.raw(ser(ticket), "Ticket")
    special = m.rng.choice(["empty", "end-max", "start-eq-end", "start-gt-end", "end-plus-one", "long-id", "no-key"])
    m.note(f"Ticket: {special}")
    if special == "empty":
        return b""
    if special == "end-max":
        ticket.partition_end = 2**32 - 1
    elif special == "start-eq-end":
        ticket.partition_start = ticket.partition_end
    elif special == "start-gt-end":
        ticket.partition_start = ticket.partition_end + 1
    elif special == "end-plus-one":
        ticket.partition_end += 1
    elif special == "long-id":
        ticket.stage_key.query_id = "q" * 70_000
    else:
        ticket.ClearField("stage_key")
    return ser(ticket)


def ticket_case(rng: random.Random, m: Mutator, qid: str) -> list[dict[str, Any]]:
    """A DoGet with a mutated ticket for a task that is live (its output unread), ended, or a map stage."""
    variant = rng.choice(["live", "live", "ended", "map", "twice"])
    parts = rng.choice([1, 3])
    kind = "exchange" if variant == "map" else "values"
    seed = make_seed(kind, "partitioned" if parts == 3 and kind == "values" else "identity", qid, compression=rng.choice([0, 1, 2]))
    if kind == "exchange":
        parts = 1
    key = seed.header.stage_key
    data = _mutate_ticket(m, make_ticket(key, 0, parts))
    get = op("doget", ticket=data, short=expects_wait(data, key))
    m.note(f"ticket for a {variant} task")
    cmd = ser(seed.header)
    if variant == "map":
        return [exchange_step(cmd, [get] + map_upload(seed), "producer")]
    if variant == "ended":
        return [exchange_step(cmd, [op("half_close")], "producer"), get]
    script = [get] + ([dict(get)] if variant == "twice" else []) + [op("half_close")]
    return [exchange_step(cmd, script, "producer")]


# -- action: DoAction and ListActions

def action_type(m: Mutator) -> str:
    """A mutated action name; never exactly ``drain`` (which disables the worker for good)."""
    base = m.rng.choice(["health", "info", "cancel"])
    how = m.rng.choice(["keep", "keep", "flip", "truncate", "upper", "append", "huge", "empty", "unicode", "random"])
    if how == "flip":
        i = m.rng.randrange(len(base))
        name = base[:i] + chr(ord(base[i]) ^ (1 << m.rng.randrange(7))) + base[i + 1:]
    else:
        name = {"keep": base, "truncate": base[: m.rng.randrange(len(base))], "upper": base.upper(), "append": base + "\x00",
                "huge": base * 20_000, "empty": "", "unicode": base + "\u202e\U0001f4a5",
                "random": "".join(m.rng.choice("abcdefghijklmnopqrstuvwxyz_-") for _ in range(8))}[how]
    m.note(f"action type {_short(name)}")
    return name if name != "drain" else "drain!"


def action_body(m: Mutator, kind: str, qid: str) -> bytes:
    request = cancel_request(qid)
    if kind == "cancel" or m.rng.random() < 0.2:
        how = m.rng.choice(["keep", "struct", "struct", "raw"])
        if how == "struct":
            m.message(request, "CancelRequest")
        return m.raw(ser(request), "CancelRequest") if how == "raw" else ser(request)
    return bytes(m.rng.choice([b"", m.rng.randbytes(16), b"\x00" * (1 << 20), ser(request)]))


def action_case(rng: random.Random, m: Mutator, qid: str) -> list[dict[str, Any]]:
    variant = _weighted(rng, [("plain", 50), ("cancel-live", 30), ("info-live", 15), ("list", 5)])
    m.note(f"action {variant}")
    if variant == "list":
        return [op("list_actions")]
    if variant == "cancel-live":
        seed = make_seed("parquet", "identity", qid, window=2)
        act = op("action", type="cancel", body=action_body(m, "cancel", qid))
        script = [op("wait_credits", count=2), act, op("half_close")]
        return [exchange_step(ser(seed.header), script)]
    kind = action_type(m)
    act = op("action", type=kind, body=action_body(m, kind, qid))
    if variant == "info-live":
        seed = make_seed("values", "identity", qid)
        return [exchange_step(ser(seed.header), [act, op("half_close")])]
    return [act]


# -- hoard and flood: a client holding what it may, within the protocol

ABANDON = ("cancel", "half-close", "release", "cancel-frame", "silent")
"""How a hoarder lets an exchange go: each then cancels the call (a hoarder that waited for the end of a
call still queued for capacity would wait for the worker's queue wait, 60 s)."""


def hoard_case(rng: random.Random, m: Mutator, qid: str) -> list[dict[str, Any]]:
    """20-70 exchanges of one query, each a task that waits for its client (a feed, a map stage's input),
    kept alive with Heartbeat frames for a few rounds, the worker's health asked meanwhile, then abandoned;
    afterwards the worker's ``info`` must count no running task."""
    count = rng.randint(*HOARD_TASKS)
    seed = make_seed(rng.choice(["parquet", "units", "exchange"]), "identity", qid, window=rng.choice([1, 4, 256]))
    cmds = []
    for i in range(count):
        header = _copy_header(seed)
        header.stage_key.task_number = i
        header.task_count = count
        cmds.append(ser(header))
    how = rng.choice([*ABANDON, "mixed"])
    beats = rng.randint(2, 4)
    m.note(f"hoard {count} {seed.kind} tasks, {beats} heartbeat rounds, abandoned: {how}")
    return [op("hoard", cmds=cmds, beats=beats, abandon=how), op("await_idle")]


FLOOD_VARIANTS = ("units", "output", "map")


def flood_case(rng: random.Random, m: Mutator, qid: str) -> list[dict[str, Any]]:
    """(units) a units task with the largest credit window flooded with units of up to 1 MiB, as fast as
    credit allows; (output) the same with the largest output buffer while a DoGet of its output is open and
    never read; (map) a map stage sent 12 MiB batches while its output is never read. The worker must
    refuse (a protocol error, field ``app_metadata.units``) or hold the client back (the calls stall until
    their FLOOD_WAIT deadline); afterwards ``info`` must count no running task."""
    variant = rng.choice(FLOOD_VARIANTS)
    window = rng.choice([1 << 16, 2**32 - 1])
    m.note(f"flood: {variant}, window {window}")
    if variant == "map":
        seed = make_seed("exchange", rng.choice(["identity", "project"]), qid)
        header = _copy_header(seed)
        header.options.output_buffer_bytes = rng.choice([MAX_OUTPUT_BUFFER, 1 << 30])
        batches = rng.randint(4, 16)
        return [op("flood", cmd=ser(header), batches=batches), op("await_idle")]
    template = "identity" if variant == "output" else rng.choice(["identity", "count", "filter_len"])
    seed = make_seed("units", template, qid, window=window)
    header = _copy_header(seed)
    header.options.feed_window = window
    header.feeds[0].window = rng.choice([0, window])
    header.options.retain_output = False
    ticket = None
    if variant == "output":
        header.options.output_buffer_bytes = rng.choice([MAX_OUTPUT_BUFFER, 1 << 30])
        ticket = ser(make_ticket(header.stage_key, 0, 1))
    size = rng.choice(FLOOD_UNIT_SIZES)
    total = (MAX_OUTPUT_BUFFER + (64 << 20)) if variant == "output" else rng.choice([32 << 20, 96 << 20])
    m.note(f"units of {size >> 10} KiB, {total >> 20} MiB in all")
    return [op("flood", cmd=ser(header), feed="u", partition=0, unit=size, total=total, ticket=ticket), op("await_idle")]


MAX_OUTPUT_BUFFER = 256 << 20
"""The largest output buffer a worker grants (flight/wire/limits.py MAX_OUTPUT_BUFFER_BYTES); a larger one asked for is clamped."""


def seed_case(kind: str, template: str, index: int) -> Case:
    """The unmutated seed ``kind``/``template`` as a case (``--check-seeds``)."""
    seed = make_seed(kind, template, f"seed-{kind}-{template}-{index}")
    return Case("seed", index, 0, f"seed {kind}/{template}", seed_steps(ser(seed.header), seed))


# ---------------------------------------------------------------------- runner


@dataclass
class Status:
    call: str
    kind: str  # the pyarrow exception's type name
    message: str
    info: str = ""  # the ErrorInfo message in the status's extra_info, if any


@dataclass
class Outcome:
    """What a case saw: error statuses, ErrorInfo messages, calls past their deadline."""

    statuses: list[Status] = field(default_factory=list)
    error_infos: list[str] = field(default_factory=list)
    bad_frames: list[str] = field(default_factory=list)
    timeouts: list[str] = field(default_factory=list)
    frames: list[str] = field(default_factory=list)
    expected_waits: int = 0
    wedged: bool = False
    internal: str = ""

    def brief(self) -> dict[str, Any]:
        return {"statuses": [[s.call, s.kind, s.message[:MAX_MESSAGE]] for s in self.statuses[:10]],
                "error_infos": [e[:MAX_MESSAGE] for e in self.error_infos[:10]], "bad_frames": self.bad_frames[:5],
                "timeouts": self.timeouts, "frames": self.frames[:40], "wedged": self.wedged, "internal": self.internal}


def _timed_out(exc: BaseException) -> bool:
    return isinstance(exc, fl.FlightTimedOutError) or "deadline exceeded" in str(exc).lower()


class _Exchange:
    """One DoExchange, driven from a single thread.

    Reads and writes alternate on the case's thread, never overlap: when a pyarrow
    write fails (the worker ended the call), the writer finishes the call and
    drains its read side itself, and a read pending on another thread at that
    moment makes gRPC abort the whole process. Waiting for a task's output with a
    time limit is done with a DoGet, another call.
    """

    def __init__(self, client: fl.FlightClient, cmd: bytes, options: fl.FlightCallOptions, label: str, path: str = "") -> None:
        self.label = label
        descriptor = fl.FlightDescriptor.for_path(path) if path else fl.FlightDescriptor.for_command(cmd)
        self.writer, self.reader = client.do_exchange(descriptor, options=options)
        self.kinds: list[str] = []
        self.errors: list[str] = []
        self.bad: list[str] = []
        self.status: BaseException | None = None
        self.ended = False
        self.broken = False
        self.sent_end = False
        self.sent_input_end = False
        self.out: Outcome | None = None  # the case's outcome (an input call beside this exchange records its status there)

    def read(self) -> str | None:
        """The next message's kind (a WorkerFrame member, ``batch``...), or None at the end of the call."""
        if self.ended:
            return None
        try:
            chunk = self.reader.read_chunk()
        except StopIteration:
            self.ended = True
            return None
        except (pa.ArrowException, OSError) as exc:
            self.status, self.ended = exc, True
            return None
        kind = self._kind(chunk.app_metadata, chunk.data is not None)
        self.kinds.append(kind)
        return kind

    def _kind(self, metadata: pa.Buffer | None, data: bool) -> str:
        if metadata is None or not metadata.size:
            return "batch" if data else "empty"
        try:
            frame = P.WorkerFrame.FromString(metadata.to_pybytes())
        except DecodeError as exc:
            self.bad.append(f"{self.label}: {exc}")
            return "unparsable"
        kind = frame.WhichOneof("frame") or "no-member"
        if kind == "error":
            self.errors.append(frame.error.message)
        return kind

    def read_until(self, done: Callable[[str], bool]) -> None:
        while (kind := self.read()) is not None and not done(kind):
            pass

    def send(self, write: Callable[[Any], None]) -> bool:
        """Write something; False once the call is over (then nothing more is written)."""
        if self.broken or self.ended:
            return False
        try:
            write(self.writer)
            return True
        except (pa.ArrowException, OSError):
            self.broken = True
            return False

    def half_close(self) -> None:
        if not self.sent_end:
            self.sent_end = True
            with contextlib.suppress(pa.ArrowException, OSError):
                self.writer.done_writing()

    def finish(self) -> None:
        """Half-close, read to the end of the call (its final status), close the writer."""
        self.half_close()
        self.read_until(lambda kind: False)
        with contextlib.suppress(pa.ArrowException, OSError):
            self.writer.close()  # re-raises the call's final status: already read


class Runner:
    """Plays a case's steps against one worker, every call bounded by the case's deadline."""

    def __init__(self, client: fl.FlightClient, url: str, timeout: float, data_dir: Path) -> None:
        self.client = client
        self.url = url
        self.timeout = timeout
        self.data_dir = data_dir
        self.deadline = 0.0

    def run(self, case: Case) -> Outcome:
        out = Outcome()
        self._write_files(case)
        self.deadline = time.monotonic() + self.timeout
        for step in case.steps:
            self._step(step, out, None)
        return out

    def _write_files(self, case: Case) -> None:
        for name, content in case.files.items():
            path = self.data_dir / name
            if not path.exists():
                path.write_bytes(content)

    def left(self) -> float:
        return max(0.05, self.deadline - time.monotonic())

    def options(self, most: float | None = None) -> fl.FlightCallOptions:
        return fl.FlightCallOptions(timeout=min(self.left(), most) if most else self.left())

    def _step(self, step: dict[str, Any], out: Outcome, ex: _Exchange | None) -> bool:
        """One step; False when the rest of this exchange's script cannot be sent."""
        kind = step["op"]
        if kind == "exchange":
            self._exchange(step, out)
        elif kind in ("doget", "output"):
            self._doget(step["ticket"], out, short=bool(step.get("short")), output=kind == "output")
        elif kind == "action":
            self._call(out, f"DoAction {_short(step['type'])}", lambda: list(self.client.do_action(
                fl.Action(step["type"], pa.py_buffer(step["body"])), options=self.options())))
        elif kind == "list_actions":
            self._call(out, "ListActions", lambda: list(self.client.list_actions(options=self.options())))
        elif kind == "hoard":
            self._hoard(step, out)
        elif kind == "flood":
            self._flood(step, out)
        elif kind == "await_idle":
            self._await_idle(out)
        elif kind == "extend":
            self.deadline += step["seconds"]
        elif ex is not None:
            return self._exchange_step(step, ex)
        return True

    def _exchange_step(self, step: dict[str, Any], ex: _Exchange) -> bool:
        kind = step["op"]
        if kind == "wait_credits":
            count = step["count"]
            ex.read_until(lambda k: k in ("error", "finished") or ex.kinds.count("credit") >= count)
        elif kind == "half_close":
            ex.finish()
        elif kind == "await_finished":
            # A map stage whose input ended with an InputEnd must finish (or fail) on its own; one
            # whose input did not may rightly wait for more, so the half-close comes at once.
            if ex.sent_input_end:
                ex.read_until(lambda k: k in ("finished", "error"))
        elif kind == "frame":
            ex.sent_input_end |= _is_input_end(step["data"])
            return ex.send(lambda w: w.write_metadata(pa.py_buffer(self._localize(step["data"]))))
        elif kind == "empty":
            return ex.send(lambda w: w.write_metadata(pa.py_buffer(b"")))
        elif kind == "begin":
            options = pa.ipc.IpcWriteOptions(compression=step.get("compression"))
            return ex.send(lambda w: w.begin(pa.ipc.read_schema(pa.py_buffer(step["schema"])), options=options))
        elif kind == "batch":
            return ex.send(lambda w: w.write_batch(_batch(step["ipc"])))
        elif kind == "batch_frame":
            return ex.send(lambda w: w.write_with_metadata(_batch(step["ipc"]), pa.py_buffer(self._localize(step["data"]))))
        elif kind == "zeros":
            return ex.send(lambda w: w.write_batch(zeros_batch(step["rows"])))
        elif kind == "input_call":
            self._input_call(step, ex)
        return True

    def _input_call(self, step: dict[str, Any], task: _Exchange) -> None:
        """An input call (docs/protocol.md, section 16) beside the task's own exchange: its messages, then its status."""
        label = "DoExchange(input call)"
        out = task.out
        short = bool(step.get("short"))  # it names a task that is not there: the worker rightly waits 10 s for it
        try:
            call = _Exchange(self.client, b"", self.options(SHORT_WAIT if short else None), label, path=INPUT_CALL_PATH)
        except (pa.ArrowException, OSError) as exc:
            if out is not None:
                self._record(out, label, exc)
            return
        for message in step["messages"]:
            if not self._exchange_step(message, call):
                break
        call.finish()
        if out is not None:
            out.bad_frames += call.bad
            out.frames += [f"{label}: {k}" for k in call.kinds][:10]
            if call.status is not None and short and _timed_out(call.status):
                out.expected_waits += 1
            elif call.status is not None:
                self._record(out, label, call.status)

    def _exchange(self, step: dict[str, Any], out: Outcome) -> None:
        cmd = self._localize(step["cmd"])
        label = f"DoExchange({step.get('label', 'task')})"
        try:
            ex = _Exchange(self.client, cmd, self.options(), label)
        except (pa.ArrowException, OSError) as exc:
            self._record(out, label, exc)
            return
        ex.out = out
        ex.read_until(lambda k: k not in ("load", "heartbeat"))  # a task may wait for capacity first
        if ex.kinds and ex.kinds[-1] == "ready":
            for inner in step["script"]:
                if not self._step(inner, out, ex):
                    break
        ex.finish()
        out.frames += [f"{label}: {k}" for k in ex.kinds if k not in ("credit", "batch", "heartbeat")][:20]
        out.error_infos += ex.errors
        out.bad_frames += ex.bad
        if ex.status is not None:
            self._record(out, label, ex.status)

    def _hoard(self, step: dict[str, Any], out: Outcome) -> None:
        """Open every exchange, beat on each for a few rounds (reading nothing), ask health, let them all go."""
        beat = frame_bytes(heartbeat=P.Heartbeat()) if "heartbeat" in FRAME_MEMBERS else b""
        held: list[_Exchange] = []
        try:
            for cmd in step["cmds"]:
                try:
                    held.append(_Exchange(self.client, self._localize(cmd), self.options(), "DoExchange(hoard)"))
                except (pa.ArrowException, OSError) as exc:
                    self._record(out, "DoExchange(hoard)", exc)
                    break
            for _ in range(step["beats"]):
                if self.deadline - time.monotonic() < self.timeout / 2:
                    break  # keep half the case's time for letting go and for the worker to free them
                threading.Event().wait(HOARD_BEAT)
                for ex in held:
                    ex.send(lambda w: w.write_metadata(pa.py_buffer(beat)))
            health = check_health(self.client, min(HEALTH_TIMEOUT, self.left()))
            out.frames.append(f"hoard: {len(held)} exchanges held, the worker running {self._running(out)} tasks")
            if health == "timeout":
                out.timeouts.append(f"health while {len(held)} exchanges were held: no answer in time")
            elif health != "ok":
                out.statuses.append(Status("health while hoarding", "HealthFailed", health))
        finally:
            for i, ex in enumerate(held):
                how = step["abandon"] if step["abandon"] != "mixed" else ABANDON[i % len(ABANDON)]
                _abandon(ex, how)

    def _flood(self, step: dict[str, Any], out: Outcome) -> None:
        """A flood (``flood_case``) on an exchange whose calls end at FLOOD_WAIT: a stall there is back-pressure."""
        label = "DoExchange(flood)"
        try:
            ex = _Exchange(self.client, self._localize(step["cmd"]), self.options(FLOOD_WAIT), label)
        except (pa.ArrowException, OSError) as exc:
            self._record(out, label, exc)
            return
        getter = None
        try:
            ex.read_until(lambda k: k not in ("load", "heartbeat"))
            if ex.kinds and ex.kinds[-1] == "ready":
                if step.get("ticket"):
                    with contextlib.suppress(pa.ArrowException, OSError):  # opened, never read
                        getter = self.client.do_get(fl.Ticket(step["ticket"]), options=self.options(FLOOD_WAIT))
                if "batches" in step:
                    _flood_map(ex, step["batches"])
                else:
                    _flood_units(ex, step["feed"], step["partition"], step["unit"], step["total"])
        finally:
            if getter is not None:
                with contextlib.suppress(pa.ArrowException, OSError):
                    getter.cancel()
            ex.finish()
        out.frames += [f"{label}: {k}" for k in ex.kinds if k not in ("credit", "batch", "heartbeat")][:20]
        out.error_infos += ex.errors
        out.bad_frames += ex.bad
        if ex.status is not None:
            if _timed_out(ex.status):
                out.expected_waits += 1  # held back: what the worker should do
            else:
                self._record(out, label, ex.status)

    def _running(self, out: Outcome) -> int:
        """The worker's running tasks (``info``), or -1 when it did not say (recorded in ``out``)."""
        try:
            (result,) = list(self.client.do_action(fl.Action("info", b""), options=self.options(HEALTH_TIMEOUT)))
            return int(P.WorkerInfo.FromString(result.body.to_pybytes()).running_tasks)
        except (pa.ArrowException, OSError, ValueError, DecodeError) as exc:
            self._record(out, "DoAction info", exc)
            return -1

    def _await_idle(self, out: Outcome) -> None:
        """Wait (within the case's deadline) until the worker's ``info`` counts no running task: a leftover is a hang."""
        while True:
            running = self._running(out)
            if running <= 0:
                return
            if time.monotonic() >= self.deadline:
                out.timeouts.append(f"info: {running} tasks still running at the end of the case (a leftover is a hang)")
                return
            threading.Event().wait(0.05)

    def _localize(self, data: bytes) -> bytes:
        """The worker's own URL where the seed said SELF_URL, the data directory where it said DATA_TOKEN
        (only when lengths match: protobuf length prefixes stay valid)."""
        if len(self.url) == len(SELF_URL):
            data = data.replace(SELF_URL.encode(), self.url.encode())
        if len(str(self.data_dir)) == len(DATA_TOKEN):
            data = data.replace(DATA_TOKEN.encode(), str(self.data_dir).encode())
        return data

    def _doget(self, ticket: bytes, out: Outcome, short: bool = False, output: bool = False) -> None:
        """A DoGet read to its end. ``short``: the ticket names a task that never ran (the worker rightly waits
        10 s for it); ``output``: the case's own task's output, which a mutated task may never finish."""
        most = SHORT_WAIT if short else SETTLE if output else None
        try:
            reader = self.client.do_get(fl.Ticket(ticket), options=self.options(most))
            with contextlib.suppress(StopIteration):
                while True:
                    reader.read_chunk()
        except (pa.ArrowException, OSError) as exc:
            if most is not None and _timed_out(exc):
                out.expected_waits += 1
            else:
                self._record(out, "DoGet", exc)

    def _call(self, out: Outcome, label: str, call_: Callable[[], object]) -> None:
        try:
            call_()
        except (pa.ArrowException, OSError) as exc:
            self._record(out, label, exc)

    @staticmethod
    def _record(out: Outcome, label: str, exc: BaseException) -> None:
        if _timed_out(exc):
            out.timeouts.append(f"{label}: {clean_message(str(exc))[:300]}")
            return
        extra = getattr(exc, "extra_info", None) or b""
        info = parse(P.ErrorInfo, bytes(extra)) if extra else None
        out.statuses.append(Status(label, type(exc).__name__, str(exc), info.message if info is not None else ""))


def _abandon(ex: _Exchange, how: str) -> None:
    """Let a hoarded exchange go: a last frame (Release, Cancel), a half-close or nothing, then cancel the call."""
    if how == "release" and "release" in FRAME_MEMBERS:
        ex.send(lambda w: w.write_metadata(pa.py_buffer(frame_bytes(release=P.Release()))))
    elif how == "cancel-frame":
        ex.send(lambda w: w.write_metadata(pa.py_buffer(frame_bytes(cancel=P.Cancel(reason="hoarder leaves")))))
    elif how == "half-close":
        ex.half_close()
    if how != "silent":
        with contextlib.suppress(pa.ArrowException, OSError):
            ex.reader.cancel()
    ex.ended = True
    with contextlib.suppress(pa.ArrowException, OSError):
        ex.writer.close()


@functools.lru_cache(maxsize=len(FLOOD_UNIT_SIZES))
def _flood_frame(feed: str, partition: int, size: int) -> bytes:
    return units_frame(feed, partition, [b"\x00" * size] * max(1, FLOOD_FRAME_BYTES // size))


def _flood_units(ex: _Exchange, feed: str, partition: int, size: int, total: int) -> None:
    """Units of ``size`` bytes, ``total`` bytes in all, as fast as the credit allows (the window is huge)."""
    ex.read_until(lambda k: k in ("credit", "error", "finished"))
    if not ex.kinds or ex.kinds[-1] != "credit":
        return
    frame = _flood_frame(feed, partition, size)
    per_frame = max(1, FLOOD_FRAME_BYTES // size) * size
    sent = 0
    while sent < total and ex.send(lambda w: w.write_metadata(pa.py_buffer(frame))):
        sent += per_frame


def _flood_map(ex: _Exchange, batches: int) -> None:
    """``batches`` large batches up a map stage, its output never read."""
    if not ex.send(lambda w: w.begin(DATA_SCHEMA)):
        return
    batch = zeros_batch(FLOOD_BATCH_ROWS)
    for _ in range(batches):
        if not ex.send(lambda w: w.write_batch(batch)):
            return
    end = input_end_frame(FLOOD_BATCH_ROWS * batches, batches)
    if end is not None:
        ex.send(lambda w: w.write_metadata(pa.py_buffer(end)))


def _is_input_end(data: bytes) -> bool:
    frame = parse(P.CoordinatorFrame, data) if "input_end" in FRAME_MEMBERS else None
    return frame is not None and frame.WhichOneof("frame") == "input_end"


@functools.lru_cache(maxsize=256)
def _batch(data: bytes) -> pa.RecordBatch:
    """The first batch of an IPC stream the generator wrote (read without validation, on purpose)."""
    return next(iter(pa.ipc.open_stream(pa.py_buffer(data))))


# ------------------------------------------------------------------ verdicts

_CUTS = (". Detail:", "\nDetail:", ". gRPC client debug context", ". Client context:")
_CODE_PATH = re.compile(r"site-packages|dist-packages|\.pyx?\b\"?, line \d+|" + re.escape(str(REPO_ROOT)))


def clean_message(text: str) -> str:
    """A status as a client shows it: the text before pyarrow's appended detail (docs/protocol.md, section 10)."""
    for cut in _CUTS:
        text = text.split(cut)[0]
    return text.strip()


def text_reasons(text: str) -> list[str]:
    reasons = []
    if "Traceback" in text or 'File "' in text:
        reasons.append("traceback")
    if _CODE_PATH.search(text):
        reasons.append("code-path")
    if len(text) > MAX_MESSAGE:
        reasons.append("too-long")
    return reasons


def status_reasons(status: Status) -> list[str]:
    """Why an error status would leave its reader unsure what was wrong with their input.

    The status text is judged as a client shows it (before pyarrow's ``". Detail:"``), except
    for tracebacks: a handler that lets a non-Flight exception escape makes pyarrow append its
    Python traceback (with file paths) to the text every client receives.
    """
    text = clean_message(status.message)
    reasons = text_reasons(text) + (text_reasons(status.info) if status.info else [])
    if "Traceback" in status.message and "traceback" not in reasons:
        reasons.append("traceback")
    if status.kind == "FlightInternalError" and "[field:" not in text:
        reasons.append("internal-no-field")
    if "internal error" in text.lower() and "[field:" not in text:
        reasons.append("internal-no-field")
    if status.kind == "ArrowInvalid" and "[field:" not in text and "Detail:" in status.message:
        reasons.append("invalid-no-field")
    raised = _raised_type(status.message)
    if raised and not raised.startswith(("pyarrow.", "flight.")) and "Python exception" in status.message:
        reasons.append("untranslated-exception")
    return reasons


def _raised_type(message: str) -> str:
    """The type of the exception a Python traceback in a status's detail ends with, if any."""
    detail = message.split("Detail: Python exception: Traceback", 1)
    if len(detail) < 2:
        return ""
    lines = detail[1].split(". gRPC client debug context")[0].splitlines()
    frames = [i for i, line in enumerate(lines) if line.startswith('  File "')]
    # After the last frame come its indented source lines, then "Type: message" (which may span lines).
    for line in lines[frames[-1] + 1 if frames else 0:]:
        if line and not line.startswith(" "):
            match = re.match(r"^([A-Za-z_][\w.]*)(:|$)", line)
            return match.group(1) if match else ""
    return ""


@dataclass(frozen=True)
class Verdict:
    kind: str  # "ok", "crash", "hang", "unclear"
    detail: str = ""
    reason: str = ""


def unclear_verdict(out: Outcome) -> Verdict | None:
    for status in out.statuses:
        reasons = status_reasons(status)
        if reasons:
            return Verdict("unclear", f"{status.call} {status.kind}: {clean_message(status.message)[:300]}", reasons[0])
    for message in out.error_infos:
        reasons = text_reasons(message)
        if reasons:
            return Verdict("unclear", f"ErrorInfo: {message[:300]}", reasons[0])
    if out.bad_frames:
        return Verdict("unclear", out.bad_frames[0], "unparsable-worker-frame")
    return None


def classify(out: Outcome, died: str | None, health: str) -> Verdict:
    if died:
        return Verdict("crash", died, "died")
    if health == "timeout":
        return Verdict("hang", "health did not answer in time", "health-timeout")
    if health != "ok":
        return Verdict("crash", f"health: {health}", "health-failed")
    if out.wedged:
        return Verdict("hang", "the case's calls did not return (watchdog)", "wedged")
    if out.timeouts:
        return Verdict("hang", out.timeouts[0], "deadline")
    return unclear_verdict(out) or Verdict("ok")


def check_health(client: fl.FlightClient, timeout: float) -> str:
    """``ok``, ``timeout``, or why health failed."""
    try:
        results = list(client.do_action(fl.Action("health", b""), options=fl.FlightCallOptions(timeout=timeout)))
    except (pa.ArrowException, OSError) as exc:
        if _timed_out(exc):
            return "timeout"
        return f"{type(exc).__name__}: {clean_message(str(exc))[:200]}"
    body = results[0].body.to_pybytes() if results else b""
    return "ok" if body == b"ok" else f"unexpected answer {body[:50]!r}"


# ------------------------------------------------------------------ the worker


@functools.lru_cache(maxsize=1)
def _worker_help() -> str:
    done = subprocess.run([sys.executable, "-m", "flight.worker", "--help"], capture_output=True, text=True,
                          timeout=START_TIMEOUT, env=_worker_env(), check=False)
    return done.stdout


def worker_accepts(flag: str) -> bool:
    """Whether ``flight-worker`` has ``flag`` (asked once, with ``--help``: the fuzzer serves several versions)."""
    return re.search(rf"{re.escape(flag)}\b", _worker_help()) is not None


def _worker_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}  # loopback only, never via a proxy
    env["PYTHONFAULTHANDLER"] = "1"  # a fatal signal prints every thread's Python stack into the log
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")  # Arrow's C++ pool as flight-worker chooses it (flight/worker/memory.py)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


_FATAL = re.compile(r"Fatal Python error: (?:Fatal Python error: )?(Segmentation fault|Bus error|Aborted|Floating-point exception|"
                    r"Illegal instruction|[^\n]+)")
_IDLE = {"wait", "wait_for", "select", "get", "put", "read_frames", "heartbeats", "_watch", "main"}
"""Functions where a worker thread waits (for a lock, the network, a queue) rather than works."""


def crash_site(worker_log: str) -> str:
    """From faulthandler's dump in a worker's log: the fatal error and the Python threads that were busy
    (not waiting) when it struck, e.g. 'Segmentation fault; busy: readers.py:150 read_ipc < pipeline.py:320 batches'."""
    fatal = _FATAL.search(worker_log)
    if not fatal:
        return ""
    busy = []
    for block in worker_log[fatal.end():].split("\n\n")[:80]:
        frames = re.findall(r'File "([^"]+)", line (\d+) in (\S+)', block)
        if frames and frames[0][2] not in _IDLE:
            busy.append(" < ".join(f"{Path(f).name}:{line} {func}" for f, line, func in frames[:3]))
    return fatal.group(1).strip() + (f"; busy: {' | '.join(busy[:2])}" if busy else "")


def describe_exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
        return f"signal {-code}"
    return f"exit code {code}"


class OwnedWorker:
    """A ``flight-worker`` process the fuzzer started in its scratch directory, logging to a file there."""

    def __init__(self, workdir: Path, number: int, extra_args: Sequence[str] = ()) -> None:
        self.workdir = workdir
        self.log = workdir / f"worker-{number}.log"
        self.url = ""
        cmd = [sys.executable, "-m", "flight.worker", "--host", "127.0.0.1", "--port", "0", "--log-level", "WARNING", "--grace", "1",
               *(a.replace("{workdir}", str(workdir)) for a in extra_args)]
        with open(self.log, "wb") as log:
            self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                cmd, cwd=workdir, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, env=_worker_env()
            )

    def wait_listening(self) -> str:
        try:
            self.url = self._listening()
        except BaseException:
            self.kill()
            raise
        return self.url

    def _listening(self) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        deadline, buf = time.monotonic() + START_TIMEOUT, b""
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while b"\n" not in buf:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"the worker did not start (its log, {self.log}):\n{self.log_since(0)[-3000:]}")
                if sel.select(0.1):
                    chunk = os.read(self.proc.stdout.fileno(), 4096)
                    buf += chunk
                    if not chunk:
                        self.proc.wait(5)
        line = buf.split(b"\n", 1)[0].decode(errors="replace").strip()
        match = LISTENING.match(line)
        if not match:
            raise RuntimeError(f"unexpected first line from the worker: {line!r}")
        return match.group(1)

    def died(self, wait: float = 0.0) -> str | None:
        if self.proc is None:
            return None
        try:
            code = self.proc.wait(wait) if wait else self.proc.poll()
        except subprocess.TimeoutExpired:
            code = None
        return None if code is None else f"the worker process ended ({describe_exit(code)})"

    def threads(self) -> int:
        """The process's thread count (0 if unknown): cases that leave hundreds behind slow every later one."""
        return self._status("Threads:")

    def rss_kb(self) -> int:
        """The process's resident memory, KiB (VmRSS; 0 if unknown)."""
        return self._status("VmRSS:")

    def _status(self, key: str) -> int:
        if self.proc is None:
            return 0
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith(key):
                    return int(line.split()[1])
        return 0

    def log_offset(self) -> int:
        with contextlib.suppress(OSError):
            return self.log.stat().st_size
        return 0

    def log_since(self, offset: int) -> str:
        """What the worker logged since ``offset`` (its first 40,000 characters: a fatal error's stacks come first)."""
        try:
            with open(self.log, "rb") as f:
                f.seek(offset)
                return f.read(40_000).decode(errors="replace")
        except OSError:
            return ""

    def dump_stacks(self) -> None:
        """Ask the worker for every thread's stack (``flight-worker`` registers faulthandler on SIGUSR1)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        before = self.log_offset()
        self.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 2.0
        while self.log_offset() == before and time.monotonic() < deadline and self.proc.poll() is None:
            threading.Event().wait(0.02)

    def kill(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def stop(self) -> None:
        """SIGTERM (it drains for its 1 s grace), then kill if it is still there."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(15)
        self.kill()


class WorkerPool:
    """The worker under test and a spare that is already starting: a crash costs no start-up time."""

    def __init__(self, workdir: Path, extra_args: Sequence[str] = ()) -> None:
        self.workdir = workdir
        self.extra_args = list(extra_args)
        self.started = 0
        self.spare: OwnedWorker | None = None

    def _spawn(self) -> OwnedWorker:
        self.started += 1
        return OwnedWorker(self.workdir, self.started, self.extra_args)

    def next(self) -> OwnedWorker:
        worker = self.spare or self._spawn()
        self.spare = self._spawn()
        worker.wait_listening()
        return worker

    def close(self) -> None:
        if self.spare is not None:
            self.spare.kill()
            self.spare = None


# -------------------------------------------------------------------- the loop


@dataclass
class Tally:
    cases: int = 0
    crashes: int = 0
    hangs: int = 0
    unclear: int = 0
    restarts: int = 0
    restart_seconds: float = 0.0
    failure_seconds: float = 0.0
    expected_waits: int = 0
    internal: int = 0
    modes: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    examples: dict[tuple[str, str, str], list[str]] = field(default_factory=dict)
    slowest: list[tuple[float, int, str]] = field(default_factory=list)
    recycled: list[str] = field(default_factory=list)
    family_seconds: dict[str, float] = field(default_factory=dict)
    family_cases: Counter[str] = field(default_factory=Counter)
    rss_growth_mb: float | None = None
    """The largest RSS of a worker after a case minus its baseline (``RssWatch``); None: not measured."""
    rss_worst: str = ""

    def timed(self, seconds: float, case: Case) -> None:
        """Time per family, and the ten slowest cases: slow is not a failure, but worth a look."""
        self.family_seconds[case.family] = self.family_seconds.get(case.family, 0.0) + seconds
        self.family_cases[case.family] += 1
        self.slowest.append((seconds, case.index, f"[{case.family}] {case.note[:150]}"))
        self.slowest.sort(reverse=True)
        del self.slowest[10:]

    def line(self) -> str:
        growth = "n/a" if self.rss_growth_mb is None else f"{self.rss_growth_mb:.0f}"
        return SUMMARY.format(n=self.cases, c=self.crashes, h=self.hangs, u=self.unclear, g=growth)

    def add(self, case: Case, verdict: Verdict, kept: Path | None, seconds: float) -> None:
        self.cases += 1
        if verdict.kind == "ok":
            return
        if verdict.kind in ("crash", "hang"):
            self.failure_seconds += seconds
        setattr(self, {"crash": "crashes", "hang": "hangs", "unclear": "unclear"}[verdict.kind],
                getattr(self, {"crash": "crashes", "hang": "hangs", "unclear": "unclear"}[verdict.kind]) + 1)
        mode = (verdict.kind, case.family, verdict.reason)
        self.modes[mode] += 1
        examples = self.examples.setdefault(mode, [])
        if len(examples) < 3:
            examples.append(f"case {case.index}: {one_line(case.note, 160)} | {one_line(verdict.detail, 160)}" + (f" -> {kept}" if kept else ""))


def log(message: str) -> None:
    print(f"[fuzz] {message}", file=sys.stderr, flush=True)


def one_line(text: str, most: int) -> str:
    """``text`` cut to ``most`` characters, newlines shown as \\n (error texts may hold whole schemas)."""
    return text[:most].replace("\n", "\\n")


class RssWatch:
    """The owned worker's RSS once it is idle again, against its baseline (the same after its first RSS_WARMUP cases).

    A flood case makes a worker *hold* memory while it runs (an unread output buffer up to
    its 192 MiB bound: tests/worker/test_memory_bounds.py checks those bounds); what must not
    happen is that the worker *keeps* it. So every RSS_EVERY cases, and at the baseline and the
    end, the fuzzer waits until the worker runs no task and its RSS stops falling (an idle
    worker collects garbage and trims its heaps within two seconds: ``release_idle_memory``),
    and takes that as a settled sample. ``max_rss_growth_mb`` is the largest settled sample
    minus the baseline; the largest RSS right after any case is reported beside it as the peak.
    A worker swapped for a fresh one (a crash, a hang, too many threads) gets a baseline of its own.
    """

    def __init__(self) -> None:
        self.pid = 0
        self.cases = 0
        self.base_kb = 0
        self.peak_mb = 0.0
        self.peak_note = ""
        self.samples: list[tuple[int, int]] = []  # (case index, settled RSS KiB) of the current worker

    def settled_kb(self, worker: OwnedWorker, idle: Callable[[], bool]) -> int:
        """The worker's RSS once it runs no task and has not shrunk for SETTLE_S (at most SETTLE_MAX_S)."""
        end = time.monotonic() + SETTLE_MAX_S
        while not idle() and time.monotonic() < end:
            time.sleep(0.1)
        last, steady_since = worker.rss_kb(), time.monotonic()
        while time.monotonic() < end and time.monotonic() - steady_since < SETTLE_S:
            time.sleep(0.1)
            now = worker.rss_kb()
            if now < last - 1024:
                last, steady_since = now, time.monotonic()
        return last

    def after(self, worker: OwnedWorker | None, case: Case, tally: Tally, idle: Callable[[], bool], last: bool = False) -> None:
        if worker is None or worker.proc is None:
            return
        if worker.proc.pid != self.pid:
            self.pid, self.cases, self.base_kb, self.samples = worker.proc.pid, 0, 0, []
        self.cases += 1
        rss = worker.rss_kb()
        if not rss:
            return
        if self.base_kb and (rss - self.base_kb) / 1024 > self.peak_mb:
            self.peak_mb = (rss - self.base_kb) / 1024
            self.peak_note = f"{rss / 1024:.0f} MiB after case {case.index} [{case.family}] {case.note[:120]}"
        if self.cases == RSS_WARMUP:
            self.base_kb = self.settled_kb(worker, idle)
            log(f"worker RSS baseline (idle, after its first {RSS_WARMUP} cases): {self.base_kb / 1024:.0f} MiB")
            if os.environ.get("FUZZ_MEMDIAG"):
                os.kill(worker.proc.pid, signal.SIGUSR2)
            tally.rss_growth_mb = tally.rss_growth_mb or 0.0
            return
        if not self.base_kb:
            tally.rss_growth_mb = tally.rss_growth_mb or 0.0
            return
        if self.cases % RSS_EVERY and not last:
            return
        settled = self.settled_kb(worker, idle)
        self.samples.append((case.index, settled))
        growth = (settled - self.base_kb) / 1024
        if growth > RSS_NOTE_MB:  # what a large sample looked like: the worker still busy, or its threads
            log(f"idle RSS after case {case.index}: {settled / 1024:.0f} MiB (+{growth:.0f}), "
                f"{worker.threads()} threads, {'idle' if idle() else 'still running a task'}")
            if os.environ.get("FUZZ_MEMDIAG"):  # the worker runs benchmarks.memdiag: it reports where the memory is
                os.kill(worker.proc.pid, signal.SIGUSR2)
        if tally.rss_growth_mb is None or growth > tally.rss_growth_mb:
            tally.rss_growth_mb = growth
            tally.rss_worst = f"{settled / 1024:.0f} MiB idle after case {case.index} [{case.family}] {case.note[:120]}"


class Fuzzer:
    """Runs cases against one worker, classifies each, keeps failures, restarts an owned worker when it broke."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.timeout: float = args.timeout
        self.health_timeout: float = args.health_timeout
        self.corpus = Path(args.corpus)
        self.own_workdir = args.workdir is None
        self.workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="fuzz-worker-"))
        self.data_dir = data_dir_in(self.workdir)
        worker_args = list(args.worker_arg or ())
        if not args.url and worker_accepts("--data-root"):
            worker_args += ["--data-root", str(self.data_dir)]  # the file readers read only there
        self.pool = None if args.url else WorkerPool(self.workdir, worker_args)
        self.worker: OwnedWorker | None = None
        self.fixed_url: str | None = args.url
        self.url = ""
        self.client: fl.FlightClient | None = None
        self.tally = Tally()
        self.kept: Counter[tuple[str, str, str]] = Counter()
        self.stopped = False
        self.last_seconds = 0.0
        self.first_case: int | None = None  # the first case the current worker ran
        self.check_alone = not args.replay
        self.rss = RssWatch()

    def __enter__(self) -> Self:
        write_data_files(self.data_dir)
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close_client()
        if self.worker is not None:
            self.worker.stop()
        if self.pool is not None:
            self.pool.close()
        if self.own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def connect(self) -> None:
        if self.pool is not None:
            self.worker = self.pool.next()
            self.url = self.worker.url
        else:
            self.url = str(self.fixed_url)
        self.client = fl.connect(self.url)

    def protocol_version(self) -> int:
        """The worker's protocol version (``info`` action), which the seeds must speak to be accepted."""
        assert self.client is not None
        (result,) = list(self.client.do_action(fl.Action("info", b""), options=fl.FlightCallOptions(timeout=START_TIMEOUT)))
        return int(P.WorkerInfo.FromString(result.body.to_pybytes()).protocol_version)

    def close_client(self) -> None:
        if self.client is not None:
            with contextlib.suppress(pa.ArrowException, OSError):
                self.client.close()
            self.client = None

    def restart(self) -> None:
        started = time.monotonic()
        self.close_client()
        if self.worker is not None:
            self.worker.kill()
        self.tally.restarts += 1
        self.first_case = None
        self.connect()
        self.tally.restart_seconds += time.monotonic() - started

    # -- one case

    def play(self, case: Case) -> Outcome:
        """Run the case on its own thread; a watchdog covers calls that ignore their deadline."""
        assert self.client is not None
        runner = Runner(self.client, self.url, self.timeout, self.data_dir)
        box: list[Outcome] = []

        def target() -> None:
            try:
                box.append(runner.run(case))
            except Exception:  # noqa: BLE001 - a bug of the fuzzer itself: report it, keep fuzzing
                box.append(Outcome(internal=traceback.format_exc()))

        thread = threading.Thread(target=target, name="fuzz-case", daemon=True)
        thread.start()
        thread.join(self.timeout + WATCHDOG_GRACE)
        return box[0] if box else Outcome(wedged=True)

    def judge(self, case: Case, timed: bool = True) -> tuple[Verdict, Outcome, str]:
        if self.first_case is None:
            self.first_case = case.index
        offset = self.worker.log_offset() if self.worker is not None else 0
        started = time.monotonic()
        out = self.play(case)
        died = self.worker.died() if self.worker is not None else None
        health = "not checked" if died else check_health(self.client, self.health_timeout) if self.client else "no client"
        if health not in ("ok", "timeout", "not checked") and self.worker is not None:
            died = self.worker.died(wait=1.0)  # unreachable: usually a process that is still being torn down
        verdict = classify(out, died, health)
        self.last_seconds = time.monotonic() - started
        if timed:
            self.tally.timed(self.last_seconds, case)
        worker_log = ""
        if verdict.kind in ("crash", "hang") and self.worker is not None:
            self.worker.dump_stacks()
            worker_log = self.worker.log_since(offset)
            if verdict.kind == "crash" and (site := crash_site(worker_log)):
                verdict = Verdict(verdict.kind, f"{verdict.detail}: {site}", verdict.reason)
        return verdict, out, worker_log

    def handle(self, case: Case, verdict: Verdict, out: Outcome, worker_log: str) -> Path | None:
        if out.internal:
            self.tally.internal += 1
            log(f"case {case.index}: fuzzer error (not counted as a worker failure):\n{out.internal}")
        self.tally.expected_waits += out.expected_waits
        seconds, extra = self.last_seconds, dict[str, Any]()
        if verdict.kind in ("crash", "hang"):
            since = self.first_case if self.first_case is not None else case.index
            self.recover(verdict)
            rerun = verdict.kind == "crash" or verdict.reason == "health-timeout"  # deadline hangs would cost another 10 s
            if rerun and self.worker is not None and self.check_alone and since < case.index:
                verdict, extra = self.rerun_alone(case, verdict, since)
        kept = self.keep(case, verdict, out, worker_log, extra)
        self.tally.add(case, verdict, kept, seconds)
        if verdict.kind != "ok":
            log(f"case {case.index} [{case.family}] {verdict.kind} ({verdict.reason}): {one_line(verdict.detail, 300)}" + (f" -> {kept}" if kept else ""))
        if verdict.kind not in ("crash", "hang") and self.worker is not None and (threads := self.worker.threads()) > RECYCLE_THREADS:
            self.tally.recycled.append(f"case {case.index} left {threads} threads: {case.note[:120]}")
            self.restart()
        return kept

    def rerun_alone(self, case: Case, verdict: Verdict, since: int) -> tuple[Verdict, dict[str, Any]]:
        """Run a failing case again on the fresh worker: a failure that needs earlier cases (memory one of them
        corrupted, work one of them left running) still counts, but its report must say which cases to replay together."""
        again, _, _ = self.judge(case, timed=False)
        if again.kind in ("crash", "hang"):
            self.restart()
        if again.kind == verdict.kind:
            return verdict, {"reproduces_alone": True}
        count = case.index - since + 1
        command = f"python -m benchmarks.fuzz_worker --seed {case.seed} --start {since} --cases {count}"
        detail = f"{verdict.detail} [alone it passes; cases {since}..{case.index} on one worker fail: {command}]"
        return Verdict(verdict.kind, detail, verdict.reason), {"reproduces_alone": False, "replay_together": command}

    def recover(self, verdict: Verdict) -> None:
        if self.worker is not None:
            self.restart()
            return
        if verdict.kind == "crash" and not self.wait_healthy(30.0):
            log(f"the worker at {self.url} is down and is not ours to restart; stopping")
            self.stopped = True

    def wait_healthy(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.close_client()
            self.client = fl.connect(self.url)
            if check_health(self.client, self.health_timeout) == "ok":
                return True
            threading.Event().wait(0.5)
        return False

    def keep(self, case: Case, verdict: Verdict, out: Outcome, worker_log: str, extra: dict[str, Any]) -> Path | None:
        """Every crash and hang, and the first few unclear cases of each kind, as a replayable JSON file."""
        mode = (verdict.kind, case.family, verdict.reason)
        if verdict.kind == "ok" or (verdict.kind == "unclear" and self.kept[mode] >= UNCLEAR_KEPT):
            return None
        self.kept[mode] += 1
        self.corpus.mkdir(parents=True, exist_ok=True)
        ignore = self.corpus / ".gitignore"
        if not ignore.exists():
            ignore.write_text("# fuzzer findings: never committed\n*\n")
        path = self.corpus / f"{verdict.kind}-{case.family}-s{case.seed}-c{case.index:05d}.json"
        record = {
            "format": "flight-exec-fuzz-case/1",
            "replay": f"python -m benchmarks.fuzz_worker --replay {path}",
            "verdict": {"kind": verdict.kind, "reason": verdict.reason, "detail": verdict.detail},
            "case": case.to_json(),
            "outcome": out.brief(),
            "worker_log": worker_log,
            **extra,
        }
        path.write_text(json.dumps(record, indent=1))
        return path

    # -- many cases

    def run(self, cases: Iterator[Case], total: int) -> Tally:
        started = last = time.monotonic()
        try:
            for n, case in enumerate(cases, 1):
                verdict, out, worker_log = self.judge(case)
                self.handle(case, verdict, out, worker_log)
                self.rss.after(self.worker, case, self.tally, self._idle, last=n == total)
                if self.stopped:
                    break
                if time.monotonic() - last >= 2.0:
                    last = time.monotonic()
                    self.progress(total, last - started)
        except KeyboardInterrupt:
            log("interrupted")
        self.progress(total, time.monotonic() - started)
        return self.tally

    def _idle(self) -> bool:
        """Whether the worker runs no task (its ``info``); False when it does not answer."""
        try:
            with fl.connect(self.url) as client:
                (result,) = list(client.do_action(fl.Action("info", b""), options=fl.FlightCallOptions(timeout=HEALTH_TIMEOUT)))
            return int(P.WorkerInfo.FromString(result.body.to_pybytes()).running_tasks) == 0
        except (pa.ArrowException, OSError, ValueError, DecodeError):
            return False

    def progress(self, total: int, elapsed: float) -> None:
        t = self.tally
        rate = t.cases / elapsed if elapsed > 0 else 0.0
        log(f"{t.cases}/{total} cases in {elapsed:.0f} s ({rate:.0f}/s): crashes {t.crashes}, hangs {t.hangs}, "
            f"unclear {t.unclear}, worker restarts {t.restarts}")

    def report(self) -> None:
        t = self.tally
        log(f"expected waits (DoGets that rightly waited): {t.expected_waits}; fuzzer errors: {t.internal}")
        log(f"seconds spent in crash and hang cases: {t.failure_seconds:.0f}; restarting the worker: {t.restart_seconds:.0f}")
        log("cases and seconds per family: " + ", ".join(
            f"{f} {t.family_cases[f]} in {t.family_seconds[f]:.1f} s" for f in sorted(t.family_cases)))
        log("slowest cases: " + "; ".join(f"case {i} {s:.1f} s {note}" for s, i, note in t.slowest[:5]))
        if t.recycled:
            log(f"worker swapped for a fresh one {len(t.recycled)} times, after: " + "; ".join(t.recycled[:5]))
        if t.rss_growth_mb is not None:
            base = f"{self.rss.base_kb / 1024:.0f} MiB" if self.rss.base_kb else f"none (fewer than {RSS_WARMUP} cases)"
            log(f"worker RSS: idle baseline {base}, largest idle growth {t.rss_growth_mb:.0f} MiB"
                + (f" ({t.rss_worst})" if t.rss_worst else ""))
            log(f"worker RSS peak while a case held memory: +{self.rss.peak_mb:.0f} MiB ({self.rss.peak_note})")
            if self.rss.samples:
                log(f"worker RSS when idle, every {RSS_EVERY} cases (case: MiB): "
                    + ", ".join(f"{i}: {kb / 1024:.0f}" for i, kb in self.rss.samples))
        for mode, count in sorted(t.modes.items(), key=lambda kv: (-kv[1], kv[0])):
            log(f"{count:5d} x {mode[0]} / {mode[1]} / {mode[2]}")
            for example in t.examples.get(mode, []):
                log(f"        {example}")

    def check_seeds(self) -> int:
        """Every unmutated seed must be accepted and finish without an error (else the fuzzer only tests rejections)."""
        failures = 0
        for index, (kind, template) in enumerate(all_seed_kinds()):
            case = seed_case(kind, template, index)
            verdict, out, _ = self.judge(case)
            finished = any(f.endswith(": finished") for f in out.frames)
            if verdict.kind != "ok" or out.statuses or out.error_infos or not finished:
                failures += 1
                log(f"seed {kind}/{template}: {verdict.kind} {verdict.detail} statuses={[(s.call, clean_message(s.message)) for s in out.statuses]} "
                    f"errors={out.error_infos} frames={out.frames}")
                if verdict.kind in ("crash", "hang"):
                    self.recover(verdict)
        log(f"{len(all_seed_kinds()) - failures}/{len(all_seed_kinds())} seeds ran cleanly")
        return 1 if failures else 0


def prefetch(make: Callable[[int], Case], indices: range, depth: int = 16) -> Iterator[Case]:
    """Cases made on a background thread while earlier ones run (each depends on its index only)."""
    ready: queue.Queue[Case | BaseException | None] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def offer(item: Case | BaseException | None) -> None:
        while not stop.is_set():
            with contextlib.suppress(queue.Full):
                ready.put(item, timeout=0.1)
                return

    def fill() -> None:
        try:
            for index in indices:
                if stop.is_set():
                    return
                offer(make(index))
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, which re-raises it
            offer(exc)
            return
        offer(None)

    threading.Thread(target=fill, name="fuzz-generator", daemon=True).start()
    try:
        while (item := ready.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()


def load_cases(paths: Sequence[str]) -> list[Case]:
    return [Case.from_json(json.loads(Path(p).read_text())["case"]) for p in paths]


def replay(fuzzer: Fuzzer, cases: Sequence[Case]) -> None:
    for case in cases:
        verdict, out, worker_log = fuzzer.judge(case)
        fuzzer.handle(case, verdict, out, worker_log)
        log(f"case {case.index} [{case.family}] {case.note}")
        log(f"  verdict: {verdict.kind} {verdict.reason} {verdict.detail}")
        for status in out.statuses:
            log(f"  {status.call} {status.kind}: {clean_message(status.message)[:500]}")
        for frame in out.frames:
            log(f"  {frame}")
        if worker_log:
            log(f"  worker log:\n{worker_log[-4000:]}")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fuzz_worker", description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=DEFAULT_CASES, help="cases to run (default: %(default)s)")
    p.add_argument("--seed", type=int, default=1, help="cases are a function of the seed and their index (default: %(default)s)")
    p.add_argument("--start", type=int, default=0, help="index of the first case (to resume or bisect)")
    p.add_argument("--corpus", default=".fuzz-corpus", help="where crash, hang (and some unclear) inputs are kept (default: %(default)s)")
    p.add_argument("--url", help="fuzz a running worker (grpc://127.0.0.1:PORT) instead of starting one (start it with "
                                 "--data-root WORKDIR/data/ddd... as printed, for file-reading units to reach their files)")
    p.add_argument("--workdir", help="scratch directory for the data files and the worker's logs (default: a temporary one)")
    p.add_argument("--worker-arg", action="append", metavar="ARG",
                   help="an extra flight-worker argument for the worker this fuzzer starts (repeatable; {workdir} is "
                        "replaced by the scratch directory), e.g. --worker-arg=--extension=flight.dev.testing")
    p.add_argument("--replay", action="append", metavar="FILE", help="run the case kept in FILE (repeatable) instead of new cases")
    p.add_argument("--families", help=f"comma-separated subset of: {', '.join([*FAMILIES, *RESOURCE_FAMILIES])}")
    p.add_argument("--timeout", type=float, default=CASE_TIMEOUT, help="deadline of a whole case, seconds (default: %(default)s)")
    p.add_argument("--health-timeout", type=float, default=HEALTH_TIMEOUT, help="deadline of the health check after each case (default: %(default)s)")
    p.add_argument("--check-seeds", action="store_true", help="run every unmutated seed once; exit 1 unless all run cleanly")
    p.add_argument("--rss-limit-mb", type=float, metavar="MIB",
                   help="exit 1 when the worker's RSS grew more than this past its baseline (a worker this fuzzer starts)")
    return p


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)  # like Ctrl-C: stop the workers, print the summary
    if args.url and not LOOPBACK_URL.fullmatch(args.url):
        raise SystemExit(f"--url must be grpc://127.0.0.1:PORT (this fuzzer only talks to loopback), not {args.url!r}")
    if args.url and args.rss_limit_mb is not None:
        raise SystemExit("--rss-limit-mb needs a worker this fuzzer starts (without --url): it reads the process's /proc/PID/status")
    families = [f.strip() for f in args.families.split(",")] if args.families else None
    with Fuzzer(args) as fuzzer:
        PROTOCOL["version"] = fuzzer.protocol_version()
        generator = Generator(args.seed, families)
        log(f"fuzzing the worker at {fuzzer.url} (protocol {PROTOCOL['version']}, seed {args.seed}, "
            f"data files in {fuzzer.data_dir}, corpus {fuzzer.corpus})")
        if args.check_seeds:
            return fuzzer.check_seeds()
        if args.replay:
            cases = load_cases(args.replay)
            replay(fuzzer, cases)
        else:
            fuzzer.run(prefetch(generator.case, range(args.start, args.start + args.cases)), args.cases)
        fuzzer.report()
    tally = fuzzer.tally
    print(tally.line(), flush=True)
    grew = args.rss_limit_mb is not None and (tally.rss_growth_mb or 0.0) > args.rss_limit_mb
    if grew:
        log(f"the worker's RSS grew by {tally.rss_growth_mb:.0f} MiB, more than --rss-limit-mb {args.rss_limit_mb:g}")
    return 1 if tally.crashes or tally.hangs or grew else 0


if __name__ == "__main__":
    sys.exit(main())
