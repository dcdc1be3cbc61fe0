"""What the plan step computes: ranges, slices and read tasks, participants and their committers, and the
checks made before planning.

Pure functions of the spec and the ranges (so every process agrees on the same slices and tasks), the
read of Kafka's offsets that bounds an epoch, and the plan-time checks that refuse a spec whose sinks
would certainly fail or weaken its guarantee later. The coordinator (`onceflow.protocol.coordinator`) runs
them and writes the plan to the ledger; the slice drivers use the same slices.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any

from onceflow.config import Settings
from onceflow.errors import ConfigError
from onceflow.ledger import Epoch, EpochStatus, Ledger
from onceflow.offsets import OffsetRange
from onceflow.pipeline import OP_COLUMN, STATE_SINK, AvroFormat, JsonFormat, Pipeline, SinkSpec
from onceflow.protocol.step_results import PlanResult, PlanStatus
from onceflow.sinks.base import SinkCommitter
from onceflow.sinks.registry import known_kinds, sink_kind
from onceflow.sources.kafka_planning import EpochPlan, SlicePlan, assign_slices
from onceflow.state.store import state_sink


def next_ranges(
    spec: Pipeline,
    ledger: Ledger,
    settings: Settings,
    *,
    data_interval: tuple[datetime, datetime] | None = None,
    max_records_per_partition: int | None = None,
) -> EpochPlan:
    """The ranges the next epoch reads: from the committed positions to Kafka's stable offsets, bounded
    by the data interval's end and the per-partition limit."""
    from onceflow.sources.errors import TopicNotFound
    from onceflow.sources.kafka_metadata import KafkaMetadata

    interval_end_ms = int(data_interval[1].timestamp() * 1000) if data_interval else None
    limit = max_records_per_partition or spec.max_records_per_partition
    transactions = transaction_topic(spec)
    with KafkaMetadata(settings.kafka_bootstrap) as metadata:
        if transactions is None:
            return metadata.plan(
                spec.source,
                ledger.committed_offsets(spec.name),
                max_records_per_partition=limit,
                interval_end_ms=interval_end_ms,
            )
        try:
            metadata.partitions((transactions,))
            topics = (*spec.source.topics, transactions)
        except TopicNotFound:  # Debezium creates it with the first transaction after its snapshot
            topics = spec.source.topics
        whole = metadata.plan(
            replace(spec.source, topics=topics),
            ledger.committed_offsets(spec.name),
            max_records_per_partition=_UNLIMITED,
            interval_end_ms=interval_end_ms,
        )
        # Read after the change topics' offsets: every change the plan reads has its BEGIN in here.
        stable = None
        if transactions in topics:
            stable = max((p.stable for p in metadata.partitions((transactions,))), default=0)
        return _cut(spec, settings, whole, transactions, stable, limit)


_UNLIMITED = 2**62


def transaction_topic(spec: Pipeline) -> str | None:
    """Debezium's transaction topic when the spec asks for epochs cut between source transactions."""
    changes = getattr(spec.format, "changes", None)
    return changes.transactions if changes is not None else None


def _cut(
    spec: Pipeline, settings: Settings, whole: EpochPlan, topic: str, stable: int | None, limit: int
) -> EpochPlan:
    from onceflow.decoding.avro_records import registry_for
    from onceflow.decoding.debezium_transactions import AvroDocuments, json_document
    from onceflow.protocol.transaction_cuts import cut_at_transactions
    from onceflow.sources.kafka_range import read_range

    if isinstance(spec.format, AvroFormat):
        registry = registry_for(settings.schema_registry_url, settings.schema_registry_allow_insecure_auth)
        if registry is None:
            raise ConfigError(
                "an Avro change stream needs the schema registry: set ONCEFLOW_SCHEMA_REGISTRY_URL"
            )
        document: Callable[[bytes], Any] = AvroDocuments(registry)
    else:
        document = json_document
    done = cut_at_transactions(
        whole,
        transaction_topic=topic,
        transaction_until=stable,
        read=lambda r: read_range(settings.kafka_bootstrap, r),
        document=document,
        limit=limit,
    )
    return replace(done.plan, notes=done.lines)


