"""The worker: a Flight service running tasks (``flight-worker`` is its daemon)."""

from flight.worker.server import WorkerServer

__all__ = ["WorkerServer"]
