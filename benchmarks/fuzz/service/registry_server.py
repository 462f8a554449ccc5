"""A fleet registry on its own (``flight.spark``'s ``RegistryServer``), for the service fuzzer to own as a process.

In a Spark application the registry runs in the driver; the fuzzer needs it without Spark, in a
process of its own whose death or wedge it can see (it never imports ``flight`` itself). The
first stdout line is ``fleet registry listening on grpc://127.0.0.1:PORT``.

    python -m benchmarks.fuzz.service.registry_server --secret S --workers 4
"""

from __future__ import annotations

import argparse
import faulthandler
import signal
import sys

from flight.spark._fleet import Registry, RegistryServer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--secret", required=True)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--expire", type=float, default=60.0)
    args = parser.parse_args()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the fuzzer asks for every thread's stack on a hang
    server = RegistryServer(Registry(args.secret, args.workers, args.expire), "127.0.0.1")
    print(f"fleet registry listening on {server.url}", flush=True)
    # The server runs on its own threads already: this one waits for SIGTERM (the fuzzer's stop) and shuts it down.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
