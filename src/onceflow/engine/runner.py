"""Run epochs without Airflow (``onceflow run``): the DAG's steps chained in one process.

The same `Coordinator` steps the DAG's tasks call; the runner owns each epoch it plans and keeps the
owner's lease alive while its slices run, so a concurrent runner waits for it and ``onceflow recover``
never rolls it back.

Slices run on Spark through a long-lived Spark Connect server when the settings name one
(``spark_remote``; ``executor="connect"`` insists on it), through one spark-submit per slice otherwise
(``executor="submit"`` insists on that), or in this process without Spark (``executor="local"``); see
`onceflow.engine.executors`, which the DAG's process task asks too. Every way, a slice runs at most the
pipeline's ``transaction_timeout_s`` (`onceflow.engine.deadline`); past it the epoch is aborted.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial

from onceflow.config import Settings
from onceflow.engine.connect import connect_sessions, interrupt_slice, pipeline_modules, slice_tag
from onceflow.engine.deadline import watched, within
from onceflow.engine.executors import Executor, SliceRunner, slice_runner_for
from onceflow.engine.failures import cause_in_output, failure_line
from onceflow.engine.local_slice import check_local, run_slice_local
from onceflow.engine.slice_job import run_slice
from onceflow.engine.submit import SliceTimedOut, submit_slice
from onceflow.errors import OnceflowError
from onceflow.ledger import Epoch, Ledger
from onceflow.logs import Log, quiet
from onceflow.pipeline import Pipeline, load_pipeline
from onceflow.protocol.coordinator import Coordinator, EpochOwned
from onceflow.protocol.owners import owner_of_this_process
from onceflow.protocol.step_results import PlanResult, RecoveryReport


class ProcessFailed(OnceflowError):
    """A slice failed; the epoch was aborted and its ranges will be replayed."""


@dataclass(frozen=True)
class EpochOutcome:
    planned: PlanResult
    epoch: Epoch
    recovery: RecoveryReport
    seconds: float = 0.0
    executor: SliceRunner = "submit"
    # Wall time of each step in seconds: "plan" (with recover), "process" (every slice), "commit".
    steps: dict[str, float] = field(default_factory=dict)


def _plan_when_free(
    coordinator: Coordinator,
    *,
    run_id: str,
    data_interval: tuple[datetime, datetime] | None,
    max_records_per_partition: int | None,
    wait_s: float,
    log: Log,
) -> PlanResult:
    """Plan, waiting while another live runner owns the epoch in flight (at most ``wait_s``)."""
    deadline = time.monotonic() + wait_s
    said = False
    while True:
        try:
            return coordinator.plan(
                run_id=run_id,
                owner=owner_of_this_process(run_id),
                data_interval=data_interval,
                max_records_per_partition=max_records_per_partition,
            )
        except EpochOwned as owned:
            if time.monotonic() >= deadline:
                raise
            if not said:
                log(str(owned))
                said = True
            time.sleep(0.5)
            coordinator.recover(by=f"runner {run_id}")  # finishes it if its owner died meanwhile


def run_epoch(
    pipeline_path: str,
    settings: Settings,
    *,
    data_interval: tuple[datetime, datetime] | None = None,
    max_records_per_partition: int | None = None,
    run_id: str | None = None,
    executor: Executor | None = None,
    spark_remote_url: str | None = None,
    wait_s: float | None = None,
    log: Log = quiet,
) -> EpochOutcome:
    """recover -> plan -> process every slice -> commit (or abort when a slice fails).

    1. Recover: finish or roll back what a crashed owner left (a live owner's epoch is kept).
    2. Plan this run's epoch, waiting for a live owner's epoch to finish first.
    3. Process each slice (on the Spark Connect server ``spark_remote_url``, default the settings'
       ``spark_remote``; with spark-submit; or, ``executor="local"``, in this process for pipelines
       without transform and state), keeping the lease alive meanwhile. ``executor`` defaults to the
       settings' ``executor``.
    4. Commit, or abort with the first slice failure's cause as the reason.
    """
    spec: Pipeline = load_pipeline(pipeline_path)
    runner, remote = slice_runner_for(settings, executor=executor, remote=spark_remote_url)
    if runner == "local":
        check_local(spec)
    run_id = run_id or f"runner__{uuid.uuid4().hex}"
    started = time.monotonic()
    with Ledger.connect(settings.ledger_url) as ledger:
        coordinator = Coordinator.for_pipeline(spec, ledger, settings, log=log)
        # 1.
        recovery = coordinator.recover(by=f"runner {run_id}")
        # 2.
        planned = _plan_when_free(
            coordinator,
            run_id=run_id,
            data_interval=data_interval,
            max_records_per_partition=max_records_per_partition,
            wait_s=settings.lease_s * 2 if wait_s is None else wait_s,
            log=log,
        )
        epoch = ledger.epoch(spec.name, planned.epoch) if planned.epoch is not None else None
        if epoch is None or planned.status != "planned":
            raise ProcessFailed(f"nothing was planned for {spec.name!r}: " + "; ".join(planned.lines))
        steps = {"plan": time.monotonic() - started}
        # 3.
        failures = []
        if runner == "connect":  # one warm session for every slice, the pipeline's modules bundled once
            assert remote is not None
            sessions = connect_sessions(remote, pipeline_modules(spec, pipeline_path), epoch.attempt_token)
        timeout_s, token = spec.transaction_timeout_s, epoch.attempt_token
        with coordinator.renewing_lease(epoch.number):
            for slice_number in planned.slices_with_tasks:
                what = f"slice {slice_number} of epoch {epoch.number}"
                if runner == "local":
                    local = partial(run_slice_local, spec, epoch.number, slice_number, token, settings)
                    try:
                        within(timeout_s, what, local)
                    except SliceTimedOut as exc:
                        failures.append(str(exc))
                    except Exception as exc:  # a sink's own error (a store out of reach) fails the slice too
                        failures.append(f"slice {slice_number} failed: {failure_line(exc)}")
                    continue
                if runner == "connect":
                    warm = partial(
                        run_slice, spec, epoch.number, slice_number, token, settings, session=sessions
                    )
                    tag = slice_tag(spec.name, epoch.number, slice_number, token)
                    try:
                        watched(timeout_s, what, warm, partial(interrupt_slice, tag))
                    except SliceTimedOut as exc:
                        failures.append(str(exc))
                    except Exception as exc:  # what a failed spark-submit reports by its exit status
                        failures.append(f"slice {slice_number} failed: {failure_line(exc)}")
                    continue
                try:
                    result = submit_slice(
                        pipeline_path,
                        epoch.number,
                        slice_number,
                        epoch.attempt_token,
                        settings,
                        timeout_s=spec.transaction_timeout_s,
                    )
                except SliceTimedOut as exc:
                    failures.append(str(exc))
                    continue
                if result.returncode != 0:
                    cause = cause_in_output(result.stdout + "\n" + result.stderr)
                    failures.append(f"slice {slice_number} exited {result.returncode}: {cause}")
        # 4.
        steps["process"] = time.monotonic() - started - steps["plan"]
        if failures:
            reason = f"process failed (run {run_id}): " + "; ".join(failures)
            coordinator.abort(number=epoch.number, reason=reason[:2000])
            raise ProcessFailed(f"{epoch} aborted: " + "\n".join(failures))
        done = coordinator.commit(number=epoch.number)
    assert done is not None
    seconds = time.monotonic() - started
    steps["commit"] = seconds - steps["plan"] - steps["process"]
    return EpochOutcome(planned, done, recovery, seconds, runner, steps)


def run_until(
    pipeline_path: str,
    settings: Settings,
    *,
    until_caught_up: bool = False,
    max_records_per_partition: int | None = None,
    executor: Executor | None = None,
    log: Log = quiet,
    progress: Log = quiet,
) -> list[EpochOutcome]:
    """One epoch, or epochs until one finds nothing new (``until_caught_up``), with a progress line
    per epoch: records, rate and the offsets left for later epochs."""
    outcomes = []
    while True:
        outcome = run_epoch(
            pipeline_path,
            settings,
            max_records_per_partition=max_records_per_partition,
            executor=executor,
            log=log,
        )
        outcomes.append(outcome)
        progress(epoch_line(outcome))
        if not until_caught_up or outcome.planned.span == 0 or outcome.planned.backlog == 0:
            return outcomes


def epoch_line(outcome: EpochOutcome) -> str:
    """One progress line per epoch: records, rate, where the time went and the offsets left for later
    epochs (``plan`` includes recover; ``process`` is every slice)."""
    records = outcome.planned.span
    rate = records / outcome.seconds if outcome.seconds > 0 else 0.0
    steps = " + ".join(f"{step} {seconds:.2f} s" for step, seconds in outcome.steps.items())
    return (
        f"{outcome.epoch}: {records} offsets in {outcome.seconds:.1f} s ({rate:,.0f}/s), "
        f"{steps or 'no steps timed'}, {outcome.planned.backlog} left"
    )
