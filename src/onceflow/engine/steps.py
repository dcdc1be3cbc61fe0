"""The steps of one epoch as plain functions: what each DAG task, the runner and the CLI call.

One DAG run is one epoch, and a DAG run can be re-run (a cleared task, a retry, a backfill over an
interval that already ran). Every step is therefore idempotent and asks the ledger first:

* ``plan`` reuses the epoch its own run planned, and plans nothing when its run or its data interval
  already committed an epoch (re-running a committed interval is a no-op that says so);
* ``commit`` of a committed epoch changes nothing; of a decided one it finishes the commit;
* ``abort`` rolls back an undecided epoch and refuses (`StepRefused`) to touch a decided one.

No Airflow import here: the Airflow operators in ``plugins/`` are thin wrappers over these functions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from onceflow.config import Settings
from onceflow.engine.planning import plan_epoch, plan_replacement, slices_of
from onceflow.engine.sinks import committers_for
from onceflow.errors import OnceflowError
from onceflow.ledger import Epoch, EpochStatus, Ledger, RecoveryReport
from onceflow.pipeline import Pipeline
from onceflow.sources.kafka_metadata import KafkaMetadata
from onceflow.sources.kafka_planning import EpochPlan, SlicePlan

Log = Callable[[str], None]
PlanStatus = Literal["planned", "dry_run", "already_committed"]


class StepRefused(OnceflowError):
    """The ledger's invariants forbid what a step was asked to do; nothing was changed."""


def _quiet(_: str) -> None:
    return None


@dataclass(frozen=True)
class PlanResult:
    """What ``plan`` decided, small enough for an Airflow XCom (see `to_dict`)."""

    status: PlanStatus
    pipeline: str
    epoch: int | None = None
    attempt_token: str | None = None
    slices_with_tasks: tuple[int, ...] = ()
    lines: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "pipeline": self.pipeline,
            "epoch": self.epoch,
            "attempt_token": self.attempt_token,
            "slices_with_tasks": list(self.slices_with_tasks),
            "lines": list(self.lines),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PlanResult:
        return cls(
            status=data["status"],
            pipeline=data["pipeline"],
            epoch=data.get("epoch"),
            attempt_token=data.get("attempt_token"),
            slices_with_tasks=tuple(data.get("slices_with_tasks", ())),
            lines=tuple(data.get("lines", ())),
        )


def describe_slices(plan: EpochPlan, slices: tuple[SlicePlan, ...]) -> list[str]:
    lines = []
    for s in slices:
        ranges = ", ".join(str(r) for r in s.ranges if not r.is_empty) or "nothing to read"
        lines.append(f"  slice {s.slice}: {len(s.tasks)} read tasks; {ranges}")
    if plan.skipped:
        lines.append(f"  skipped (deleted by retention): {', '.join(str(s) for s in plan.skipped)}")
    if plan.backlog:
        lines.append(f"  left for later epochs: {plan.backlog} offsets")
    return lines


def run_epoch_of(ledger: Ledger, pipeline: str, run_id: str) -> Epoch | None:
    """The latest epoch planned by the orchestrator run ``run_id`` (a re-planned run has several)."""
    mine = [e for e in ledger.epochs(pipeline) if e.run_id == run_id]
    return mine[-1] if mine else None


def committed_for_interval(
    ledger: Ledger, pipeline: str, data_interval: tuple[datetime, datetime]
) -> Epoch | None:
    """The committed epoch of exactly this data interval, if there is one."""
    found = [
        e
        for e in ledger.find_by_interval(pipeline, *data_interval)
        if e.status in (EpochStatus.COMMITTED, EpochStatus.COMMITTING)
    ]
    return found[-1] if found else None


def recover(spec: Pipeline, settings: Settings, log: Log = _quiet) -> RecoveryReport:
    """Finish a decided epoch, roll back an undecided one, sweep orphans (safe to run any time)."""
    with Ledger.connect(settings.ledger_url) as ledger:
        report = ledger.recover(spec.name, committers_for(spec))
    log(report.summary())
    return report


def preview(
    spec: Pipeline,
    ledger: Ledger,
    settings: Settings,
    *,
    data_interval: tuple[datetime, datetime] | None = None,
    max_records_per_partition: int | None = None,
) -> tuple[EpochPlan, tuple[SlicePlan, ...]]:
    """The ranges and slices the next epoch would get, without writing anything to the ledger."""
    committed = ledger.committed_offsets(spec.name)
    interval_end_ms = int(data_interval[1].timestamp() * 1000) if data_interval else None
    with KafkaMetadata(settings.kafka_bootstrap) as metadata:
        plan = metadata.plan(
            spec.source,
            committed,
            max_records_per_partition=max_records_per_partition or spec.max_records_per_partition,
            interval_end_ms=interval_end_ms,
        )
    return plan, slices_of(spec, plan.ranges)


