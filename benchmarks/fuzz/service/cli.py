"""``python -m benchmarks.fuzz_service``: the Flight SQL service and the fleet registry fuzzed like the worker.

    python -m benchmarks.fuzz_service [--cases N] [--registry-cases M] [--seed S] [--url grpc://127.0.0.1:PORT]
    python -m benchmarks.fuzz_service --replay .fuzz-corpus/hang-command-s1-c00042.json

Without ``--url`` it starts ``flight-coordinator`` (one local worker, two tables over one Parquet
file, a bearer token and a user with a password, results kept 30 s) and a fleet registry
(``registry_server``), each in its scratch directory, and replaces either after a crash or a hang.
With ``--url``, the service must accept the token in ``--token`` (or need none). The last two stdout
lines are ``registry_fuzz_cases: ...`` and ``service_fuzz_cases: N, crashes: C, hangs: H, unclear: U (per family)``;
the exit code is 1 when there was a crash or a hang.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pyarrow.parquet as pq

from benchmarks.fuzz.cases import Case
from benchmarks.fuzz.cli import prefetch
from benchmarks.fuzz.data import data_table
from benchmarks.fuzz.service.fuzzer import REGISTRY_LISTENING, SERVICE_LISTENING, Target, report, run_cases, summary
from benchmarks.fuzz.service.generator import REGISTRY_FAMILIES, SERVICE_FAMILIES, ServiceGenerator
from benchmarks.fuzz.service.registry import REGISTRY_SECRET, REGISTRY_WORKERS
from benchmarks.fuzz.service.sqlproto import PASSWORD, TABLES, TOKEN, USER, hash_password
from benchmarks.fuzz.settings import LOOPBACK_URL
from benchmarks.fuzz.tally import Tally, log
from benchmarks.fuzz.worker import OwnedWorker

__all__ = ["main", "service_command"]


def service_command(workdir: Path) -> list[str]:
    """``flight-coordinator`` over the fuzzer's table, with both kinds of credentials (so that ``authorization`` is read)."""
    data = workdir / "data"
    data.mkdir(parents=True, exist_ok=True)
    pq.write_table(data_table(200).combine_chunks(), data / "t.parquet", row_group_size=50)
    (workdir / "tokens").write_text(f"fuzz:{TOKEN}\n")
    (workdir / "users").write_text(f"{USER}:{hash_password(PASSWORD)}\n")
    tables = [a for name in TABLES for a in ("--table", f"{name}={data / 't.parquet'}")]
    return [sys.executable, "-m", "flight.service", "--host", "127.0.0.1", "--port", "0", "--local-workers", "1", *tables,
            "--auth-token-file", str(workdir / "tokens"), "--users-file", str(workdir / "users"), "--result-ttl", "30",
            "--max-queries", "16", "--queue-wait", "10", "--grace", "1", "--log-level", "WARNING"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fuzz_service", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--cases", type=int, default=2_000, help="service cases (default: %(default)s)")
    p.add_argument("--registry-cases", type=int, default=None, help="registry cases (default: as many as --cases)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--start", type=int, default=0, help="index of the first case (to resume or bisect)")
    p.add_argument("--families", help=f"comma-separated subset of: {', '.join([*SERVICE_FAMILIES, *REGISTRY_FAMILIES])}")
    p.add_argument("--url", help="fuzz a running service (grpc://127.0.0.1:PORT) instead of starting one")
    p.add_argument("--token", default=TOKEN, help="the bearer token --url's service takes")
    p.add_argument("--registry-url", help="fuzz a running registry whose secret is the fuzzer's (see registry.py)")
    p.add_argument("--corpus", default=".fuzz-corpus")
    p.add_argument("--unclear-kept", type=int, default=3, metavar="N", help="unclear cases kept per family and reason (default: %(default)s)")
    p.add_argument("--workdir", help="scratch directory (default: a temporary one)")
    p.add_argument("--timeout", type=float, default=15.0, help="deadline of a whole case, seconds (default: %(default)s)")
    p.add_argument("--health-timeout", type=float, default=10.0, help="deadline of the check after each case (default: %(default)s)")
    p.add_argument("--replay", action="append", metavar="FILE", help="run the case kept in FILE (repeatable)")
    return p


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _run(kind: str, target: Target, cases: Sequence[Case] | None, generator: ServiceGenerator | None, args: argparse.Namespace,
         count: int) -> Tally:
    with target:
        log(f"fuzzing the {kind} at {target.url} (seed {args.seed})")
        stream = iter(cases) if cases is not None else prefetch(generator.case, range(args.start, args.start + count)) if generator else iter(())
        tally = run_cases(target, stream, count, args.timeout, Path(args.corpus), args.unclear_kept)
    report(kind, tally)
    return tally


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    for url in (args.url, args.registry_url):
        if url and not LOOPBACK_URL.fullmatch(url):
            raise SystemExit(f"--url and --registry-url must be grpc://127.0.0.1:PORT (this fuzzer only talks to loopback), not {url!r}")
    only = [f.strip() for f in args.families.split(",")] if args.families else None
    replayed = [Case.from_json(json.loads(Path(p).read_text())["case"]) for p in args.replay or ()]
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="fuzz-service-"))
    registry_count = args.cases if args.registry_cases is None else args.registry_cases
    tallies: dict[str, Tally] = {}
    try:
        plans = [("registry", REGISTRY_FAMILIES, registry_count, args.registry_url, REGISTRY_LISTENING,
                  [sys.executable, "-m", "benchmarks.fuzz.service.registry_server", "--secret", REGISTRY_SECRET, "--workers", str(REGISTRY_WORKERS)]),
                 ("service", SERVICE_FAMILIES, args.cases, args.url, SERVICE_LISTENING, service_command(workdir))]
        for kind, families, count, url, listening, command in plans:
            mine = [c for c in replayed if (c.family in REGISTRY_FAMILIES) == (kind == "registry")] if replayed else None
            chosen = [f for f in only or families if f in families] if only else None
            if (replayed and not mine) or (not replayed and (count <= 0 or chosen == [])):
                continue
            start = None if url else (lambda n, c=command, lk=listening, k=kind: OwnedWorker(workdir, n, command=c, listening=lk, name=k))
            target = Target(kind, start, url or "", args.health_timeout)
            generator = None if mine else ServiceGenerator(args.seed, families, chosen, namespace=kind)
            tallies[kind] = _run(kind, target, mine, generator, args, len(mine) if mine else count)
    except KeyboardInterrupt:
        log("interrupted")
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    for kind in ("registry", "service"):
        if kind in tallies:
            print(summary(kind, tallies[kind]), flush=True)
    return 1 if any(t.crashes or t.hangs for t in tallies.values()) else 0
