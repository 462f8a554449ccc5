"""Workers on the Spark cluster: ``flight.spark.start_workers(spark, n)`` runs one long-lived Spark task per worker.

As Ray on Spark and XGBoost's Spark integration start their daemons, a background job of ``n``
tasks (its own job group) runs on the executors; each task starts ``flight-worker`` on its
executor's host and registers the worker's URL with a registry in the driver. The driver's
``resolver()`` serves the registered URLs whose tasks still beat, so queries follow the fleet:

* **Registration** is a Flight action (``register``: JSON ``{secret, url, index, attempt}``) on a
  small Flight server in the driver, checked against a random per-fleet secret that travels in the
  task's closure (Spark ships closures to executors; a cluster without RPC encryption ships them
  in the clear: docs/spark.md). The registry keeps the worker of each task index, renewed by the
  task every ``beat`` seconds; one silent for ``expire`` seconds is dropped.
* **A lost worker**: its task sees the process end and fails; Spark retries the task (its
  ``spark.task.maxFailures``) and the new attempt starts a worker and registers, replacing the
  index's URL.
* **Stop**: ``stop()`` (or leaving the ``with`` block, or the SparkSession ending) cancels the job
  group; Spark kills the tasks' Python workers, and each ``flight-worker`` watches a pipe its task
  holds (``--parent-fd``), so it drains and exits when its task, or the whole executor, goes.

``Registry`` holds the decisions (tested without sockets); ``RegistryServer`` is its Flight face.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import secrets
import selectors
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self, TypeGuard

import pyarrow as pa
import pyarrow.flight as fl

from flight.coordinator.resolver import PollingWorkerResolver, WorkerResolver, normalize_url
from flight.errors import ResolverError, WorkerUnavailableError
from flight.worker.memory import WORKER_ENV

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["Registry", "SparkWorkers", "start_workers"]

log = logging.getLogger(__name__)

MAX_BODY = 4096
"""Bytes a registration may have: a URL and three small fields."""
LISTENING = "flight-worker listening on "


@dataclass
class Entry:
    url: str
    attempt: int
    seen: float


class Registry:
    """The workers of one fleet by task index: who may register (the secret), and who is still there."""

    def __init__(self, secret: str, workers: int, expire: float) -> None:
        self.secret = secret
        self._secret = secret.encode()
        self.workers = workers
        self.expire = expire
        self._entries: dict[int, Entry] = {}
        self._lock = threading.Lock()
        self.changed = threading.Condition(self._lock)

    def register(self, body: bytes, now: float) -> str:
        """Take a registration or a renewal; raises ``ValueError`` naming the field that is wrong (never echoing it)."""
        if len(body) > MAX_BODY:
            raise ValueError(f"a registration is at most {MAX_BODY} bytes")
        try:
            msg = json.loads(body)
        except (ValueError, RecursionError):  # RecursionError: arrays nested past the parser's depth, within MAX_BODY
            raise ValueError("a registration is a JSON object") from None
        if not isinstance(msg, dict):
            raise ValueError("a registration is a JSON object")
        secret = msg.get("secret")
        # surrogatepass: JSON may spell a lone surrogate ("\\ud800"), which plain encode() refuses with a message quoting it
        if not isinstance(secret, str) or not hmac.compare_digest(secret.encode("utf-8", "surrogatepass"), self._secret):
            raise PermissionError("the registration does not carry this fleet's secret")
        index, attempt, url = msg.get("index"), msg.get("attempt"), msg.get("url")
        if not _whole(index) or not 0 <= index < self.workers:
            raise ValueError(f"field 'index' must be a task index below {self.workers}")
        if not _whole(attempt) or attempt < 0:
            raise ValueError("field 'attempt' must be a task attempt number")
        if not isinstance(url, str):
            raise ValueError("field 'url' must be a grpc:// URL")
        if len(url) > 300:
            raise ValueError("field 'url' must be a grpc:// URL")
        try:
            url = normalize_url(url)
        except ResolverError:
            raise ValueError("field 'url' must be a grpc:// URL") from None
        with self.changed:
            current = self._entries.get(index)
            if current is not None and current.attempt > attempt:
                raise ValueError(f"task {index} attempt {attempt} was replaced by attempt {current.attempt}")
            self._entries[index] = Entry(url, attempt, now)
            if current is None or current.url != url:
                log.info("flight worker %d (attempt %d) registered at %s", index, attempt, url)
                self.changed.notify_all()
        return url

    def live(self, now: float) -> list[str]:
        """The URLs of workers whose task renewed them within ``expire`` seconds, by task index."""
        with self._lock:
            return [e.url for _, e in sorted(self._entries.items()) if now - e.seen <= self.expire]

    def wait(self, count: int, timeout: float, failed: Callable[[], BaseException | None]) -> list[str]:
        """Block until ``count`` workers are live (or ``failed()`` says why they never will); their URLs."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                now = time.monotonic()
                live = [e.url for _, e in sorted(self._entries.items()) if now - e.seen <= self.expire]
                if len(live) >= count:
                    return live
                error = failed()
                if error is not None:
                    raise WorkerUnavailableError(f"the Spark job running the flight workers failed: {error}") from error
                if now >= deadline:
                    raise WorkerUnavailableError(
                        f"{len(live)} of {count} flight workers registered within {timeout:g} s (are there {count} free task "
                        "slots on the executors? each worker holds one for its whole life)"
                    )
                self.changed.wait(min(0.5, deadline - now))


