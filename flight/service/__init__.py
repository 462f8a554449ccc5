"""The coordinator service (``flight-coordinator``): SQL from any Flight SQL client, run on the workers.

``server`` answers Flight SQL (statements, prepared statements, metadata, cancellation);
``queries`` keeps the running queries and their results' lifetimes; ``commands`` decodes Flight
SQL's messages and answers the metadata commands without sockets; ``cli`` is the daemon.
docs/service.md says how to start it and connect to it.
"""

from flight.service.queries import Queries
from flight.service.server import CoordinatorServer

__all__ = ["CoordinatorServer", "Queries"]
