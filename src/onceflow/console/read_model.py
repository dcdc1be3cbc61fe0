"""The console's read model: a pipeline's epochs, what is in doubt, its dead letters and its lag.

Every function returns plain dicts of JSON types, so the same data serves ``onceflow epochs --json``,
the console's API and its page. Ages are seconds before ``now`` (passed in, so a page shows one instant
and tests need no clock).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from onceflow import redact
from onceflow.errors import OnceflowError
from onceflow.monitoring import dead_letters

if TYPE_CHECKING:
    from onceflow.ledger import Epoch, Ledger, Participant
    from onceflow.pipeline import Pipeline

Partition = tuple[str, int]
DEAD_LETTER_LIMIT = 200

# What an operator may do about an epoch in flight, by its status (the invariants of docs/architecture.md).
NEXT_STEP = {
    "PLANNED": "undecided: commit once every participant pre-committed, or abort (its ranges are replayed)",
    "COMMITTING": "decided: the only outcome is COMMITTED; commit (or recover) finishes it, abort is refused",
    "ABORTING": "abort begun: abort (or recover) finishes it, commit is refused",
}


def iso_time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat(timespec="seconds")


def age_s(since: datetime | None, now: datetime) -> float | None:
    """Seconds from ``since`` to ``now``, rounded to 0.1 s (None when there is no ``since``)."""
    return None if since is None else round((now - since).total_seconds(), 1)


def epoch_dict(
    ledger: Ledger, epoch: Epoch, participants: Sequence[Participant] | None = None
) -> dict[str, Any]:
    """An epoch as ``onceflow epochs --json`` prints it: status, run, ranges, participants, times."""
    if participants is None:
        participants = ledger.participants(epoch.pipeline, epoch.number)
    return {
        "epoch": epoch.number,
        "status": str(epoch.status),
        "run_id": epoch.run_id,
        "ranges": [
            {"topic": r.topic, "partition": r.partition, "from": r.from_offset, "until": r.until_offset}
            for r in epoch.ranges
        ],
        "expected_participants": len(epoch.expected),
        "participants": [
            {
                "sink": p.sink,
                "task": p.task,
                "attempt": p.attempt,
                "status": str(p.status),
                "records": p.record_count,
                "staged": p.staged_location,
            }
            for p in participants
        ],
        "data_interval": [iso_time(epoch.data_interval_start), iso_time(epoch.data_interval_end)],
        "planned_at": iso_time(epoch.planned_at),
        "decided_at": iso_time(epoch.decided_at),
        "finished_at": iso_time(epoch.finished_at),
        "abort_reason": epoch.abort_reason,
    }


def epoch_view(ledger: Ledger, epoch: Epoch, now: datetime) -> dict[str, Any]:
    """`epoch_dict` plus what the console adds: owner, lease, age, and each participant's age."""
    participants = ledger.participants(epoch.pipeline, epoch.number)
    view = epoch_dict(ledger, epoch, participants)
    for shown, p in zip(view["participants"], participants, strict=True):
        shown["slice"] = p.slice
        shown["precommitted_at"] = iso_time(p.precommitted_at)
        shown["age_s"] = age_s(p.precommitted_at, now) if p.finished_at is None else None
    view.update(
        owner=epoch.owner,
        lease_expires_at=iso_time(epoch.lease_expires_at),
        records=sum(r.until_offset - r.from_offset for r in epoch.ranges),
        age_s=None if epoch.is_final else age_s(epoch.planned_at, now),
    )
    return view


def epochs_view(
    ledger: Ledger, pipeline: str, now: datetime, *, last: int | None = 20
) -> list[dict[str, Any]]:
    """The pipeline's last epochs, newest first."""
    return [epoch_view(ledger, e, now) for e in reversed(ledger.epochs(pipeline, last=last))]


def epoch_of_run(ledger: Ledger, pipeline: str, run_id: str, now: datetime) -> dict[str, Any] | None:
    """The epoch an orchestrator run planned (its latest, if it planned more than one) with the number of
    its dead letters (also before it commits, as the run's report counts them), or None."""
    epoch = ledger.epoch_of_run(pipeline, run_id)
    if epoch is None:
        return None
    view = epoch_view(ledger, epoch, now)
    view["dead_letters"] = ledger.dead_letter_count(pipeline, epoch=epoch.number, include_uncommitted=True)
    return view


def in_doubt(ledger: Ledger, pipeline: str, now: datetime) -> dict[str, Any] | None:
    """The epoch in flight (at most one: invariant 1) with how long it has been undecided or decided,
    and its participants still prepared (pre-committed, neither committed nor rolled back) with their
    ages; None when nothing is in flight."""
    epoch = ledger.open_epoch(pipeline)
    if epoch is None:
        return None
    participants = ledger.participants(pipeline, epoch.number)
    registered = {(p.sink, p.task) for p in participants}
    return {
        "epoch": epoch.number,
        "status": str(epoch.status),
        "run_id": epoch.run_id,
        "owner": epoch.owner,
        "lease_expires_at": iso_time(epoch.lease_expires_at),
        "planned_at": iso_time(epoch.planned_at),
        "age_s": age_s(epoch.planned_at, now),
        "decided_age_s": age_s(epoch.decided_at, now),
        "next_step": NEXT_STEP[str(epoch.status)],
        "prepared": [
            {
                "sink": p.sink,
                "task": p.task,
                "attempt": p.attempt,
                "records": p.record_count,
                "staged": p.staged_location,
                "age_s": age_s(p.precommitted_at, now),
            }
            for p in participants
            if p.finished_at is None and str(p.status) == "PRECOMMITTED"
        ],
        "missing": [f"{sink}/{task}" for sink, task in epoch.expected if (sink, task) not in registered],
    }


