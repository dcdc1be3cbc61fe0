"""Plan step: decide epoch n's exact input and participants, and write them to the ledger first.

Like Spark's offset log, the plan is durable before anything runs, so a crash anywhere after it is
recovered by reading the ledger: the same ranges are either committed once or replayed by a later epoch.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from onceflow.config import Settings
from onceflow.engine.sinks import sink_config
from onceflow.errors import ConfigError
from onceflow.faults import crash_point
from onceflow.ledger import Epoch, EpochStatus, Ledger
from onceflow.offsets import OffsetRange
from onceflow.pipeline import STATE_SINK, Pipeline
from onceflow.sources.kafka_metadata import KafkaMetadata
from onceflow.sources.kafka_planning import EpochPlan, SlicePlan, assign_slices


@dataclass(frozen=True)
class PlannedEpoch:
    epoch: Epoch
    plan: EpochPlan
    slices: tuple[SlicePlan, ...]

    def describe(self) -> list[str]:
        """Human-readable lines: the epoch and each slice's ranges and read tasks."""
        lines = [
            f"epoch {self.epoch.number} of {self.epoch.pipeline!r}: {self.plan.span} offsets in "
            f"{len(self.plan.ranges)} partitions, {len(self.epoch.expected)} participants"
        ]
        for s in self.slices:
            ranges = ", ".join(str(r) for r in s.ranges) or "no partitions"
            lines.append(f"  slice {s.slice}: {ranges}; {len(s.tasks)} read tasks")
        if self.plan.skipped:
            lines.append(f"  skipped (deleted by retention): {', '.join(str(s) for s in self.plan.skipped)}")
        if self.plan.backlog:
            lines.append(f"  left for later epochs: {self.plan.backlog} offsets")
        return lines


def slices_of(spec: Pipeline, ranges: tuple[OffsetRange, ...]) -> tuple[SlicePlan, ...]:
    """Slices and read tasks of an epoch; a pure function of its ranges, so every process agrees."""
    return assign_slices(ranges, spec.slices, spec.max_records_per_task)


def expected_participants(spec: Pipeline, slices: tuple[SlicePlan, ...]) -> list[tuple[str, str]]:
    """Every (sink, task) pair that must pre-commit before the epoch may be decided."""
    if spec.commits_before_processing:
        return []  # nothing to wait for: the epoch is committed when it is planned
    names = [sink.name for sink in spec.sinks] + ([STATE_SINK] if spec.state is not None else [])
    return [(name, task.task_id) for s in slices for task in s.tasks for name in names]


def check_timeouts(spec: Pipeline) -> None:
    """Refuse sink-side timeouts shorter than the pipeline's transaction timeout.

    If Kafka aborts a transaction while the epoch is still allowed to commit, the commit finds nothing to
    commit: that gap is how long outages turn into lost data. Staged files and prepared PostgreSQL
    transactions have no timeout of their own: only the sweeper removes them, and only for final epochs.
    """
    from onceflow.sinks.kafka import KafkaSinkConfig, check_transaction_timeout

    for sink in spec.sinks:
        if sink.kind == "kafka":
            try:
                check_transaction_timeout(
                    KafkaSinkConfig.from_mapping(sink_config(sink)), spec.transaction_timeout_s * 1000
                )
            except ConfigError as exc:
                raise ConfigError(
                    f"sink {sink.name!r}: {exc}; Kafka would abort a staged epoch that the pipeline may "
                    "still commit. Raise transaction_timeout_ms (up to the broker's "
                    "transaction.max.timeout.ms) or lower the pipeline's transaction_timeout_s"
                ) from exc


def check_guarantee(spec: Pipeline) -> None:
    """Refuse a pipeline whose sinks cannot give the guarantee it declares.

    ``exactly_once`` needs every sink to be transactional or idempotent; ``at_least_once`` accepts the
    write-ahead-log and plain sinks too (same protocol: offsets advance only with a committed epoch).
    ``at_most_once`` commits the offsets before processing, so its sinks must write directly: a staged
    sink would wait for a commit that has already happened.
    """
    from onceflow.sinks.registry import sink_kind

    if spec.commits_before_processing:
        staged = [s.name for s in spec.sinks if not sink_kind(s.kind).direct]
        if staged:
            raise ConfigError(
                f"pipeline {spec.name!r} declares at_most_once, but sinks {staged} stage their output until "
                "the epoch commits, and an at-most-once epoch commits before processing; use sinks that "
                "write directly (plain, postgres_upsert) or another guarantee"
            )
    if spec.guarantee == "exactly_once":
        weaker = [s.name for s in spec.sinks if sink_kind(s.kind).guarantee != "exactly_once"]
        if weaker:
            raise ConfigError(
                f"pipeline {spec.name!r} declares exactly_once, but sinks {weaker} only give at-least-once "
                "(they write before the epoch commits); declare guarantee='at_least_once' or use a "
                "two-phase or idempotent sink"
            )


