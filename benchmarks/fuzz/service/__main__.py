"""``python -m benchmarks.fuzz.service``: the same as ``python -m benchmarks.fuzz_service``."""

import sys

from benchmarks.fuzz.service.cli import main

if __name__ == "__main__":
    sys.exit(main())
