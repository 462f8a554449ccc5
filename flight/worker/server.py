"""The worker's Flight service: thin handlers over the task registry.

``DoExchange`` runs one task for as long as its coordinator keeps the exchange
open; ``DoGet`` streams a task's output partitions; ``DoAction`` answers
health, info, cancel and drain. Errors are translated here, at the boundary
(``failures.py`` words them): a clean ``ErrorInfo`` frame goes to the
coordinator, and the call ends with the matching Flight status
(``INVALID_ARGUMENT`` for bad input), so that neither side sees a Python
traceback as the message.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator

import pyarrow as pa
import pyarrow.flight as fl

from flight._version import __version__
from flight.config import WorkerOptions
from flight.engine.acero.pipeline import source_threads
from flight.engine.readers import UnitReadError
from flight.engine.select import compile_task
from flight.errors import FlightExecError, ProtocolError, TaskCancelledError, light_copy
from flight.threads import Job, spawn
from flight.wire._proto import plan_pb2, protocol_pb2
from flight.wire.clients import ClientPool
from flight.wire.limits import MAX_OUTPUT_BUFFER_BYTES, MIN_OUTPUT_BUFFER_BYTES, clamp, clip, heartbeat_seconds, task_reserve
from flight.wire.protocol import (
    INPUT_CALL_PATH,
    PROTOCOL_VERSION,
    decode_cancel_request,
    decode_header,
    decode_ticket,
    encode_schema,
    format_stage_key,
    ipc_options,
    status_error,
)
from flight.worker.admission import Admission
from flight.worker.auth import MIDDLEWARE_KEY, ServerSecurity, TokenAuth, identity, is_anonymous, same_secret
from flight.worker.beats import Heartbeats
from flight.worker.boundary import error_boundary
from flight.worker.capacity import Need, worker_capacity
from flight.worker.doget import output_stream
from flight.worker.exchange import Sender, read_frames
from flight.worker.failures import error_info, fail, refuse, reject
from flight.worker.inputcall import serve_input_call
from flight.worker.shuffle import read_partitions
from flight.worker.tasks import Task, TaskRegistry
from flight.worker.watchdog import watch

__all__ = ["ACTIONS", "WorkerServer"]

log = logging.getLogger(__name__)

ACTIONS = {
    "health": "Answers b'ok' while the worker accepts tasks.",
    "info": "A WorkerInfo: version, protocol version, running tasks, buffered bytes, draining.",
    "cancel": "Body: a CancelRequest. Cancels every task of that query; answers a CancelResult.",
    "drain": "Stop accepting tasks; running ones finish or are cancelled after the grace period.",
    "resume": "Undo a drain: accept tasks again (tasks already cancelled stay cancelled).",
}


_RUNNER_STOP_S = 5.0
"""How long a stopped task's runner may take to notice before its handler returns without it."""