def _result(status: PlanStatus, epoch: Epoch, spec: Pipeline, lines: list[str]) -> PlanResult:
    slices = slices_of(spec, epoch.ranges)
    return PlanResult(
        status=status,
        pipeline=spec.name,
        epoch=epoch.number,
        attempt_token=epoch.attempt_token,
        slices_with_tasks=tuple(s.slice for s in slices if s.tasks),
        lines=tuple(lines),
    )


def plan(
    spec: Pipeline,
    settings: Settings,
    *,
    run_id: str,
    data_interval: tuple[datetime, datetime] | None = None,
    max_records_per_partition: int | None = None,
    dry_run: bool = False,
    log: Log = _quiet,
) -> PlanResult:
    """Plan this run's epoch, or find why there is nothing to plan.

    1. This run already planned an epoch: reuse it while it is undecided or decided, do nothing if it
       committed (the run was re-run).
    2. The data interval already has a committed epoch (another run of the same interval): no-op.
    3. Dry run: print the ranges the epoch would read; the ledger is not touched.
    4. Otherwise plan the next epoch (ranges bounded by the interval's end, if any) in the ledger.
    """
    with Ledger.connect(settings.ledger_url) as ledger:
        # 1.
        own = run_epoch_of(ledger, spec.name, run_id)
        if own is not None and own.status is EpochStatus.COMMITTED and _replaceable(spec, own):
            return _replace(spec, ledger, own, run_id, log)
        if own is not None and own.status is EpochStatus.COMMITTED:
            line = f"{own} was committed by this run already: nothing to do"
            log(line)
            return _result("already_committed", own, spec, [line])
        if own is not None and own.status in (EpochStatus.PLANNED, EpochStatus.COMMITTING):
            line = f"{own} was planned by this run already: processing it again (idempotent)"
            log(line)
            return _result("planned", own, spec, [line])
        # 2.
        if data_interval is not None:
            done = committed_for_interval(ledger, spec.name, data_interval)
            if done is not None and _replaceable(spec, done):
                return _replace(spec, ledger, done, run_id, log)
            if done is not None:
                line = (
                    f"data interval {data_interval[0].isoformat()} .. {data_interval[1].isoformat()} was "
                    f"already processed by {done} (run {done.run_id}): nothing to do; each interval is "
                    "processed exactly once"
                )
                log(line)
                return _result("already_committed", done, spec, [line])
        # 3.
        if dry_run:
            epoch_plan, slices = preview(
                spec,
                ledger,
                settings,
                data_interval=data_interval,
                max_records_per_partition=max_records_per_partition,
            )
            lines = [
                f"dry run of {spec.name!r}: the next epoch would read {epoch_plan.span} offsets "
                f"in {len(epoch_plan.ranges)} partitions (nothing was written to the ledger)",
                *describe_slices(epoch_plan, slices),
            ]
            for line in lines:
                log(line)
            return PlanResult("dry_run", spec.name, lines=tuple(lines))
        # 4.
        planned = plan_epoch(
            spec,
            ledger,
            settings,
            run_id=run_id,
            data_interval=data_interval,
            max_records_per_partition=max_records_per_partition,
        )
        lines = [
            f"{planned.epoch}: {planned.plan.span} offsets in {len(planned.plan.ranges)} partitions, "
            f"{len(planned.epoch.expected)} participants"
            + (
                f", data interval {data_interval[0].isoformat()} .. {data_interval[1].isoformat()}"
                if data_interval
                else ""
            ),
            *describe_slices(planned.plan, planned.slices),
        ]
        if data_interval is not None and planned.plan.is_empty:
            lines.append(
                "  nothing new up to the interval's end (a later interval's epoch may have read it already)"
            )
        for line in lines:
            log(line)
        return _result("planned", planned.epoch, spec, lines)


def _replaceable(spec: Pipeline, epoch: Epoch) -> bool:
    return spec.on_rerun == "replace" and epoch.data_interval_start is not None


def _replace(spec: Pipeline, ledger: Ledger, done: Epoch, run_id: str, log: Log) -> PlanResult:
    """on_rerun="replace": plan the interval's ranges again; its output will replace ``done``'s."""
    planned = plan_replacement(spec, ledger, done, run_id=run_id)
    line = (
        f"{planned.epoch}: re-runs data interval {done.data_interval_start} .. {done.data_interval_end} "
        f"over the ranges of {done}, and will replace its output when it commits (on_rerun='replace')"
    )
    log(line)
    return _result("planned", planned.epoch, spec, [line, *describe_slices(planned.plan, planned.slices)])


