"""One operator per epoch step; each calls the matching `onceflow.engine.steps` function.

Every operator takes the pipeline as ``module:attribute`` and finds its epoch through the ledger by the
DAG run's id, never through XCom alone, so a cleared task, a retry or ``airflow tasks test`` acts on
the epoch the ledger says this run owns.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from onceflow.engine import steps
from onceflow.ledger import EpochStatus, Ledger
from onceflow.pipeline import Pipeline, load_pipeline
from onceflow_airflow.hooks import OnceflowHook

# How a run chooses its input: "auto" bounds scheduled and backfill runs by their data interval and
# reads manual runs up to the newest stable offset; "bound" and "ignore" force one or the other.
INTERVAL_MODES = ("auto", "bound", "ignore")


class _OnceflowOperator(BaseOperator):
    template_fields: Sequence[str] = ("pipeline",)
    ui_color = "#e8f4fa"

    def __init__(
        self,
        *,
        pipeline: str,
        ledger_conn_id: str = "onceflow_ledger",
        kafka_conn_id: str = "onceflow_kafka",
        postgres_conn_id: str = "onceflow_postgres",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.ledger_conn_id = ledger_conn_id
        self.kafka_conn_id = kafka_conn_id
        self.postgres_conn_id = postgres_conn_id

    def hook(self) -> OnceflowHook:
        return OnceflowHook(self.ledger_conn_id, self.kafka_conn_id, self.postgres_conn_id)

    def spec(self) -> Pipeline:
        return load_pipeline(self.pipeline)

    def say(self, line: str) -> None:
        self.log.info("onceflow: %s", line)


class OnceflowRecoverOperator(_OnceflowOperator):
    """Finish what a crash left behind: commit a decided epoch, roll back an undecided one, sweep."""

    def execute(self, context: Any) -> dict[str, Any]:
        spec, settings = self.spec(), self.hook().export()
        self._refuse_if_another_run_is_active(context, spec, settings)
        report = steps.recover(spec, settings, log=self.say)
        return report.to_dict()

    def _refuse_if_another_run_is_active(self, context: Any, spec: Pipeline, settings: Any) -> None:
        """Recovery must never roll back an epoch that another, still running DAG run is processing.

        ``max_active_runs=1`` prevents that for scheduled runs, but a backfill has its own limit
        (``airflow backfill create --max-active-runs``, default 10).
        """
        with Ledger.connect(settings.ledger_url) as ledger:
            epoch = ledger.open_epoch(spec.name)
        this_run = context["dag_run"].run_id
        if epoch is None or epoch.run_id in (None, this_run):
            return
        try:
            state = str(context["ti"].get_dagrun_state(dag_id=context["dag"].dag_id, run_id=epoch.run_id))
        except Exception as exc:  # the run belongs to another DAG or no longer exists: it is not active
            self.log.info(
                "onceflow: %s belongs to run %s, not found in this DAG (%s)", epoch, epoch.run_id, exc
            )
            return
        self.log.info("onceflow: %s belongs to DAG run %s, which is %s", epoch, epoch.run_id, state)
        if state.lower().rsplit(".", 1)[-1] in ("queued", "running"):
            raise AirflowException(
                f"{epoch} belongs to DAG run {epoch.run_id}, which is still {state}; this run waits for it "
                "(retried). Epochs of a pipeline run one at a time: backfill with "
                "`airflow backfill create --max-active-runs 1`"
            )


def run_interval(context: Any, mode: str) -> tuple[datetime, datetime] | None:
    """The data interval that bounds this run's epoch, or None to read up to the newest stable offset."""
    if mode not in INTERVAL_MODES:
        raise AirflowFailException(f"param interval={mode!r}: expected one of {INTERVAL_MODES}")
    start, end = context.get("data_interval_start"), context.get("data_interval_end")
    if mode == "ignore" or start is None or end is None:
        return None
    run_type = context["dag_run"].run_type
    if mode == "auto" and str(getattr(run_type, "value", run_type)) not in ("scheduled", "backfill"):
        return None
    if end <= start:
        if mode == "bound":
            raise AirflowFailException(
                f"interval=bound, but the run's data interval {start} .. {end} is empty"
            )
        return None
    return (start, end)