class WorkerServer(fl.FlightServerBase):
    """A flight-exec worker. ``url`` is what coordinators dial."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        options: WorkerOptions | None = None,
        *,
        security: ServerSecurity | None = None,
    ) -> None:
        sec = security or ServerSecurity()
        scheme = "grpc+tls" if sec.tls_cert else "grpc"
        super().__init__(
            f"{scheme}://{host}:{port}",
            # pyarrow takes PEM bytes here (its stubs say str)
            tls_certificates=[(sec.tls_cert, sec.tls_key)] if sec.tls_cert else None,  # type: ignore[list-item]
            verify_client=sec.client_ca is not None,
            root_certificates=sec.client_ca,  # type: ignore[arg-type]
            middleware={MIDDLEWARE_KEY: TokenAuth(sec.tokens, sec.public_health)} if sec.tokens else None,
        )
        self.security = sec
        self.options = options or WorkerOptions()
        self.url = f"{scheme}://{host}:{self.port}"
        self.registry = TaskRegistry(queued=lambda key: self.admission.is_waiting(key))
        self.peers = ClientPool(sec.peer)
        self.draining = threading.Event()
        o = self.options
        # Fair shares per identity (admission.py): the defaults depend on whether callers have identities.
        self.admission = Admission(worker_capacity(o, sec.identifies_callers))
        self.beats = Heartbeats()
        self._stopped = threading.Event()  # set by shutdown()
        self._idle = threading.Event()  # calls ended since memory was last handed back
        # The watchdog (watchdog.py) runs for the worker's whole life, drained or not: a drain that
        # is undone (resume) must still free the tasks of coordinators that went silent.
        watchdog = (self.registry, self.admission, self.options.peer_timeout, self._stopped, self._idle, self.options.memory_ceiling)
        threading.Thread(target=watch, args=watchdog, name="watchdog", daemon=True).start()

    def call_ended(self) -> None:
        """Any call ended (``error_boundary``): the watchdog's next round that finds no task gives memory
        back. Before, only a task's end did, and a run of refused calls (large headers, tickets and
        action bodies, decoded then refused) left an idle worker 270-300 MiB above its baseline at
        some samples of the 10,000-case fuzz run."""
        self._idle.set()

    # ------------------------------------------------------------- DoExchange

    @error_boundary
    def do_exchange(
        self,
        context: fl.ServerCallContext,
        descriptor: fl.FlightDescriptor,
        reader: fl.MetadataRecordBatchReader,
        writer: fl.MetadataRecordBatchWriter,
    ) -> None:
        if descriptor.descriptor_type == fl.DescriptorType.PATH and descriptor.path == [INPUT_CALL_PATH.encode()]:
            serve_input_call(self.registry, self.url, reader, self.options.get_wait)  # batches for a task (section 16)
            return
        sender = Sender(writer)
        try:
            header, plan = decode_header(descriptor.command or b"")
        except ProtocolError as exc:
            raise reject(self.url, sender, exc, None) from None
        key = format_stage_key(header.stage_key)
        client = identity(context)
        if self.draining.is_set():
            message = f"worker {self.url} is draining and accepts no new tasks"
            raise refuse(self.url, sender, protocol_pb2.ERROR_CODE_UNAVAILABLE, message, header.stage_key)
        opts = header.options
        buffer_bytes = clamp(opts.output_buffer_bytes or self.options.output_buffer_bytes, MIN_OUTPUT_BUFFER_BYTES, MAX_OUTPUT_BUFFER_BYTES)
        threads = source_threads(plan)
        need = Need(threads=threads, memory=task_reserve(buffer_bytes, threads))
        interval = heartbeat_seconds(opts.heartbeat_ms)

        def queued() -> None:  # "I wait for capacity": tells the coordinator to wait longer, and is its heartbeat
            try:
                sender.frame(protocol_pb2.WorkerFrame(load=self._load(0)))
            except (pa.ArrowException, OSError) as exc:
                log.debug("task %s: could not say it is queued: %s", key, exc)

        refusal = self.admission.admit(
            key,
            need,
            pa.total_allocated_bytes,
            client=client,
            query=header.stage_key.query_id,
            give_up=context.is_cancelled,
            tick=queued,
            tick_every=interval,
        )
        if refusal is not None:
            code = protocol_pb2.ERROR_CODE_BUSY if refusal.fits_ever else protocol_pb2.ERROR_CODE_TOO_LARGE
            log.debug("refused task %s of %s: %s", key, client, refusal.reason)
            raise refuse(self.url, sender, code, f"worker {self.url} cannot take task {key}: {refusal.reason}", header.stage_key)
        try:
            self._run_exchange(header, plan, buffer_bytes, sender, reader, client, context.is_cancelled)
        finally:
            self.admission.release(key)

    def _run_exchange(
        self,
        header: protocol_pb2.TaskHeader,
        plan: plan_pb2.StagePlan,
        buffer_bytes: int,
        sender: Sender,
        reader: fl.MetadataRecordBatchReader,
        client: str,
        gone: Callable[[], bool],
    ) -> None:
        """An admitted task of identity ``client``, from its start to the end of its exchange (or ``gone()``: the call's)."""
        opts = header.options
        task, output = self._start_task(header, plan, buffer_bytes, sender, client)
        log.debug("task %s started (%d feed partitions)", task.key, len(task.inboxes))
        interval = heartbeat_seconds(opts.heartbeat_ms)
        runner: Job | None = None
        try:
            self._send_ready(task, sender)
            runner = spawn(self._run, task, output, sender, name=f"task-{task.key}")
            self.beats.add(sender, interval)  # one thread beats for every task (beats.py)
            # This thread reads the coordinator's side until it half-closes or goes away;
            # the reader is only valid while this handler runs, so it is read nowhere else.
            read_frames(task, reader)
            # The runner finishes the task; once the task was stopped (a bad frame, a cancel),
            # a runner stuck in a reader must not hold this call: it is left to end on its own.
            while runner.is_alive() and not task.cancelled.is_set():
                if gone():  # the client cancelled the call: nobody reads what the task would still send
                    task.cancel("the coordinator ended the call")
                    break
                runner.join(0.5)
            runner.join(_RUNNER_STOP_S)
            if task.failure is None and task.finished and (task.error is not None or task.called_off):
                # Stopped after it finished (a bad frame, a Cancel): the call still says so (docs/protocol.md §9).
                task.failure = fail(self.url, task, sender, task.error or TaskCancelledError(task.cancel_reason))
        finally:
            self.beats.remove(sender)
            task.cancel("the task ended")
            if runner is not None and runner.is_alive():
                runner.join(timeout=_RUNNER_STOP_S)
            sender.close()
            self.registry.remove(task)
            log.debug("task %s freed", task.key)
            if not len(self.registry):
                self._idle.set()  # the watchdog hands freed memory back (release_idle_memory)
        failure = task.failure
        if failure is not None:
            # Raised as a copy: the stored error would take this frame (and with it the task) into
            # its traceback, and the task holds the error: a cycle that native code keeping the
            # raised error (pyarrow's error detail) makes permanent (issue 24's fuzz growth).
            del task, output, runner, sender, reader, plan, header
            raise light_copy(failure)

    def _start_task(
        self, header: protocol_pb2.TaskHeader, plan: plan_pb2.StagePlan, buffer_bytes: int, sender: Sender, client: str
    ) -> tuple[Task, pa.RecordBatchReader]:
        """The task and its compiled output, registered (visible to DoGet); a plan that cannot run is rejected here."""
        opts = header.options
        task = Task(
            header,
            plan,
            pa.schema([]),
            worker_url=self.url,
            feed_window=opts.feed_window or self.options.feed_window,
            output_buffer_bytes=buffer_bytes,
            spill_dir=self.options.spill_dir,
            send_credit=lambda fid, p, n: sender.frame(
                protocol_pb2.WorkerFrame(credit=protocol_pb2.FeedCredit(feed_id=fid, partition=p, credits=n))
            ),
            read_partitions=self._read_partitions,
        )
        task.client = client
        try:
            try:
                output = compile_task(
                    plan, task, self.options.batch_rows, self.options.unit_delay_ms / 1000, tag_units=opts.tag_units,
                    whole_query=opts.whole_query,
                )
            except (pa.ArrowException, ValueError, TypeError) as exc:  # Acero refused what our checks let through
                raise ProtocolError(f"the plan cannot run on this worker: {type(exc).__name__}: {clip(exc)}", field="header.plan") from None
            except RecursionError:  # the engines compile a plan recursively: a few hundred operators deep at most
                raise ProtocolError(
                    "the plan's operators nest too deep for this worker to compile (past Python's recursion limit)", field="header.plan"
                ) from None
            task.output_schema = output.schema  # before the task is visible to DoGet
            self.registry.add(task)
        except ProtocolError as exc:
            task.cancel("rejected")
            raise reject(self.url, sender, exc, header.stage_key) from None
        return task, output

    def _load(self, buffered: int) -> protocol_pb2.LoadInfo:
        """The admission's load, with the output buffer a task gets when its options name none (a coordinator
        sums what a query's tasks reserve from it: ``flight.wire.limits.task_reserve``)."""
        load = self.admission.load(len(self.registry), buffered)
        load.output_buffer_bytes = self.options.output_buffer_bytes
        return load

    def _send_ready(self, task: Task, sender: Sender) -> None:
        ready = protocol_pb2.Ready(
            worker_url=self.url, worker_version=__version__, output_schema=encode_schema(task.output_schema), credits=task.open_feeds()
        )
        sender.frame(protocol_pb2.WorkerFrame(ready=ready))

    def _run(self, task: Task, output: pa.RecordBatchReader, sender: Sender) -> None:
        """The task's pipeline, on its own thread; its outcome is a frame (and ``task.failure``)."""
        ipc = ipc_options(task.header.options.ipc_compression)
        try:
            if task.is_map:
                sender.begin(output.schema, ipc)
            for batch in output:
                if task.cancelled.is_set():
                    break
                task.record_output(batch)
                if task.output is None:
                    sender.batch(task.sent.add(batch) if batch.num_rows else batch)
                else:
                    task.emit(batch)
            if task.error is not None or task.cancelled.is_set():
                raise task.error or TaskCancelledError(task.cancel_reason)
            if task.inputs is not None:
                task.inputs.discard()  # input may still come after the output is complete
            if task.output is not None:
                task.output.finish()
                out = task.output
                self.admission.computed(task.key, out.buffered_bytes if out.retain else out.bound, kept=out.retain)
            task.finished = True
            sender.frame(protocol_pb2.WorkerFrame(finished=task.metrics()))
            if task.output is not None:
                task.output.wait_drained()
                if task.error is not None or task.called_off:  # a bad frame or a Cancel after finished
                    raise task.error or TaskCancelledError(task.cancel_reason)
                if task.output.all_drained():
                    sender.frame(protocol_pb2.WorkerFrame(drained=protocol_pb2.Drained()))
        except (FlightExecError, UnitReadError, pa.ArrowException, OSError) as exc:
            task.failure = fail(self.url, task, sender, exc)
        except Exception as exc:
            if task.cancelled.is_set():  # the engine's own way of stopping (DuckDB's InterruptException): expected
                log.debug("task %s: stopped by its cancel: %s", task.key, type(exc).__name__)
            else:
                log.warning("task %s: unexpected %s", task.key, type(exc).__name__, exc_info=True)
            task.failure = fail(self.url, task, sender, exc)
        finally:
            # Native code keeps the errors it pulled (pyarrow's Python error detail, in the reader's
            # Status) and raises them again here: their tracebacks, and the frames of this thread
            # they hold (f_back), keep this frame for the process's life. It must not hold the task.
            del task, output, sender

    def _read_partitions(
        self, task: Task, producers: list[tuple[str, bytes]], start: int, end: int
    ) -> Iterator[tuple[pa.RecordBatch, bool]]:
        o = self.options
        return read_partitions(task, self.registry, self.peers, self.url, producers, start, end, o.get_wait, o.peer_timeout)

    # ------------------------------------------------------------------- DoGet

    @error_boundary
    def do_get(self, context: fl.ServerCallContext, ticket: fl.Ticket) -> fl.FlightDataStream:
        invalid = protocol_pb2.ERROR_CODE_INVALID_ARGUMENT
        try:
            t = decode_ticket(ticket.ticket)
        except ProtocolError as exc:
            raise status_error(error_info(self.url, invalid, str(exc), None, exc.field)) from None
        key = format_stage_key(t.stage_key)
        task, why = self.registry.get(key, wait=self.options.get_wait)
        if task is not None and not same_secret(t.query_secret, task.header.query_secret):
            message = f"the ticket for task {key} does not carry its query's secret"
            raise status_error(error_info(self.url, protocol_pb2.ERROR_CODE_PERMISSION_DENIED, message, t.stage_key, "ticket.query_secret"))
        if task is None:
            gone = self.registry.unavailable(key)
            if gone is not None:  # a worker it needed is gone (it runs again elsewhere, or it could not reach a peer)
                raise status_error(error_info(gone[0], protocol_pb2.ERROR_CODE_UNAVAILABLE, gone[1], t.stage_key, "ticket.stage_key"))
            message = f"no task {key} on worker {self.url}: {why}"
            info = error_info(self.url, protocol_pb2.ERROR_CODE_NOT_FOUND, message, t.stage_key, "ticket.stage_key")
            info.never_here = self.registry.never_here(key)
            raise status_error(info)
        if task.output is None:
            message = f"task {key} is a map stage: its output streams on its DoExchange"
            raise status_error(error_info(self.url, invalid, message, t.stage_key, "ticket"))
        if t.partition_end > task.output.partitions:
            message = f"ticket asks for partitions [{t.partition_start}, {t.partition_end}) but task {key} has {task.output.partitions}"
            raise status_error(error_info(self.url, invalid, message, t.stage_key, "ticket.partition_end"))
        ipc = ipc_options(task.header.options.ipc_compression)
        # (batch, app_metadata) pairs, pyarrow takes them; heartbeats while it waits (doget.py)
        stream = output_stream(task, t.partition_start, t.partition_end, context.is_cancelled)
        return fl.GeneratorStream(task.output_schema, stream, options=ipc)  # type: ignore[arg-type]

    # ---------------------------------------------------------------- DoAction

    def list_actions(self, context: fl.ServerCallContext) -> list[tuple[str, str]]:  # type: ignore[override]  # pyarrow takes pairs
        return list(ACTIONS.items())

    @error_boundary
    def do_action(self, context: fl.ServerCallContext, action: fl.Action) -> Iterator[bytes]:
        kind = action.type
        invalid = protocol_pb2.ERROR_CODE_INVALID_ARGUMENT
        if kind != "health" and is_anonymous(context):
            message = f"action {clip(kind, 40)!r} needs a bearer token (only health is public on this worker)"
            raise status_error(error_info(self.url, protocol_pb2.ERROR_CODE_UNAUTHENTICATED, message, None))
        if kind == "health":
            if self.draining.is_set():
                raise status_error(error_info(self.url, protocol_pb2.ERROR_CODE_UNAVAILABLE, f"worker {self.url} is draining", None))
            return iter([b"ok"])
        if kind == "info":
            return iter([self.info().SerializeToString()])
        if kind == "cancel":
            try:
                req = decode_cancel_request(action.body.to_pybytes() if action.body else b"")
            except ProtocolError as exc:
                raise status_error(error_info(self.url, invalid, str(exc), None, exc.field)) from None
            n = self.registry.cancel_query(req.query_id, req.query_secret, "cancelled by request")
            return iter([protocol_pb2.CancelResult(cancelled_tasks=n).SerializeToString()])
        if kind == "drain":
            threading.Thread(target=self.drain, name="drain", daemon=True).start()
            return iter([b"draining"])
        if kind == "resume":
            self.resume()
            return iter([b"resumed"])
        message = f"unknown action {clip(kind, 40)!r}; known: {', '.join(ACTIONS)}"
        raise status_error(error_info(self.url, invalid, message, None, "action.type"))

    def info(self) -> protocol_pb2.WorkerInfo:
        return protocol_pb2.WorkerInfo(
            version=__version__,
            protocol_version=PROTOCOL_VERSION,
            running_tasks=len(self.registry),
            buffered_bytes=self.registry.buffered_bytes(),
            draining=self.draining.is_set(),
            url=self.url,
            load=self._load(self.registry.buffered_bytes()),
            clients=self._client_loads(),
        )

    def _client_loads(self) -> list[protocol_pb2.ClientLoad]:
        """Admission's load per identity, with the bytes each makes this worker hold now."""
        held: dict[str, int] = {}
        for task in self.registry.tasks():
            held[task.client] = held.get(task.client, 0) + task.held_bytes
        rows = self.admission.clients()
        for row in rows:
            row.buffered_bytes = held.get(row.identity, 0)
        return rows

    def shutdown(self) -> None:
        """Stop serving (after a drain, say); the watchdog and the heartbeats stop too."""
        self._stopped.set()
        self.beats.close()
        super().shutdown()

    def resume(self) -> None:
        """Accept tasks again after a drain (one that is still in its grace period stops cancelling)."""
        self.draining.clear()
        self.registry.reopen()
        log.info("resumed: accepting tasks again")

    def drain(self, grace: float | None = None) -> None:
        """Accept no new tasks; wait up to ``grace`` seconds for running ones, then cancel them."""
        grace = self.options.grace if grace is None else grace
        self.draining.set()
        self.registry.close()
        log.info("draining: %d running tasks, grace %.1fs", len(self.registry), grace)
        if not self.registry.wait_empty(grace) and self.draining.is_set():
            for task in self.registry.tasks():
                task.cancel("the worker is shutting down")
                self.registry.remove(task)  # its handler may be stuck reading a silent client
                self.admission.release(task.key)

