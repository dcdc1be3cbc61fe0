"""An epoch's figures as named metrics, for whatever metrics system the orchestrator has.

Names are ``onceflow.<pipeline>.<what>`` (the pipeline in the name, since plain StatsD has no tags) and
each metric also carries the tag ``pipeline``, for backends that have tags (StatsD with InfluxDB tags,
OpenTelemetry). The figures come from the ledger, the one record of what an epoch did, so they are the
same whichever door ran the epoch; the Airflow operators send them (`onceflow_airflow.metrics`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from onceflow.ledger import Epoch, EpochStatus, Ledger
from onceflow.monitoring.new_records import Backlog

Kind = Literal["count", "gauge", "timing_ms"]
# The steps whose wall time is measured, as the DAG names its tasks.
STEPS = ("recover", "plan", "process", "commit", "abort")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True)
class Metric:
    name: str
    kind: Kind
    value: float
    tags: dict[str, str] = field(default_factory=dict)


def _part(text: str) -> str:
    """One dot-separated part of a name: characters StatsD names allow, and no dot of its own."""
    return _UNSAFE.sub("_", text)


def metric_name(pipeline: str, *parts: str) -> str:
    return ".".join(["onceflow", _part(pipeline), *(_part(p) for p in parts)])


def step_metric(pipeline: str, step: str, seconds: float, **tags: str) -> Metric:
    """The wall time of one step of an epoch (a DAG task), ``onceflow.<pipeline>.<step>.duration``."""
    if step not in STEPS:
        raise ValueError(f"step {step!r}: expected one of {STEPS}")
    return Metric(
        metric_name(pipeline, step, "duration"),
        "timing_ms",
        seconds * 1000.0,
        {"pipeline": pipeline, "step": step, **tags},
    )


def epoch_metrics(ledger: Ledger, epoch: Epoch) -> list[Metric]:
    """What a finished epoch did: one count of ``epochs.committed`` or ``epochs.aborted``; for a
    committed one also the offsets it read, the rows each sink took, its dead letters and its duration
    from plan to the end of the commit."""
    pipeline = epoch.pipeline
    tags = {"pipeline": pipeline}
    if epoch.status not in (EpochStatus.COMMITTED, EpochStatus.ABORTED):
        raise ValueError(f"{epoch} is not finished: no epoch metrics yet")
    outcome = "committed" if epoch.status is EpochStatus.COMMITTED else "aborted"
    metrics = [Metric(metric_name(pipeline, "epochs", outcome), "count", 1, tags)]
    if epoch.status is EpochStatus.ABORTED:
        return metrics
    rows: dict[str, int] = {}
    for p in ledger.participants(pipeline, epoch.number):
        rows[p.sink] = rows.get(p.sink, 0) + p.record_count
    letters = ledger.dead_letter_count(pipeline, epoch=epoch.number)  # counted in SQL, not loaded
    metrics += [
        Metric(metric_name(pipeline, "offsets"), "count", sum(r.span for r in epoch.ranges), tags),
        Metric(metric_name(pipeline, "dead_letters"), "count", letters, tags),
        *(
            Metric(metric_name(pipeline, "rows", sink), "count", count, {**tags, "sink": sink})
            for sink, count in sorted(rows.items())
        ),
    ]
    if epoch.finished_at is not None:
        seconds = (epoch.finished_at - epoch.planned_at).total_seconds()
        metrics.append(
            Metric(metric_name(pipeline, "epoch", "duration"), "timing_ms", seconds * 1000.0, tags)
        )
    return metrics


def lag_metrics(backlog: Backlog) -> list[Metric]:
    """Offsets beyond the committed position: ``onceflow.<pipeline>.lag`` in all and
    ``onceflow.<pipeline>.lag.<topic>.<partition>`` per partition (gauges)."""
    pipeline = backlog.pipeline
    tags = {"pipeline": pipeline}
    return [
        Metric(metric_name(pipeline, "lag"), "gauge", backlog.records, tags),
        *(
            Metric(
                metric_name(pipeline, "lag", p.topic, str(p.partition)),
                "gauge",
                p.lag,
                {**tags, "topic": p.topic, "partition": str(p.partition)},
            )
            for p in backlog.partitions
        ),
    ]
