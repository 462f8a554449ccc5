"""``python -m benchmarks.fuzz_worker`` (or ``python -m benchmarks.fuzz``): the worker fuzzer's command line."""

from __future__ import annotations

import argparse
import contextlib
import json
import queue
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from benchmarks.fuzz.cases import Case
from benchmarks.fuzz.fuzzer import Fuzzer
from benchmarks.fuzz.generator import FAMILIES, RESOURCE_FAMILIES, Generator
from benchmarks.fuzz.settings import CASE_TIMEOUT, DEFAULT_CASES, HEALTH_TIMEOUT, LOOPBACK_URL, PROTOCOL, RSS_EVERY
from benchmarks.fuzz.tally import log
from benchmarks.fuzz.verdicts import clean_message

__all__ = ["load_cases", "main", "prefetch", "replay"]


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
    p.add_argument("--rss-every", type=int, default=RSS_EVERY, metavar="N",
                   help="cases between two settled (idle) RSS samples; each waits for the worker to go idle and its RSS "
                        "to stop falling, a few seconds (default: %(default)s)")
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
