"""Whether a pipeline's topics hold records beyond its committed position, and when to say so.

Event-driven DAG runs poll this (`read_backlog`) and start a run when `should_announce` says yes. The
answer only starts a run: the run's epoch still takes its ranges from the ledger's plan (committed
position up to the last stable offset), so a late, repeated or spurious announcement can cost at most an
empty epoch, never a record read twice or skipped. The same backlog is the lag that metrics report.

Offsets come from `KafkaMetadata`, a read_committed consumer: its high watermark is the last stable
offset (LSO), so records of open or aborted transactions never count as new.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from onceflow.ledger import Ledger
from onceflow.pipeline import KafkaSource, Pipeline
from onceflow.sources.kafka_planning import (
    PartitionOffsets,
    TopicPartitionKey,
    plan_ranges,
    topics_without_positions,
)

# A state as announced: per partition, (topic, partition, committed position, last stable offset).
BacklogState = tuple[tuple[str, int, int, int], ...]


@dataclass(frozen=True)
class PartitionBacklog:
    """One partition: where the pipeline stands in it and how far a read_committed reader could go."""

    topic: str
    partition: int
    position: int
    stable: int

    @property
    def lag(self) -> int:
        return self.stable - self.position


@dataclass(frozen=True)
class Backlog:
    """What separates a pipeline from its input's end, as the ledger and Kafka see it right now.

    ``unstarted`` names topics without any committed position: their first epoch fixes where the
    pipeline starts (``starting="latest"`` has no backlog until then, yet needs that epoch).
    ``epoch_in_flight`` is the number of a planned, undecided epoch, if any.
    """

    pipeline: str
    partitions: tuple[PartitionBacklog, ...]
    unstarted: tuple[str, ...] = ()
    epoch_in_flight: int | None = None

    @property
    def records(self) -> int:
        """Offsets beyond the committed position up to the LSO (an upper bound on records: transaction
        markers take offsets too)."""
        return sum(p.lag for p in self.partitions)

    @property
    def has_work(self) -> bool:
        return self.records > 0 or bool(self.unstarted)

    @property
    def state(self) -> BacklogState:
        return tuple((p.topic, p.partition, p.position, p.stable) for p in self.partitions)


def backlog_of(
    pipeline: str,
    source: KafkaSource,
    partitions: Iterable[PartitionOffsets],
    committed: Mapping[TopicPartitionKey, int],
    *,
    start_offsets: Mapping[TopicPartitionKey, int] | None = None,
    epoch_in_flight: int | None = None,
) -> Backlog:
    """The backlog over ``partitions`` (every current partition of the source's topics, as Kafka
    reports them) from the ledger's ``committed`` positions.

    The start of each partition is exactly where the next epoch's plan would start (`plan_ranges`, with
    the source's ``starting`` and new-partition rules); offsets that retention already deleted are not
    counted, since no epoch can read them (the plan itself fails or skips them, as the source says).
    """
    current = list(partitions)
    plan = plan_ranges(
        current,
        committed,
        starting=source.starting,
        max_records_per_partition=sys.maxsize,
        on_missing_offsets="skip",
        start_offsets=start_offsets,
    )
    return Backlog(
        pipeline=pipeline,
        partitions=tuple(
            PartitionBacklog(r.topic, r.partition, r.from_offset, r.until_offset) for r in plan.ranges
        ),
        unstarted=tuple(topics_without_positions(source.topics, committed)),
        epoch_in_flight=epoch_in_flight,
    )


def read_backlog(spec: Pipeline, ledger: Ledger, bootstrap: str, *, timeout_s: float = 15.0) -> Backlog:
    """Ask the ledger for the committed positions and Kafka for the LSOs, and compare them."""
    from onceflow.sources.kafka_metadata import KafkaMetadata

    committed = ledger.committed_offsets(spec.name)
    in_flight = ledger.open_epoch(spec.name)
    with KafkaMetadata(bootstrap, timeout_s=timeout_s) as metadata:
        partitions = metadata.partitions(spec.source.topics)
        start_offsets = None
        if isinstance(spec.source.starting, int):
            fresh = set(topics_without_positions(spec.source.topics, committed))
            start_offsets = metadata.offsets_for_times(
                (p.key for p in partitions if p.topic in fresh), spec.source.starting
            )
    return backlog_of(
        spec.name,
        spec.source,
        partitions,
        committed,
        start_offsets=start_offsets,
        epoch_in_flight=None if in_flight is None else in_flight.number,
    )


@dataclass(frozen=True)
class Announced:
    """The last announcement: the state it was about and when (a monotonic clock's seconds)."""

    state: BacklogState
    at: float


def should_announce(backlog: Backlog, last: Announced | None, now: float, repeat_s: float) -> bool:
    """Whether to announce new records now.

    * Nothing beyond the committed position (and every topic started): no.
    * A state not announced before (new records arrived, or an epoch committed and records remain): yes.
      While a run is active its plan does not change the state (only a commit does), so the run is
      not announced again for its own records.
    * The same state, ``repeat_s`` after the last announcement and with no epoch in flight: yes again,
      so that records left behind by an aborted run, or an announcement lost on the way, start a run.
    """
    if not backlog.has_work:
        return False
    if last is None or last.state != backlog.state:
        return True
    return backlog.epoch_in_flight is None and now - last.at >= repeat_s


def describe(backlog: Backlog) -> str:
    """One line for a log: how many offsets are new, and where."""
    shown = [p for p in backlog.partitions if p.lag]
    where = ", ".join(f"{p.topic}[{p.partition}] {p.position}..{p.stable}" for p in shown) or "none"
    unstarted = f"; topics without a position: {', '.join(backlog.unstarted)}" if backlog.unstarted else ""
    return f"pipeline {backlog.pipeline!r}: {backlog.records} new offsets ({where}){unstarted}"
