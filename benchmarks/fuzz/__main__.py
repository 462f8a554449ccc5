"""``python -m benchmarks.fuzz``: the worker fuzzer, the same as ``python -m benchmarks.fuzz_worker``."""

import sys

from benchmarks.fuzz.cli import main

if __name__ == "__main__":
    sys.exit(main())
