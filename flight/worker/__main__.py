"""``python -m flight.worker``: the same as ``flight-worker``."""

import sys

from flight.worker.cli import main

sys.exit(main())
