"""What a query measured: per task (from the workers' final frames) and per feed partition."""

from __future__ import annotations

from dataclasses import dataclass, field

from flight.coordinator.dispatch import PartitionStats
from flight.wire._proto import protocol_pb2
from flight.wire.limits import clip
from flight.wire.protocol import format_stage_key

__all__ = ["FeedStats", "QueryMetrics", "TaskStats"]


def _mean_ms(stats: protocol_pb2.LatencyStats) -> float:
    return stats.sum_nanos / stats.count / 1e6 if stats.count else 0.0


@dataclass(frozen=True)
class FeedStats:
    """One feed partition as a worker saw it; latencies are means in milliseconds."""

    feed_id: str
    partition: int
    units: int
    bytes: int
    created_to_sent_ms: float
    sent_to_received_ms: float
    received_to_processed_ms: float
    max_created_to_processed_ms: float

    @classmethod
    def from_proto(cls, m: protocol_pb2.FeedMetrics) -> FeedStats:
        worst = (m.created_to_sent.max_nanos + m.sent_to_received.max_nanos + m.received_to_processed.max_nanos) / 1e6
        return cls(
            m.feed_id,
            m.partition,
            m.units,
            m.bytes,
            _mean_ms(m.created_to_sent),
            _mean_ms(m.sent_to_received),
            _mean_ms(m.received_to_processed),
            worst,
        )


@dataclass(frozen=True)
class TaskStats:
    stage_key: str
    worker_url: str
    rows_out: int
    batches_out: int
    bytes_out: int
    rows_in: int
    elapsed_s: float
    feeds: list[FeedStats] = field(default_factory=list)
    bytes_in: int = 0
    bytes_in_local: int = 0
    engine: str = ""
    """What computed the task: ``duckdb`` or ``acero`` (docs/engine.md)."""
    row_groups_read: int = 0
    row_groups_skipped: int = 0
    """Parquet row groups its readers read, and skipped by a filter's statistics (pyarrow's readers)."""
    scan_bytes_read: int = 0
    scan_bytes_skipped: int = 0
    inputs: tuple[tuple[int, int], ...] = ()
    """(stage id, rows) read from each stage below, every stream checked by its trailers (protocol §17)."""
    notes: tuple[str, ...] = ()
    """What the task's engine decided from what it received (``TaskMetrics.notes``: a broadcast's keys kept by a scan)."""

    def describe_scan(self) -> str:
        """``row groups 2/100 read (1.2 of 80.0 MB)``, or "" when its readers read no row group."""
        total = self.row_groups_read + self.row_groups_skipped
        if not total:
            return ""
        mb = (self.scan_bytes_read / 1e6, (self.scan_bytes_read + self.scan_bytes_skipped) / 1e6)
        return f"row groups {self.row_groups_read}/{total} read ({mb[0]:.1f} of {mb[1]:.1f} MB)"

    @classmethod
    def from_proto(cls, m: protocol_pb2.TaskMetrics, url: str) -> TaskStats:
        return cls(
            format_stage_key(m.stage_key),
            m.worker_url or url,
            m.rows_out,
            m.batches_out,
            m.bytes_out,
            m.rows_in,
            m.elapsed_nanos / 1e9,
            [FeedStats.from_proto(f) for f in m.feeds],
            m.bytes_in,
            m.bytes_in_local,
            clip(m.engine, 16),  # a peer's text, shown by explain(): kept short
            m.scan.row_groups_read,
            m.scan.row_groups_skipped,
            m.scan.bytes_read,
            m.scan.bytes_skipped,
            tuple((i.stage_id, i.rows) for i in m.inputs[:64]),  # a peer's list: a plan reads few stages
            tuple(clip(n, 300) for n in m.notes[:16]),  # a peer's words, shown by explain(): few and short
        )


@dataclass(frozen=True)
class QueryMetrics:
    query_id: str
    elapsed_s: float
    first_batch_s: float | None
    tasks: list[TaskStats]
    feeds: list[PartitionStats]
    notes: tuple[str, ...] = ()
    """How its tasks were opened when not all at once as asked: smaller output buffers, turns (``opening.py``)."""

    @property
    def rows(self) -> int:
        """Rows the tasks of the head stage produced (what the caller received)."""
        head = max((int(t.stage_key.split("/")[1]) for t in self.tasks), default=0)
        return sum(t.rows_out for t in self.tasks if int(t.stage_key.split("/")[1]) == head)

    def summary(self) -> str:
        first = f"{self.first_batch_s * 1000:.1f} ms" if self.first_batch_s is not None else "-"
        return f"Executed query {self.query_id} in {self.elapsed_s:.3f}s (first batch after {first}), {len(self.tasks)} task(s)"

    @property
    def units(self) -> int:
        return sum(f.units for f in self.feeds)

    def describe(self) -> str:
        first = f"{self.first_batch_s * 1000:.1f} ms" if self.first_batch_s is not None else "-"
        lines = [f"Executed query {self.query_id} in {self.elapsed_s:.3f}s (first batch after {first})"]
        for t in self.tasks:
            units = sum(f.units for f in t.feeds)
            lines.append(
                f"  task {t.stage_key} on {t.worker_url}: {t.rows_out} rows, {t.batches_out} batches, "
                f"{t.bytes_out} bytes out, {units} units, {t.elapsed_s:.3f}s"
            )
            for f in t.feeds:
                lines.append(
                    f"    feed {f.feed_id}[{f.partition}]: {f.units} units, {f.bytes} bytes; mean ms "
                    f"created->sent {f.created_to_sent_ms:.2f}, sent->received {f.sent_to_received_ms:.2f}, "
                    f"received->processed {f.received_to_processed_ms:.2f}"
                )
        return "\n".join(lines)