def _whole(value: object) -> TypeGuard[int]:
    """A JSON integer: not a bool (``true`` is an int to Python, and would have registered as task 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


class RegistryServer(fl.FlightServerBase):
    """The registry's Flight face in the driver: one action, ``register``."""

    def __init__(self, registry: Registry, host: str) -> None:
        super().__init__(f"grpc://{host}:0")
        self.registry = registry
        self.url = f"grpc://{host}:{self.port}"

    def do_action(self, context: fl.ServerCallContext, action: fl.Action) -> Iterator[bytes]:
        if action.type != "register":
            raise fl.FlightServerError(f"unknown action {action.type[:40]!r}: this registry takes 'register'")
        body = action.body.to_pybytes() if action.body is not None else b""
        try:
            url = self.registry.register(body, time.monotonic())
        except PermissionError as exc:
            raise fl.FlightUnauthenticatedError(str(exc)) from None
        except ValueError as exc:
            raise fl.FlightServerError(f"registration refused: {exc}") from None
        return iter([url.encode()])


# ------------------------------------------------------------------ the Spark task


def _start_worker(host: str, args: Sequence[str], timeout: float) -> tuple[subprocess.Popen[str], str, int]:
    """``flight-worker`` on this host, bound to ``host``, watching a pipe this process holds; (process, URL, pipe's write end)."""
    life_r, life_w = os.pipe()
    cmd = [sys.executable, "-m", "flight.worker", "--host", host, "--port", "0", "--parent-fd", str(life_r), *args]
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, pass_fds=(life_r,),
                                env={**os.environ, **WORKER_ENV, "PYTHONUNBUFFERED": "1"})
    finally:
        os.close(life_r)
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline and proc.poll() is None:
            if sel.select(timeout=0.1):
                line = proc.stdout.readline()
                if line.startswith(LISTENING):
                    return proc, line[len(LISTENING):].strip(), life_w
    proc.kill()
    os.close(life_w)
    raise WorkerUnavailableError(f"flight-worker did not start within {timeout:g} s on this executor (exit code {proc.poll()})")


def _register(registry_url: str, body: dict[str, object], timeout: float) -> None:
    with fl.connect(registry_url) as client:
        list(client.do_action(fl.Action("register", json.dumps(body).encode()), fl.FlightCallOptions(timeout=timeout)))


def worker_task(conf: dict[str, Any]) -> Callable[[int, Iterable[int]], Iterator[str]]:
    """The function each fleet task runs (``mapPartitionsWithIndex``): start, register, beat; fail when the worker ends."""

    def run(index: int, _rows: Iterable[int]) -> Iterator[str]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        attempt = ctx.attemptNumber() if ctx is not None else 0
        host = _executor_host() if conf["host"] == "auto" else conf["host"]
        proc, url, life_w = _start_worker(host, conf["worker_args"], conf["start_timeout"])
        body = {"secret": conf["secret"], "index": index, "attempt": attempt, "url": url}
        try:
            while proc.poll() is None:
                try:
                    _register(conf["registry"], body, conf["beat"])
                except (pa.ArrowException, OSError) as exc:
                    if "replaced by attempt" in str(exc) or "secret" in str(exc):
                        raise RuntimeError(f"flight worker {index}: the driver's registry refused it: {exc}") from None
                    log.warning("flight worker %d: could not reach the driver's registry: %s", index, exc)
                time.sleep(conf["beat"])
            raise RuntimeError(f"flight worker {index} at {url} exited with code {proc.returncode}: Spark retries this task")
        finally:
            os.close(life_w)  # the worker drains and exits (if it has not)
            try:
                proc.wait(conf["grace"] + 5)
            except subprocess.TimeoutExpired:
                proc.kill()
        yield url  # never reached: the task ends by failing, or by being cancelled

    return run


# ------------------------------------------------------------------ the handle


