"""``python -m benchmarks``: the same as ``flight-bench`` (see ``benchmarks/cli.py``).

With no arguments it is the main job: TPC-H SF 0.1, all ten queries on flight-exec
(a 2-worker ``LocalCluster``), Acero, DuckDB and PySpark (when installed), three
timed runs each, results in ``bench-results/``.
"""

import sys

from benchmarks.cli import main

if __name__ == "__main__":
    sys.exit(main())
