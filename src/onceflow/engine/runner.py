"""Run whole epochs without Airflow: the same steps the DAG runs as tasks, chained in one process.

Used by tests, benchmarks and `onceflow run`; each step is the function the corresponding DAG task calls.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal, TypeAlias

from onceflow.config import Settings
from onceflow.engine import slice_job
from onceflow.engine.local_slice import check_local, run_slice_local
from onceflow.engine.planning import PlannedEpoch, plan_epoch
from onceflow.engine.sinks import committers_for
from onceflow.errors import OnceflowError
from onceflow.ledger import Epoch, Ledger, RecoveryReport
from onceflow.local_airflow import spark_environment
from onceflow.pipeline import Pipeline, load_pipeline

Executor: TypeAlias = Literal["spark", "local"]


class ProcessFailed(OnceflowError):
    """A slice's Spark job failed; the epoch was aborted and its ranges will be replayed."""


@dataclass(frozen=True)
class EpochOutcome:
    planned: PlannedEpoch
    epoch: Epoch
    recovery: RecoveryReport


def spark_application() -> str:
    """The spark-submit entry point: ONCEFLOW_SPARK_JOBS/onceflow_process.py, or the module itself."""
    jobs = os.environ.get("ONCEFLOW_SPARK_JOBS")
    if jobs and (Path(jobs) / "onceflow_process.py").is_file():
        return str(Path(jobs) / "onceflow_process.py")
    return str(Path(slice_job.__file__))


def spark_master() -> str:
    """ONCEFLOW_SPARK_MASTER, else local[2]; ``local[N,F]`` lets Spark retry a failed task F-1 times."""
    return os.environ.get("ONCEFLOW_SPARK_MASTER") or "local[2]"


def submit_slice(
    pipeline_path: str, epoch: Epoch, slice_number: int, settings: Settings, *, master: str | None = None
) -> subprocess.CompletedProcess[str]:
    """spark-submit one slice of an epoch and wait for it."""
    master = master or spark_master()
    command = [
        "spark-submit",
        "--master", master,
        "--conf", "spark.ui.enabled=false",
        "--conf", "spark.sql.shuffle.partitions=4",
        spark_application(),
        "--pipeline", pipeline_path,
        "--epoch", str(epoch.number),
        "--slice", str(slice_number),
        "--attempt-token", epoch.attempt_token,
    ]  # fmt: skip
    env = spark_environment(settings)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [*sys.path, env.get("PYTHONPATH", "")] if p)
    return subprocess.run(command, env=env, capture_output=True, text=True, check=False)


def run_epoch(
    pipeline_path: str,
    settings: Settings | None = None,
    *,
    data_interval: tuple[datetime, datetime] | None = None,
    max_records_per_partition: int | None = None,
    executor: Executor = "spark",
) -> EpochOutcome:
    """recover -> plan -> process every slice -> commit (or abort when a slice fails).

    ``executor="local"`` runs each slice in this process without Spark (`local_slice`), for pipelines
    without transform and state.
    """
    settings = settings or Settings.from_env()
    spec: Pipeline = load_pipeline(pipeline_path)
    if executor == "local":
        check_local(spec)
    committers = committers_for(spec)
    ledger = Ledger.connect(settings.ledger_url)
    try:
        recovery = ledger.recover(spec.name, committers)
        planned = plan_epoch(
            spec,
            ledger,
            settings,
            data_interval=data_interval,
            max_records_per_partition=max_records_per_partition,
        )
        epoch = planned.epoch
        failures = []
        for plan in planned.slices:
            if not plan.tasks:
                continue
            if executor == "local":
                try:
                    run_slice_local(spec, epoch.number, plan.slice, epoch.attempt_token, settings)
                except OnceflowError as exc:
                    failures.append(f"slice {plan.slice} failed: {exc}")
                continue
            result = submit_slice(pipeline_path, epoch, plan.slice, settings)
            if result.returncode != 0:
                failures.append(f"slice {plan.slice} exited {result.returncode}: {result.stderr[-3000:]}")
        if failures:
            ledger.abort_epoch(spec.name, epoch.number, committers, reason="; ".join(failures)[:2000])
            raise ProcessFailed(f"{epoch} aborted: " + "\n".join(failures))
        return EpochOutcome(planned, ledger.commit_epoch(spec.name, epoch.number, committers), recovery)
    finally:
        ledger.close()
