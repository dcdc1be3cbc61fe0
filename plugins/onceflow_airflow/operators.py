"""One operator per epoch step; each calls the matching `onceflow.protocol.coordinator.Coordinator` method.

Every operator takes the pipeline as ``module:attribute``, gets its settings and ledger from
`OnceflowHook`, and finds its epoch through the ledger by the DAG run's id, never through XCom alone, so
a cleared task, a retry or ``airflow tasks test`` acts on the epoch the ledger says this run owns. A
refusal fails the task (no retry) with the refusal as its last log line, in the CLI's words; under
``airflow tasks test``, which reports every task outcome with exit status 0, it also ends the command
with the CLI's exit status for a refusal (3).

Each step sends its wall time, and the report and abort steps the epoch's figures and lag, through
Airflow's metrics (`onceflow_airflow.metrics`); the process and commit steps describe their inputs and
outputs to OpenLineage (`onceflow_airflow.lineage`).
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import (
    AirflowException,
    AirflowFailException,
    AirflowNotFoundException,
    AirflowSkipException,
)

from onceflow import redact
from onceflow.cli.main import EXIT_REFUSED
from onceflow.config import Settings
from onceflow.engine.connect import connect_sessions, pipeline_modules
from onceflow.engine.executors import SliceRunner, slice_runner_for
from onceflow.engine.local_slice import run_slice_local
from onceflow.engine.slice_job import run_slice
from onceflow.engine.submit import application_args
from onceflow.errors import OnceflowError
from onceflow.ledger import Ledger, Refused, SinkCallFailedKnown
from onceflow.monitoring.metrics import epoch_metrics, lag_metrics, step_metric
from onceflow.monitoring.new_records import read_backlog
from onceflow.pipeline import Pipeline, load_pipeline
from onceflow.protocol.coordinator import Coordinator, EpochOwned
from onceflow.protocol.owners import process_alive
from onceflow.protocol.step_results import PlanResult
from onceflow_airflow.hooks import OnceflowHook
from onceflow_airflow.lineage import operator_lineage
from onceflow_airflow.metrics import emit

# How a run chooses its input: "auto" bounds scheduled and backfill runs by their data interval and
# reads manual runs up to the newest stable offset; "bound" and "ignore" force one or the other.
INTERVAL_MODES = ("auto", "bound", "ignore")


@contextmanager
def timed(pipeline: str, step: str, **tags: str) -> Iterator[None]:
    """Send the block's wall time as ``onceflow.<pipeline>.<step>.duration``, whether it succeeds or
    fails (not when it is skipped)."""
    started = time.monotonic()
    try:
        yield
    except AirflowSkipException:
        raise  # a step with nothing to do is not timed
    except BaseException:
        emit([step_metric(pipeline, step, time.monotonic() - started, **tags)])
        raise
    emit([step_metric(pipeline, step, time.monotonic() - started, **tags)])


def send_epoch_metrics(ledger: Ledger, spec: Pipeline, run_id: str, bootstrap: str, log: Any) -> None:
    """The figures of the run's finished epoch and the pipeline's lag now; best effort (a lag that cannot
    be read is left out with one line in the log)."""
    epoch = ledger.epoch_of_run(spec.name, run_id)
    if epoch is not None and epoch.is_final:
        emit(epoch_metrics(ledger, epoch))
    try:
        emit(lag_metrics(read_backlog(spec, ledger, bootstrap)))
    except OnceflowError as exc:
        log.warning("onceflow: lag not sent: %s", redact.text(exc))


def _under_tasks_test() -> bool:
    """True inside ``airflow tasks test``, the only command that sets AIRFLOW_TEST_MODE (Airflow 3)."""
    return os.environ.get("AIRFLOW_TEST_MODE", "").lower() == "true"


def _end_with_refusal(context: Any) -> None:
    """Failure callback: Airflow has logged the failure with its traceback; repeat the refusal as the
    task's last line and, under ``airflow tasks test``, make the command exit with status 3.

    ``airflow tasks test`` runs the task in process and exits 0 whatever the task's state (Airflow 3.3
    checks no state on the way out), so a script or a person reading ``$?`` would take a refused abort
    for a done one. The command must still record the task as failed, which it does after this
    callback, so the exit status is set when the command is done, at interpreter exit.
    """
    refusal = getattr(context.get("exception"), "onceflow_refusal", None)
    if refusal is None:
        return
    log = context["task"].log
    log.error("onceflow: %s", refusal)
    if _under_tasks_test():
        atexit.register(_exit_refused, log, refusal)


def _exit_refused(log: Any, refusal: str) -> None:
    """At the end of ``airflow tasks test``: the refusal as the command's last line, then exit 3 (the
    ``onceflow`` CLI's status for a refusal). Python ignores SystemExit raised at exit, hence os._exit,
    after flushing what is buffered."""
    log.error("onceflow: %s", refusal)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_REFUSED)


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
        callbacks = kwargs.pop("on_failure_callback", None)
        if callbacks is None:
            callbacks = []
        elif callable(callbacks):
            callbacks = [callbacks]
        super().__init__(on_failure_callback=[*callbacks, _end_with_refusal], **kwargs)
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

    @contextmanager
    def coordinator(self) -> Iterator[Coordinator]:
        """The pipeline's coordinator over the hook's ledger; a refusal fails the task without retry."""
        hook = self.hook()
        # Airflow logs what a task raises, with its causes: no password may be in any of them.
        with redact.scrubbed():
            settings = hook.settings()
            with hook.get_conn() as ledger:
                try:
                    yield Coordinator.for_pipeline(self.spec(), ledger, settings, log=self.say)
                except Refused as refused:
                    failure = AirflowFailException(redact.text(refused))
                    failure.onceflow_refusal = redact.text(refused)  # type: ignore[attr-defined]
                    raise failure from None
                except SinkCallFailedKnown as known:  # a retried task would fail the same way
                    raise AirflowFailException(redact.text(known)) from known


class OnceflowRecoverOperator(_OnceflowOperator):
    """Finish what a crash left behind: commit a decided epoch, roll back an undecided one whose owner
    is gone, sweep orphans. An epoch owned by another DAG run that is still queued or running is kept."""

    def execute(self, context: Any) -> dict[str, Any]:
        alive = self._owner_alive(context)
        with self.coordinator() as coordinator, timed(coordinator.pipeline, "recover"):
            report = coordinator.recover(
                by=f"Airflow task {self.task_id} of run {context['dag_run'].run_id}", owner_alive=alive
            )
        return report.to_dict()

    def _owner_alive(self, context: Any) -> Callable[[str], bool | None]:
        """An owner is a DAG run of this DAG (alive while queued or running), or a process."""

        def alive(owner: str) -> bool | None:
            run_id = owner.split(" (pid ", 1)[0]
            if run_id == context["dag_run"].run_id:
                return False  # this very run starts over: what it planned before is not running
            try:
                state = str(context["ti"].get_dagrun_state(dag_id=context["dag"].dag_id, run_id=run_id))
            except Exception:  # not a run of this DAG: a runner or another orchestrator
                return process_alive(owner)
            self.log.info("onceflow: the epoch in flight belongs to DAG run %s, which is %s", run_id, state)
            return state.lower().rsplit(".", 1)[-1] in ("queued", "running")

        return alive


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
    """Write the epoch's exact offset ranges to the ledger before anything runs (or print them: preview).

    Params read: ``max_records_per_partition`` (null = the pipeline's), ``preview``, ``interval``. The DAG
    run owns the epoch it plans; while another run's epoch is in flight, the task fails to be retried.
    """

    def execute(self, context: Any) -> dict[str, Any]:
        params = context["params"]
        interval = run_interval(context, str(params.get("interval", "auto")))
        run_id = context["dag_run"].run_id
        with self.coordinator() as coordinator, timed(coordinator.pipeline, "plan"):
            try:
                result = coordinator.plan(
                    run_id=run_id,
                    owner=f"{run_id} (DAG {context['dag'].dag_id})",
                    data_interval=interval,
                    max_records_per_partition=params.get("max_records_per_partition") or None,
                    preview=bool(params.get("preview", False)),
                )
            except EpochOwned as owned:
                raise AirflowException(
                    f"{owned} (retried). Backfill with `airflow backfill create --max-active-runs 1`"
                ) from owned
        return result.to_dict()


class OnceflowProcessOperator(SparkSubmitOperator):
    """The process step: one slice of this run's epoch, on the warm Spark runtime or by spark-submit.

    Where the slice runs is `onceflow.engine.executors.slice_runner`'s choice, as for ``onceflow run``,
    from the configured executor (``ONCEFLOW_EXECUTOR``) and the Spark Connect server (the
    ``spark_connect`` connection ``spark_connect_conn_id``, else ``ONCEFLOW_SPARK_REMOTE``). On the
    server or, with ``local``, in this task's process, this task is the slice's driver; for spark-submit
    it submits ``onceflow_process.py`` through the ``spark`` connection, as the apache-spark provider's
    SparkSubmitOperator does.

    Skipped (not failed) when the run planned nothing to process, when the slice has no read task in
    this epoch, or when the epoch is already decided (a cleared or retried task must not redo it); the
    gate is `Coordinator.slice_to_process`, the runner's too.
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
        spark_connect_conn_id: str = SparkConnectHook.default_conn_name,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.slice_number = slice_number
        self.spark_connect_conn_id = spark_connect_conn_id
        self.plan_task_id = plan_task_id
        self.onceflow_hook = OnceflowHook(ledger_conn_id, kafka_conn_id, postgres_conn_id)

    def execute(self, context: Any) -> None:
        name = load_pipeline(self.pipeline).name
        with redact.scrubbed(), timed(name, "process", slice=str(self.slice_number)):
            self._process_slice(context)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """The slice reads the pipeline's topics and stages into its sinks."""
        return operator_lineage(load_pipeline(self.pipeline), self.onceflow_hook.settings())

    def _process_slice(self, context: Any) -> None:
        planned = context["ti"].xcom_pull(task_ids=self.plan_task_id)
        if not planned:
            raise AirflowFailException(f"task {self.plan_task_id!r} left no plan for this run")
        settings = self.onceflow_hook.settings()
        with self.onceflow_hook.get_conn() as ledger:
            coordinator = Coordinator.for_pipeline(load_pipeline(self.pipeline), ledger, settings)
            gate = coordinator.slice_to_process(PlanResult.from_dict(planned), self.slice_number)
            if gate.verdict == "process" and gate.epoch is not None:
                coordinator.renew_lease(gate.epoch.number)
        if gate.verdict == "aborted":
            raise AirflowFailException(redact.text(gate.line))
        if gate.verdict == "skip" or gate.epoch is None:
            raise AirflowSkipException(gate.line)
        epoch, why = gate.epoch, gate.line
        spec = load_pipeline(self.pipeline)
        in_task = self.slice_in_task(spec, epoch.attempt_token, settings)
        if in_task is not None:
            where, run = in_task
            self.log.info("onceflow: %s: %s", why, where)
            try:
                summary = run(spec, epoch.number, self.slice_number, epoch.attempt_token, settings)
            except OnceflowError as exc:  # the epoch is aborted (or the abort task aborts it); replayed next
                raise AirflowFailException(redact.text(f"onceflow: {exc}")) from exc
            self.log.info("onceflow: slice %s done: %s", self.slice_number, summary)
            return
        self.log.info("onceflow: %s: spark-submit", why)
        self.application_args = application_args(
            self.pipeline, epoch.number, self.slice_number, epoch.attempt_token
        )
        self.env_vars = {
            **(self.env_vars or {}),
            **settings.as_env(),
            "PYTHONPATH": ":".join(p for p in sys.path if p),
        }
        super().execute(context)

    def slice_runner(self, settings: Settings) -> tuple[SliceRunner, str | None]:
        """How this task runs its slice, and on which server: the library's one rule, which ``onceflow
        run`` asks too, from the configured executor and the Spark Connect server this task sees."""
        return slice_runner_for(settings, remote=self.connection_remote())

    def slice_in_task(
        self, spec: Pipeline, attempt_token: str, settings: Settings
    ) -> tuple[str, Callable[..., dict[str, Any]]] | None:
        """Where the slice runs when this task is its driver, and how: in this process without Spark
        (executor ``local``), or on the Spark Connect server; None means spark-submit."""
        runner, remote = self.slice_runner(settings)
        if runner == "local":
            return "in this task's process (ONCEFLOW_EXECUTOR=local)", run_slice_local
        if runner == "submit" or remote is None:
            return None
        sessions = connect_sessions(remote, pipeline_modules(spec, self.pipeline), attempt_token)
        where = f"on the Spark Connect server {redact.url(remote)}"
        return where, functools.partial(run_slice, session=sessions)

    def spark_remote(self, settings: Settings) -> str | None:
        """The Spark Connect server: the ``spark_connect`` connection if there is one, else the
        settings' (``ONCEFLOW_SPARK_REMOTE``); None means spark-submit."""
        return self.connection_remote() or settings.spark_remote

    def connection_remote(self) -> str | None:
        """The URL of the ``spark_connect`` connection ``spark_connect_conn_id``, None without one."""
        try:
            return SparkConnectHook(self.spark_connect_conn_id).get_connection_url()
        except AirflowNotFoundException:
            return None


class OnceflowCommitOperator(_OnceflowOperator):
    """The commit step: decide, then commit every participant; a committed epoch is left as it is."""

    def execute(self, context: Any) -> dict[str, Any] | None:
        with self.coordinator() as coordinator, timed(coordinator.pipeline, "commit"):
            epoch = coordinator.commit(run_id=context["dag_run"].run_id)
        return None if epoch is None else {"epoch": epoch.number, "status": str(epoch.status)}

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """The commit makes the sinks' output visible: the pipeline's topics in, its sinks out."""
        return operator_lineage(self.spec(), self.hook().settings())


class OnceflowAbortOperator(_OnceflowOperator):
    """The abort step: roll back the run's undecided epoch; refuses, failing without retries, to touch a
    decided one."""

    def execute(self, context: Any) -> dict[str, Any] | None:
        run_id = context["dag_run"].run_id
        with self.coordinator() as coordinator:
            with timed(coordinator.pipeline, "abort"):
                epoch = coordinator.abort(
                    run_id=run_id, reason=f"aborted by Airflow task {self.task_id} of run {run_id}"
                )
            assert coordinator.spec is not None
            send_epoch_metrics(
                coordinator.ledger, coordinator.spec, run_id, coordinator.settings.kafka_bootstrap, self.log
            )
        return None if epoch is None else {"epoch": epoch.number, "status": str(epoch.status)}


class OnceflowReportOperator(_OnceflowOperator):
    """The report step: the run's epoch in a few lines (status, input ranges, records per sink, dead
    letters), the last lines of the run's log."""

    def execute(self, context: Any) -> list[str]:
        run_id = context["dag_run"].run_id
        with self.coordinator() as coordinator:
            assert coordinator.spec is not None
            send_epoch_metrics(
                coordinator.ledger, coordinator.spec, run_id, coordinator.settings.kafka_bootstrap, self.log
            )
            return coordinator.report(run_id=run_id)