def _target(ledger: Ledger, spec: Pipeline, run_id: str | None, epoch: int | None) -> Epoch | None:
    if epoch is not None:
        return ledger.epoch(spec.name, epoch)
    if run_id is None:
        raise ValueError("name the epoch or the run that planned it")
    return run_epoch_of(ledger, spec.name, run_id)


def commit(
    spec: Pipeline,
    settings: Settings,
    *,
    run_id: str | None = None,
    epoch: int | None = None,
    log: Log = _quiet,
) -> Epoch | None:
    """Coordinator: decide and commit the epoch (of ``run_id``, or number ``epoch``); idempotent.

    A committed epoch is left as it is; a decided one is finished (e.g. after a sink outage); an
    undecided one is decided when every participant pre-committed; an aborted one is refused.
    """
    with Ledger.connect(settings.ledger_url) as ledger:
        target = _target(ledger, spec, run_id, epoch)
        if target is None:
            log(f"run {run_id} planned no epoch of {spec.name!r}: nothing to commit")
            return None
        if target.status is EpochStatus.COMMITTED:
            log(f"{target} is already committed (at {target.finished_at}): nothing changed")
            return target
        if target.status in (EpochStatus.ABORTING, EpochStatus.ABORTED):
            raise StepRefused(
                f"commit refused: {target} was aborted (reason: {target.abort_reason}); its range is "
                "replayed by the next epoch"
            )
        if target.status is EpochStatus.COMMITTING:
            log(f"{target}: the decision to commit is durable; committing the remaining participants")
        done = ledger.commit_epoch(spec.name, target.number, committers_for(spec))
    log(f"{done}: every participant committed")
    return done


def abort(
    spec: Pipeline,
    settings: Settings,
    *,
    reason: str,
    run_id: str | None = None,
    epoch: int | None = None,
    log: Log = _quiet,
) -> Epoch | None:
    """Roll back the undecided epoch (of ``run_id``, or number ``epoch``); refuse a decided one."""
    with Ledger.connect(settings.ledger_url) as ledger:
        target = _target(ledger, spec, run_id, epoch)
        if target is None:
            log(f"run {run_id} planned no epoch of {spec.name!r}: nothing to abort")
            return None
        if target.status is EpochStatus.ABORTED:
            log(f"{target} is already aborted (reason: {target.abort_reason}): nothing changed")
            return target
        if spec.commits_before_processing and target.status is EpochStatus.COMMITTED:
            log(
                f"{target}: at_most_once committed its offsets before processing; nothing to roll back, and "
                "the records it did not deliver are not replayed"
            )
            return target
        if target.status in (EpochStatus.COMMITTING, EpochStatus.COMMITTED):
            raise StepRefused(
                f"abort refused: {target} is decided; the only outcome of a decided epoch is COMMITTED, "
                "so nothing was rolled back"
                + (
                    f" (finish it by clearing `commit` or `onceflow commit {spec.name} {target.number}`)"
                    if target.status is EpochStatus.COMMITTING
                    else ""
                )
            )
        done = ledger.abort_epoch(spec.name, target.number, committers_for(spec), reason=reason)
    log(f"{done}: rolled back; its ranges are replayed by the next epoch")
    return done


def report(spec: Pipeline, settings: Settings, *, run_id: str, log: Log = _quiet) -> list[str]:
    """The run's epoch in a few lines: status, ranges, records per sink, dead letters."""
    with Ledger.connect(settings.ledger_url) as ledger:
        epoch = run_epoch_of(ledger, spec.name, run_id)
        if epoch is None:
            lines = [f"run {run_id} planned no epoch of {spec.name!r}"]
        else:
            per_sink: dict[str, int] = {}
            for p in ledger.participants(spec.name, epoch.number):
                per_sink[p.sink] = per_sink.get(p.sink, 0) + p.record_count
            letters = ledger.dead_letters(spec.name, epoch=epoch.number, include_uncommitted=True)
            lines = [
                f"{epoch}",
                "  input: " + (", ".join(str(r) for r in epoch.ranges if not r.is_empty) or "nothing new"),
                *(f"  sink {sink}: {count} records" for sink, count in sorted(per_sink.items())),
                f"  dead letters: {len(letters)}",
            ]
    for line in lines:
        log(line)
    return lines
