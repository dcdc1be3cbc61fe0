"""One DAG per pipeline spec: ``recover -> plan -> process (one spark-submit per slice) -> commit ->
report``, with ``abort`` when any process task fails.

Each DAG run is one epoch. ``max_active_runs=1`` keeps epochs in order; retries are safe because every
step is idempotent and guarded by the ledger. Process tasks are not retried: a failed slice aborts the
epoch, and the next run replays its ranges from the same offsets.

``schedule=ON_NEW_RECORDS`` runs the DAG when its topics hold records beyond the committed position: the
DAG is scheduled on an asset whose watcher (`onceflow_airflow.triggers.NewRecordsTrigger`, in the
triggerer) announces them. The run still plans its ranges from the ledger, so events only wake it up.
"""

from __future__ import annotations

import os
import sys
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG, Asset, AssetWatcher, Param, TriggerRule

from onceflow.config import Settings
from onceflow.engine.submit import SPARK_CONF, spark_application
from onceflow.pipeline import Pipeline, load_pipeline
from onceflow_airflow.operators import (
    INTERVAL_MODES,
    OnceflowAbortOperator,
    OnceflowCommitOperator,
    OnceflowPlanOperator,
    OnceflowProcessOperator,
    OnceflowRecoverOperator,
    OnceflowReportOperator,
)
from onceflow_airflow.triggers import NewRecordsTrigger

DEFAULT_START = datetime(2024, 1, 1)
# schedule=ON_NEW_RECORDS: run when the pipeline's topics hold records beyond its committed position.
ON_NEW_RECORDS = "on_new_records"
# Every DAG the factory builds carries the tag PIPELINE_TAG + the pipeline's name, whatever its dag_id:
# the epochs console finds a pipeline's DAGs (and checks permissions on them) by this tag.
PIPELINE_TAG = "onceflow:"


def new_records_asset(
    spec: Pipeline,
    pipeline: str,
    conns: dict[str, str],
    *,
    poll_interval_s: float = 5.0,
    repeat_s: float = 300.0,
) -> Asset:
    """The asset ``onceflow_<name>_new_records`` whose watcher announces the pipeline's new records."""
    trigger = NewRecordsTrigger(
        pipeline=pipeline, poll_interval_s=poll_interval_s, repeat_s=repeat_s, **conns
    )
    return Asset(
        name=f"onceflow_{spec.name}_new_records",
        uri=f"onceflow://{spec.name}/new-records",
        watchers=[AssetWatcher(name=f"onceflow_{spec.name}_new_records", trigger=trigger)],
    )


def executor_python() -> str:
    """The executors' Python: PYSPARK_PYTHON when the workers run another image or host (docker-compose
    sets the Spark image's virtualenv), else this interpreter (local Spark, the same machine)."""
    return os.environ.get("PYSPARK_PYTHON") or sys.executable


def build_dag(
    pipeline: str,
    *,
    dag_id: str | None = None,
    schedule: Any = None,
    start_date: datetime = DEFAULT_START,
    catchup: bool = False,
    retries: int = 2,
    retry_delay: timedelta = timedelta(seconds=10),
    spark_conn_id: str = "spark_default",
    spark_connect_conn_id: str = "spark_connect_default",
    spark_conf: dict[str, str] | None = None,
    ledger_conn_id: str = "onceflow_ledger",
    kafka_conn_id: str = "onceflow_kafka",
    postgres_conn_id: str = "onceflow_postgres",
    tags: tuple[str, ...] = (),
    doc_md: str | None = None,
    poll_interval_s: float = 5.0,
) -> DAG:
    """Build the DAG of the pipeline at ``module:attribute`` (its dag_id defaults to onceflow_<name>).

    ``schedule`` is any Airflow schedule; use an interval timetable (e.g. ``CronDataIntervalTimetable``)
    for scheduled runs and backfills whose data interval bounds each epoch, or ``ON_NEW_RECORDS`` to run
    when new records arrive (checked every ``poll_interval_s`` by the triggerer).

    Process tasks send their slices to the Spark Connect server of ``spark_connect_conn_id`` when that
    connection exists (else of ``ONCEFLOW_SPARK_REMOTE``), and spark-submit through ``spark_conn_id``
    otherwise.
    """
    spec = load_pipeline(pipeline)
    settings = Settings.from_env()  # the door: where spark-submit finds the slice job's entry point
    conns = {
        "ledger_conn_id": ledger_conn_id,
        "kafka_conn_id": kafka_conn_id,
        "postgres_conn_id": postgres_conn_id,
    }
    if schedule == ON_NEW_RECORDS:
        schedule = [new_records_asset(spec, pipeline, conns, poll_interval_s=poll_interval_s)]
    with DAG(
        dag_id=dag_id or f"onceflow_{spec.name}",
        schedule=schedule,
        start_date=start_date,
        catchup=catchup,
        max_active_runs=1,
        tags=["onceflow", f"{PIPELINE_TAG}{spec.name}", *tags],
        doc_md=doc_md or f"onceflow pipeline `{spec.name}` (`{pipeline}`): one DAG run is one epoch.",
        default_args={"retries": retries, "retry_delay": retry_delay},
        params={
            "max_records_per_partition": Param(
                None,
                type=["null", "integer"],
                minimum=1,
                description=f"at most this many offsets per partition (empty: the pipeline's "
                f"{spec.max_records_per_partition})",
            ),
            "preview": Param(
                False, type="boolean", description="plan and print the ranges; process and commit nothing"
            ),
            "interval": Param(
                "auto",
                enum=list(INTERVAL_MODES),
                description="auto: scheduled and backfill runs read up to their data interval's end, "
                "manual runs up to the newest records; bound / ignore force one or the other",
            ),
        },
    ) as dag:
        recover = OnceflowRecoverOperator(task_id="recover", pipeline=pipeline, **conns)
        plan = OnceflowPlanOperator(task_id="plan", pipeline=pipeline, **conns)
        process = [
            OnceflowProcessOperator(
                task_id=f"process_s{number}",
                pipeline=pipeline,
                slice_number=number,
                application=spark_application(settings),
                conn_id=spark_conn_id,
                spark_connect_conn_id=spark_connect_conn_id,
                name=f"onceflow-{spec.name}-s{number}",
                conf={**SPARK_CONF, **(spark_conf or {})},
                env_vars={"PYSPARK_PYTHON": executor_python(), "PYSPARK_DRIVER_PYTHON": sys.executable},
                retries=0,
                # A hung slice must not hold the epoch's prepared transactions past their timeout.
                execution_timeout=timedelta(seconds=spec.transaction_timeout_s),
                **conns,
            )
            for number in range(spec.slices)
        ]
        commit = OnceflowCommitOperator(
            task_id="commit", pipeline=pipeline, trigger_rule=TriggerRule.NONE_FAILED, **conns
        )
        report = OnceflowReportOperator(task_id="report", pipeline=pipeline, **conns)
        abort = OnceflowAbortOperator(
            task_id="abort", pipeline=pipeline, trigger_rule=TriggerRule.ONE_FAILED, **conns
        )
        recover >> plan >> process >> commit >> report
        process >> abort
    return dag