class OnceflowPlanOperator(_OnceflowOperator):
    """Write the epoch's exact offset ranges to the ledger before anything runs (or print them, dry run).

    Params read: ``max_records_per_partition`` (null = the pipeline's), ``dry_run``, ``interval``.
    """

    def execute(self, context: Any) -> dict[str, Any]:
        params = context["params"]
        interval = run_interval(context, str(params.get("interval", "auto")))
        result = steps.plan(
            self.spec(),
            self.hook().export(),
            run_id=context["dag_run"].run_id,
            data_interval=interval,
            max_records_per_partition=params.get("max_records_per_partition") or None,
            dry_run=bool(params.get("dry_run", False)),
            log=self.say,
        )
        return result.to_dict()


class OnceflowSliceOperator(SparkSubmitOperator):
    """spark-submit ``onceflow_process.py`` for one slice of this run's epoch.

    Skipped (not failed) when the run planned nothing to process, when the slice has no read task in
    this epoch, or when the epoch is already decided (a cleared or retried task must not redo it).
    """

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "pipeline")
    ui_color = "#fdf2e4"

    def __init__(
        self,
        *,
        pipeline: str,
        slice_number: int,
        plan_task_id: str = "plan",
        ledger_conn_id: str = "onceflow_ledger",
        kafka_conn_id: str = "onceflow_kafka",
        postgres_conn_id: str = "onceflow_postgres",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.slice_number = slice_number
        self.plan_task_id = plan_task_id
        self.onceflow_hook = OnceflowHook(ledger_conn_id, kafka_conn_id, postgres_conn_id)

    def execute(self, context: Any) -> None:
        planned = context["ti"].xcom_pull(task_ids=self.plan_task_id)
        if not planned:
            raise AirflowFailException(f"task {self.plan_task_id!r} left no plan for this run")
        result = steps.PlanResult.from_dict(planned)
        if result.status != "planned" or result.epoch is None:
            raise AirflowSkipException(f"nothing to process: plan said {result.status}")
        if self.slice_number not in result.slices_with_tasks:
            raise AirflowSkipException(f"epoch {result.epoch}: slice {self.slice_number} has no read task")
        settings = self.onceflow_hook.export()
        with Ledger.connect(settings.ledger_url) as ledger:
            epoch = ledger.epoch(result.pipeline, result.epoch)
        at_most_once = load_pipeline(self.pipeline).commits_before_processing
        if epoch.status is not EpochStatus.PLANNED and not (
            at_most_once and epoch.status is EpochStatus.COMMITTED
        ):
            message = f"{epoch} is {epoch.status}: the slice has nothing left to do"
            if epoch.status.is_final and epoch.status is EpochStatus.ABORTED:
                raise AirflowFailException(message + " (aborted; the next run replays its range)")
            raise AirflowSkipException(message)
        self.log.info("onceflow: %s, slice %s: spark-submit", epoch, self.slice_number)
        self.application_args = [
            "--pipeline", self.pipeline,
            "--epoch", str(epoch.number),
            "--slice", str(self.slice_number),
            "--attempt-token", epoch.attempt_token,
        ]  # fmt: skip
        self.env_vars = {
            **(self.env_vars or {}),
            **settings.as_env(),
            "PYTHONPATH": ":".join(p for p in sys.path if p),
        }
        super().execute(context)


class OnceflowCommitOperator(_OnceflowOperator):
    """The coordinator: decide, then commit every participant; a committed epoch is left as it is."""

    def execute(self, context: Any) -> dict[str, Any] | None:
        try:
            epoch = steps.commit(
                self.spec(), self.hook().export(), run_id=context["dag_run"].run_id, log=self.say
            )
        except steps.StepRefused as refused:
            self.log.error("onceflow: %s", refused)
            raise AirflowFailException(str(refused)) from refused
        return None if epoch is None else {"epoch": epoch.number, "status": str(epoch.status)}


class OnceflowAbortOperator(_OnceflowOperator):
    """Roll back the run's undecided epoch; refuses, failing without retries, to touch a decided one."""

    def execute(self, context: Any) -> dict[str, Any] | None:
        run_id = context["dag_run"].run_id
        try:
            epoch = steps.abort(
                self.spec(),
                self.hook().export(),
                run_id=run_id,
                reason=f"aborted by Airflow task {self.task_id} of run {run_id}",
                log=self.say,
            )
        except steps.StepRefused as refused:
            self.log.error("onceflow: %s", refused)
            raise AirflowFailException(str(refused)) from refused
        return None if epoch is None else {"epoch": epoch.number, "status": str(epoch.status)}


class OnceflowReportOperator(_OnceflowOperator):
    """Print the run's epoch: status, input ranges, records per sink, dead letters."""

    def execute(self, context: Any) -> list[str]:
        return steps.report(self.spec(), self.hook().export(), run_id=context["dag_run"].run_id, log=self.say)
