"""Fuzzers of flight-exec's boundaries: the worker's wire, the Flight SQL service and the fleet registry.

No input a peer can send may kill or wedge a server. The worker fuzzer (this package's top-level modules,
``python -m benchmarks.fuzz_worker``) is described below; the service and registry fuzzer is
``benchmarks.fuzz.service`` (``python -m benchmarks.fuzz_service``, docs/service.md).

The worker fuzzer: no input a peer can send may kill or wedge a worker.

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
What it measures is what the worker *keeps*: every ``--rss-every`` (100) cases, and at the end, it
waits until the worker runs no task and its RSS stops falling, and takes that idle RSS. The
baseline is the idle RSS after its first RSS_WARMUP (20) cases, which load the engines, open
DuckDB and start the thread pools every later case reuses; a worker swapped for a fresh one
gets its own. ``max_rss_growth_mb`` is the largest idle RSS minus the baseline, in MiB
(``n/a`` with ``--url``: the process is not ours to read). What a case makes the worker hold
while it runs (a flood's unread output, up to its bounds) is reported as the peak beside it.

Progress goes to stderr; the last stdout line is exactly
``fuzz_cases: N, crashes: C, hangs: H, unclear: U, max_rss_growth_mb: G``. The exit code is 1
when there was a crash or a hang, or (with ``--rss-limit-mb``) when G is above the limit.

Modules, one per family of inputs or part of the loop: ``proto`` (the generated modules, loaded by path,
and protobuf written by hand), ``settings``, ``data``, ``plans``, ``seeds``, ``scripts``, ``mutator``,
``ipc`` and ``schemas`` (Arrow payload corruptions), ``cases``, ``generator``, the families ``headers``,
``frames``, ``maps``, ``ipc_family``, ``calls`` and ``resources``, then ``exchange``, ``runner``,
``verdicts``, ``worker``, ``tally``, ``fuzzer`` and ``cli``.
"""

from __future__ import annotations

from benchmarks.fuzz.cases import Case, unsafe_reason
from benchmarks.fuzz.cli import main
from benchmarks.fuzz.data import DATA_TOKEN
from benchmarks.fuzz.generator import FAMILIES, RESOURCE_FAMILIES, Generator, seed_case
from benchmarks.fuzz.proto import L, P, ser
from benchmarks.fuzz.scripts import exchange_step, op, units_frame
from benchmarks.fuzz.seeds import all_seed_kinds, file_unit, stage_key, task_header
from benchmarks.fuzz.settings import PROTOCOL

__all__ = [
    "DATA_TOKEN", "FAMILIES", "PROTOCOL", "RESOURCE_FAMILIES", "Case", "Generator", "L", "P", "all_seed_kinds", "exchange_step", "file_unit",
    "main", "op", "seed_case", "ser", "stage_key", "task_header", "units_frame", "unsafe_reason",
]