def check_kafka_groups(spec: Pipeline) -> None:
    """Refuse two Kafka sinks of one pipeline that commit input offsets to the same consumer group.

    A Kafka sink's group position is its "already published" marker: sharing one, the second sink would
    find the position the first one committed, take its own epoch for published and drop it.
    """
    from onceflow.sinks.kafka import KafkaSinkConfig

    seen: dict[str, str] = {}
    for sink in spec.sinks:
        if sink.kind != "kafka":
            continue
        group = KafkaSinkConfig.from_mapping(sink_config(sink)).group_for(spec.name)
        if group in seen:
            raise ConfigError(
                f"sinks {seen[group]!r} and {sink.name!r} both commit input offsets to consumer group "
                f"{group!r}; that position marks an epoch as published, so each Kafka sink needs its own: "
                "set a distinct group_id in their configs"
            )
        seen[group] = sink.name


def plan_epoch(
    spec: Pipeline,
    ledger: Ledger,
    settings: Settings,
    *,
    run_id: str | None = None,
    data_interval: tuple[datetime, datetime] | None = None,
    max_records_per_partition: int | None = None,
) -> PlannedEpoch:
    """Plan the next epoch: Kafka positions -> ranges -> slices and tasks -> the ledger (durable)."""
    check_guarantee(spec)
    check_timeouts(spec)
    check_kafka_groups(spec)
    committed = ledger.committed_offsets(spec.name)
    limit = max_records_per_partition or spec.max_records_per_partition
    interval_end_ms = int(data_interval[1].timestamp() * 1000) if data_interval else None
    with KafkaMetadata(settings.kafka_bootstrap) as metadata:
        plan = metadata.plan(
            spec.source, committed, max_records_per_partition=limit, interval_end_ms=interval_end_ms
        )
    return _record(spec, ledger, plan, run_id, data_interval, None)


def _record(
    spec: Pipeline,
    ledger: Ledger,
    plan: EpochPlan,
    run_id: str | None,
    data_interval: tuple[datetime, datetime] | None,
    replaces: int | None,
) -> PlannedEpoch:
    """Write the plan, with its slices' participants, to the ledger: from here on it is durable."""
    slices = slices_of(spec, plan.ranges)
    epoch = ledger.plan_epoch(
        spec.name,
        plan.ranges,
        expected_participants(spec, slices),
        run_id=run_id,
        data_interval=data_interval,
        replaces=replaces,
    )
    if spec.commits_before_processing:
        epoch = ledger.commit_epoch(spec.name, epoch.number, {})  # at_most_once: the position moves now
    crash_point("after_plan")
    return PlannedEpoch(epoch, plan, slices)


def plan_replacement(
    spec: Pipeline, ledger: Ledger, replaced: Epoch, *, run_id: str | None = None
) -> PlannedEpoch:
    """Plan a re-run of a committed interval's epoch over exactly its ranges (``on_rerun="replace"``).

    Its sinks replace the replaced epoch's output when it commits (see `replaced_epochs`).
    """
    if spec.on_rerun != "replace":
        raise ConfigError(f"pipeline {spec.name!r} does not replace intervals (on_rerun={spec.on_rerun!r})")
    assert replaced.data_interval_start is not None and replaced.data_interval_end is not None
    interval = (replaced.data_interval_start, replaced.data_interval_end)
    return _record(spec, ledger, EpochPlan(replaced.ranges), run_id, interval, replaced.number)


def replaced_epochs(spec: Pipeline, ledger: Ledger, epoch: Epoch) -> tuple[int, ...]:
    """The committed epochs whose output ``epoch`` replaces: earlier ones of its data interval."""
    if spec.on_rerun != "replace" or epoch.data_interval_start is None or epoch.data_interval_end is None:
        return ()
    same = ledger.find_by_interval(spec.name, epoch.data_interval_start, epoch.data_interval_end)
    return tuple(e.number for e in same if e.number < epoch.number and e.status is EpochStatus.COMMITTED)