def dead_letter_view(
    ledger: Ledger,
    pipeline: str,
    *,
    epoch: int | None = None,
    code: str | None = None,
    text: str | None = None,
    limit: int = DEAD_LETTER_LIMIT,
    offset: int = 0,
) -> dict[str, Any]:
    """The pipeline's committed dead letters (as ``onceflow dead-letters`` lists them), filtered by
    epoch, reason code and a text found in the reason, the position or the start of the payload; newest
    epoch first, at most ``limit`` of them from ``offset`` on (``total`` counts every match). The ledger
    filters, counts and pages, and reads only the start of each payload: a list costs its page."""
    found = ledger.dead_letter_page(pipeline, epoch=epoch, code=code, text=text, limit=limit, offset=offset)
    shown = [
        {
            "epoch": d.epoch,
            "topic": d.topic,
            "partition": d.partition,
            "offset": d.offset,
            "code": d.code,
            "reason": d.reason,
            "value_preview": dead_letters.preview(d.value_prefix, size=d.value_size),
            "created_at": d.created_at.isoformat(timespec="seconds"),
            "key_preview": None
            if d.key_prefix is None
            else dead_letters.preview(d.key_prefix, size=d.key_size),
        }
        for d in found.letters
    ]
    return {"total": found.total, "shown": shown, "codes": found.codes}


def backlog(
    spec: Pipeline | None, committed: dict[Partition, int], bootstrap: str, timeout: float
) -> dict[Partition, tuple[int, int]]:
    """Each partition's next offset to read and its last stable offset, as the next plan would see them:
    every partition of the spec's topics, also those with nothing committed yet (or, without a spec,
    the partitions the ledger has positions for)."""
    from onceflow.pipeline import KafkaSource
    from onceflow.sources.kafka_metadata import KafkaMetadata

    topics = tuple(sorted({*(spec.source.topics if spec is not None else ()), *(t for t, _ in committed)}))
    source = replace(spec.source, topics=topics) if spec is not None else KafkaSource(topics=topics)
    with KafkaMetadata(bootstrap, timeout_s=timeout) as metadata:
        plan = metadata.plan(source, committed, max_records_per_partition=2**62)
    return {(r.topic, r.partition): (r.from_offset, r.until_offset) for r in plan.ranges}


def lag_view(
    ledger: Ledger, pipeline: str, spec: Pipeline | None, bootstrap: str, *, timeout: float = 3.0
) -> dict[str, Any]:
    """Per partition: the ledger's committed position, Kafka's last stable offset and the lag between
    them (offsets an epoch could still read). Kafka out of reach costs only the end and lag columns."""
    committed = ledger.committed_offsets(pipeline)
    kafka = "ok"
    ends: dict[Partition, tuple[int, int]] = {}
    if committed or spec is not None:
        try:
            ends = backlog(spec, committed, bootstrap, timeout)
        except OnceflowError as exc:
            kafka = f"lag unknown: {redact.text(exc)}"
    partitions = [
        {
            "topic": topic,
            "partition": part,
            "committed": committed.get((topic, part)),
            "end": ends[(topic, part)][1] if (topic, part) in ends else None,
            "lag": ends[(topic, part)][1] - ends[(topic, part)][0] if (topic, part) in ends else None,
        }
        for topic, part in sorted({*committed, *ends})
    ]
    known = [p["lag"] for p in partitions if p["lag"] is not None]
    return {"partitions": partitions, "total": sum(known) if known else None, "kafka": kafka}


def pipeline_names(ledger: Ledger, pipelines: Sequence[str]) -> list[str]:
    """Every pipeline the ledger has epochs of or ``pipelines`` (ONCEFLOW_PIPELINES) lists, sorted."""
    from onceflow.catalog import listed_pipelines

    return sorted({*ledger.pipelines(), *listed_pipelines(pipelines)})


def pipeline_view(
    ledger: Ledger,
    pipeline: str,
    now: datetime,
    *,
    bootstrap: str,
    pipelines: Sequence[str],
    last: int | None = 20,
    kafka_timeout: float = 3.0,
    dead_letter_filters: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything the console page shows of one pipeline (``pipelines``: ONCEFLOW_PIPELINES' specs; its
    dead letters filtered by ``dead_letter_filters``, `dead_letter_view`'s keywords)."""
    from onceflow.catalog import known_pipeline

    spec = known_pipeline(ledger, pipeline, pipelines)  # an unknown name is an error listing the known ones
    return {
        "pipeline": pipeline,
        "spec_known": spec is not None,
        "epochs": epochs_view(ledger, pipeline, now, last=last),
        "in_doubt": in_doubt(ledger, pipeline, now),
        "lag": lag_view(ledger, pipeline, spec, bootstrap, timeout=kafka_timeout),
        "dead_letters": dead_letter_view(ledger, pipeline, **(dead_letter_filters or {})),
        "now": iso_time(now),
    }
