"""``python -m flight.shell``: the same as ``flight-sql``."""

from flight.shell.cli import main

main()
