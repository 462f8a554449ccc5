"""flight-exec: run distributed query plans on a fleet of Arrow Flight workers.

The public API lives here; everything else is private to the package.
"""

from flight._version import __version__
from flight.config import ExecOptions, WorkerOptions
from flight.coordinator.dns import DnsWorkerResolver
from flight.coordinator.exec import DistributedExec
from flight.coordinator.map import map_batches
from flight.coordinator.metrics import FeedStats, QueryMetrics, TaskStats
from flight.coordinator.resolver import FileWorkerResolver, PollingWorkerResolver, StaticWorkerResolver, WorkerResolver
from flight.dev.cluster import LocalCluster
from flight.dev.local import run_local
from flight.engine.readers import ReaderContext, register_reader
from flight.errors import (
    FeedError,
    FlightExecError,
    InvalidTaskError,
    PermissionDeniedError,
    PlanError,
    ProtocolError,
    QueryTimeoutError,
    ResolverError,
    RetryableError,
    TaskCancelledError,
    TaskFailedError,
    UnauthenticatedError,
    UnitReadError,
    VersionMismatchError,
    WorkerBusyError,
    WorkerError,
    WorkerUnavailableError,
)
from flight.plan import agg
from flight.plan.expr import Expr, call, coalesce, col, if_else, lit
from flight.plan.query import Query, from_arrow, from_feed, map_input, read_ipc, read_parquet, units
from flight.security import Security
from flight.sources.estimate import DefaultTaskEstimator, DiscoverySample, TaskEstimate, TaskEstimator
from flight.sources.feed import FeedContext, Unit, WorkUnit, WorkUnitFeed, WorkUnitFeedProvider, file_unit
from flight.sources.providers import FileListProvider, ListingProvider
from flight.sources.storage import configure_storage
from flight.sql import Catalog, sql
from flight.tables.delta import read_delta
from flight.tables.iceberg import read_iceberg

__all__ = [
    "Catalog",
    "DefaultTaskEstimator",
    "DiscoverySample",
    "DistributedExec",
    "DnsWorkerResolver",
    "ExecOptions",
    "Expr",
    "FeedContext",
    "FeedError",
    "FeedStats",
    "FileListProvider",
    "FileWorkerResolver",
    "FlightExecError",
    "InvalidTaskError",
    "ListingProvider",
    "LocalCluster",
    "PermissionDeniedError",
    "PlanError",
    "PollingWorkerResolver",
    "ProtocolError",
    "Query",
    "QueryMetrics",
    "QueryTimeoutError",
    "ReaderContext",
    "ResolverError",
    "RetryableError",
    "Security",
    "StaticWorkerResolver",
    "TaskCancelledError",
    "TaskEstimate",
    "TaskEstimator",
    "TaskFailedError",
    "TaskStats",
    "UnauthenticatedError",
    "Unit",
    "UnitReadError",
    "VersionMismatchError",
    "WorkUnit",
    "WorkUnitFeed",
    "WorkUnitFeedProvider",
    "WorkerBusyError",
    "WorkerError",
    "WorkerOptions",
    "WorkerResolver",
    "WorkerUnavailableError",
    "__version__",
    "agg",
    "call",
    "coalesce",
    "col",
    "configure_storage",
    "file_unit",
    "from_arrow",
    "from_feed",
    "if_else",
    "lit",
    "map_batches",
    "map_input",
    "read_delta",
    "read_iceberg",
    "read_ipc",
    "read_parquet",
    "register_reader",
    "run_local",
    "sql",
    "units",
]
