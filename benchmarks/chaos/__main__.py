"""``python -m benchmarks.chaos``: see ``benchmarks/chaos/cli.py``."""

import sys

from benchmarks.chaos.cli import main

if __name__ == "__main__":
    sys.exit(main())
