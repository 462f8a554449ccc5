"""``python -m flight.service``: the same as ``flight-coordinator``."""

from flight.service.cli import main

main()
