"""``python -m benchmarks.fuzz_worker``: the worker fuzzer, which lives in the package ``benchmarks.fuzz``.

Kept as a command because docs, CI and every kept corpus file (its ``replay`` line) name it.
"""

import sys

from benchmarks.fuzz.cli import main

if __name__ == "__main__":
    sys.exit(main())
