"""Run whole epochs without Airflow: the same steps the DAG runs as tasks, chained in one process.

Used by tests, benchmarks and `onceflow run`; each step is the function the corresponding DAG task calls.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal, TypeAlias

from onceflow.config import Settings
from onceflow.engine import slice_job, steps
from onceflow.engine.local_slice import check_local, run_slice_local
from onceflow.errors import OnceflowError
from onceflow.ledger import Epoch, Ledger, RecoveryReport
from onceflow.local_airflow import spark_environment
from onceflow.pipeline import Pipeline, load_pipeline

Executor: TypeAlias = Literal["spark", "local"]


class ProcessFailed(OnceflowError):
    """A slice's Spark job failed; the epoch was aborted and its ranges will be replayed."""


@dataclass(frozen=True)
class EpochOutcome:
    planned: steps.PlanResult
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
    run_id: str | None = None,
    executor: Executor = "spark",
) -> EpochOutcome:
    """recover -> plan -> process every slice -> commit (or abort when a slice fails).

    The same `steps` as the DAG's tasks; ``run_id`` names the run in the ledger (a fresh one by default).
    ``executor="local"`` runs each slice in this process without Spark (`local_slice`), for pipelines
    without transform and state.
    """
    settings = settings or Settings.from_env()
    spec: Pipeline = load_pipeline(pipeline_path)
    if executor == "local":
        check_local(spec)
    run_id = run_id or f"runner__{uuid.uuid4().hex}"
    recovery = steps.recover(spec, settings)
    planned = steps.plan(
        spec,
        settings,
        run_id=run_id,
        data_interval=data_interval,
        max_records_per_partition=max_records_per_partition,
    )
    with Ledger.connect(settings.ledger_url) as ledger:
        epoch = ledger.epoch(spec.name, planned.epoch) if planned.epoch is not None else None
    if epoch is None or planned.status != "planned":
        raise ProcessFailed(f"nothing was planned for {spec.name!r}: " + "; ".join(planned.lines))
    failures = []
    for slice_number in planned.slices_with_tasks:
        if executor == "local":
            try:
                run_slice_local(spec, epoch.number, slice_number, epoch.attempt_token, settings)
            except OnceflowError as exc:
                failures.append(f"slice {slice_number} failed: {exc}")
            continue
        result = submit_slice(pipeline_path, epoch, slice_number, settings)
        if result.returncode != 0:
            failures.append(f"slice {slice_number} exited {result.returncode}: {result.stderr[-3000:]}")
    if failures:
        steps.abort(spec, settings, epoch=epoch.number, reason="; ".join(failures)[:2000])
        raise ProcessFailed(f"{epoch} aborted: " + "\n".join(failures))
    done = steps.commit(spec, settings, epoch=epoch.number)
    assert done is not None
    return EpochOutcome(planned, done, recovery)
