"""``python -m benchmarks.fuzz_service``: the Flight SQL service and the fleet registry fuzzed (``benchmarks.fuzz.service``)."""

import sys

from benchmarks.fuzz.service.cli import main

if __name__ == "__main__":
    sys.exit(main())