def slices_of(spec: Pipeline, ranges: tuple[OffsetRange, ...]) -> tuple[SlicePlan, ...]:
    """Slices and read tasks of an epoch; a pure function of its ranges, so every process agrees. The
    transaction topic of a change stream is one of the ranges (its position moves with the epoch's),
    read by the plan only: no slice reads it."""
    transactions = transaction_topic(spec)
    read = ranges if transactions is None else tuple(r for r in ranges if r.topic != transactions)
    return assign_slices(read, spec.slices, spec.max_records_per_task)


def participant_sinks(spec: Pipeline, settings: Settings) -> tuple[SinkSpec, ...]:
    """The user's sinks plus, for a stateful pipeline, the internal sink of its state snapshot."""
    state = state_sink(spec, settings)
    return spec.sinks if state is None else (*spec.sinks, state)


def committers_for(spec: Pipeline, settings: Settings) -> dict[str, SinkCommitter]:
    """A committer per participant sink of the pipeline (its sinks, plus its keyed state's)."""
    committers = {}
    for sink in participant_sinks(spec, settings):
        kind = sink_kind(sink.kind)
        committers[sink.name] = kind.build_committer(kind.config_for(sink, settings))
    return committers


def expected_participants(spec: Pipeline, slices: tuple[SlicePlan, ...]) -> list[tuple[str, str]]:
    """Every (sink, task) pair that must pre-commit before the epoch may be decided."""
    if spec.commits_before_processing:
        return []  # nothing to wait for: the epoch is committed when it is planned
    names = [sink.name for sink in spec.sinks] + ([STATE_SINK] if spec.state is not None else [])
    return [(name, task.task_id) for s in slices for task in s.tasks for name in names]


def describe_slices(plan: EpochPlan, slices: tuple[SlicePlan, ...]) -> list[str]:
    """One line per slice (its read tasks and ranges), then what was skipped or left for later."""
    lines = []
    for s in slices:
        ranges = ", ".join(str(r) for r in s.ranges if not r.is_empty) or "nothing to read"
        lines.append(f"  slice {s.slice}: {len(s.tasks)} read tasks; {ranges}")
    if plan.skipped:
        lines.append(f"  skipped (deleted by retention): {', '.join(str(s) for s in plan.skipped)}")
    if plan.backlog:
        lines.append(f"  left for later epochs: {plan.backlog} offsets")
    return lines


def planned_lines(
    epoch: Epoch,
    plan: EpochPlan,
    slices: tuple[SlicePlan, ...],
    owner: str,
    data_interval: tuple[datetime, datetime] | None,
) -> list[str]:
    """What ``plan`` says of the epoch it recorded: its span, participants and owner, then its slices."""
    interval = (
        f", data interval {data_interval[0].isoformat()} .. {data_interval[1].isoformat()}"
        if data_interval
        else ""
    )
    lines = [
        f"{epoch}: {plan.span} offsets in {len(plan.ranges)} partitions, {len(epoch.expected)} "
        f"participants, owner {owner}{interval}",
        *describe_slices(plan, slices),
    ]
    if data_interval is not None and plan.is_empty:
        lines.append(
            "  nothing new up to the interval's end (a later interval's epoch may have read it already)"
        )
    return lines


def plan_result(
    spec: Pipeline, status: PlanStatus, epoch: Epoch, lines: list[str], backlog: int = 0
) -> PlanResult:
    """The plan step's result for ``epoch``: the slices that have read tasks, for the process tasks."""
    slices = slices_of(spec, epoch.ranges)
    return PlanResult(
        status=status,
        pipeline=spec.name,
        epoch=epoch.number,
        attempt_token=epoch.attempt_token,
        slices_with_tasks=tuple(s.slice for s in slices if s.tasks),
        lines=tuple(lines),
        span=sum(r.span for r in epoch.ranges),
        backlog=backlog,
    )