class SparkWorkers:
    """A fleet of ``flight-worker``s running as Spark tasks; ``resolver()`` follows it."""

    def __init__(self, spark: SparkSession, registry: Registry, server: RegistryServer, group: str) -> None:
        self.spark = spark
        self.registry = registry
        self._server = server
        self.group = group
        self.error: BaseException | None = None
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def urls(self) -> list[str]:
        """The workers registered now (whose tasks still beat)."""
        return self.registry.live(time.monotonic())

    def resolver(self, interval: float = 1.0) -> WorkerResolver:
        """A resolver of the live workers, refreshed every ``interval`` seconds (close it when done)."""
        return PollingWorkerResolver(lambda: self.registry.live(time.monotonic()), interval, name="spark fleet")

    def stop(self) -> None:
        """Cancel the fleet's job: Spark kills its tasks, and each worker drains and exits with its task."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        try:
            if _is_connect(self.spark):
                self.spark.interruptTag(self.group)
            else:
                self.spark.sparkContext.cancelJobGroup(self.group)
        except Exception as exc:  # noqa: BLE001 - the session may have stopped already, taking the job with it
            log.debug("cancelling the flight fleet's job group: %s", exc)
        if self._thread is not None:
            self._thread.join(30)
        self._server.shutdown()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_workers(
    spark: SparkSession,
    num_workers: int,
    *,
    worker_args: Sequence[str] = (),
    host: str | None = None,
    num_cpus_per_worker: int | None = None,
    memory_per_worker: str | None = None,
    start_timeout: float = 120.0,
    beat: float = 2.0,
    grace: float = 5.0,
) -> SparkWorkers:
    """Start ``num_workers`` flight workers as long-lived Spark tasks; return once all registered.

    ``worker_args`` go to each ``flight-worker`` (its options and security: ``--auth-token-file``,
    ``--tls-cert``... name files the executors can read). ``host``: the address each worker binds
    and registers (default: ``spark.driver.host``'s loopback in local mode, else the executor's
    ``SPARK_LOCAL_IP`` or host name). ``num_cpus_per_worker`` and ``memory_per_worker`` become a
    stage-level resource profile where the cluster manager supports one (YARN, Kubernetes,
    standalone with dynamic allocation); elsewhere they are refused with Spark's reason.
    Each worker holds one task slot for its whole life. Works from a Spark Connect session too (its
    job tagged and interrupted by tag; stage-level resources are not offered there).
    """
    if num_workers < 1:
        raise ValueError("start_workers needs at least one worker")
    connect = _is_connect(spark)
    driver_host = spark.conf.get("spark.driver.host", "127.0.0.1") or "127.0.0.1"
    local = (spark.conf.get("spark.master", "") or "").startswith("local")
    registry = Registry(secrets.token_hex(32), num_workers, expire=max(5.0, beat * 5))
    server = RegistryServer(registry, driver_host if not local else "127.0.0.1")
    group = f"flight-workers-{uuid.uuid4().hex[:8]}"
    fleet = SparkWorkers(spark, registry, server, group)
    conf = {"registry": server.url, "secret": registry.secret, "host": host or ("127.0.0.1" if local else "auto"),
            "worker_args": list(worker_args) + ["--grace", str(grace)], "start_timeout": start_timeout, "beat": beat, "grace": grace}
    job = _connect_job(spark, conf, num_workers) if connect else _classic_job(spark, conf, num_workers, num_cpus_per_worker, memory_per_worker)

    def run() -> None:
        if connect:
            spark.addTag(group)  # this thread's operations: spark.interruptTag(group) stops them
        else:
            spark.sparkContext.setJobGroup(group, f"flight-exec: {num_workers} flight workers", interruptOnCancel=True)
        try:
            job()
        except Exception as exc:  # noqa: BLE001 - the fleet's end: cancelled (stop) or failed (kept for whoever waits)
            if not fleet._stopped.is_set():
                fleet.error = exc
                log.warning("the flight workers' Spark job ended: %s", exc)

    fleet._thread = threading.Thread(target=run, name=group, daemon=True)
    fleet._thread.start()
    try:
        registry.wait(num_workers, start_timeout, lambda: fleet.error)
    except BaseException:
        fleet.stop()
        raise
    return fleet


def _is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session (no SparkContext here: jobs are tagged, not grouped)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def _classic_job(spark: Any, conf: dict[str, Any], n: int, cpus: int | None, memory: str | None) -> Callable[[], object]:
    rdd = spark.sparkContext.parallelize(range(n), n)
    if cpus is not None or memory is not None:
        rdd = rdd.withResources(_profile(cpus, memory))
    return rdd.mapPartitionsWithIndex(worker_task(conf)).collect


def _connect_job(spark: Any, conf: dict[str, Any], n: int) -> Callable[[], object]:
    """The fleet's job over Spark Connect: ``n`` partitions of ``range``, each a worker's task (``mapInArrow``)."""
    run = worker_task(conf)

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        for url in run(ctx.partitionId() if ctx is not None else 0, iter(())):
            yield pa.RecordBatch.from_pylist([{"url": url}])

    return spark.range(0, n, 1, n).mapInArrow(task, "url string").collect


def _executor_host() -> str:
    """The address this executor is reached at: Spark's ``SPARK_LOCAL_IP`` if set, else its host name's."""
    import socket

    return os.environ.get("SPARK_LOCAL_IP") or socket.gethostbyname(socket.gethostname())


def _profile(cpus: int | None, memory: str | None) -> Any:
    from pyspark.resource import ExecutorResourceRequests, ResourceProfileBuilder, TaskResourceRequests

    builder = ResourceProfileBuilder()
    if cpus is not None:
        builder.require(TaskResourceRequests().cpus(cpus))
        builder.require(ExecutorResourceRequests().cores(cpus))
    if memory is not None:
        builder.require(ExecutorResourceRequests().memory(memory))
    return builder.build