def check_guarantee(spec: Pipeline) -> None:
    """Refuse a pipeline whose sinks cannot give the guarantee it declares.

    ``exactly_once`` needs every sink to be transactional or idempotent; ``at_least_once`` accepts the
    write-ahead-log and plain sinks too (same protocol: offsets advance only with a committed epoch).
    ``at_most_once`` commits the offsets before processing, so its sinks must write directly: a staged
    sink would wait for a commit that has already happened.
    """
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


def check_rerun(spec: Pipeline) -> None:
    """Refuse ``on_rerun="replace"`` unless every sink's kind can take an interval's earlier output back
    atomically: an append-only sink would deliver the interval twice."""
    if spec.on_rerun != "replace":
        return
    replaceable = [k for k in known_kinds() if sink_kind(k).replaceable]
    append_only = [f"{s.name} ({s.kind})" for s in spec.sinks if not sink_kind(s.kind).replaceable]
    if append_only:
        raise ConfigError(
            f"on_rerun='replace': sinks {append_only} are append-only: they cannot take an interval's "
            "earlier output back, so replacing it would deliver it twice (only "
            f"{' and '.join(replaceable)} sinks replace atomically)"
        )


def check_changes(spec: Pipeline) -> None:
    """A change stream's rows are changes, not records: a sink that narrows them to columns without
    their op would store a delete as a row of its key and nulls. A sink applies them by key
    (`postgres_changes`, whose rows keep the op) or keeps them as a log, with the op."""
    fmt = spec.format
    if not isinstance(fmt, JsonFormat | AvroFormat) or fmt.changes is None:
        return
    if fmt.changes.transactions in spec.source.topics:
        raise ConfigError(
            f"topic {fmt.changes.transactions!r} is the change stream's transaction topic "
            "(format.changes.transactions): the plan reads it, the source must not list it"
        )
    if spec.transform is not None:
        return
    for sink in spec.sinks:
        columns = sink_kind(sink.kind).columns(sink.config)
        if columns is not None and OP_COLUMN not in columns:
            raise ConfigError(
                f"sink {sink.name!r} ({sink.kind}) would take the change events' rows without their op, and "
                f"store a delete as a row of its key and nulls: add {OP_COLUMN!r} to its columns to keep "
                "the changes as a log, or apply them by key (postgres_changes, iceberg_changes, or "
                "postgres_upsert with changes=true)"
            )


def run_plan_checks(
    spec: Pipeline, settings: Settings, parallel_tasks: int | None = None, *, apply: bool = True
) -> None:
    """Every check made before an epoch is planned: the guarantee, the transform importable, then each
    sink kind's own checks, given the configs of all the pipeline's sinks of that kind and how many tasks
    of one epoch write to each (``parallel_tasks``: the epoch's read tasks once its ranges are known).
    ``apply``: the sinks also make what the epoch needs (tables, new columns); a preview only checks."""
    check_guarantee(spec)
    check_rerun(spec)
    check_changes(spec)
    if spec.transform is not None:
        spec.load_transform()  # a transform that cannot be imported fails now, not inside Spark
    parallel = max(spec.slices, 1) if parallel_tasks is None else parallel_tasks
    by_kind: dict[str, list[SinkSpec]] = {}
    for sink in spec.sinks:
        by_kind.setdefault(sink.kind, []).append(sink)
    for name, sinks in sorted(by_kind.items()):
        kind = sink_kind(name)
        kind.plan_checks(spec, [kind.config_for(sink, settings) for sink in sinks], parallel, apply)


def replaced_epochs(spec: Pipeline, ledger: Ledger, epoch: Epoch) -> tuple[int, ...]:
    """The committed epochs whose output ``epoch`` replaces: earlier ones of its data interval."""
    if spec.on_rerun != "replace" or epoch.data_interval_start is None or epoch.data_interval_end is None:
        return ()
    same = ledger.find_by_interval(spec.name, epoch.data_interval_start, epoch.data_interval_end)
    return tuple(e.number for e in same if e.number < epoch.number and e.status is EpochStatus.COMMITTED)
